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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_verl_compat.checks.model_facts import Citation, WrappedRouter
from pytest_verl_compat.files.safe_input import InputError, read_text
from pytest_verl_compat.releases.environment_records import LORA_ROUTERS

PROBE = LORA_ROUTERS.probe


def found_in(citation: Citation, site_packages: Path) -> bool:
    """Whether the cited line of the environment's files (under its ``site_packages``) is the
    statement."""
    file, _, line = citation.where.rpartition(":")
    try:
        lines = read_text(site_packages / file, what="installed source").splitlines()
    except (InputError, OSError):
        return False
    number = int(line) if line.isdigit() else 0
    return 0 < number <= len(lines) and lines[number - 1].strip() == citation.statement


def routers_path(version: str) -> Path:
    return LORA_ROUTERS.path(version)


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
    return LORA_ROUTERS.load(version, routers_from_mapping, {})
