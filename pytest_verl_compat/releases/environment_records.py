"""The records a probe derives in a release's environment (``release derive VERSION --only
STEP``), kept per release under ``data/releases/<version>/``: where each is, the probe that
derives it, and how it is read.

A release without the record has no such fact, and neither has one whose record cannot be read
(too large, not JSON, a missing field): the check standing on it then says nothing there.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pytest_verl_compat.files.safe_input import InputError, read_bytes
from pytest_verl_compat.releases.index import RELEASE_DATA

MAX_BYTES = 1 << 20
T = TypeVar("T")


@dataclass(frozen=True)
class EnvironmentRecord:
    """One kind of record: its file under each release's data folder, the probe module that
    prints it when run in the release's environment, and the derive step that keeps it."""

    filename: str
    probe: str
    step: str

    def path(self, version: str) -> Path:
        return RELEASE_DATA / version / self.filename

    def load(self, version: str, parse: Callable[[Mapping[str, Any]], T], missing: T) -> T:
        """The release's record read by ``parse``, or ``missing`` where it has none it can read."""
        path = self.path(version)
        if not path.is_file():
            return missing
        try:
            return parse(json.loads(read_bytes(path, MAX_BYTES, self.step)))
        except (InputError, ValueError, KeyError, TypeError, AttributeError):
            return missing


_PROBES = "pytest_verl_compat.upstream.probes"
# The MoE routers whose LoRA the release's environment cannot run (its peft wraps them, its
# transformers reads through them): releases/lora_routers.py.
LORA_ROUTERS = EnvironmentRecord(
    "lora_routers.json", f"{_PROBES}.lora_routers_probe", "lora-routers"
)
# The critics whose LoRA it cannot build (its peft's causal-LM wrapper reads a generation method
# its transformers' token-classification models lack): releases/value_heads.py.
VALUE_HEADS = EnvironmentRecord("value_heads.json", f"{_PROBES}.value_heads_probe", "value-heads")
# What it hands SGLang (the actor's LoRA rank and targets, the attention backend it picks), its
# own server code evaluated there: releases/sglang_server.py.
SGLANG_SERVER = EnvironmentRecord(
    "sglang_server.json", f"{_PROBES}.sglang_server_probe", "sglang-server"
)
RECORDS = (LORA_ROUTERS, VALUE_HEADS, SGLANG_SERVER)
