"""Shared pieces of the run-folder tests: the grpo config, a tiny budget, a finished run to copy."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from reference_trainer.budget import LocalBudget
from reference_trainer.config import ReferenceTrainerConfig
from reference_trainer.trainer import ReferenceTrainer, RunResult


def grpo_config() -> ReferenceTrainerConfig:
    from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession

    session = AuditSession.start(AuditOptions(upstream=None))
    return session.reference_config(session.manifest.case("grpo"))


def tiny_budget(**overrides: Any) -> LocalBudget:
    base: dict[str, Any] = {
        "steps": 2,
        "save_freq": 1,
        "max_response_length": 8,
        "val_prompts": 4,
        "test_freq": -1,
        "val_before_train": False,
        "reward": "length",
    }
    return LocalBudget(**{**base, **overrides})


def train(cfg: ReferenceTrainerConfig, out: Path, budget: LocalBudget, **run: Any) -> RunResult:
    return ReferenceTrainer(cfg, budget, out, progress=False).run(**run)


def copy_run(finished: Path, out: Path) -> Path:
    shutil.copytree(finished, out, symlinks=True)
    return out


def relist(checkpoint: Path, **extra: str) -> None:
    """Rewrite `manifest.json` with the digests of the listed files (plus `extra` entries)."""
    manifest = checkpoint / "manifest.json"
    names = [*json.loads(manifest.read_text()), *extra]
    digests = {}
    for name in names:
        path = checkpoint / name
        digests[name] = (
            hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "0" * 64
        )
    manifest.write_text(json.dumps(digests))
