"""Findings: what the pinned verl release would report only at trainer start, or never, said statically.

Each check is one decorated function (id, level, evidence) in the module of its family; importing
this package registers them all. Errors reject the case; warnings keep it accepted but are
reported. Every finding cites the upstream source that makes it true.
"""

from __future__ import annotations

from pytest_verl_compat.checks import (  # noqa: F401  (importing a family registers its checks)
    algorithm,
    batch,
    fields,
    lora_targets,
    micro_batch,
    model_fit,
    off_path,
    parallel,
    precision,
    run_loop,
    sft,
    sglang_attention,
    sglang_lora,
    types,
    upstream_validation,
)
from pytest_verl_compat.checks.registry import (
    CHECKS,
    Check,
    CheckInput,
    Example,
    Hit,
    RuleDoc,
    check,
    register_rule,
    rule_docs,
    semantic_findings,
    yield_to_others,
)

__all__ = [
    "CHECKS",
    "Check",
    "CheckInput",
    "Example",
    "Hit",
    "RuleDoc",
    "check",
    "register_rule",
    "rule_docs",
    "semantic_findings",
    "yield_to_others",
]
