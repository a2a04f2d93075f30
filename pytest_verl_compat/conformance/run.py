"""Running one conformance case: seeded inputs, both sides, every quantity compared."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from pytest_verl_compat.conformance.compare import (
    Check,
    ConformanceResult,
    case_result,
    compare_outputs,
)
from pytest_verl_compat.conformance.components import SIDES
from pytest_verl_compat.conformance.inputs import INPUTS, case_generator
from pytest_verl_compat.conformance.plan import ConformanceCase, upstream_missing_reason
from pytest_verl_compat.conformance.sides import resolve_namespace

__all__ = ["ConformanceResult", "run_case", "upstream_missing_reason"]


# Upstream's outputs for (case, sample): computed here by default, or answered by the oracle
# process that already imported verl (`reference_answers.OracleReferences`).
ReferenceSource = Callable[[ConformanceCase, int], dict[str, Any]]


@functools.cache
def upstream_outputs(case: ConformanceCase, sample: int) -> dict[str, Any]:
    """Upstream's side of a case: it never changes, so the mutation check reuses it."""
    inputs = INPUTS[case.component](case, case_generator(case, sample))
    return SIDES[case.component].reference(case, inputs, {})


def run_case(
    case: ConformanceCase,
    ours: ModuleType | Mapping[str, Any] | None = None,
    reference: ReferenceSource | None = None,
    candidate: ReferenceSource | None = None,
) -> ConformanceResult:
    """Compare our functions (or the substitutes in `ours`) with upstream on the case's samples;
    upstream's side comes from `reference` when given (it never depends on `ours`), and so does
    the candidate side from `candidate` when it calls none of our functions (the micro-batch
    cases that hold verl's own split against its whole mini-batch)."""
    namespace = resolve_namespace(ours)
    component = SIDES[case.component]
    checks: list[Check] = []
    for sample in range(case.samples):
        inputs = INPUTS[case.component](case, case_generator(case, sample))
        if component.reference_uses_ours(case):
            expected = component.reference(case, inputs, namespace)
        elif reference is not None:
            expected = reference(case, sample)
        else:
            # Inside a release's environment (the oracle process) only: upstream's code is
            # never imported where the checker runs.
            expected = upstream_outputs(case, sample)
        try:
            if candidate is not None and not component.uses(case):
                actual = candidate(case, sample)
            else:
                actual = component.candidate(case, inputs, namespace)
        except Exception as error:  # a mutant may raise; that is a failure, not a crash
            checks.append(
                Check(
                    "call",
                    sample,
                    math.inf,
                    f"{component.labels[0]} raised {error!r} [{case.id} sample {sample}]",
                )
            )
            continue
        checks.extend(compare_outputs(case, sample, actual, expected, component.labels))
    return case_result(case, checks)
