"""Snapshot stage's syrupy extension: one golden JSON file per case, diffs by dotted path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from syrupy.data import SnapshotCollection, SnapshotCollections
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode
from syrupy.location import PyTestLocation

from pytest_verl_compat.pipeline.snapshot import dumps, leaf_diff, write_atomic


class GoldenExtension(SingleFileSnapshotExtension):
    """One ``<golden>/<stage>/<case id>.json`` per case; the test's parameter id names the file.

    Syrupy's discovery of unused snapshots is switched off: it keys files by test-file
    location, which these shared golden folders are not, and it would delete the snapshots
    of skipped or deselected cases on ``--snapshot-update``. Orphaned golden files are
    reported by the plugin's own check instead.
    """

    golden_dir: Path = Path("golden")
    stage: str = "compose"
    # The command that accepts a change, with the run's own corpus options (plugin/commands.py).
    accept: str = "pytest --verl-corpus --snapshot-update"
    # Another release's golden folder (the manifest's own release's) and what to call it: a
    # release without its golden file yet is shown its drift from that one's.
    baseline_dir: Path | None = None
    baseline: str = ""
    release: str = ""
    file_extension = "json"
    _write_mode = WriteMode.TEXT

    @classmethod
    def _case_id(cls, test_location: PyTestLocation) -> str:
        # syrupy also asks about items that never asserted (skipped, or not parametrized).
        callspec = getattr(test_location.item, "callspec", None)
        return callspec.id if callspec is not None else test_location.testname

    @classmethod
    def case_path(cls, case_id: str) -> Path:
        return golden_file(cls.golden_dir, cls.stage, case_id)

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
        write_atomic(Path(snapshot_collection.location), str(data))

    def _baseline(self, case_path: Path) -> str | None:
        if self.baseline_dir is None:
            return None
        relative = case_path.relative_to(self.golden_dir)
        found = self.baseline_dir / relative
        return found.read_text(encoding="utf-8") if found.is_file() else None

    def diff_lines(self, serialized_data: Any, snapshot_data: Any) -> Iterator[str]:
        if snapshot_data == "" and serialized_data:
            baseline = self._baseline(self.case_path(json.loads(str(serialized_data))["case"]))
            if baseline is not None:
                yield (
                    f"no golden file for {self.release} yet; how it differs from "
                    f"{self.baseline}'s (- {self.baseline}, + {self.release}):"
                )
                yield from leaf_diff(json.loads(baseline), json.loads(str(serialized_data)))
                yield f"run {self.accept} to accept it"
                return
        try:
            old, new = json.loads(str(snapshot_data)), json.loads(str(serialized_data))
        except json.JSONDecodeError:
            yield from super().diff_lines(serialized_data, snapshot_data)
            return
        yield "golden differs at these leaves (- golden, + now):"
        yield from leaf_diff(old, new)
        yield f"run {self.accept} to accept the change"


class UnsafeCaseId(ValueError):
    """A case id that would name a file outside its stage's golden folder."""


def golden_file(golden_dir: Path, stage: str, case_id: str) -> Path:
    """``<golden>/<stage>/<case id>.json``, refused unless it resolves inside ``<golden>/<stage>``."""
    folder = Path(golden_dir) / stage
    segments = case_id.split("/")
    if any(not part or part.startswith(".") or "\\" in part for part in segments):
        raise UnsafeCaseId(f"case id {case_id!r} is not a safe file name under {folder}")
    path = folder / f"{case_id}.json"
    if not path.resolve().is_relative_to(folder.resolve()):
        raise UnsafeCaseId(f"case id {case_id!r} leads outside {folder}")
    return path


def golden_orphans(golden_dir: Path, stage: str, case_ids: set[str]) -> list[Path]:
    """Golden files of a stage whose case id is not in the manifest, sorted."""
    folder = Path(golden_dir) / stage
    if not folder.is_dir():
        return []
    return sorted(
        path
        for path in folder.rglob("*.json")
        if path.relative_to(folder).with_suffix("").as_posix() not in case_ids
    )


def golden_extension(
    golden_dir: Path,
    stage: str,
    accept: str = GoldenExtension.accept,
    baseline: tuple[Path, str, str] | None = None,
) -> type[GoldenExtension]:
    """A GoldenExtension bound to one golden folder and stage (syrupy takes classes, not
    instances); ``baseline``: another release's golden folder, its name and this one's."""
    attributes: dict[str, Any] = {"golden_dir": Path(golden_dir), "stage": stage, "accept": accept}
    if baseline is not None:
        attributes.update(baseline_dir=baseline[0], baseline=baseline[1], release=baseline[2])
    return type(f"Golden_{stage}", (GoldenExtension,), attributes)
