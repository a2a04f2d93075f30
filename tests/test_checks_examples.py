"""Checks on upstream's own launch scripts: each finding fires on a config and not on its twin."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_verl_compat.model import Case
from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
from pytest_verl_compat.pipeline.compose import split_hydra_argv


@pytest.fixture(scope="module")
def session(upstream_checkout: Path) -> AuditSession:
    return AuditSession.start(AuditOptions(upstream=str(upstream_checkout)))


def findings(session: AuditSession, case: Case, *overrides: str) -> list[str]:
    import dataclasses

    if overrides:
        case = dataclasses.replace(
            case, id=f"{case.id}+" + "+".join(overrides), overrides=case.overrides + overrides
        )
    report = session.compile(case)
    assert report is not None, session.outcome(case).composition.reason
    return [f"{f.level}:{f.path}: {f.message}" for f in report.findings]


def script(session: AuditSession, upstream: Path, rel: str) -> Case:
    return session.case_for_script(upstream / rel)


def test_lora_with_sglang_unmerged_is_served_as_an_adapter(session: AuditSession) -> None:
    """verl 0.9.0 serves the adapter (sglang_rollout/utils.py:29 lora_served_as_adapter)."""
    lora = session.manifest.case("grpo_lora")  # type: ignore[union-attr]
    for name in ("sglang", "vllm"):
        found = findings(session, lora, f"actor_rollout_ref.rollout.name={name}")
        assert not [f for f in found if f.startswith("error:")], (name, found)


def test_megatron_data_parallel_is_gpus_over_tp_pp_cp(
    session: AuditSession, upstream_checkout: Path
) -> None:
    case = script(
        session, upstream_checkout, "examples/grpo_trainer/run_deepseek_v3_671b_megatron.sh"
    )
    report = session.compile(case)
    assert report is not None
    assert not [f for f in report.findings if f.level == "error"], report.findings
    # The twin: a tensor-parallel size that does not divide the GPUs fires the layout check.
    found = findings(session, case, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=7")
    assert any(f.startswith("error:") and "model-parallel layout" in f for f in found), found


def test_config_path_and_name_select_the_megatron_config(
    session: AuditSession, upstream_checkout: Path
) -> None:
    case = script(
        session, upstream_checkout, "examples/grpo_trainer/run_qwen2-7b_math_megatron_fsdp.sh"
    )
    outcome = session.outcome(case)
    assert "--config-name=ppo_megatron_trainer.yaml" in outcome.fields.fields
    assert outcome.composition.composed, outcome.composition.reason
    assert outcome.composition.mapping["actor_rollout_ref"]["actor"]["strategy"] == "megatron"


def test_hydra_flags_split_like_argparse() -> None:
    argv = split_hydra_argv(
        ["--config-path", "config", "a=1", "-cn=x.yaml", "--config-name=y", "b=2"]
    )
    assert (argv.config_path, argv.config_name, argv.overrides) == ("config", "y", ("a=1", "b=2"))
