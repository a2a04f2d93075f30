"""Compose stage: Hydra 1.3.2's compose on the pinned tree (or its exact fast path), resolved."""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypeGuard, cast

import yaml

from pytest_verl_compat.files.safe_input import InputError, load_yaml, read_bytes, read_text
from pytest_verl_compat.model import COMPOSED, COMPOSITION_REJECTION, Composition
from pytest_verl_compat.pipeline.defaults_mounts import Mount, mounts_of
from pytest_verl_compat.pipeline.hydra_internals import (
    apply_value_overrides,
    config_groups,
    config_repository,
    defaults_list,
    deterministic_resolvers,
    grammar_parse_cache,
    libyaml_config_loading,
    mounted_configs,
    parse_override,
)
from pytest_verl_compat.pipeline.memo import BASE as BASE_KIND
from pytest_verl_compat.pipeline.memo import CONFIG_FILES as CONFIG_FILES_KIND
from pytest_verl_compat.pipeline.memo import StageMemo, json_exact
from pytest_verl_compat.pipeline.targets import target_rejection

if TYPE_CHECKING:
    from omegaconf import DictConfig

MISSING = "???"
# libyaml's parser under PyYAML's safe constructor: the documents ``yaml.safe_load`` gives.
_SAFE: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# OmegaConf types container keys loosely; a tree composed from YAML files has string keys.
_Mapping = dict[str, Any]
# What Hydra and OmegaConf raise for a bad override list. Hydra lets some malformed overrides
# through to a bare TypeError (e.g. a group override with a list of numbers, `model_engine=[0]`);
# still the input's fault. Anything else is a bug here and propagates.
# A tree file that is not YAML reaches Hydra's own loader as PyYAML's error: the tree's fault too.


@functools.cache
def _hydra() -> SimpleNamespace:
    """Hydra's and OmegaConf's names, imported at their first use: a run whose compositions are
    all kept (``memo``) imports neither (~0.2 s, more from a cold disk)."""
    import hydra
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import ConfigCompositionException, HydraException
    from omegaconf import Container, DictConfig, ListConfig, OmegaConf
    from omegaconf.basecontainer import BaseContainer
    from omegaconf.errors import OmegaConfBaseException

    return SimpleNamespace(
        compose=hydra.compose,
        initialize_config_dir=hydra.initialize_config_dir,
        GlobalHydra=GlobalHydra,
        ConfigCompositionException=ConfigCompositionException,
        HydraException=HydraException,
        Container=Container,
        DictConfig=DictConfig,
        ListConfig=ListConfig,
        OmegaConf=OmegaConf,
        BaseContainer=BaseContainer,
        OmegaConfBaseException=OmegaConfBaseException,
    )


def _input_errors() -> tuple[type[BaseException], ...]:
    return (
        _hydra().HydraException,
        _hydra().OmegaConfBaseException,
        ValueError,
        KeyError,
        TypeError,
        yaml.YAMLError,
    )


# Hydra looks an override's key up as a config group, a file name under the tree
# (ConfigRepository.group_exists): past the file system's name limit (255) that is an OSError,
# not an answer. verl's longest key has 83 characters.
MAX_OVERRIDE_KEY = 200


def override_refusal(line: str, *, parse: bool = False) -> str | None:
    """Why an override cannot reach Hydra, in one line naming it, or None.

    Always: a key longer than ``MAX_OVERRIDE_KEY``. With ``parse``: Hydra's own override grammar
    (a ``--set`` value is checked before anything composes; in a case, Hydra's rejection of the
    grammar is the composition's outcome).
    """
    key = line.split("=", 1)[0]
    shown = line if len(line) <= 80 else f"{line[:60]}… ({len(line)} characters)"
    if len(key) > MAX_OVERRIDE_KEY:
        return (
            f"override {shown!r}: a key of {len(key)} characters ({key.count('.') + 1} "
            f"segments); at most {MAX_OVERRIDE_KEY}"
        )
    if parse:
        try:
            parse_override(line)
        except _hydra().HydraException as exc:
            reason = " ".join(str(exc).split())
            return f"override {shown!r}: expected KEY=VALUE (or ~KEY), as Hydra reads it: {reason}"
        except ValueError as exc:  # a value Hydra's grammar converts: an integer of 5000 digits
            reason = " ".join(str(exc).split(";")[0].split())
            return f"override {shown!r}: Hydra cannot read its value: {reason}"
    return None


def count_leaves(value: Any) -> int:
    """Leaves of a resolved mapping: list items one by one; an empty mapping or list is one leaf."""
    if isinstance(value, Mapping) and value:
        return sum(count_leaves(v) for v in value.values())
    if isinstance(value, list) and value:
        return sum(count_leaves(v) for v in value)
    return 1


def iter_leaves(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Yield (dotted path, value) for every leaf; list items are addressed as ``path[i]``."""
    if isinstance(value, Mapping) and value:
        for key, item in value.items():
            yield from iter_leaves(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            yield from iter_leaves(item, f"{prefix}[{index}]")
    else:
        yield prefix, value


def _missing_paths(node: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(node, _hydra().DictConfig):
        for key in node.keys():
            path = f"{prefix}.{key!s}" if prefix else str(key)
            if _hydra().OmegaConf.is_missing(node, key):
                yield path
            else:
                yield from _missing_paths(node._get_node(key), path)
    elif isinstance(node, _hydra().ListConfig):
        for index in range(len(node)):
            if _hydra().OmegaConf.is_missing(node, index):
                yield f"{prefix}[{index}]"
            else:
                yield from _missing_paths(node._get_node(index), f"{prefix}[{index}]")


def _clean_message(exc: BaseException, config_dir: Path) -> str:
    """Hydra's message, without machine-specific paths, so snapshots stay byte-identical."""
    message = f"{type(exc).__name__}: {exc}".replace(str(config_dir), "<config_dir>")
    return message.strip()


# --- The fast path ------------------------------------------------------------------------------
#
# Hydra spends ~0.7 s per compose rebuilding the defaults tree of verl's 100-odd YAML files. When
# no override names a config group, that tree is the same for every case: Hydra's
# `_load_configuration_impl` composes the override-free config, sets struct mode and then applies
# the value overrides one by one with `ConfigLoaderImpl._apply_overrides_to_config`. The fast path
# keeps that override-free composition (per tree hash and config name) and calls the same
# function on it, so assignment, `+`, `++`, merges and Hydra's checks are Hydra's own code. Anything
# else (group overrides, deletions, sweeps, `hydra.*`, or any exception) goes through Hydra.


@dataclass
class _Base:
    """The override-free composition of one tree, shared by every Composer in the process."""

    cfg: DictConfig  # struct mode, without the `hydra` node, exactly as `hydra.compose` returns it
    plain: dict[str, Any]  # `cfg` exported without resolving: interpolations stay strings
    groups: frozenset[str]  # every config group Hydra's repository holds (`actor`, `hydra/env`)
    resolved: dict[str, Any] | None = None  # `cfg` resolved, the defaults (made when first asked)

    def group_exists(self, key: str) -> bool:
        """Hydra's ``ConfigRepository.group_exists`` for a plain group path (``_GROUP_PATH``);
        the callers send any other key to Hydra's own compose."""
        return key in self.groups


def _pairs_of_strings(value: Any) -> TypeGuard[list[list[str]]]:
    return isinstance(value, list) and all(
        isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)
        for pair in value
    )


def _kept_base(kept: Any) -> _Base | None:
    """A base from the user cache (``memo.BASE``): Hydra's composition is rebuilt from its
    unresolved export, which gives the same nodes, types and flags (a test compares them with
    Hydra's), in ~0.1 s instead of Hydra's ~0.8 s; JSON, never a pickle."""
    if not (
        isinstance(kept, dict)
        and isinstance(kept.get("plain"), dict)
        and isinstance(kept.get("groups"), list)
        and all(isinstance(group, str) for group in kept["groups"])
    ):
        return None  # not what this code writes: Hydra composes it anew
    cfg = _hydra().OmegaConf.create(kept["plain"])
    _hydra().OmegaConf.set_struct(cfg, True)
    return _Base(cfg, cast(_Mapping, kept["plain"]), frozenset(kept["groups"]))


_BASES: dict[tuple[str, str, tuple[str, ...]], _Base] = {}
# A config group's path as the fast path decides it from the kept set of groups.
_GROUP_PATH = re.compile(r"[A-Za-z0-9_\-]+(/[A-Za-z0-9_\-]+)*")
# The config files each set of group selections merges (``Composer.config_files``).
_CONFIG_FILES: dict[tuple[str, str, tuple[str, ...]], list[tuple[Path, str]]] = {}
# Config groups selected by a plain `group=option` override; their compositions are memoised too.
_GROUP_OVERRIDE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*)*=[A-Za-z0-9_\-.]+")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z_][A-Za-z0-9_\-]*)*")


def tree_digest(config_dir: Path) -> str:
    """sha256 over the relative paths and bytes of every file under ``config_dir``.

    The tree may be a stranger's: before Hydra opens anything, every entry must be a folder or a
    bounded regular file, and every YAML file must pass the bounded loader (no alias bombs, no
    duplicate keys); otherwise InputError names the file.
    """
    digest = hashlib.sha256()
    for file in sorted(p for p in Path(config_dir).rglob("*") if not p.is_dir()):
        data = read_bytes(file, what="config file")
        # OmegaConf's own loader refuses duplicate keys; an anchor is what an alias bomb needs
        # and a tag (`!!python/...`) starts with `!`: only files with one of them pay for the
        # bounded parse (~5 ms per file). Other syntax errors are Hydra's loader's to report.
        if file.suffix in {".yaml", ".yml"} and (b"&" in data or b"!" in data):
            load_yaml(read_text(file, what="config file"), str(file))
        digest.update(file.relative_to(config_dir).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(data).digest())
    return digest.hexdigest()


def _export(node: Any, resolve: bool) -> Any:
    """What ``OmegaConf.to_container`` puts at a node's place in its parent (``get_node_value``)."""
    if resolve:
        node = node._dereference_node()
    if isinstance(node, _hydra().Container):
        return _hydra().BaseContainer._to_content(node, resolve=resolve, throw_on_missing=False)
    return node._value()


# ``${a.b}``, ``${..b}`` and ``${oc.select:a.b,default}``: a leaf that copies one other key.
_SINGLE_INTERPOLATION = re.compile(r"^\$\{(?:oc\.select:)?([A-Za-z0-9_.]+)(?:,[^}]*)?\}$")


def _absolute(path: str, target: str) -> str:
    """OmegaConf's relative keys: ``.x`` is a sibling of the leaf, each further dot one level up."""
    if not target.startswith("."):
        return target
    dots = len(target) - len(target.lstrip("."))
    parent = path.split(".")[:-1]
    base = parent[: len(parent) - (dots - 1)] if dots > 1 else parent
    return ".".join([*base, target[dots:]])


def _interpolation_paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    # An unresolved export shows every interpolation, container or leaf, as a string with `${`
    # (OmegaConf's own test in `get_value_kind`); everything else resolves to itself.
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _interpolation_paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _interpolation_paths(item, (*path, index))
    elif isinstance(value, str) and "${" in value:
        yield path


def _plain_missing(value: Any, prefix: str = "") -> Iterator[str]:
    """`_missing_paths` computed on the unresolved export (`???` marks a missing node)."""
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(item, str) and item == MISSING:
                yield path
            else:
                yield from _plain_missing(item, path)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if isinstance(item, str) and item == MISSING:
                yield f"{prefix}[{index}]"
            else:
                yield from _plain_missing(item, f"{prefix}[{index}]")


def _copy_plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _copy_plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy_plain(item) for item in value]
    return value


# Hydra's own command-line flags (hydra/_internal/utils.py get_args_parser); each takes one value,
# as `--flag=VALUE` or `--flag VALUE`.
_CONFIG_PATH_FLAGS = ("--config-path", "-cp")
_CONFIG_NAME_FLAGS = ("--config-name", "-cn")


@dataclass(frozen=True)
class HydraArgv:
    """A launcher argv split as Hydra's argument parser splits it: flags, then overrides."""

    config_path: str | None
    config_name: str | None
    overrides: tuple[str, ...]


def split_hydra_argv(fields: Sequence[str]) -> HydraArgv:
    """Take --config-path/-cp and --config-name/-cn out of the argv (the last one wins, as argparse)."""
    config_path: str | None = None
    config_name: str | None = None
    overrides: list[str] = []
    index = 0
    while index < len(fields):
        word = fields[index]
        flag, eq, value = word.partition("=")
        if flag in _CONFIG_PATH_FLAGS + _CONFIG_NAME_FLAGS:
            if not eq:
                index += 1
                value = fields[index] if index < len(fields) else ""
            if flag in _CONFIG_PATH_FLAGS:
                config_path = value
            else:
                config_name = value
        else:
            overrides.append(word)
        index += 1
    return HydraArgv(config_path, config_name, tuple(overrides))


def launcher_config_dir(config_dir: Path, config_path: str) -> Path:
    """The primary config folder a `--config-path` selects.

    Hydra resolves a relative path against the launcher module's package
    (hydra/_internal/utils.py compute_search_path_dir: `pkg://verl.trainer/<path>`), and the pinned
    tree's config folder is that package's `config/`; an absolute path is a folder on disk.
    """
    path = Path(config_path)
    return path if path.is_absolute() else (config_dir.parent / path).resolve()


class _FastPathUnavailable(Exception):
    """The overrides need Hydra's defaults machinery; compose with Hydra instead."""


class _OverrideRejected(Exception):
    """Hydra's own override application refused the value overrides (``__cause__``).

    Hydra's compose would raise the same exception: it applies the same overrides, with the same
    function, to the same composed config (``_load_configuration_impl``), and only an
    ``OverrideParseException`` is rewrapped on the way out, which parsing here would have raised
    first. So the rejection is taken as it is instead of composing again through Hydra (~1 s
    each; a release matrix meets hundreds of them).
    """


class Composer:
    """Composes override lists on one config tree; keeps Hydra initialised between calls.

    The override-free composition is memoised per process by the sha256 of the tree's files
    (hashed at this Composer's first use) and the config name. ``fast=False`` always runs
    Hydra's full compose (the reference the fast path is tested against).
    """

    def __init__(
        self,
        config_dir: Path,
        config_name: str,
        *,
        fast: bool = True,
        search_path: Sequence[Path] = (),
    ) -> None:
        self.config_dir = Path(config_dir)
        self.config_name = config_name
        self.fast = fast
        # Further config folders the config's own ``hydra.searchpath`` names (a ``pkg://``
        # package of verl: Hydra would import the package to find it, so the folder is given).
        self.search_path = tuple(Path(folder) for folder in search_path)
        self._digest: str | None = None
        self._siblings: dict[tuple[Path, str], Composer] = {}

    def _for_argv(self, fields: Sequence[str]) -> tuple[Composer, tuple[str, ...]]:
        """The composer of the config the argv's Hydra flags select, and the remaining overrides."""
        argv = split_hydra_argv(fields)
        config_dir = self.config_dir
        if argv.config_path is not None:
            config_dir = launcher_config_dir(self.config_dir, argv.config_path)
        name = argv.config_name if argv.config_name is not None else self.config_name
        if name.endswith(".yaml"):
            name = name[: -len(".yaml")]
        if name == self.config_name and config_dir in (self.config_dir, self.config_dir.resolve()):
            return self, argv.overrides
        key = (config_dir, name)
        if key not in self._siblings:
            self._siblings[key] = Composer(
                config_dir, name, fast=self.fast, search_path=self.search_path
            )
        return self._siblings[key], argv.overrides

    @contextlib.contextmanager
    def _hydra(self) -> Iterator[None]:
        # GlobalHydra is process-wide: another tree, or another user of Hydra in the same
        # pytest process, may have initialised it.
        self._tree_digest()  # no Hydra read of a tree whose files were not checked (InputError)
        _hydra().GlobalHydra.instance().clear()
        with (
            _hydra().initialize_config_dir(config_dir=str(self.config_dir), version_base=None),
            libyaml_config_loading(),
            warnings.catch_warnings(),
        ):
            # A search path the script names (hydra.searchpath=[pkg://a_plugin.config]) lives in
            # the user's environment, not here: Hydra's warning that it is not available is not
            # the user's news; a group it would have held is rejected by name all the same.
            warnings.filterwarnings(
                "ignore",
                message=r"provider=hydra\.searchpath .* is not available",
                category=UserWarning,
            )
            yield

    def _hydra_compose(self, fields: Sequence[str]) -> DictConfig:
        with self._hydra():
            composed: DictConfig = _hydra().compose(
                config_name=self.config_name, overrides=[*self._searching(), *fields]
            )
            return composed

    def check_tree(self) -> str:
        """The tree's digest, once every file was checked (``tree_digest``; InputError names the
        first file refused)."""
        return self._tree_digest()

    def _tree_digest(self) -> str:
        if self._digest is None:
            digest = tree_digest(self.config_dir)
            for folder in self.search_path:
                digest = hashlib.sha256(f"{digest}\0{tree_digest(folder)}".encode()).hexdigest()
            self._digest = digest
        return self._digest

    def _searching(self) -> list[str]:
        """The override that puts the search path in place of the one the config names."""
        if not self.search_path:
            return []
        folders = ",".join(f"file://{folder.resolve()}" for folder in self.search_path)
        return [f"hydra.searchpath=[{folders}]"]

    def _base(self, groups: tuple[str, ...] = ()) -> _Base:
        """The composition of the tree with only these config-group selections, memoised.

        Hydra picks the defaults (config groups) from the group overrides first and applies the
        value overrides, in order, to the merged config afterwards
        (hydra/_internal/config_loader_impl.py _load_configuration_impl), so a base composed
        with the group selections alone is where the value overrides start from.
        """
        key = (self._tree_digest(), self.config_name, groups)
        base = _BASES.get(key)
        if base is None:
            memo = StageMemo()
            memo_key = memo.key(BASE_KIND, list(key))
            base = _kept_base(memo.get(BASE_KIND, memo_key))
            if base is None:
                base = self._hydra_base(groups)
                if json_exact(base.plain):
                    memo.put(
                        BASE_KIND, memo_key, {"plain": base.plain, "groups": sorted(base.groups)}
                    )
            _BASES[key] = base
        return base

    def _hydra_base(self, groups: tuple[str, ...]) -> _Base:
        with self._hydra():
            cfg = _hydra().compose(
                config_name=self.config_name, overrides=[*self._searching(), *groups]
            )
            every_group = config_groups(config_repository())
        plain = _hydra().OmegaConf.to_container(cfg, resolve=False)
        assert isinstance(plain, dict)
        return _Base(cfg, cast(_Mapping, plain), every_group)

    def defaults(self, fields: Sequence[str] = ()) -> dict[str, Any]:
        """The tree with only the fields' config-group selections, resolved: every key's default
        value (the checks' types); empty when the selections are not plain ones."""
        try:
            groups, _ = self._split_groups(fields)
        except _FastPathUnavailable:
            return {}
        base = self._base(groups)
        if base.resolved is None:
            resolved = _hydra().OmegaConf.to_container(base.cfg, resolve=True)
            assert isinstance(resolved, dict)
            base.resolved = cast(dict[str, Any], resolved)
        return base.resolved

    def is_group(self, key: str) -> bool:
        """Whether ``key`` names a config group of the tree (``model_engine``): setting it
        selects the group's file, which Hydra's composition reads, not verl's code."""
        return "." not in key and self._base().group_exists(key)

    def interpolation_sources(self, fields: Sequence[str] = ()) -> dict[str, str]:
        """Each leaf of the override-free tree that is one interpolation (``${..strategy}``), and
        the absolute key it copies (``actor_rollout_ref.actor.strategy``); a key the tree derives
        from another is the other key's setting. With ``fields``, the tree their config name and
        group selections compose (``model_engine=megatron``'s reference copies the actor's
        Megatron flags, ref/megatron_ref.yaml:29-39; the plain tree has no such section)."""
        composer, overrides = self._for_argv(fields)
        try:
            groups, _ = composer._split_groups(overrides)
        except _FastPathUnavailable:
            groups = ()
        sources: dict[str, str] = {}
        for path, value in iter_leaves(composer._base(groups).plain):
            match = _SINGLE_INTERPOLATION.match(value) if isinstance(value, str) else None
            if match:
                sources[path] = _absolute(path, match.group(1))
        return sources

    def key_followers(self, fields: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """Each key of the composition of ``fields`` and the leaves that copy it by interpolation,
        directly or through another copy (``ref.megatron.param_offload`` follows the actor's):
        setting the key moves them too, but for a leaf the fields set themselves, whose own value
        stands (the memory forecast's fixes move them, as composing again would)."""
        explicit = {line.split("=", 1)[0].lstrip("+~") for line in fields}
        copies: dict[str, list[str]] = {}
        for leaf, source in sorted(self.interpolation_sources(fields).items()):
            if leaf not in explicit:
                copies.setdefault(source, []).append(leaf)
        followers: dict[str, tuple[str, ...]] = {}
        for key in sorted(copies):
            found: list[str] = []
            pending = list(copies[key])
            while pending:
                leaf = pending.pop(0)
                if leaf not in found and leaf != key:
                    found.append(leaf)
                    pending.extend(copies.get(leaf, ()))
            followers[key] = tuple(found)
        return followers

    def interpolated_leaves(self) -> frozenset[str]:
        """The leaves of the override-free tree whose value holds an interpolation (``${…}``):
        their resolved value follows other keys."""
        return frozenset(
            path
            for path, value in iter_leaves(self._base().plain)
            if isinstance(value, str) and "${" in value
        )

    def _split_groups(self, fields: Sequence[str]) -> tuple[tuple[str, ...], list[str]]:
        """(plain group selections, the other overrides), or the fast path is unavailable."""
        if not any("=" in line and "." not in line.split("=", 1)[0] for line in fields):
            return (), list(fields)
        base = self._base()
        groups: list[str] = []
        values: list[str] = []
        for line in fields:
            key = line.split("=", 1)[0]
            name = key.lstrip("+~")
            if "." not in key and not _GROUP_PATH.fullmatch(name):
                raise _FastPathUnavailable(line)  # Hydra decides what such a key names
            if "." not in key and base.group_exists(name):
                if not _GROUP_OVERRIDE.fullmatch(line):
                    raise _FastPathUnavailable(line)
                groups.append(line)
            else:
                values.append(line)
        return tuple(groups), values

    def config_files(self, fields: Sequence[str]) -> list[tuple[Path, str]]:
        """(YAML file, package) of every config of this tree the fields' composition merges, in
        Hydra's merge order (a later file's key replaces an earlier one's). Only the fields that
        may select a config group matter, so compositions of the same groups share one answer."""
        composer, overrides = self._for_argv(fields)
        if composer is not self:
            return composer.config_files(overrides)
        groups = tuple(line for line in overrides if "." not in line.split("=", 1)[0])
        key = (self._tree_digest(), self.config_name, groups)
        if key not in _CONFIG_FILES:
            memo = StageMemo()
            memo_key = memo.key(CONFIG_FILES_KIND, list(key))
            kept = memo.get(CONFIG_FILES_KIND, memo_key)
            listed: list[tuple[str, str]]
            if _pairs_of_strings(kept):
                listed = [(config_path, package) for config_path, package in kept]
            else:  # Hydra's defaults list: as costly as a compose
                with self._hydra():
                    listed = defaults_list(self.config_name, [*self._searching(), *groups])
                memo.put(CONFIG_FILES_KIND, memo_key, listed)
            files = []
            for config_path, package in listed:
                for folder in (self.config_dir, *self.search_path):
                    file = (folder / f"{config_path}.yaml").resolve()
                    if file.is_relative_to(folder.resolve()) and file.is_file():
                        files.append((file, package))
                        break
            _CONFIG_FILES[key] = files
        return _CONFIG_FILES[key]

    def config_mounts(self, fields: Sequence[str]) -> list[Mount]:
        """Every config of this tree the fields' composition merges, with the config whose
        defaults list mounts it and that entry's line (Hydra's defaults list, as costly as a
        compose: asked for only where a key of the launch has left the tree)."""
        composer, overrides = self._for_argv(fields)
        if composer is not self:
            return composer.config_mounts(overrides)
        groups = [line for line in overrides if "." not in line.split("=", 1)[0]]
        with self._hydra():
            listed = mounted_configs(self.config_name, [*self._searching(), *groups])
        return mounts_of(listed, (self.config_dir, *self.search_path))

    def generated_difference(self, generated: Path) -> str | None:
        """Where the override-free composition differs from upstream's generated reference
        (values, types, key order), or None. The reference is printed from a tree where the
        engine is already chosen, so the ``model_engine`` selector is not compared."""
        from pytest_verl_compat.pipeline.snapshot import first_difference

        reference = yaml.load(read_text(generated, what="generated reference"), Loader=_SAFE)
        composed = _hydra().OmegaConf.to_container(self.compose_config([]), resolve=False)
        assert isinstance(composed, dict)
        composed.pop("model_engine", None)
        return first_difference(composed, reference)

    def compose_config(self, fields: Sequence[str]) -> DictConfig:
        """The unresolved composed config (raises Hydra's own exceptions)."""
        composer, overrides = self._for_argv(fields)
        if composer is not self:
            return composer.compose_config(overrides)
        fields = overrides
        if self.fast and not fields:
            return copy.deepcopy(self._base().cfg)
        return self._hydra_compose(fields)

    def compose(self, fields: Sequence[str], variables: Mapping[str, str]) -> Composition:
        """Compose and resolve; Hydra and OmegaConf errors become a composition rejection, and
        so does a ``_target_`` the tree does not name (see ``targets.py``)."""
        composer, overrides = self._for_argv(fields)
        if composer is not self:
            if not composer.config_dir.is_dir():
                return Composition(
                    COMPOSITION_REJECTION,
                    reason=f"MissingConfigException: Primary config directory not found: {composer.config_dir}",
                )
            return composer.compose(overrides, variables)
        try:
            self._tree_digest()  # checks the tree's files before Hydra opens any of them
        except InputError as exc:
            return Composition(COMPOSITION_REJECTION, reason=str(exc))
        refused = next(filter(None, map(override_refusal, overrides)), None)
        if refused is not None:
            return Composition(COMPOSITION_REJECTION, reason=refused)
        composition = self._compose_values(overrides, variables)
        if composition.composed:
            foreign = target_rejection(composition.mapping, self.config_dir, *self.search_path)
            if foreign is not None:
                return Composition(COMPOSITION_REJECTION, reason=foreign)
        return composition

    def _compose_values(self, fields: Sequence[str], variables: Mapping[str, str]) -> Composition:
        if self.fast:
            try:
                return self._fast_compose(fields, variables)
            except _OverrideRejected as rejected:
                cause = rejected.__cause__
                assert cause is not None
                return Composition(
                    COMPOSITION_REJECTION, reason=_clean_message(cause, self.config_dir)
                )
            except Exception as exc:
                if not isinstance(exc, (_FastPathUnavailable, *_input_errors())):
                    raise
                # Hydra's own compose produces the result or the exact error message.
        return self._slow_compose(fields, variables)

    def _slow_compose(self, fields: Sequence[str], variables: Mapping[str, str]) -> Composition:
        try:
            cfg = self._hydra_compose(fields)
            with deterministic_resolvers(variables):
                resolved = _hydra().OmegaConf.to_container(
                    cfg, resolve=True, throw_on_missing=False
                )
        except _input_errors() as exc:
            return Composition(COMPOSITION_REJECTION, reason=_clean_message(exc, self.config_dir))
        assert isinstance(resolved, dict)
        return Composition(
            COMPOSED, resolved=cast(_Mapping, resolved), missing=tuple(_missing_paths(cfg))
        )

    def _resolution_rejection(
        self, cfg: DictConfig, variables: Mapping[str, str]
    ) -> Composition | None:
        try:
            with deterministic_resolvers(variables):
                _hydra().OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
        except (
            _hydra().HydraException,
            _hydra().OmegaConfBaseException,
            ValueError,
            KeyError,
        ) as exc:
            return Composition(COMPOSITION_REJECTION, reason=_clean_message(exc, self.config_dir))
        return None

    def _eligible(self, base: _Base, fields: Sequence[str]) -> list[Any]:
        overrides = []
        for line in fields:
            override = parse_override(line)
            key = override.key_or_group
            if (
                override.package is not None
                or override.is_sweep_override()
                or override.is_delete()
                or override.is_hydra_override()
                or key == "hydra"
                or not _KEY.fullmatch(key)
                or base.group_exists(key)
            ):
                raise _FastPathUnavailable(line)
            overrides.append(override)
        return overrides

    def _fast_compose(self, fields: Sequence[str], variables: Mapping[str, str]) -> Composition:
        groups, values = self._split_groups(fields)
        base = self._base(groups)
        overrides = self._eligible(base, values)
        cfg = base.cfg
        # Overrides are applied in place to the shared base: each key's existing node is swapped
        # for a private copy first (or its first missing component is noted), and the originals
        # are put back afterwards, so the base itself is never written to.
        swapped: list[tuple[DictConfig, Any, Any]] = []
        created: list[tuple[DictConfig, Any]] = []
        exports: list[tuple[tuple[Any, ...], DictConfig, Any]] = []
        try:
            for override in overrides:
                node: Any = cfg
                parts = override.key_or_group.split(".")
                for depth, part in enumerate(parts):
                    if not isinstance(node, _hydra().DictConfig) or (
                        node._is_none() or node._is_missing() or node._is_interpolation()
                    ):
                        raise _FastPathUnavailable(override.input_line)
                    content = node.__dict__["_content"]
                    if part not in content:
                        created.append((node, part))
                        exports.append((tuple(parts[:depth]), node, part))
                        break
                    if depth == len(parts) - 1:
                        original = content[part]
                        private = copy.deepcopy(original)
                        private._set_parent(node)
                        content[part] = private
                        swapped.append((node, part, original))
                        exports.append((tuple(parts[:depth]), node, part))
                    node = content[part]
            try:
                apply_value_overrides(overrides, cfg)
            except _hydra().ConfigCompositionException as exc:
                raise _OverrideRejected() from exc
            plain = _copy_plain(base.plain)
            for path, parent, part in exports:
                target = plain
                for step in path:
                    target = target[step]
                if not isinstance(target, dict):
                    raise _FastPathUnavailable(".".join(map(str, path)))
                target[part] = _export(parent._get_node(part), resolve=False)
            missing = tuple(_plain_missing(plain))
            try:
                with deterministic_resolvers(variables), grammar_parse_cache():
                    for path in list(_interpolation_paths(plain)):
                        parent_node: Any = cfg
                        target = plain
                        for step in path[:-1]:
                            parent_node = parent_node._get_child(step)
                            target = target[step]
                        child = parent_node._get_child(path[-1], throw_on_missing_value=False)
                        target[path[-1]] = _export(child, resolve=True)
            except (_hydra().OmegaConfBaseException, ValueError, KeyError) as exc:
                # The config is the one Hydra would return, so resolving it whole as the slow
                # path does raises Hydra's error, with its full key, without composing again.
                rejection = self._resolution_rejection(cfg, variables)
                if rejection is None:
                    raise _FastPathUnavailable(str(exc)) from exc
                return rejection
        finally:
            for parent, part in reversed(created):
                parent.__dict__["_content"].pop(part, None)
            for parent, part, original in reversed(swapped):
                parent.__dict__["_content"][part] = original
        return Composition(COMPOSED, resolved=plain, missing=missing)
