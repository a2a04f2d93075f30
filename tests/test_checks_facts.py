"""Finding classes from verl 0.9.0's worker-start and first-step assertions, and model facts.

Each class fires on a configuration and stays quiet on a near-identical valid twin; the upstream
line that makes it true is named in the check's evidence (pytest_verl_compat/checks/).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from check_findings import findings

from pytest_verl_compat.checks.micro_batch import step_rows
from pytest_verl_compat.checks.model_facts import facts_from_config, tokenizer_ids
from pytest_verl_compat.files.safe_input import InputError
from pytest_verl_compat.model import Case
from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
from pytest_verl_compat.pipeline.model_facts import local_model_facts, read_model_facts

STATIC = (
    "actor_rollout_ref.actor.use_dynamic_bsz=False",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=False",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=False",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
)
MEGATRON = "examples/grpo_trainer/run_deepseek_v3_671b_megatron.sh"


@pytest.fixture(scope="module")
def session(upstream_checkout: Path) -> AuditSession:
    return AuditSession.start(AuditOptions(upstream=str(upstream_checkout)))


def manifest_case(session: AuditSession, case_id: str) -> Case:
    case = session.manifest.case(case_id)  # type: ignore[union-attr]
    assert case is not None
    return case


def hits(found: list[str], level: str, text: str) -> list[str]:
    return [f for f in found if f.startswith(f"{level}:") and text in f]


# --- per-GPU micro-batches in static mode -----------------------------------------------------


def test_actor_micro_batch_must_divide_the_per_gpu_mini_batch(session: AuditSession) -> None:
    """engine/utils.py:124-127: 256 prompts × 5 / 8 ranks = 160 rows; micro 3 fails, 4 divides."""
    grpo = manifest_case(session, "grpo")
    good = findings(session, grpo, *STATIC)
    bad = findings(session, grpo, *STATIC, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3")
    assert not hits(good, "error", "micro-batches of"), good
    (hit,) = hits(bad, "error", "micro-batches of 3 do not divide")
    assert "160 per GPU over 8 data-parallel ranks" in hit and "first actor update (step 1)" in hit


def test_log_prob_micro_batches_must_divide_the_step_batch(session: AuditSession) -> None:
    """1024 prompts × 5 = 5120 rows, 640 per GPU: 8 divides, 7 fails, for the old and ref passes."""
    grpo = manifest_case(session, "grpo")
    good = findings(session, grpo, *STATIC)
    old = findings(
        session, grpo, *STATIC, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=7"
    )
    ref = findings(
        session, grpo, *STATIC, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=7"
    )
    assert not hits(good, "error", "log-prob pass"), good
    assert hits(old, "error", "old log-prob pass (step 1)") and "640 per GPU" in str(old)
    assert hits(ref, "error", "reference log-prob pass (step 1)"), ref
    # With LoRA the actor computes the reference log-probs (trainer_base.py:317-320): ref's own
    # micro-batch size is never used.
    lora = manifest_case(session, "grpo_lora")
    quiet = findings(
        session, lora, *STATIC, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=7"
    )
    assert not hits(quiet, "error", "reference log-prob pass"), quiet


def test_step_rows_pads_to_the_mini_batch_multiple() -> None:
    """trainer_base.py:1434-1466: the batch is padded to lcm(dp, actor and critic mini-batches)."""
    resolved: dict[str, Any] = {
        "trainer": {"n_gpus_per_node": 8, "nnodes": 1, "v1": {"trainer_mode": "sync"}},
        "data": {"train_batch_size": 100},
        "algorithm": {"adv_estimator": "gae"},
        "critic": {"enable": None, "ppo_mini_batch_size": 48},
        "actor_rollout_ref": {
            "rollout": {"n": 1},
            "actor": {"strategy": "fsdp", "ppo_mini_batch_size": 32, "fsdp_config": {}},
        },
    }
    assert step_rows(resolved) == (100, 96, 192)
    # Critic warm-up steps update no actor: lcm(8, 48) = 48, so 100 → 144.
    assert step_rows(resolved, actor_updates=False) == (100, 48, 144)
    resolved["trainer"]["v1"] = {
        "trainer_mode": "separate_async",
        "separate_async": {"parameter_sync_step": 4},
    }
    assert step_rows(resolved)[0] == 25


# --- the critic -------------------------------------------------------------------------------


def test_critic_batch_settings_never_reach_its_engine(session: AuditSession) -> None:
    """engine.py:102 keeps use_dynamic_bsz=True for the critic; trainer_base.py:251-252 sets its budget."""
    ppo = manifest_case(session, "ppo")
    found = findings(session, ppo, "critic.ppo_micro_batch_size_per_gpu=2")
    assert hits(found, "warning", "`critic.ppo_micro_batch_size_per_gpu=2` never reaches"), found
    grpo = manifest_case(session, "grpo")  # no critic: nothing to say
    quiet = findings(session, grpo, "critic.ppo_micro_batch_size_per_gpu=2")
    assert not hits(quiet, "warning", "critic's engine"), quiet
    # Asking for dynamic batching is what the critic does anyway.
    same = findings(session, ppo, "critic.use_dynamic_bsz=True")
    assert not hits(same, "warning", "critic.use_dynamic_bsz"), same


def test_critic_token_budget_is_checked_whatever_its_use_dynamic_bsz(session: AuditSession) -> None:
    """The V1 critic packs by ppo_infer_max_token_len_per_gpu (default 32768) in every mode."""
    ppo = manifest_case(session, "ppo")
    long = ("data.max_response_length=32768", "critic.use_dynamic_bsz=False")
    bad = findings(session, ppo, *long)
    good = findings(session, ppo, *long, "+critic.ppo_infer_max_token_len_per_gpu=40000")
    assert hits(bad, "error", "per-GPU token budget 32768"), bad
    assert not [f for f in good if "critic.ppo_infer_max_token_len_per_gpu, data" in f], good


def test_critic_mini_batch_must_split_over_the_critic_ranks(session: AuditSession) -> None:
    """engine_workers.py:266-268 asserts in the critic's train_mini_batch as in the actor's."""
    ppo = manifest_case(session, "ppo")
    bad = findings(session, ppo, "critic.ppo_mini_batch_size=4")
    good = findings(session, ppo, "critic.ppo_mini_batch_size=8")
    assert hits(bad, "error", "4 prompts × n=1 = 4 responses does not split over 8"), bad
    assert not hits(good, "error", "does not split over"), good


def test_critic_deprecated_sequence_parallel_never_reaches_its_engine(
    session: AuditSession,
) -> None:
    """critic.py:214-221: critic.fsdp is the engine; the deprecated size is not copied into it."""
    ppo = manifest_case(session, "ppo")
    bad = findings(session, ppo, "critic.ulysses_sequence_parallel_size=2")
    good = findings(
        session,
        ppo,
        "critic.ulysses_sequence_parallel_size=2",
        "critic.fsdp.ulysses_sequence_parallel_size=2",
    )
    assert hits(bad, "warning", "critic.ulysses_sequence_parallel_size=2 never reaches"), bad
    assert not hits(good, "warning", "critic.ulysses_sequence_parallel_size=2 never reaches"), good


def test_deprecated_global_micro_batch_fails_where_each_role_meets_it(
    session: AuditSession,
) -> None:
    """critic.py:154-158 (both sizes set, at start); the ref engine gets None (engine_workers.py:541-543)."""
    ppo = manifest_case(session, "ppo")
    critic = findings(
        session, ppo, "critic.use_dynamic_bsz=False", "critic.ppo_micro_batch_size=64"
    )
    assert hits(critic, "error", "CriticConfig raises ValueError at trainer start"), critic
    per_gpu = findings(
        session, ppo, "critic.use_dynamic_bsz=False", "critic.ppo_micro_batch_size_per_gpu=8"
    )
    assert not hits(per_gpu, "error", "critic.ppo_micro_batch_size"), per_gpu
    grpo = manifest_case(session, "grpo")
    ref = (*STATIC[:-1], "actor_rollout_ref.ref.log_prob_micro_batch_size=64")
    with_ref = findings(session, grpo, *ref)
    assert hits(with_ref, "error", "reference worker's micro-batch size stays None"), with_ref
    # Without a reference policy the ref section is never read.
    no_ref = findings(session, grpo, *ref, "actor_rollout_ref.actor.use_kl_loss=False")
    assert not hits(no_ref, "error", "actor_rollout_ref.ref.log_prob_micro_batch_size"), no_ref
    # the fix is what the older workers made of it: the global size over the data-parallel
    # ranks, GPUs over Ulysses size (the forecast reads it alike, memory/batches.py)
    actor = (*STATIC[:3], "actor_rollout_ref.actor.ppo_micro_batch_size=64", *STATIC[4:])
    gpus = "trainer.n_gpus_per_node=8"
    plain = findings(session, grpo, *actor, gpus)
    assert hits(plain, "error", "over 8 GPUs it means 64 / 8 = 8 per GPU"), plain
    ulysses = findings(
        session, grpo, *actor, gpus, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"
    )
    said = "over 4 data-parallel ranks (8 GPUs, Ulysses 2) it means 64 / 4 = 16 per GPU"
    assert hits(ulysses, "error", said), ulysses


# --- Megatron layouts -------------------------------------------------------------------------


def test_megatron_expert_layout_must_divide_the_gpus(
    session: AuditSession, upstream_checkout: Path
) -> None:
    """megatron.core initialize_model_parallel: world % (etp × ep × pp) == 0 (etp defaults to tp)."""
    case = session.case_for_script(upstream_checkout / MEGATRON)
    assert not hits(findings(session, case), "error", "expert layout")
    bad = findings(session, case, "actor_rollout_ref.actor.megatron.expert_model_parallel_size=3")
    assert hits(bad, "error", "expert parallel 3") and "RuntimeError" in str(bad), bad


def test_megatron_virtual_pipeline_needs_pipeline(
    session: AuditSession, upstream_checkout: Path
) -> None:
    case = session.case_for_script(upstream_checkout / MEGATRON)
    pp1 = (
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1",
        "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=1",
    )
    vpp = "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2"
    assert hits(findings(session, case, *pp1, vpp), "error", "needs pipeline parallel > 1")
    assert not hits(findings(session, case, *pp1), "error", "virtual pipeline")


def test_reference_layout_is_checked_like_the_actors(
    session: AuditSession, upstream_checkout: Path
) -> None:
    case = session.case_for_script(upstream_checkout / MEGATRON)
    bad = findings(session, case, "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=7")
    assert hits(bad, "error", "the reference's model-parallel layout"), bad
    assert not hits(findings(session, case), "error", "reference's model-parallel layout")


def test_rollout_data_parallel_counts_in_the_replica(session: AuditSession) -> None:
    """engine_workers.py:650-655: GPUs % (tp × dp × pp) at rollout start."""
    grpo = manifest_case(session, "grpo")
    bad = findings(session, grpo, "actor_rollout_ref.rollout.data_parallel_size=3")
    good = findings(session, grpo, "actor_rollout_ref.rollout.data_parallel_size=2")
    assert hits(bad, "error", "data parallel 3) do not fit 8 GPUs"), bad
    assert not hits(good, "error", "rollout replicas"), good


# --- model facts ------------------------------------------------------------------------------


def model_folder(
    tmp_path: Path, name: str, tokenizer: dict[str, Any] | None = None, **config: Any
) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    base = {"num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 40960}
    (folder / "config.json").write_text(json.dumps({**base, **config}), encoding="utf-8")
    if tokenizer is not None:
        (folder / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    return folder


def with_model(folder: Path) -> tuple[str, ...]:
    return (f"actor_rollout_ref.model.path={folder}", f"critic.model.path={folder}")


def test_no_model_facts_no_model_findings(session: AuditSession) -> None:
    grpo = manifest_case(session, "grpo")
    found = findings(session, grpo, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=3")
    assert not [f for f in found if "attention heads" in f]
    assert session.model_facts(grpo) == {}


def test_ulysses_size_against_heads(session: AuditSession, tmp_path: Path) -> None:
    """monkey_patch.py:340-346: heads % sp, and kv % sp or sp % kv, at worker start."""
    grpo = manifest_case(session, "grpo")
    folder = model_folder(tmp_path, "m", num_attention_heads=12, num_key_value_heads=2)
    sp = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
    two = findings(session, grpo, *with_model(folder), f"{sp}=2")
    four = findings(session, grpo, *with_model(folder), f"{sp}=4")
    eight = findings(session, grpo, *with_model(folder), f"{sp}=8")
    assert not hits(two, "error", "Ulysses"), two
    assert not hits(four, "error", "key-value heads"), four  # 4 % 2 == 0: kv heads repeat
    assert hits(eight, "error", "does not divide the 12 attention heads"), eight


def test_megatron_tensor_and_expert_parallel_against_the_model(
    session: AuditSession, upstream_checkout: Path, tmp_path: Path
) -> None:
    """megatron.core TransformerConfig: heads and query groups % tp; experts % ep."""
    case = session.case_for_script(upstream_checkout / MEGATRON)
    resolved = session.outcome(case).composition.mapping
    engine = resolved["actor_rollout_ref"]["actor"]["megatron"]
    tp, ep = engine["tensor_model_parallel_size"], engine["expert_model_parallel_size"]
    fits = model_folder(
        tmp_path, "fits", num_attention_heads=128, num_key_value_heads=128, n_routed_experts=256
    )
    odd = model_folder(
        tmp_path,
        "odd",
        num_attention_heads=128,
        num_key_value_heads=tp + 1,
        n_routed_experts=ep * 3 + 1,
    )
    dense = model_folder(tmp_path, "dense", num_attention_heads=128, num_key_value_heads=128)
    assert not [
        f for f in findings(session, case, *with_model(fits)) if f.startswith("error:model")
    ]
    bad = findings(session, case, *with_model(odd))
    assert hits(bad, "error", f"key-value heads (num_query_groups) of {odd}"), bad
    assert hits(bad, "error", f"does not divide the {ep * 3 + 1} experts"), bad
    if ep > 1:
        assert hits(findings(session, case, *with_model(dense)), "error", "without routed experts")


def test_rollout_context_against_the_model(session: AuditSession, tmp_path: Path) -> None:
    """vllm_async_server.py:953-961: unset max_model_len is the model's context; a larger one raises."""
    grpo = manifest_case(session, "grpo")
    data = session.outcome(grpo).composition.mapping["data"]
    prompt, response = int(data["max_prompt_length"]), int(data["max_response_length"])
    roomy = model_folder(tmp_path, "roomy", max_position_embeddings=prompt + response)
    short = model_folder(tmp_path, "short", max_position_embeddings=prompt + response - 1)
    assert not [f for f in findings(session, grpo, *with_model(roomy)) if "context length" in f]
    cut = findings(session, grpo, *with_model(short))
    assert hits(cut, "warning", "max_model_len unset: max_position_embeddings"), cut
    above = findings(
        session,
        grpo,
        *with_model(roomy),
        f"actor_rollout_ref.rollout.max_model_len={prompt + response + 1}",
    )
    assert hits(above, "error", "is above the max_position_embeddings"), above


def test_rollout_tensor_parallel_against_heads(session: AuditSession, tmp_path: Path) -> None:
    grpo = manifest_case(session, "grpo")
    folder = model_folder(tmp_path, "m", num_attention_heads=12, num_key_value_heads=12)
    tp = "actor_rollout_ref.rollout.tensor_model_parallel_size"
    assert hits(
        findings(session, grpo, *with_model(folder), f"{tp}=8"), "error", "vLLM tensor parallel 8"
    )
    assert not hits(
        findings(session, grpo, *with_model(folder), f"{tp}=4"), "error", "vLLM tensor parallel"
    )


def test_tokenizer_ids_past_the_vocabulary(session: AuditSession, tmp_path: Path) -> None:
    grpo = manifest_case(session, "grpo")
    vocab = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}}}
    past = {**vocab, "added_tokens": [{"id": 10, "content": "<|end|>"}]}
    within = {**vocab, "added_tokens": [{"id": 9, "content": "<|end|>"}]}
    bad = findings(session, grpo, *with_model(model_folder(tmp_path, "a", past, vocab_size=10)))
    good = findings(session, grpo, *with_model(model_folder(tmp_path, "b", within, vocab_size=10)))
    assert hits(bad, "warning", "'<|end|>'=10"), bad
    assert not [f for f in good if "vocab_size" in f], good


def test_model_facts_parse_and_refuse(tmp_path: Path) -> None:
    nested = facts_from_config(
        {"text_config": {"num_attention_heads": 8, "max_position_embeddings": 4096}}, "x"
    )
    assert (nested.num_attention_heads, nested.num_key_value_heads) == (8, 8)
    assert nested.max_position_embeddings == 4096
    assert facts_from_config({"num_attention_heads": True}, "x").num_attention_heads is None
    assert tokenizer_ids({"model": {"vocab": [["a", 0.0], ["b", -1.0]]}}) == {"a": 0, "b": 1}
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(InputError, match=r"config.json:1: the model config is not valid JSON"):
        read_model_facts(bad)
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "config.json")
    with pytest.raises(InputError, match="not a regular file"):
        read_model_facts(fifo)
    # Found through a model path, an unreadable config gives no facts (the run meets it first).
    assert local_model_facts({"actor_rollout_ref": {"model": {"path": str(bad)}}}) == {}


def test_check_cli_model_config_option(upstream_checkout: Path, tmp_path: Path) -> None:
    folder = model_folder(tmp_path, "m", num_attention_heads=12, num_key_value_heads=12)

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                *(sys.executable, "-m", "pytest_verl_compat.cli", "--upstream"),
                *(str(upstream_checkout), "check", "grpo", *extra),
            ],
            capture_output=True,
            text=True,
            check=False,
        )

    tp8 = ("--set", "actor_rollout_ref.rollout.tensor_model_parallel_size=8")
    plain = run(*tp8)
    assert plain.returncode == 0 and "model facts: none" in plain.stderr, plain.stderr
    given = run(*tp8, "--model-config", str(folder / "config.json"))
    assert given.returncode == 1 and "vLLM tensor parallel 8" in given.stdout, given.stdout
    missing = run("--model-config", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "cannot read the model config: not found" in missing.stderr
