"""The step cases: which accepted cases the step oracle trains, at which shape, steps and ranks.

The official cases and the derived cases the manifest expects the compiler to accept train at
the plan's default shape, one step, one rank, with the default variants. The step-only cases
of `corpus/step.yaml` are an official case plus Hydra overrides, composed and compiled like a
derived case (the compile gate applies: a case the profile rejects has no lowered config), each
moving settings the others leave neutral, with its own shape, steps, ranks and claims.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from pytest_verl_compat.conformance.step.plan import (
    StepCase,
    StepCaseSpec,
    StepPlan,
    default_shape,
    load_step_plan,
)
from pytest_verl_compat.model import Case, CompileReport
from pytest_verl_compat.pipeline.audit import AuditSession


def trains(case: Case) -> bool:
    """An official case, or a derived case whose expected outcome is acceptance.

    The manifest's expected outcome is what the compile stage holds the compiler to, and it is
    known at collection (compiling every case to parametrize would cost seconds); a derived case
    the compiler does not accept after all fails its step at `reference_config`, which lowers
    only an accepted case.
    """
    if case.kind == "official":
        return True
    return case.kind == "derived" and (case.expected or {}).get("outcome", "accepted") == "accepted"


def step_case_ids(session: AuditSession, plan: StepPlan | None = None) -> list[str]:
    """Every step case's id, without composing anything (what the stage parametrizes)."""
    plan = plan or load_step_plan()
    manifest = {c.id for c in session.cases}
    step_only = [spec.id for spec in plan.cases if spec.base in manifest]
    # An SFT launch trains in the SFT step stage (conformance/step/sft.py), not this one.
    return [c.id for c in session.cases if trains(c) and not session.launches_sft(c)] + step_only


def _spec_case(session: AuditSession, spec: StepCaseSpec) -> StepCase:
    by_id = {c.id: c for c in session.cases}
    if spec.base not in by_id:
        raise ValueError(f"step case {spec.id}: base {spec.base!r} is not a manifest case")
    case = session.with_overrides(by_id[spec.base], spec.overrides, case_id=spec.id)
    return StepCase(
        id=spec.id,
        config=session.reference_config(case),
        resolved=session.outcome(case).composition.mapping,
        shape=spec.shape_in(session.version),
        steps=spec.steps,
        ranks=spec.ranks,
        variants=spec.variants,
        active=spec.active,
        not_compared=spec.not_compared,
    )


def step_case(session: AuditSession, case_id: str, plan: StepPlan | None = None) -> StepCase:
    """One step case by id; the compile gate's `StageFailed` when the compiler rejects it."""
    plan = plan or load_step_plan()
    for spec in plan.cases:
        if spec.id == case_id:
            return _spec_case(session, spec)
    case = next(c for c in session.cases if c.id == case_id)
    return StepCase(
        id=case.id,
        config=session.reference_config(case),
        resolved=session.outcome(case).composition.mapping,
        shape=default_shape(),
        variants=plan.default_variants,
    )


def step_cases(
    session: AuditSession, ids: Iterable[str] | None = None, plan: StepPlan | None = None
) -> list[StepCase]:
    plan = plan or load_step_plan()
    wanted = list(ids) if ids is not None else step_case_ids(session, plan)
    return [step_case(session, cid, plan) for cid in wanted]


def step_report(session: AuditSession, case_id: str) -> CompileReport:
    """The compile report of a step case `step_case` has built (a step-only case is composed
    under its own id by then)."""
    by_id = {c.id: c for c in session.cases}
    plan_case = next((spec for spec in load_step_plan().cases if spec.id == case_id), None)
    case = by_id[case_id] if plan_case is None else replace(by_id[plan_case.base], id=case_id)
    report = session.compile(case)
    assert report is not None, case_id
    return report
