"""One case's verdict, as ``verl-compat check`` gives it and the plugin's check stage records it.

The static findings of the compile report, then upstream's own early checks on the same resolved
mapping (the static findings they repeat left out), and the two verdicts: *valid for verl* (no
error finding) and *runnable by the reference trainer* (the report accepted and valid). Every front
end asks here, so the command line, the pytest stage and the examples recording cannot disagree;
they differ only in who answers for upstream (``Asker``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_verl_compat.model import Case, Finding
from pytest_verl_compat.pipeline.compile import reference_problems
from pytest_verl_compat.upstream.early import (
    AnswerStore,
    EarlyAnswer,
    UpstreamGate,
    covered_static_checks,
    early_answer,
    upstream_gate,
)
from pytest_verl_compat.upstream.rules import COMPOSE

if TYPE_CHECKING:
    from pytest_verl_compat.pipeline.audit import AuditSession
    from pytest_verl_compat.upstream.oracle import UpstreamOracle

# The path of the one finding a composition rejection gives.
COMPOSITION = "<composition>"

# Upstream's answer on one resolved mapping, or the one-line reason it gave none.
Asker = Callable[[Mapping[str, Any]], "EarlyAnswer | str"]


@dataclass(frozen=True)
class CaseCheck:
    """What ``check`` says of one case: findings in order, the two verdicts and why."""

    findings: tuple[Finding, ...]
    valid: bool
    runnable: bool
    # Why the reference trainer cannot run it (its problems and verl's errors), "" when it can.
    not_runnable: str
    # Why upstream's own checks did not run ("" when they did or were not asked).
    upstream_skipped: str = ""
    composed: bool = True
    problems: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "runnable": self.runnable,
            "composed": self.composed,
            "findings": [finding.to_json() for finding in self.findings],
            "upstream_skipped": self.upstream_skipped,
        }


def live_asker(
    session: AuditSession,
    cache: AnswerStore | None = None,
    oracle: UpstreamOracle | None = None,
    gate: UpstreamGate | None = None,
) -> Asker:
    """Upstream's early checks through the oracle process (or its cache), behind the gate."""
    gate = gate if gate is not None else upstream_gate(session)

    def ask(mapping: Mapping[str, Any]) -> EarlyAnswer | str:
        if gate.tree is None:
            return gate.reason
        try:
            answer = early_answer(session, mapping, gate.tree, cache, oracle)
        except RuntimeError as exc:
            return str(exc).splitlines()[0]
        return answer.message if answer.verdict == "refused" else answer

    return ask


def check_case(session: AuditSession, case: Case, ask: Asker | None) -> CaseCheck:
    """The case's findings and verdicts; ``ask`` None leaves upstream's own checks out."""
    report = session.compile(case)
    if report is None:
        reason = session.outcome(case).composition.reason
        finding = Finding("error", COMPOSITION, reason, check=COMPOSE)
        return CaseCheck((finding,), False, False, reason, composed=False)
    findings = list(report.findings)
    upstream: list[Finding] = []
    skipped = ""
    if ask is not None:
        answer = ask(session.outcome(case).composition.mapping)
        if isinstance(answer, str):
            skipped = answer
        else:
            covered = covered_static_checks(answer)
            findings = [f for f in findings if f.check not in covered]
            # The rule id is the phase's (upstream.<phase>), whatever the finding's path names.
            upstream = [
                dataclasses.replace(failure.finding(session.pin.version), check=failure.check_id)
                for failure in answer.failures
            ]
    findings += upstream
    valid = not any(f.level == "error" for f in findings)
    runnable = report.accepted and valid
    if runnable:
        not_runnable = ""
    elif not report.accepted:
        not_runnable = report.reason
    else:
        not_runnable = "; ".join(f"{f.path}: {f.message}" for f in upstream if f.level == "error")
    problems = tuple(reference_problems(report.leaves, report.findings))
    return CaseCheck(tuple(findings), valid, runnable, not_runnable, skipped, True, problems)
