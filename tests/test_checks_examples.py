"""Checks on upstream's own launch scripts: each finding fires on a config and not on its twin."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_findings import findings

from pytest_verl_compat.model import Case
from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
from pytest_verl_compat.pipeline.compose import split_hydra_argv


@pytest.fixture(scope="module")
def session(upstream_checkout: Path) -> AuditSession:
    return AuditSession.start(AuditOptions(upstream=str(upstream_checkout)))


def script(session: AuditSession, upstream: Path, rel: str) -> Case:
    return session.case_for_script(upstream / rel)


def test_lora_with_sglang_unmerged_is_served_as_an_adapter(session: AuditSession) -> None:
    """verl 0.9.0 serves the adapter (sglang_rollout/utils.py:29 lora_served_as_adapter): no
    finding asks for lora.merge. The example's all-linear targets are the one error with SGLang
    (rollout.sglang-lora: 0.9.0 hands the string to SGLang as written); listed module names
    serve."""
    lora = session.manifest.case("grpo_lora")  # type: ignore[union-attr]
    listed = "actor_rollout_ref.model.target_modules=[q_proj,k_proj,v_proj,o_proj]"
    for overrides in (("vllm",), ("sglang", listed)):
        name = f"actor_rollout_ref.rollout.name={overrides[0]}"
        found = findings(session, lora, name, *overrides[1:])
        assert not [f for f in found if f.startswith("error:")], (name, found)
    found = findings(session, lora, "actor_rollout_ref.rollout.name=sglang")
    errors = [f for f in found if f.startswith("error:")]
    assert [f.split(": ", 1)[0] for f in errors] == ["error:actor_rollout_ref.model.target_modules"]
    assert not [f for f in found if "merge" in f.split(": ", 1)[0]], found


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


def test_no_effect_only_while_the_feature_is_off(session: AuditSession) -> None:
    """distillation.* is read once distillation.enabled (ray_trainer.py:934); off, it is inert."""
    grpo = session.manifest.case("grpo")  # type: ignore[union-attr]
    on = findings(
        session, grpo, "distillation.enabled=True", "distillation.distillation_loss.topk=32"
    )
    off = findings(session, grpo, "distillation.distillation_loss.topk=32")
    assert not [f for f in on if "distillation.distillation_loss.topk" in f and "no effect" in f]
    assert [f for f in off if "distillation.distillation_loss.topk" in f and "no effect" in f]


def test_group_of_one_silent_when_distillation_discards_the_advantage(
    session: AuditSession,
) -> None:
    """losses.py:216-217: without task rewards the policy loss is 0, so n=1 changes nothing."""
    grpo = session.manifest.case("grpo")  # type: ignore[union-attr]
    base = ("actor_rollout_ref.rollout.n=1", "distillation.enabled=True")
    quiet = findings(session, grpo, *base, "distillation.distillation_loss.use_task_rewards=False")
    loud = findings(session, grpo, *base, "distillation.distillation_loss.use_task_rewards=True")
    assert not [f for f in quiet if "n=1" in f]
    assert [f for f in loud if f.startswith("warning:") and "n=1" in f]


def test_rloo_group_of_one_is_a_warning_not_an_error(session: AuditSession) -> None:
    """core_algos.py:622-623: RLOO with one response uses baseline 0; 0.9.0 runs it."""
    grpo = session.manifest.case("grpo")  # type: ignore[union-attr]
    found = findings(session, grpo, "algorithm.adv_estimator=rloo", "actor_rollout_ref.rollout.n=1")
    assert [f for f in found if f.startswith("warning:") and "baseline 0" in f]
    assert not [f for f in found if f.startswith("error:")]
    assert not [f for f in findings(session, grpo, "algorithm.adv_estimator=rloo") if "n=" in f]


def test_megatron_responses_unit_is_dp_times_micro_batch(
    session: AuditSession, upstream_checkout: Path
) -> None:
    """verl/utils/config.py:87-110: Megatron divides by dp × micro-batch per GPU, not the GPUs."""
    case = script(
        session,
        upstream_checkout,
        "examples/ascend_extras/grpo_trainer/run_qwen3_5_122b_a10b_32k_megatron.sh",
    )
    ok = findings(session, case)
    assert not [f for f in ok if f.startswith("error:")], ok
    # Twin: a micro-batch of 3 per rank makes the unit 2 × 3 = 6, which 16 × 5 = 80 does not fill.
    bad = findings(session, case, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3")
    assert [f for f in bad if f.startswith("error:") and "micro-batch 3 = 6" in f], bad


def test_fsdp_sequence_parallel_comes_from_fsdp_config(
    session: AuditSession, upstream_checkout: Path
) -> None:
    """actor.py:332-333: fsdp_config.ulysses_sequence_parallel_size is the size unless the deprecated one is > 1."""
    case = script(
        session, upstream_checkout, "examples/grpo_trainer/run_qwen3_next_80b_a3b_fsdp.sh"
    )
    assert not [f for f in findings(session, case) if f.startswith("error:")]
    bad = findings(
        session, case, "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=1"
    )
    assert [f for f in bad if f.startswith("error:") and "token budget" in f], bad


def test_check_exit_code_is_verls_verdict_and_profile_asks_for_the_trainers(
    upstream_checkout: Path,
) -> None:
    """Distillation is valid for verl 0.9.0 (exit 0); the reference trainer lacks it (--profile: 1)."""
    import subprocess
    import sys

    target = str(
        upstream_checkout / "examples/on_policy_distillation_trainer/run_qwen3_8b_mopd_fsdp.sh"
    )

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                *(sys.executable, "-m", "pytest_verl_compat.cli"),
                *("--upstream", str(upstream_checkout), "check", target, *extra),
            ],
            capture_output=True,
            text=True,
            check=False,
        )

    plain = run()
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "valid for verl 0.9.0: yes" in plain.stderr
    assert "runnable by the reference trainer: no (distillation.enabled=True" in plain.stderr
    strict = run("--profile")
    assert strict.returncode == 1
    assert "ERROR distillation.enabled=True is not supported" in strict.stdout


def test_lora_with_vllm_dummy_weights_is_not_flagged(session: AuditSession) -> None:
    """engine_workers.py:667 and :777-785: with dummy weights the first sync sends the base model."""
    lora = session.manifest.case("grpo_lora")  # type: ignore[union-attr]
    found = findings(session, lora, "actor_rollout_ref.rollout.load_format=dummy")
    assert not [f for f in found if "load_format" in f], found


def test_dynamic_batch_must_agree_between_actor_and_rollout(session: AuditSession) -> None:
    """engine_workers.py:611 asserts actor.use_dynamic_bsz == rollout.log_prob_use_dynamic_bsz."""
    grpo = session.manifest.case("grpo")  # type: ignore[union-attr]
    off = ("actor_rollout_ref.actor.use_dynamic_bsz=False",)
    bad = findings(session, grpo, *off)
    good = findings(session, grpo, *off, "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=False")
    assert [f for f in bad if f.startswith("error:") and "asserts they are equal" in f], bad
    assert not [f for f in good if "asserts they are equal" in f], good


def test_vllm_max_model_len_against_prompt_and_response(session: AuditSession) -> None:
    """vllm_async_server.py:546-552 raises when no room is left; :570 clamps responses silently."""
    grpo = session.manifest.case("grpo")  # type: ignore[union-attr]
    data = session.outcome(grpo).composition.mapping["data"]
    prompt, response = int(data["max_prompt_length"]), int(data["max_response_length"])
    key = "actor_rollout_ref.rollout.max_model_len"
    full = findings(session, grpo, f"{key}={prompt + response}")
    short = findings(session, grpo, f"{key}={prompt + response - 1}")
    none = findings(session, grpo, f"{key}={prompt}")
    assert not [f for f in full if "max_model_len" in f], full
    assert [f for f in short if f.startswith("warning:") and "silently cuts" in f], short
    assert [f for f in none if f.startswith("error:") and "raises ValueError" in f], none


def test_vllm_false_flags_are_dropped(session: AuditSession) -> None:
    """vllm_rollout/utils.py:458-460: a False boolean never becomes a vLLM argument."""
    grpo = session.manifest.case("grpo")  # type: ignore[union-attr]
    key = "actor_rollout_ref.rollout.enable_chunked_prefill"
    off = findings(session, grpo, f"{key}=False")
    on = findings(session, grpo, f"{key}=True")
    assert [f for f in off if f.startswith("warning:") and "never reaches vLLM" in f], off
    assert not [f for f in on if "never reaches vLLM" in f], on


def test_a_deprecated_warmup_style_is_not_a_key_without_effect(session: AuditSession) -> None:
    """``optim.warmup_style``, when set, replaces lr_scheduler_type
    (verl/workers/config/optimizer.py:117-122): not a no-op, so no ``fields.no-effect`` finding
    (the profile classes it unsupported: the reference trainer reads lr_scheduler_type). Its
    twin, a PF-PPO field while PF-PPO is off, is a key without effect."""
    grpo = session.manifest.case("grpo")  # type: ignore[union-attr]
    style = findings(session, grpo, "actor_rollout_ref.actor.optim.warmup_style=cosine")
    assert not [f for f in style if "warmup_style" in f and "no effect" in f], style
    pf_ppo = findings(session, grpo, "algorithm.pf_ppo.reweight_method=pow")
    assert [f for f in pf_ppo if "pf_ppo.reweight_method" in f and "no effect" in f], pf_ppo
