"""The conformance stage's results, kept by content between runs (no torch imported here).

A case's result (``ConformanceResult``: passed, its largest errors, the failure's table) is a pure
function of the case (its seeds, shapes and tolerances), upstream's side (the oracle's answer,
itself keyed by verl's and torch's versions and the code that asks, ``pipeline.answers``) and our
side: the reference trainer's math and the modules that build the inputs and compare (every
file of the package, ``memo.package_sha256``). So the
plugin keeps each result under a key digesting all of those (``result_key``) and a warm run
answers from it without importing torch; any change to either side's code, a package version,
the case or its tolerance is a new key and the comparison runs again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from pytest_verl_compat.conformance.plan import ConformanceCase, ConformanceResult
from pytest_verl_compat.pipeline.answers import (
    CONFORMANCE,
    answer_key,
    platform_versions,
)
from pytest_verl_compat.pipeline.memo import StageMemo, package_sha256

KIND = "conformance"
# The question the oracle answers with upstream's side of a case (``reference_answers``).
REFERENCE_KIND = "conformance"
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
            # Our side: every file of the package and of the reference trainer.
            "ours": package_sha256(),
            "platform": platform_versions(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def _result_shape(entry: Any) -> bool:
    return isinstance(entry, dict) and set(entry) == set(_FIELDS)


class ConformanceResults:
    """The results kept between runs, one per case key (``memo.StageMemo``: the user cache's
    ``results/conformance`` folder, off with ``VERL_COMPAT_NO_CACHE=1``)."""

    def __init__(self, memo: StageMemo | None = None) -> None:
        self.memo = memo if memo is not None else StageMemo()
        self._known: dict[str, ConformanceResult | None] = {}

    def get(self, case: ConformanceCase) -> ConformanceResult | None:
        if case.id not in self._known:
            entry = self.memo.get(KIND, result_key(case))
            kept = entry if _result_shape(entry) else None
            self._known[case.id] = ConformanceResult(**kept) if kept is not None else None
        return self._known[case.id]

    def put(self, case: ConformanceCase, result: ConformanceResult) -> None:
        self._known[case.id] = result
        self.memo.put(KIND, result_key(case), dataclasses.asdict(result))
