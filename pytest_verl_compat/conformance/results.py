"""The conformance stage's results, kept by content between runs (no torch imported here).

A case's result (``ConformanceResult``: passed, its largest errors, the failure's table) is a pure
function of the case (its seeds, shapes and tolerances), upstream's side (the oracle's answer,
itself keyed by verl's and torch's versions and the code that asks, ``pipeline.answers``) and our
side: the reference trainer's math and the modules that build the inputs and compare
(``OURS_CODE``). So the plugin keeps each result under a key digesting all of those (``result_key``) and a warm run
answers from it without importing torch; any change to either side's code, a package version,
the case or its tolerance is a new key and the comparison runs again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from pytest_verl_compat.conformance.plan import ConformanceCase, ConformanceResult
from pytest_verl_compat.pipeline.answers import (
    CONFORMANCE,
    CONFORMANCE_RESULTS,
    RecordedAnswers,
    answer_key,
    code_sha256,
    platform_versions,
    recorded_path,
)
from pytest_verl_compat.pipeline.memo import StageMemo

KIND = "conformance"
# The question the oracle answers with upstream's side of a case (``reference_answers``).
REFERENCE_KIND = "conformance"
# Our side: the reference trainer's math, and how the inputs are built, fed and compared (every
# module the comparison imports; a test walks its imports to keep this complete).
OURS_CODE = (
    "reference_trainer/math",
    "pytest_verl_compat/conformance",
    "pytest_verl_compat/pipeline/answers.py",
    "pytest_verl_compat/pipeline/manifest.py",
    "pytest_verl_compat/pipeline/memo.py",
    "pytest_verl_compat/files/safe_input.py",
    "pytest_verl_compat/files/cache.py",
    "pytest_verl_compat/files/digests.py",
    "pytest_verl_compat/releases/environment.py",
    "pytest_verl_compat/releases/index.py",
    "pytest_verl_compat/releases/wheels.py",
    "pytest_verl_compat/pipeline/snapshot.py",
)
_FIELDS = tuple(field.name for field in dataclasses.fields(ConformanceResult))


def reference_request(case: ConformanceCase) -> dict[str, Any]:
    """The oracle's question for upstream's side of ``case``."""
    return {"kind": REFERENCE_KIND, "case": dataclasses.asdict(case)}


def reference_key(case: ConformanceCase, release: str) -> str:
    """Where upstream's side of ``case`` (``release``'s) is kept (``pipeline.answers``)."""
    return answer_key(CONFORMANCE, reference_request(case), release=release)


def result_key(case: ConformanceCase, release: str) -> str:
    """The key of ``case``'s result: the case, upstream's side, our code, the packages."""
    payload = json.dumps(
        {
            "case": dataclasses.asdict(case),
            "reference": reference_key(case, release),
            "ours": code_sha256(OURS_CODE),
            "platform": platform_versions(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def _result_shape(entry: Any) -> bool:
    return isinstance(entry, dict) and set(entry) == set(_FIELDS)


class ConformanceResults:
    """The results kept between runs, one per case key: the user cache's (``memo.StageMemo``,
    off with ``VERL_COMPAT_NO_CACHE=1``), then those recorded for the golden folder."""

    def __init__(
        self, release: str, memo: StageMemo | None = None, golden_dir: Path | None = None
    ) -> None:
        self.release = release
        self.memo = memo if memo is not None else StageMemo()
        self.recorded = (
            RecordedAnswers(recorded_path(golden_dir, CONFORMANCE_RESULTS), _result_shape)
            if golden_dir is not None and self.memo.enabled
            else None
        )
        self._known: dict[str, ConformanceResult | None] = {}

    def get(self, case: ConformanceCase) -> ConformanceResult | None:
        if case.id not in self._known:
            key = result_key(case, self.release)
            entry = self.memo.get(KIND, key)
            if not _result_shape(entry) and self.recorded is not None:
                entry = self.recorded.get(key)
            kept: dict[str, Any] | None = entry if _result_shape(entry) else None
            self._known[case.id] = ConformanceResult(**kept) if kept is not None else None
        return self._known[case.id]

    def put(self, case: ConformanceCase, result: ConformanceResult) -> None:
        self._known[case.id] = result
        self.memo.put(KIND, result_key(case, self.release), dataclasses.asdict(result))
