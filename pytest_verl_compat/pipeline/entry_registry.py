"""The installed release's entry points as our own process knows them: ``entry_points.scan``,
kept in the user cache between runs, and which modules a launch may run.

A supported release ships both as data (``data/releases/VERSION/entry_points.json``, derived from
its pinned files by ``verl-compat release derive VERSION --only entry-points``): reading a launch
then needs neither the release's files nor their ~0.6 s fetch on a machine's first run.

Apart from ``entry_points`` because the oracle's process runs that module (its answers' keys
digest it) and reads nothing of the user's cache: it scans anew.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_verl_compat.files.digests import files_sha256
from pytest_verl_compat.pipeline.entry_points import EntryPoint, scan
from pytest_verl_compat.pipeline.memo import StageMemo
from pytest_verl_compat.releases.index import RELEASE_DATA

# The user cache's kind for ``installed``.
_KEPT_KIND = "entry-points"


@functools.lru_cache(maxsize=4)
def installed(site: Path) -> tuple[EntryPoint, ...]:
    """``scan(site)``, kept in the user cache (``StageMemo``) by the content of every file under
    ``site/verl`` it may read (the modules, and the configs their search paths come from) and
    our code: ~0.5 s of every process that reads a launch script, the same for a release."""
    memo = StageMemo()
    files = files_sha256(
        (
            (path.relative_to(site).as_posix(), path)
            for path in sorted((site / "verl").rglob("*"))
            if path.suffix in (".py", ".yaml") and path.is_file()
        ),
        "verl file",
    )
    key = memo.key(_KEPT_KIND, files)
    kept = memo.get(_KEPT_KIND, key)
    if kept is not None:
        try:
            return tuple(_from_json(entry) for entry in kept)
        except (KeyError, TypeError, ValueError):
            pass  # not what this code writes: scan anew, and keep that instead
    found = scan(site)
    memo.put(_KEPT_KIND, key, [_as_json(entry) for entry in found])
    return found


def _as_json(entry: EntryPoint) -> dict[str, Any]:
    plain = dataclasses.asdict(entry)
    plain["calls"] = sorted(entry.calls)
    return plain


def _from_json(raw: dict[str, Any]) -> EntryPoint:
    return EntryPoint(
        **{
            **raw,
            "search_path": tuple(raw["search_path"]),
            "forced": tuple(tuple(item) for item in raw["forced"]),
            "calls": frozenset(raw["calls"]),
        }
    )


# A release's shipped entry points and module names (``ReleaseModules.to_json``), in its folder.
SHIPPED_FILE = "entry_points.json"


def shipped_path(version: str) -> Path:
    return RELEASE_DATA / version / SHIPPED_FILE


@dataclass(frozen=True)
class ReleaseModules:
    """A release's entry points and the dotted names of every module of its ``verl`` package."""

    entries: tuple[EntryPoint, ...]
    modules: frozenset[str]

    @classmethod
    def from_site(cls, site: Path) -> ReleaseModules:
        """Read from the release's files (``site``: the parent of its ``verl`` package)."""
        names = set()
        for path in (site / "verl").rglob("*.py"):
            parts = path.relative_to(site).with_suffix("").parts
            names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
        return cls(installed(site), frozenset(names))

    def to_json(self) -> dict[str, Any]:
        return {
            "entry_points": [_as_json(entry) for entry in self.entries],
            "modules": sorted(self.modules),
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ReleaseModules:
        entries = tuple(_from_json(entry) for entry in raw["entry_points"])
        return cls(entries, frozenset(str(name) for name in raw["modules"]))

    def accepts(self, module: str) -> bool:
        """Whether a script's launch may run ``module`` (``read_launch``'s ``entry_modules``):
        an entry point of the release, or a module the release does not have at all (a renamed
        or removed entry point, an older release's recipe), which the session then names as
        missing. A module the release has that is no entry point (a model merger run after
        training) is another command, not the launch."""
        return any(entry.module == module for entry in self.entries) or module not in self.modules


@functools.cache
def shipped(version: str) -> ReleaseModules | None:
    """The release's shipped entry points and modules; None when it ships none (a release being
    added: its files are read instead)."""
    path = shipped_path(version)
    if not path.is_file():
        return None
    return ReleaseModules.from_json(json.loads(path.read_text(encoding="utf-8")))


def release_modules(version: str, files: Callable[[], Path | None]) -> ReleaseModules | None:
    """A release's entry points and module names: shipped with a supported release, else read
    from its files (``files()``, fetched only then) when they can be had; None otherwise (the
    reader's default)."""
    found = shipped(version)
    if found is not None:
        return found
    site = files()
    return ReleaseModules.from_site(site) if site is not None else None
