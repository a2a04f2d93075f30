"""Resolved configuration files as input: check one against the checked tree before compiling it.

verl writes a run's resolved configuration to ``.hydra/config.yaml``, and the overrides the run
was given to ``.hydra/overrides.yaml`` beside it; teams often have those and no launch script. A
file is first compared leaf by leaf with the composition of a tree with only the run's config-group
selections, so a file from another verl version is reported as such instead of being compiled as
the checked one. The keys a run set are its ``overrides.yaml``'s (read as data, never composed),
or, without that file, the leaves whose value differs from the tree's (``changed_fields``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_verl_compat.files.digests import sha256_file
from pytest_verl_compat.files.safe_input import InputError, load_yaml_file
from pytest_verl_compat.model import (
    COMPOSED,
    COMPOSITION_REJECTION,
    Bindings,
    Case,
    Composition,
    ExplicitFields,
    InputPin,
)
from pytest_verl_compat.pipeline.compose import Composer, iter_leaves
from pytest_verl_compat.pipeline.hydra_internals import override_literal
from pytest_verl_compat.pipeline.targets import target_rejection

# What Hydra writes into a run's output folder (``hydra.output_subdir``).
HYDRA_FOLDER = ".hydra"
CONFIG_FILE = "config.yaml"
OVERRIDES_FILE = "overrides.yaml"
# More overrides than any launch passes; a longer list is not a run's.
MAX_OVERRIDES = 10_000


class ResolvedFileError(Exception):
    """The file is not a readable YAML mapping."""


def resolved_path(given: Path) -> Path:
    """The resolved file of ``given``: itself, or a run folder's ``.hydra/config.yaml``."""
    if given.is_dir():
        inner = given / HYDRA_FOLDER / CONFIG_FILE
        if not inner.is_file():
            raise ResolvedFileError(f"{given}: a folder without {HYDRA_FOLDER}/{CONFIG_FILE}")
        return inner
    return given


def overrides_path(resolved: Path) -> Path | None:
    """Hydra's ``overrides.yaml`` beside a run's resolved ``config.yaml``, if there is one."""
    if resolved.name != CONFIG_FILE:
        return None
    beside = resolved.parent / OVERRIDES_FILE
    return beside if beside.is_file() else None


def load_overrides(path: Path) -> tuple[str, ...]:
    """The overrides a run was given, as Hydra recorded them: a list of ``KEY=VALUE`` strings,
    read bounded as data (nothing here composes them)."""
    try:
        data = load_yaml_file(path, what="overrides file")
    except InputError as exc:
        raise ResolvedFileError(str(exc)) from exc
    if data is None:
        return ()
    if not isinstance(data, list) or not all(isinstance(item, str) for item in data):
        raise ResolvedFileError(f"{path}: expected a list of override strings (KEY=VALUE)")
    if len(data) > MAX_OVERRIDES:
        raise ResolvedFileError(f"{path}: {len(data)} overrides, more than {MAX_OVERRIDES}")
    return tuple(data)


@dataclass(frozen=True)
class ResolvedRun:
    """A run's resolved configuration, and the overrides it was given when Hydra wrote them."""

    path: Path
    mapping: dict[str, Any]
    overrides: tuple[str, ...] | None = None
    overrides_file: Path | None = None


def load_run(path: Path) -> ResolvedRun:
    """The resolved file (or a run folder's) and its ``overrides.yaml`` when it has one."""
    path = resolved_path(path)
    mapping = load_resolved(path)
    beside = overrides_path(path)
    overrides = load_overrides(beside) if beside is not None else None
    return ResolvedRun(path, mapping, overrides, beside)


def _render(value: Any) -> str:
    """A value as an override writes it (``null``, ``true``, ``[a,b]``): message text only."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(_render(item) for item in value) + "]"
    return str(value)


def changed_fields(
    resolved: Mapping[str, Any], base: Mapping[str, Any], sources: Mapping[str, str]
) -> tuple[str, ...]:
    """``KEY=VALUE`` for each leaf whose value differs from the tree's (lists as values), in the
    file's order: the keys a run without ``overrides.yaml`` set. A leaf the tree copies from
    another by interpolation (``${..strategy}``) is that other key's setting when it holds the
    same value, so it is not listed again; a leaf the tree does not have is listed."""
    return _as_fields(_changed_leaves(resolved, base, sources))


def _as_fields(leaves: Sequence[tuple[str, str, Any]]) -> tuple[str, ...]:
    """``KEY=VALUE`` (``+KEY=VALUE`` for a leaf the tree lacks) of each changed leaf."""
    return tuple(f"{prefix}{path}={_render(value)}" for prefix, path, value in leaves)


def _changed_leaves(
    resolved: Mapping[str, Any], base: Mapping[str, Any], sources: Mapping[str, str]
) -> list[tuple[str, str, Any]]:
    """(``+`` or "", path, value) of each leaf ``changed_fields`` lists."""
    ours, theirs = _shape(resolved), _shape(base)
    changed = {
        path: value
        for path, value in ours.items()
        if path not in theirs or not _same_value(value, theirs[path])
    }
    out = []
    for path, value in changed.items():
        source = sources.get(path)
        if source is not None and source in changed and _same_value(changed[source], value):
            continue
        out.append(("" if path in theirs else "+", path, value))
    return out


def _same_value(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def load_resolved(path: Path) -> dict[str, Any]:
    try:
        data = load_yaml_file(path, what="resolved configuration")
    except InputError as exc:
        raise ResolvedFileError(str(exc)) from exc
    if not isinstance(data, dict):
        raise ResolvedFileError(
            f"{path}: expected a mapping at the top level, got {type(data).__name__}"
        )
    data.pop("hydra", None)  # Hydra's own node, present in some dumps
    return data


def _shape(mapping: Mapping[str, Any]) -> dict[str, Any]:
    # Lists are compared as values (their length is data), so list items are not separate keys.
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, Mapping) and node:
            for key, value in node.items():
                walk(value, f"{prefix}.{key}" if prefix else str(key))
        else:
            out[prefix] = node

    walk(mapping, "")
    return out


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    # verl's file fields take one path or a list of paths; both are the same kind of value.
    if isinstance(value, str | list):
        return "str-or-list"
    return type(value).__name__


@dataclass
class TreeMatch:
    """How a resolved file lines up with one config tree."""

    label: str
    extra: list[str] = field(default_factory=list)  # leaves the tree does not have
    missing: list[str] = field(default_factory=list)  # leaves the tree has that the file lacks
    wrong_type: list[str] = field(default_factory=list)  # "path: file <kind>, tree <kind>"

    @property
    def mismatches(self) -> int:
        return len(self.extra) + len(self.missing) + len(self.wrong_type)


def match_tree(resolved: Mapping[str, Any], base: Mapping[str, Any], label: str) -> TreeMatch:
    ours, theirs = _shape(resolved), _shape(base)
    # An empty mapping of the tree (rollout.engine_kwargs.sglang: {}) that the file fills with
    # keys (+…sglang.attention_backend=…) is there: its keys are the run's own, not a leaf lost.
    filled = {
        path
        for path, value in theirs.items()
        if value == {} and path not in ours and any(p.startswith(f"{path}.") for p in ours)
    }
    match = TreeMatch(
        label, sorted(set(ours) - set(theirs)), sorted(set(theirs) - set(ours) - filled)
    )
    for path in sorted(set(ours) & set(theirs)):
        a, b = _kind(ours[path]), _kind(theirs[path])
        # null defaults accept any value, and a value may be set back to null.
        if a != b and "null" not in (a, b):
            match.wrong_type.append(f"{path}: file {a}, tree {b}")
    return match


def unresolved_values(resolved: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """Paths still holding ``???`` (mandatory, unset), and paths with an unresolved ``${...}``."""
    missing, interpolations = [], []
    for path, value in iter_leaves(resolved):
        if value == "???":
            missing.append(f"{path}: ???")
        elif isinstance(value, str) and "${" in value:
            interpolations.append(f"{path}: {value}")
    return missing, interpolations


@dataclass
class ResolvedCheck:
    """The file against the pinned tree, and the best-matching other tree if any."""

    pinned: TreeMatch
    others: list[TreeMatch]
    missing: list[str]  # ??? values: reported; a composed case may have them too
    unresolved: list[str]  # ${...} left in the file: it was not resolved, so it cannot be compiled

    @property
    def best(self) -> TreeMatch:
        return min(
            [self.pinned, *self.others], key=lambda m: (m.mismatches, m.label != self.pinned.label)
        )

    @property
    def from_pinned_tree(self) -> bool:
        return self.pinned.mismatches == 0

    @property
    def same_leaves(self) -> bool:
        """The pinned tree's leaves, no more, no fewer: a value of another type than the tree's
        default is then the type check's finding (``types.wrong-type``), as a launch's is."""
        return not self.pinned.extra and not self.pinned.missing

    def lines(self, limit: int = 12) -> list[str]:
        out = []
        for title, items in (
            ("leaves the pinned tree does not have", self.pinned.extra),
            ("leaves of the pinned tree missing from the file", self.pinned.missing),
            ("values of the wrong type", self.pinned.wrong_type),
            ("unresolved interpolations", self.unresolved),
            ("mandatory values never set (???)", self.missing),
        ):
            if items:
                out.append(f"{title} ({len(items)}):")
                out.extend(f"  {item}" for item in items[:limit])
                if len(items) > limit:
                    out.append(f"  ... and {len(items) - limit} more")
        if not self.from_pinned_tree and self.best.label != self.pinned.label:
            out.append(
                f"this file most likely comes from {self.best.label} "
                f"({self.best.mismatches} mismatches there, {self.pinned.mismatches} against {self.pinned.label})"
            )
        return out


def check_resolved(
    resolved: Mapping[str, Any],
    pinned: Composer,
    pinned_label: str,
    others: Sequence[tuple[str, Composer]] = (),
    groups: Sequence[str] = (),
) -> ResolvedCheck:
    """Compare with the composition of the pinned tree and of each other tree with only the
    run's config-group selections (``groups``: ``model_engine=megatron``; none: the defaults)."""

    def base(composer: Composer) -> dict[str, Any]:
        composition = composer.compose(groups, {})
        if composition.resolved is None:
            raise ResolvedFileError(
                f"the run's group selections do not compose: {composition.reason}"
            )
        return composition.resolved

    return ResolvedCheck(
        pinned=match_tree(resolved, base(pinned), pinned_label),
        others=[match_tree(resolved, base(composer), label) for label, composer in others],
        missing=unresolved_values(resolved)[0],
        unresolved=unresolved_values(resolved)[1],
    )


def resolved_composition(
    run: ResolvedRun, composer: Composer, label: str, launch: ExplicitFields
) -> tuple[ExplicitFields, Composition]:
    """A resolved file as a composition, by the rules a launch's composition keeps: a
    ``_target_`` the tree does not name is refused as composing it would be (``targets.py``);
    then the file must match the tree (``check_resolved``) and hold no ``${…}``. The fields are
    the run's overrides, or the leaves it changed; the launch's entry module and world kept."""
    foreign = target_rejection(run.mapping, composer.config_dir, *composer.search_path)
    if foreign is not None:
        fields = dataclasses.replace(launch, fields=run.overrides or ())
        return fields, Composition(COMPOSITION_REJECTION, reason=foreign)
    overrides = run.overrides or ()
    groups = [
        line
        for line in overrides
        if "=" in line and composer.is_group(line.split("=", 1)[0].lstrip("+~"))
    ]
    try:
        check = check_resolved(run.mapping, composer, label, groups=groups)
    except ResolvedFileError as exc:
        fields = dataclasses.replace(launch, fields=overrides)
        return fields, Composition(COMPOSITION_REJECTION, reason=str(exc))
    # Leaves the run added (``+KEY=``) or deleted (``~KEY``) are its own, as in a composition.
    check.pinned.extra = _not_under(check.pinned.extra, overrides, "+")
    check.pinned.missing = _not_under(check.pinned.missing, overrides, "~")
    if run.overrides is not None:
        explicit = run.overrides
    else:
        explicit = _derived_fields(run.mapping, composer, groups)
    fields = dataclasses.replace(launch, fields=explicit)
    if not check.same_leaves or check.unresolved:
        reason = "; ".join(check.lines(limit=5))
        return fields, Composition(COMPOSITION_REJECTION, reason=reason)
    return fields, Composition(COMPOSED, resolved=run.mapping)


def _not_under(paths: list[str], overrides: Sequence[str], prefix: str) -> list[str]:
    keys = [line.split("=", 1)[0].lstrip("+~") for line in overrides if line.startswith(prefix)]
    return [p for p in paths if not any(p == k or p.startswith(k + ".") for k in keys)]


def _derived_fields(
    mapping: Mapping[str, Any], composer: Composer, groups: Sequence[str]
) -> tuple[str, ...]:
    """The keys a run without ``overrides.yaml`` set: the leaves it changed, less those the tree
    derives by an interpolation from the others (``trainer.default_local_dir`` from the
    experiment's name), found by composing the others and seeing the same value there."""
    base = composer.compose(groups, {}).mapping
    leaves = _changed_leaves(mapping, base, composer.interpolation_sources())
    changed = _as_fields(leaves)
    derived = composer.interpolated_leaves()
    if not any(path in derived for _, path, _ in leaves):
        return changed
    try:
        # the others written as Hydra reads them back (a name with a comma, a string "1e-4"),
        # not as the message text renders them
        plain = [
            f"{prefix}{path}={override_literal(value)}"
            for prefix, path, value in leaves
            if path not in derived
        ]
    except ValueError:
        return changed
    composed = composer.compose([*groups, *plain], {})
    if not composed.composed:
        return changed  # values Hydra's grammar does not take back: every changed leaf is kept
    theirs, ours = _shape(composed.mapping), _shape(mapping)
    return tuple(
        text
        for text, (_, key, _) in zip(changed, leaves, strict=True)
        if key not in derived or key not in theirs or not _same_value(ours.get(key), theirs[key])
    )


def resolved_case(given: Path, bindings: Bindings) -> Case:
    """A one-off case for a run's resolved file (or its run folder), pinning it and Hydra's
    ``overrides.yaml`` beside it by sha256. Raises ResolvedFileError."""
    path = resolved_path(given).resolve()
    run = load_run(path)
    pinned = [path] + ([run.overrides_file.resolve()] if run.overrides_file else [])
    return Case(
        id=f"{path.stem}@{path}",
        kind="resolved",
        line=0,
        resolved=str(path),
        inputs=tuple(InputPin(str(file), sha256_file(file)) for file in pinned),
        bindings=bindings,
    )
