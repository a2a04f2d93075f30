"""The conformance stage's results, kept by content between runs (no torch imported here).

A case's result (``ConformanceResult``: passed, its largest errors, the failure's table) is a pure
function of the case (its seeds, shapes and tolerances), upstream's side (the oracle's answer,
itself keyed by verl's and torch's versions and the code that asks, ``pipeline.answers``) and our
side: the reference trainer's math and the modules that build the inputs and compare. So the
plugin keeps each result under a key digesting all of those (``result_key``) and a warm run
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
    UserAnswers,
    answer_key,
    code_sha256,
    platform_versions,
    user_cache_root,
)

KIND = "conformance-results"
# The question the oracle answers with upstream's side of a case (``reference_answers``).
REFERENCE_KIND = "conformance"
# Our side: the reference trainer, and how the inputs are built, fed and compared (the whole
# conformance package but its step oracle, ``answers.NOT_ASKING``).
OURS_CODE = ("reference_trainer", "pytest_verl_compat/conformance")
_FIELDS = tuple(field.name for field in dataclasses.fields(ConformanceResult))


def reference_request(case: ConformanceCase) -> dict[str, Any]:
    """The oracle's question for upstream's side of ``case``."""
    return {"kind": REFERENCE_KIND, "case": dataclasses.asdict(case)}


def reference_key(case: ConformanceCase) -> str:
    """Where upstream's side of ``case`` is kept (``pipeline.answers``)."""
    return answer_key(CONFORMANCE, reference_request(case))


def result_key(case: ConformanceCase) -> str:
    """The key of ``case``'s result: the case, upstream's side, our code, the packages."""
    payload = json.dumps(
        {
            "case": dataclasses.asdict(case),
            "reference": reference_key(case),
            "ours": code_sha256(OURS_CODE),
            "platform": platform_versions(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def _result_shape(entry: Any) -> bool:
    return isinstance(entry, dict) and set(entry) == set(_FIELDS)


class ConformanceResults:
    """The results kept in the user cache (``$XDG_CACHE_HOME/pytest-verl-compat/answers/
    conformance-results``), one file per case key."""

    def __init__(self, folder: Path | None = None) -> None:
        self.store = UserAnswers(
            KIND, folder or user_cache_root() / "answers" / KIND, checker=_result_shape
        )

    def get(self, case: ConformanceCase) -> ConformanceResult | None:
        entry = self.store.get(result_key(case))
        return ConformanceResult(**entry) if entry is not None else None

    def put(self, case: ConformanceCase, result: ConformanceResult) -> None:
        self.store.put(result_key(case), dataclasses.asdict(result))
