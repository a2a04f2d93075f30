"""The full verdict ``verl-compat check`` gives a case, for many cases at once.

``check`` prints the compile report's findings, then upstream's own early checks (asked of the
oracle process, cached per mapping), leaving out a static finding whose upstream statement
upstream itself reported failing. ``pinned_verdicts`` does the same for a list of cases: every
question not in the cache is sent to one oracle first (two forked workers), so a release matrix
of a hundred scripts imports verl once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_verl_compat.model import Case, Finding
from pytest_verl_compat.pipeline.compile import verdicts
from pytest_verl_compat.upstream.early import (
    AnswerCache,
    EarlyAnswer,
    cache_key,
    covered_static_checks,
    early_answer,
    upstream_gate,
)
from pytest_verl_compat.upstream.oracle import UpstreamOracle, checks_request

if TYPE_CHECKING:
    from pytest_verl_compat.pipeline.audit import AuditSession


@dataclass(frozen=True)
class PinnedVerdict:
    """What ``check`` says of a composed case: valid for verl, runnable here, its findings."""

    valid: bool
    runnable: bool
    findings: tuple[Finding, ...]
    # Empty when upstream's own checks ran; otherwise why they were skipped (as `check` says it).
    upstream_skipped: str = ""


def pinned_verdicts(
    session: AuditSession,
    cases: Iterable[Case],
    *,
    upstream_checks: bool = True,
    workers: int = 2,
) -> dict[str, PinnedVerdict]:
    """The verdict of every composed case, by case id (cases that do not compose are left out)."""
    reports = {}
    for case in cases:
        report = session.compile(case)
        if report is not None:
            reports[case.id] = (case, report)
    answers: dict[str, EarlyAnswer] = {}
    skipped = "" if upstream_checks else "not asked (--no-upstream-checks)"
    if upstream_checks and reports:
        gate = upstream_gate(session)
        if gate.tree is None:
            skipped = gate.reason
        else:
            try:
                answers = _early_answers(
                    session, [case for case, _ in reports.values()], gate.tree, workers
                )
            except RuntimeError as exc:
                skipped = str(exc).splitlines()[0]
    result = {}
    for case_id, (_, report) in reports.items():
        verdict = verdicts(report)
        findings = list(report.findings)
        answer = answers.get(case_id)
        case_skipped = skipped
        if answer is not None and answer.verdict == "refused":
            case_skipped = answer.message
        elif answer is not None:
            covered = covered_static_checks(answer)
            findings = [f for f in findings if f.check not in covered] + [
                failure.finding(session.pin.version) for failure in answer.failures
            ]
        valid = verdict.valid and not any(f.level == "error" for f in findings)
        result[case_id] = PinnedVerdict(valid, verdict.runnable, tuple(findings), case_skipped)
    return result


def _early_answers(
    session: AuditSession, cases: list[Case], tree: str, workers: int
) -> dict[str, EarlyAnswer]:
    """Upstream's early checks for each case: from the cache, else from one shared oracle."""
    cache = AnswerCache()
    version = session.pin.version
    mappings = {case.id: session.outcome(case).composition.mapping for case in cases}
    missing = {
        case_id: mapping
        for case_id, mapping in mappings.items()
        if cache.get(cache_key(version, tree, mapping)) is None
    }
    oracle = UpstreamOracle(workers=workers) if missing else None
    try:
        if oracle is not None:
            for mapping in missing.values():
                oracle.submit(cache_key(version, tree, mapping), checks_request(mapping))
        return {
            case_id: early_answer(session, mapping, tree, cache, oracle)
            for case_id, mapping in mappings.items()
        }
    finally:
        if oracle is not None:
            oracle.close()
