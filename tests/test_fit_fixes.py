"""A proposed fix is what the user gets by applying it: every fix a forecast proposes for verl
0.9.0's example scripts on a small GPU composes with Hydra as written (its keys exist, ``+`` where
the tree lacks them) and the forecast of that composition gives the phase the peak the fix
promised, and ``check`` finds no error in it the script did not have (a halved token budget
never goes below the longest sequence, which verl asserts). Interpolation is the trap: the reference's Megatron param_offload copies the actor's
(ref/megatron_ref.yaml:39), so a fix that offloads the actor offloads the reference too, as
composing again does; the composer hands the forecast those copies (``Composer.key_followers``).

The examples are chosen by class (FSDP and Megatron RL, a VL model, LoRA, SFT on Megatron, FSDP
without remove-padding), not
as the ones that once failed; each must propose at least one fix on the GPU, or the test proves
nothing about it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pytest_verl_compat.cli.fit_common import forecast_case
from pytest_verl_compat.memory.forecast import Request
from pytest_verl_compat.memory.gpus import find_gpu
from pytest_verl_compat.pipeline.audit import AuditSession
from pytest_verl_compat.upstream.verdict.case import check_case

EXAMPLES = (
    "grpo_trainer/run_qwen3_8b_fsdp.sh",
    "grpo_trainer/run_qwen3_8b_megatron.sh",
    "grpo_trainer/run_qwen2_5_vl_7b_megatron.sh",
    "ppo_trainer/run_qwen3_8b_megatron.sh",
    "tuning/lora/run_qwen3_8b_fsdp.sh",
    "sft/gsm8k/run_qwen_megatron_fsdp.sh",
    # FSDP without remove-padding: a Ulysses fix turns remove-padding on too
    "grpo_trainer/run_qwen2_5_32b_fsdp.sh",
)
GPU = "RTX4090"
TOLERANCE = 2**20  # the forecast is in bytes; a MiB covers nothing but rounding


@pytest.mark.parametrize("example", EXAMPLES)
def test_each_proposed_fix_composes_and_forecasts_what_it_promised(
    upstream_session: AuditSession, upstream_checkout: Path, example: str
) -> None:
    script = upstream_checkout / "examples" / example
    case = dataclasses.replace(upstream_session.case_for_script(script), id=example)
    result = forecast_case(upstream_session, case, Request(gpu=find_gpu(GPU)))
    errors = _errors(upstream_session, case)
    checked = 0
    for verdict in result.verdicts:
        for index, fix in enumerate(verdict.fixes):
            overrides = tuple(f"{key}={value}" for key, value in fix.keys)
            fixed = upstream_session.with_overrides(
                case, overrides, case_id=f"{example}|{verdict.phase}|{index}"
            )
            outcome = upstream_session.outcome(fixed)
            assert outcome.composition.composed, (overrides, outcome.composition.reason)
            again = forecast_case(upstream_session, fixed, Request(gpu=find_gpu(GPU)))
            peak = max(
                phase.total
                for rank in again.ranks
                if rank.name == verdict.rank
                for phase in rank.phases
                if phase.phase == verdict.phase
            )
            assert abs(peak - fix.after) <= TOLERANCE, (verdict.phase, overrides, peak, fix.after)
            assert _errors(upstream_session, fixed) <= errors, overrides
            checked += 1
    assert checked, f"{example}: no fix proposed on {GPU}, so nothing was checked"


def _errors(session: AuditSession, case: object) -> set[str]:
    """The rules of check's error findings (its static checks: upstream's own run apart)."""
    return {f.rule for f in check_case(session, case, None).findings if f.level == "error"}  # type: ignore[arg-type]
