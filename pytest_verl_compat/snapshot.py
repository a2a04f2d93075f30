"""Snapshot stage: one golden JSON file per case, compared by syrupy, diffs by dotted path."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from syrupy.data import SnapshotCollection, SnapshotCollections
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode
from syrupy.location import PyTestLocation

# A diff longer than this stalls CI logs and helps nobody; the file diff has the rest.
MAX_DIFF_LINES = 40


def dumps(data: Any) -> str:
    """Byte-deterministic JSON: sorted keys, fixed indentation, trailing newline."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_atomic(path: Path, text: str) -> None:
    """Write through a temporary file in the same folder, then rename: never half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _dotted(path: list[Any]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def leaf_diff(old: Any, new: Any, limit: int = MAX_DIFF_LINES) -> list[str]:
    """Changed leaves as ``+ path: new``, ``- path: old``, ``~ path: old -> new``, capped."""
    # deepdiff imports pandas when it is installed (half a second); only a mismatch needs it.
    from deepdiff import DeepDiff

    diff = DeepDiff(old, new, view="tree", ignore_order=False, verbose_level=2)
    lines: list[str] = []
    for kind in sorted(diff.keys()):
        for level in diff[kind]:
            path = _dotted(level.path(output_format="list"))
            if kind.endswith("_added"):
                lines.append(f"+ {path}: {_short(level.t2)}")
            elif kind.endswith("_removed"):
                lines.append(f"- {path}: {_short(level.t1)}")
            else:
                lines.append(f"~ {path}: {_short(level.t1)} -> {_short(level.t2)}")
    lines.sort(key=lambda line: (line[2:].split(":", 1)[0], line[0]))
    if len(lines) > limit:
        lines = [*lines[:limit], f"... and {len(lines) - limit} more changed leaves"]
    return lines


class GoldenExtension(SingleFileSnapshotExtension):
    """One ``<golden>/<stage>/<case id>.json`` per case; the test's parameter id names the file.

    Syrupy's discovery of unused snapshots is switched off: it keys files by test-file
    location, which these shared golden folders are not, and it would delete the snapshots
    of skipped or deselected cases on ``--snapshot-update``. Orphaned golden files are
    reported by the plugin's own check instead.
    """

    golden_dir: Path = Path("golden")
    stage: str = "compose"
    file_extension = "json"
    _write_mode = WriteMode.TEXT

    @classmethod
    def _case_id(cls, test_location: PyTestLocation) -> str:
        # syrupy also asks about items that never asserted (skipped, or not parametrized).
        callspec = getattr(test_location.item, "callspec", None)
        return callspec.id if callspec is not None else test_location.testname

    @classmethod
    def case_path(cls, case_id: str) -> Path:
        return cls.golden_dir / cls.stage / f"{case_id}.json"

    @classmethod
    def dirname(cls, *, test_location: PyTestLocation) -> str:
        return str(cls.case_path(cls._case_id(test_location)).parent)

    @classmethod
    def discovery_dirname(cls, *, test_location: PyTestLocation) -> str:
        return cls.dirname(test_location=test_location)

    @classmethod
    def get_location(cls, *, test_location: PyTestLocation, index: Any = 0) -> str:
        return str(cls.case_path(cls._case_id(test_location)))

    @classmethod
    def get_snapshot_name(cls, *, test_location: PyTestLocation, index: Any = 0) -> str:
        # The name syrupy relates to the test; the file itself is named by case id.
        return test_location.snapshot_name

    @classmethod
    def matches_test_location(
        cls, *, test_location: PyTestLocation, snapshot_location: str
    ) -> bool:
        return Path(snapshot_location) == cls.case_path(cls._case_id(test_location))

    def discover_snapshots(
        self, *, test_location: PyTestLocation, ignore_extensions: Any = None
    ) -> SnapshotCollections:
        return SnapshotCollections()

    def serialize(self, data: Any, **_: Any) -> str:
        return dumps(data)

    @classmethod
    def write_snapshot_collection(
        cls, *, snapshot_collection: SnapshotCollection, name_order: Any = None
    ) -> None:
        data = next(iter(snapshot_collection)).data
        write_atomic(Path(snapshot_collection.location), data)

    def diff_lines(self, serialized_data: Any, snapshot_data: Any) -> Iterator[str]:
        try:
            old, new = json.loads(str(snapshot_data)), json.loads(str(serialized_data))
        except json.JSONDecodeError:
            yield from super().diff_lines(serialized_data, snapshot_data)
            return
        yield "golden differs at these leaves (- golden, + now):"
        yield from leaf_diff(old, new)
        yield "run pytest --verl-corpus --snapshot-update to accept the change"


def golden_extension(golden_dir: Path, stage: str) -> type[GoldenExtension]:
    """A GoldenExtension bound to one golden folder and stage (syrupy takes classes, not instances)."""
    return type(
        f"Golden_{stage}", (GoldenExtension,), {"golden_dir": Path(golden_dir), "stage": stage}
    )


def read_golden(golden_dir: Path, stage: str, case_id: str) -> dict[str, Any] | None:
    path = golden_dir / stage / f"{case_id}.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))
