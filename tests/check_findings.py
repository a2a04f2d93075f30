"""The findings of a case compiled with extra overrides, as ``level:path: message`` lines."""

from __future__ import annotations

import dataclasses

from pytest_verl_compat.model import Case
from pytest_verl_compat.pipeline.audit import AuditSession


def findings(session: AuditSession, case: Case, *overrides: str) -> list[str]:
    if overrides:
        case = dataclasses.replace(
            case, id=f"{case.id}+" + "+".join(overrides), overrides=case.overrides + overrides
        )
    report = session.compile(case)
    assert report is not None, session.outcome(case).composition.reason
    return [f"{f.level}:{f.path}: {f.message}" for f in report.findings]
