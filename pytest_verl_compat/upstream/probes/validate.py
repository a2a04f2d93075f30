"""Upstream's own verdict: the pinned verl's ``validate_config`` on each composed case, in a subprocess.

Runs inside the oracle process (``oracle.py``), one resolved mapping per question. Two parts of upstream validation need what a laptop does not
have, and are replaced by labelled stand-ins:

- the vLLM LoRA rank check imports vllm; the stand-in applies vLLM's allowed ranks
  (``MaxLoRARanks``, 1, 8, ..., 512: vllm/config/lora.py:24@vllm-0.18.0, :26@vllm-0.24.0, the
  list ``get_vllm_max_lora_rank`` also falls back to), and a rank above them is vLLM's rule at
  the verl line that asks (a ``LibraryCheck``: a finding, not the sandbox's stop);
- the critic's model config is loaded from the model hub; the stand-in keeps the critic's model
  section a plain mapping, which keeps every batch-size check of ``CriticConfig.validate``.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import sys
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_verl_compat.checks.upstream_names import VLLM_LORA_RANKS
from pytest_verl_compat.pipeline.entry_points import (
    FULLY_ASYNC_MODULE,
    ONE_STEP_OFF_MODULE,
    SFT_ENTRY_MODULE,
)
from pytest_verl_compat.pipeline.targets import foreign_targets, tree_targets
from pytest_verl_compat.upstream.oracle.client import ENTRY_MODULE
from pytest_verl_compat.upstream.probes import records
from pytest_verl_compat.upstream.probes.boundary import LibraryCheck
from pytest_verl_compat.upstream.probes.config_load import VALIDATE_CONFIG
from pytest_verl_compat.upstream.probes.phases import run_all

if TYPE_CHECKING:
    pass

STAND_INS = (
    "vllm LoRA rank: allowed ranks 1, 8, 16, 32, 64, 128, 256, 320, 512 (upstream's fallback list)",
    "critic model config: not loaded from the model hub; batch checks run on the critic section",
)
# The probes of each entry point besides main_ppo, by module: each module's ``run_entry(mapping,
# world_size, explicit, entry=…)`` answers its questions. Named, not imported here, so that
# main_ppo's answers are keyed by main_ppo's code alone (``pipeline.answers.ENTRY_CODE`` keys these).
_ASYNCHRONOUS = "pytest_verl_compat.upstream.probes.asynchronous"
ENTRY_PROBES = {
    SFT_ENTRY_MODULE: "pytest_verl_compat.upstream.probes.sft.phases",
    FULLY_ASYNC_MODULE: _ASYNCHRONOUS,
    ONE_STEP_OFF_MODULE: _ASYNCHRONOUS,
}


def _stand_in_lora_rank(lora_rank: int) -> int:
    if lora_rank <= 0:
        raise AssertionError(f"lora_rank must be greater than 0, get {lora_rank}")
    if lora_rank > VLLM_LORA_RANKS[-1]:
        # verl raises this ValueError itself (vllm_rollout/utils.py:95-96@0.9.0, :97-98@0.9.1)
        # from vLLM's list: a rule of the run, which a plain raise here would file as the
        # sandbox's (stand_ins.sandbox_failure: raised inside a stand-in)
        raise LibraryCheck(
            f"vLLM max_lora_rank: lora_rank must be less than or equal to "
            f"{VLLM_LORA_RANKS[-1]}, but got {lora_rank}"
        )
    return next(rank for rank in VLLM_LORA_RANKS if lora_rank <= rank)


def install_stand_ins() -> None:
    """Replace the module that imports vllm; only its rank helper is used by validate_config."""
    fake = types.ModuleType("verl.workers.rollout.vllm_rollout.utils")
    fake.get_vllm_max_lora_rank = _stand_in_lora_rank  # type: ignore[attr-defined]
    sys.modules["verl.workers.rollout.vllm_rollout.utils"] = fake


def _refusal(mapping: Mapping[str, Any]) -> str | None:
    import verl

    # Checked here too: whatever the sender, only classes verl's own tree names are instantiated.
    foreign = foreign_targets(
        mapping, tree_targets(Path(verl.__file__).parent / "trainer" / "config")
    )
    return f"not sent to upstream's checks: {foreign[0]}" if foreign else None


def validate_config_with_stand_ins(cfg: Any) -> None:
    """Upstream's validate_config on one config (inside the oracle process), with the stand-ins."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils import config as config_utils

    config_utils.validate_config(
        config=cfg,
        use_reference_policy=need_reference_policy(cfg),
        use_critic=need_critic(cfg),
    )


def validate_one(mapping: Mapping[str, Any]) -> dict[str, str]:
    """validate_config's verdict on one resolved mapping (inside the oracle process)."""
    from omegaconf import OmegaConf

    refused = _refusal(mapping)
    if refused:
        return {"verdict": "refused", "message": refused}
    cfg = OmegaConf.create(dict(mapping))
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            validate_config_with_stand_ins(cfg)
    except Exception as exc:
        return {"verdict": "fails", "message": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    lines = printed.getvalue().strip().splitlines()
    return {"verdict": "passes", "message": lines[-1] if lines else ""}


def checks_one(
    mapping: Mapping[str, Any],
    watch: Mapping[str, list[int]] | None = None,
    explicit: list[str] | None = None,
    entry: str | None = None,
    world_size: int | None = None,
) -> dict[str, Any]:
    """Every early upstream check on one resolved mapping (inside the oracle process), by the
    entry point it is composed for (``oracle.CHECKED_ENTRIES``, main_ppo by default).

    main_ppo's ``verdict``/``message`` are validate_config's alone (what the validate stage
    compares with the compiler's outcome); the SFT trainer's are its config load's
    (``SFTTrainer._build_config``), on rank 0 of a world of ``world_size``; ``failures`` holds
    every probe's failure record (``probes``).
    """
    refused = _refusal(mapping)
    if refused:
        return {"verdict": "refused", "message": refused, "failures": []}
    if entry in ENTRY_PROBES:
        probes = importlib.import_module(ENTRY_PROBES[entry])
        answer: dict[str, Any] = probes.run_entry(
            mapping, world_size, [str(k) for k in explicit or []], entry=entry
        )
        return answer
    if entry not in (None, ENTRY_MODULE):
        raise ValueError(f"no upstream checks for entry point {entry!r}")
    answer = run_all(
        mapping, validate_config_with_stand_ins, watch, [str(k) for k in explicit or []]
    )
    validate = [f for f in answer["failures"] if f[records.KEY_CHECK] == VALIDATE_CONFIG]
    return {
        "verdict": "fails" if validate else "passes",
        "message": validate[0][records.KEY_MESSAGE] if validate else "",
        **answer,
    }


def timed_phases(mapping: Mapping[str, Any], explicit: Sequence[str]) -> list[tuple[str, float]]:
    """Each phase's wall seconds on one mapping (verl already imported by the caller)."""
    timings: list[tuple[str, float]] = []
    run_all(mapping, validate_config_with_stand_ins, explicit=explicit, timings=timings)
    return timings
