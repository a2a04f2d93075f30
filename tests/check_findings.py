"""The findings of a case compiled with extra overrides, as ``level:path: message`` lines."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

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


def manifest_case(session: AuditSession, case_id: str) -> Case:
    """A case of the session's embedded manifest."""
    assert session.manifest is not None
    case = session.manifest.case(case_id)
    assert case is not None
    return case


def model_folder(folder: Path, model_type: str, **more: object) -> str:
    """A local model folder whose config.json declares ``model_type`` (and the head counts the
    checks read, and ``more`` keys): what the checks find at a model path."""
    model = folder / model_type
    model.mkdir(exist_ok=True)
    config = {"model_type": model_type, "num_attention_heads": 16, "num_key_value_heads": 4}
    (model / "config.json").write_text(json.dumps({**config, **more}), encoding="utf-8")
    return str(model)
