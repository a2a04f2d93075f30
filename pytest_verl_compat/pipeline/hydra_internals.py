"""Every use of Hydra's and OmegaConf's internals, in one place, each scoped and restored.

The fast compose path reuses Hydra's own override machinery (so assignment, ``+``, ``++`` and
Hydra's checks stay Hydra's code) and resolves under resolvers that never read the machine. The
private entry points it needs are named here, once, so a Hydra or OmegaConf upgrade breaks one
module; every patch is a context manager that puts the original back.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omegaconf import DictConfig

_PARSED: dict[str, Any] = {}
_PARSE_TREES: dict[tuple[Any, ...], Any] = {}


@contextlib.contextmanager
def deterministic_resolvers(variables: Mapping[str, str]) -> Iterator[None]:
    """Shadow the resolvers that read the machine (``oc.env``, Hydra's ``now``) while resolving.

    ``oc.env`` answers from the manifest's bindings only, so a resolved mapping never depends on
    the machine; ``now`` is refused because it reads the clock. OmegaConf has no public way to
    save and restore a resolver, so the registry itself is saved and put back.
    """
    from omegaconf import OmegaConf
    from omegaconf.basecontainer import BaseContainer

    saved = dict(BaseContainer._resolvers)

    def env(key: str, default: Any = "__unset__") -> Any:
        if key in variables:
            return variables[key]
        if default != "__unset__":
            return default
        raise KeyError(f"environment variable {key!r} is not bound in the manifest")

    def now(*_: Any) -> Any:
        raise ValueError("the `now` resolver reads the clock; bind a literal value instead")

    OmegaConf.register_new_resolver("oc.env", env, replace=True)
    OmegaConf.register_new_resolver("now", now, replace=True)
    try:
        yield
    finally:
        BaseContainer._resolvers.clear()
        BaseContainer._resolvers.update(saved)


def parse_override(line: str) -> Any:
    # Hydra's ANTLR parser costs about a millisecond per override; an Override is never mutated
    # by `_apply_overrides_to_config`, so the parse of a string is kept.
    parsed = _PARSED.get(line)
    if parsed is None:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parsed = OverridesParser.create().parse_override(line)
        if len(_PARSED) < 100_000:
            _PARSED[line] = parsed
    return parsed


def override_literal(value: Any) -> str:
    """``value`` as a Hydra override writes it, so that Hydra's grammar reads back exactly
    ``value``: strings quoted by Hydra's own ``QuotedString`` (a backslash is escaped only where it
    precedes a quote, as the grammar reads it), mapping keys escaped by Hydra's own escaper.
    ValueError for what no override holds: a string Hydra would resolve as an interpolation
    (``${``), a key or value of another type."""
    from hydra._internal.grammar.utils import escape_special_characters
    from hydra.core.override_parser.types import Quote, QuotedString

    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)  # the grammar reads inf, -inf and nan as floats too
    if isinstance(value, str):
        if "${" in value:
            raise ValueError(f"{value!r} would be read as an interpolation")
        return QuotedString(text=value, quote=Quote.single).with_quotes()
    if isinstance(value, list | tuple):
        return "[" + ",".join(override_literal(item) for item in value) + "]"
    if isinstance(value, Mapping):
        if not all(isinstance(key, str) for key in value):
            raise ValueError(f"{value!r}: an override's mapping keys are strings")
        pairs = (f"{escape_special_characters(k)}:{override_literal(v)}" for k, v in value.items())
        return "{" + ",".join(pairs) + "}"
    raise ValueError(f"{value!r} has no override form")


def _cached_grammar_parse(value: str, *args: Any, **kwargs: Any) -> Any:
    key = (value, args, tuple(sorted(kwargs.items())))
    tree = _PARSE_TREES.get(key)
    if tree is None:
        from omegaconf import grammar_parser

        tree = grammar_parser.parse(value, *args, **kwargs)
        if len(_PARSE_TREES) < 100_000:
            _PARSE_TREES[key] = tree
    return tree


@contextlib.contextmanager
def grammar_parse_cache() -> Iterator[None]:
    """Let OmegaConf reuse the parse tree of an interpolation string it has parsed before.

    The parse tree is a pure function of the string and OmegaConf's visitor only reads it; the
    same ~80 interpolation strings of verl's tree are otherwise parsed again for every case.
    """
    import omegaconf.base

    saved = omegaconf.base.parse  # type: ignore[attr-defined]
    omegaconf.base.parse = _cached_grammar_parse  # type: ignore[attr-defined]
    try:
        yield
    finally:
        omegaconf.base.parse = saved  # type: ignore[attr-defined]


@functools.cache
def _libyaml_omegaconf_loader() -> Any:
    """OmegaConf's own YAML loader (its duplicate-key check, its float and no-timestamp
    resolvers) over libyaml's parser and composer, as PyYAML's CSafeLoader is SafeLoader over
    them; None when PyYAML was built without libyaml."""
    from omegaconf import _utils

    try:
        # Not ``yaml.CParser``: PyYAML re-exports only cyaml's ``__all__`` (the C loaders and
        # dumpers), so that name is never set and libyaml went unused while this read it.
        from yaml.cyaml import CParser as parser
    except ImportError:  # PyYAML built without libyaml
        return None
    from yaml.constructor import SafeConstructor
    from yaml.resolver import Resolver

    pure = _utils.get_yaml_loader()

    class OmegaConfLibyamlLoader(parser, pure):  # type: ignore[misc,valid-type]
        def __init__(self, stream: Any) -> None:
            parser.__init__(self, stream)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

    return OmegaConfLibyamlLoader


@contextlib.contextmanager
def libyaml_config_loading() -> Iterator[None]:
    """Let OmegaConf read config files with libyaml: the same documents (a test loads every file
    of the pinned trees both ways), ~8x faster; Hydra reads the ~100 files of verl's tree on
    every composition of an override-free base."""
    from omegaconf import _utils

    loader = _libyaml_omegaconf_loader()
    if loader is None:
        yield
        return
    saved = _utils.get_yaml_loader
    _utils.get_yaml_loader = lambda: loader
    try:
        yield
    finally:
        _utils.get_yaml_loader = saved


def apply_value_overrides(overrides: Sequence[Any], cfg: DictConfig) -> None:
    """Hydra 1.3.2's own application of value overrides to a composed config (private API).

    ``hydra._internal.config_loader_impl.ConfigLoaderImpl._apply_overrides_to_config`` is the
    function Hydra's ``_load_configuration_impl`` calls after composing the defaults tree.
    """
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    ConfigLoaderImpl._apply_overrides_to_config(list(overrides), cfg)


def config_repository() -> Any:
    """The initialised Hydra's config repository, to ask whether a key names a config group."""
    from hydra.core.global_hydra import GlobalHydra

    hydra = GlobalHydra.instance().hydra
    assert hydra is not None
    return hydra.config_loader.repository  # type: ignore[attr-defined]


def config_groups(repository: Any) -> frozenset[str]:
    """Every config group the repository holds, nested ones by their path (``hydra/env``): what
    its ``group_exists`` answers true for, as ``get_group_options`` lists them."""
    from hydra.core.object_type import ObjectType

    found: set[str] = set()
    pending = [""]
    while pending:
        parent = pending.pop()
        for name in repository.get_group_options(parent, results_filter=ObjectType.GROUP):
            path = f"{parent}/{name}" if parent else name
            if path not in found:
                found.add(path)
                pending.append(path)
    return frozenset(found)


def defaults_list(config_name: str, overrides: Sequence[str]) -> list[tuple[str, str]]:
    """(config path, package) of every config the initialised Hydra merges, in merge order.

    Hydra's ``ConfigLoaderImpl.compute_defaults_list`` (what ``--info defaults`` prints): a later
    entry's keys replace an earlier one's, so the last file that defines a key is where its
    default is written. Hydra's own ``hydra/*`` configs are left out.
    """
    return [(path, package) for path, package, _ in mounted_configs(config_name, overrides)]


def mounted_configs(config_name: str, overrides: Sequence[str]) -> list[tuple[str, str, str]]:
    """(config path, package, parent) of every config the initialised Hydra merges, in merge
    order: ``defaults_list`` with the config whose defaults list mounts each one (Hydra's
    ``ResultDefault.parent``; ``critic/dp_critic`` mounts ``critic/../engine/fsdp``)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    hydra = GlobalHydra.instance().hydra
    assert hydra is not None
    loader = hydra.config_loader
    result = loader.compute_defaults_list(config_name, list(overrides), RunMode.RUN)
    return [
        (default.config_path, default.package or "", default.parent or "")
        for default in result.defaults
        if default.config_path is not None and not (default.package or "").split(".")[0] == "hydra"
    ]
