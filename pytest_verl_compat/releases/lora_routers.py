"""The MoE routers a release's environment cannot train LoRA around, as data.

Found in the environment's own peft and transformers by
``upstream/probes/lora_routers_probe.py`` (its docstring says how) and kept per release in
``data/releases/<version>/lora_routers.json`` by ``verl-compat release derive VERSION --only
lora-routers``; tests/test_lora_routers.py derives it again in the release's environment and
finds each statement at its line. A release without the file has no such fact: the check that
reads it says nothing there.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_verl_compat.files.safe_input import InputError, read_bytes, read_text
from pytest_verl_compat.releases.index import RELEASE_DATA

ROUTERS_FILE = "lora_routers.json"
PROBE = "pytest_verl_compat.upstream.probes.lora_routers_probe"
MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class Citation:
    """A statement of the environment's files at ``where`` (a path under site-packages:LINE)."""

    where: str
    statement: str

    def found_in(self, site_packages: Path) -> bool:
        file, _, line = self.where.rpartition(":")
        try:
            lines = read_text(site_packages / file, what="installed source").splitlines()
        except (InputError, OSError):
            return False
        return (
            line.isdigit()
            and 0 < int(line) <= len(lines)
            and lines[int(line) - 1].strip() == self.statement
        )


@dataclass(frozen=True)
class WrappedRouter:
    """A model type whose MoE block reads ``attribute`` from its router, which peft wraps when
    the LoRA targets name ``target`` (the router's v4 module name) or ``parameter``."""

    model_type: str
    parameter: str  # the router's weight as peft's parameter target ("gate.weight")
    attribute: str  # what the block reads from the router and the wrapper lacks
    read: Citation  # the block's read, in transformers' modeling file
    mapped: Citation  # peft's line mapping the v4 target to the parameter
    versions: Mapping[str, str]  # the environment's transformers and peft

    @property
    def target(self) -> str:
        return self.parameter.rsplit(".", 1)[0]

    @property
    def environment(self) -> str:
        return ", ".join(f"{name} {version}" for name, version in sorted(self.versions.items()))


def routers_path(version: str) -> Path:
    return RELEASE_DATA / version / ROUTERS_FILE


def routers_from_mapping(raw: Mapping[str, Any]) -> dict[str, WrappedRouter]:
    versions = {str(k): str(v) for k, v in raw["versions"].items()}
    patterns = raw["router_target"]
    mapped = {str(k): Citation(str(v["where"]), str(v["statement"])) for k, v in patterns.items()}
    routers = {}
    for model_type, entry in raw["model_types"].items():
        routers[str(model_type)] = WrappedRouter(
            model_type=str(model_type),
            parameter=str(entry["parameter"]),
            attribute=str(entry["attribute"]),
            read=Citation(str(entry["where"]), str(entry["statement"])),
            mapped=mapped[str(entry["pattern"])],
            versions=versions,
        )
    return routers


@functools.cache
def wrapped_routers(version: str) -> Mapping[str, WrappedRouter]:
    """The release's wrapped routers by model type (none when the release has no record, or an
    unreadable one: the check then has nothing to stand on)."""
    path = routers_path(version)
    if not path.is_file():
        return {}
    try:
        return routers_from_mapping(json.loads(read_bytes(path, MAX_BYTES, "LoRA routers")))
    except (InputError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def dumps_routers(raw: Mapping[str, Any]) -> str:
    return json.dumps(raw, indent=1, sort_keys=True) + "\n"
