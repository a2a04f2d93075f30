"""Launch scripts of our own for the release tests: the official GRPO case's fields plus more."""

from __future__ import annotations

import functools
import shlex
from pathlib import Path

from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession


@functools.lru_cache(maxsize=1)
def grpo_fields() -> tuple[str, ...]:
    """The official GRPO case's fields: a configuration verl 0.9.0 accepts."""
    session = AuditSession.start(AuditOptions())
    assert session.manifest is not None
    return session.outcome(session.manifest.case("grpo")).fields.fields


def launch_script(folder: Path, name: str, *fields: str, base: bool = True, head: str = "") -> Path:
    """``folder/name``: ``head`` (shell lines), then the launcher with the GRPO case's fields
    (unless ``base=False``) and ``fields``, each a shell word written as given."""
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    words = [*map(shlex.quote, grpo_fields() if base else ()), *fields]
    body = " \\\n    ".join(["python3 -m verl.trainer.main_ppo", *words])
    path.write_text(f"#!/usr/bin/env bash\nset -euo pipefail\n{head}{body}\n")
    return path
