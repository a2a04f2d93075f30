"""Resolved configuration files as input: check one against the pinned tree before compiling it.

verl writes a run's resolved configuration to ``.hydra/config.yaml``; teams often have that and no
launch script. A file is first compared leaf by leaf with the override-free composition of a tree,
so a file from another verl version is reported as such instead of being compiled as 0.9.0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_verl_compat.files.safe_input import InputError, load_yaml_file
from pytest_verl_compat.pipeline.compose import Composer, iter_leaves


class ResolvedFileError(Exception):
    """The file is not a readable YAML mapping."""


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
    match = TreeMatch(label, sorted(set(ours) - set(theirs)), sorted(set(theirs) - set(ours)))
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
) -> ResolvedCheck:
    """Compare with the override-free composition of the pinned tree and of each other tree."""

    def base(composer: Composer) -> dict[str, Any]:
        composition = composer.compose([], {})
        assert composition.resolved is not None
        return composition.resolved

    return ResolvedCheck(
        pinned=match_tree(resolved, base(pinned), pinned_label),
        others=[match_tree(resolved, base(composer), label) for label, composer in others],
        missing=unresolved_values(resolved)[0],
        unresolved=unresolved_values(resolved)[1],
    )
