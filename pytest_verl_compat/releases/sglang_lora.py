"""How a release hands SGLang the actor's LoRA, as data.

Found by running the release's own server expressions in its environment
(``upstream/probes/sglang_lora_probe.py``, its docstring says how) and kept per release in
``data/releases/<version>/sglang_lora.json`` by ``verl-compat release derive VERSION --only
sglang-lora``; tests/test_sglang_lora.py derives it again in the release's environment and finds
each statement at its line. A release without the file has no such fact: the check that reads it
says nothing there.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_verl_compat.checks.model_facts import Citation, Rendering, SglangLora
from pytest_verl_compat.releases.environment_records import load_record, record_path

SGLANG_LORA_FILE = "sglang_lora.json"
PROBE = "pytest_verl_compat.upstream.probes.sglang_lora_probe"


def sglang_lora_path(version: str) -> Path:
    return record_path(version, SGLANG_LORA_FILE)


def _rendering(raw: Mapping[str, Any]) -> Rendering:
    return Rendering(
        read=Citation(str(raw["where"]), str(raw["statement"])),
        renders=dict(raw["renders"]),
    )


def sglang_lora_from_mapping(raw: Mapping[str, Any]) -> SglangLora:
    return SglangLora(
        rank=_rendering(raw["max_lora_rank"]),
        targets=_rendering(raw["lora_target_modules"]),
        sglang=str(raw["sglang"]),
    )


@functools.cache
def sglang_lora(version: str) -> SglangLora | None:
    """The release's record (None when it has none, or an unreadable one: the check then has
    nothing to stand on)."""
    return load_record(version, SGLANG_LORA_FILE, sglang_lora_from_mapping, "sglang lora", None)
