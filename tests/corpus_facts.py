"""Case lists and totals the tests expect, read from the corpus and the golden audit, never pasted.

Adding a derived case is then data only: a manifest entry and the regenerated golden files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
MANIFEST: dict[str, Any] = yaml.safe_load((REPO / "corpus" / "manifest.yaml").read_text())
AUDIT: dict[str, Any] = json.loads((REPO / "golden" / "audit.json").read_text())


def case_ids(kind: str) -> list[str]:
    """The manifest's case ids of one kind, in manifest order."""
    return [case["id"] for case in MANIFEST["cases"] if case["kind"] == kind]


OFFICIAL = case_ids("official")
# The official cases of the RL entry point (main_ppo): those without script arguments of an SFT
# launch (an SFT case names its entry point's own tree, sft_trainer_engine).
OFFICIAL_RL = [case_id for case_id in OFFICIAL if not case_id.startswith("sft_")]
PINNED_VERSION: str = MANIFEST["upstream"]["version"]
