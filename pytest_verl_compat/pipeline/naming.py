"""Where a value only names something (``data/naming.yaml``): there a run-time value is carried.

A value that names a run, a project, a file, a folder or a rendezvous port changes no verdict of
``check``: the checker stands in for files and never starts a rendezvous. The registry says, per
key (or leaf pattern, or launcher option), what the value names and where verl reads it; a key
with ``unless`` stops only naming when the argv sets another key to the listed value, and an
exception of a leaf pattern names what the value decides there. :func:`may_carry` is the launch
reader's ``carry``; :func:`what_it_names` is the words of ``check``'s info finding.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

NAMING_FILE = "data/naming.yaml"
RUNTIME_PREFIX = "RUNTIME_"


@dataclass(frozen=True)
class NamingKey:
    """One entry: what its value names, where verl reads it, and the values elsewhere in the
    argv (``unless``) that make it decide something, with the reads that do and why."""

    key: str
    names: str
    reads: tuple[str, ...] = ()
    unless: Mapping[str, str] = field(default_factory=dict)
    deciding_reads: tuple[str, ...] = ()
    because: str = ""


@dataclass(frozen=True)
class LeafPattern:
    """Leaves named like files and folders, with the keys among them that decide something."""

    pattern: re.Pattern[str]
    names: str
    decides: Mapping[str, str] = field(default_factory=dict)
    known_after: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Naming:
    keys: Mapping[str, NamingKey]
    leaves: tuple[LeafPattern, ...]
    launcher: Mapping[str, NamingKey]


def _entry(key: str, raw: Mapping[str, Any]) -> NamingKey:
    unless = raw.get("unless") or {}
    return NamingKey(
        key,
        str(raw["names"]),
        tuple(str(place) for place in raw.get("reads") or ()),
        {str(k): str(v) for k, v in (unless.get("when") or {}).items()},
        tuple(str(place) for place in unless.get("reads") or ()),
        " ".join(str(unless.get("because", "")).split()),
    )


@functools.cache
def naming() -> Naming:
    """The registry, read once."""
    text = resources.files("pytest_verl_compat").joinpath(NAMING_FILE).read_text()
    raw = yaml.safe_load(text)
    leaves = []
    for leaf in raw.get("leaves") or ():
        exceptions = leaf.get("except") or {}
        leaves.append(
            LeafPattern(
                re.compile(leaf["pattern"]),
                str(leaf["names"]),
                {k: str(v["decides"]) for k, v in exceptions.items() if "decides" in v},
                {k: str(v["known_after"]) for k, v in exceptions.items() if "known_after" in v},
            )
        )
    return Naming(
        {key: _entry(key, entry) for key, entry in (raw.get("keys") or {}).items()},
        tuple(leaves),
        {key: _entry(key, entry) for key, entry in (raw.get("launcher") or {}).items()},
    )


def _sets(argv: Sequence[str], key: str, value: str) -> bool:
    """Whether the argv sets ``key`` to ``value`` (with any of Hydra's prefixes)."""
    return any(
        word.lstrip("+~").partition("=")[::2] == (key, value) for word in argv if "=" in word
    )


def decides(key: str, value: str = "", argv: Sequence[str] = ()) -> str | None:
    """None when a run-time value in ``key`` (an override's key or ``torchrun --NAME``) only
    names something; else why it decides (empty when the registry does not list the key)."""
    registry = naming()
    entry = registry.keys.get(key) or registry.launcher.get(key)
    if entry is not None:
        for other, wanted in entry.unless.items():
            if _sets(argv, other, wanted):
                return f"with {other}={wanted}, {entry.because}"
        return None
    for leaf in registry.leaves:
        if not leaf.pattern.search(key.rpartition(".")[2]):
            continue
        if key in leaf.decides:
            return leaf.decides[key]
        marker = leaf.known_after.get(key)
        if marker is not None and (
            marker not in value or RUNTIME_PREFIX in value.rpartition(marker)[2]
        ):
            return f"verl reads the number after {marker!r} in it"
        return None
    return ""


def what_it_names(key: str) -> str:
    """What ``key``'s value names, whatever the rest of the argv (for a key carried already)."""
    registry = naming()
    entry = registry.keys.get(key) or registry.launcher.get(key)
    if entry is not None:
        return entry.names
    leaf = next(
        (leaf for leaf in registry.leaves if leaf.pattern.search(key.rpartition(".")[2])), None
    )
    return leaf.names if leaf is not None else "something"


def may_carry(key: str, value: str, argv: tuple[str, ...]) -> str | None:
    """The launch reader's ``carry``: None where a run-time value may stay unknown (it only
    names something), else why it decides (see :func:`decides`)."""
    return decides(key, value, argv)
