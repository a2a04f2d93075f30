"""The critics a release's environment cannot build LoRA on, as data.

Found in the environment's own peft and transformers by
``upstream/probes/value_heads_probe.py`` (its docstring says how) and kept per release in
``data/releases/<version>/value_heads.json`` by ``verl-compat release derive VERSION --only
value-heads``; tests/test_critic_lora.py derives it again in the release's environment, finds the
statement at its line and runs the claim on verl's own critic engine. A release without the file
has no such fact: the check that reads it says nothing there.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_verl_compat.checks.model_facts import Citation, ValueHeads
from pytest_verl_compat.releases.environment_records import VALUE_HEADS

PROBE = VALUE_HEADS.probe


def value_heads_path(version: str) -> Path:
    return VALUE_HEADS.path(version)


def value_heads_from_mapping(raw: Mapping[str, Any]) -> ValueHeads:
    read = raw["peft_reads"]
    return ValueHeads(
        model_types={str(k): str(v) for k, v in raw["model_types"].items()},
        read=Citation(str(read["where"]), str(read["statement"])),
        versions={str(k): str(v) for k, v in raw["versions"].items()},
    )


@functools.cache
def value_heads(version: str) -> ValueHeads | None:
    """The release's critics peft cannot wrap for LoRA (None when the release has no record, or
    an unreadable one: the check then has nothing to stand on)."""
    return VALUE_HEADS.load(version, value_heads_from_mapping, None)
