"""The installed release's entry points as our own process knows them: ``entry_points.scan``,
kept in the user cache between runs, and which modules a launch may run.

Apart from ``entry_points`` because the oracle's process runs that module (its answers' keys
digest it) and reads nothing of the user's cache: it scans anew.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_verl_compat.files.digests import files_sha256
from pytest_verl_compat.pipeline.entry_points import EntryPoint, by_module, scan
from pytest_verl_compat.pipeline.memo import StageMemo

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


def launch_acceptor(site: Path | None) -> Callable[[str], bool] | None:
    """Which modules a script's launch may run, for the reader (``read_launch``'s
    ``entry_modules``): an entry point of the installed release, or a module the release does
    not have at all (a renamed or removed entry point, an older release's recipe), which the
    session then names as missing. A module the release has that is no entry point (a model
    merger run after training) is another command, not the launch. Without an installed verl,
    None: the reader's default (the pinned entry point alone)."""
    if site is None:
        return None
    entries = by_module(installed(site))

    def accepts(module: str) -> bool:
        if module in entries:
            return True
        path = site / module.replace(".", "/")
        return not (path.with_suffix(".py").is_file() or (path / "__init__.py").is_file())

    return accepts
