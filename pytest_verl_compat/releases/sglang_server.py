"""What a release hands SGLang (the actor's LoRA, the attention backend), as data.

Found by running the release's own server expressions in its environment
(``upstream/probes/sglang_server_probe.py``, its docstring says how) and kept per release in
``data/releases/<version>/sglang_server.json`` by ``verl-compat release derive VERSION --only
sglang-server``; tests/test_sglang_server.py derives it again in the release's environment and finds
each statement at its line. A release without the file has no such fact: the check that reads it
says nothing there.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_verl_compat.checks.model_facts import Citation, Rendering, SglangServer
from pytest_verl_compat.releases.environment_records import SGLANG_SERVER

PROBE = SGLANG_SERVER.probe


def sglang_server_path(version: str) -> Path:
    return SGLANG_SERVER.path(version)


def _rendering(raw: Mapping[str, Any]) -> Rendering:
    return Rendering(
        read=Citation(str(raw["where"]), str(raw["statement"])),
        renders=dict(raw["renders"]),
    )


def sglang_server_from_mapping(raw: Mapping[str, Any]) -> SglangServer:
    attention = raw["attention_backend"]
    return SglangServer(
        rank=_rendering(raw["max_lora_rank"]),
        targets=_rendering(raw["lora_target_modules"]),
        sglang=str(raw["sglang"]),
        attention=Citation(str(attention["where"]), str(attention["statement"])),
        default_attention=str(attention["default"]),
    )


@functools.cache
def sglang_server(version: str) -> SglangServer | None:
    """The release's record (None when it has none, or an unreadable one: the check then has
    nothing to stand on)."""
    return SGLANG_SERVER.load(version, sglang_server_from_mapping, None)
