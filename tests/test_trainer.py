"""The reference trainer really trains: update counts, exact resume, exports, LoRA, reward model.

Every run here is a tiny CPU budget (8 prompts, 8-16 new tokens, a handful of steps).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from corpus_facts import OFFICIAL_RL

from reference_trainer.budget import LocalBudget
from reference_trainer.checkpoint import CheckpointError, complete_checkpoints
from reference_trainer.config import ReferenceTrainerConfig
from reference_trainer.tiny import ATTENTION
from reference_trainer.trainer import ReferenceTrainer, RunResult

# Keys that legitimately differ between two identical runs: wall-clock measurements.
CLOCK_PREFIXES = ("timing_s/", "perf/")


@pytest.fixture(scope="module")
def configs() -> dict[str, ReferenceTrainerConfig]:
    from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession

    session = AuditSession.start(AuditOptions(upstream=None))
    return {case: session.reference_config(session.manifest.case(case)) for case in OFFICIAL_RL}


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from reference_trainer.reward import train_reward_model

    folder = tmp_path_factory.mktemp("rm") / "tiny_rm"
    train_reward_model(folder, seed=0, epochs=1)
    return folder


def quick_budget(**overrides: Any) -> LocalBudget:
    base: dict[str, Any] = {
        "steps": 2,
        "max_response_length": 8,
        "val_prompts": 4,
        "test_freq": -1,
        "val_before_train": False,
        "reward": "length",
    }
    return LocalBudget(**{**base, **overrides})


def train(cfg: ReferenceTrainerConfig, out: Path, budget: LocalBudget, **run: Any) -> RunResult:
    return ReferenceTrainer(cfg, budget, out, progress=False).run(**run)


def without_clock(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    return [{k: v for k, v in r.items() if not k.startswith(CLOCK_PREFIXES)} for r in rows]


def assert_same_state(a: torch.nn.Module, b: torch.nn.Module, case: str) -> None:
    __tracebackhide__ = True
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys(), f"state keys differ [{case}]"
    differing = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert not differing, f"tensors not bit-identical={differing[:5]}, but should be none [{case}]"


@pytest.mark.parametrize("case", OFFICIAL_RL)
def test_each_official_case_trains_with_upstream_update_counts(
    case: str,
    configs: dict[str, ReferenceTrainerConfig],
    reward_model: Path,
    tmp_path: Path,
) -> None:
    upstream = configs[case]
    budget = quick_budget(reward_model_path=str(reward_model))
    result = train(upstream, tmp_path, budget)
    last = result.metrics[-1]
    steps = budget.steps
    # The local mini-batch keeps upstream's train_batch_size / ppo_mini_batch_size.
    actor_expected = steps * upstream.actor_updates_per_step
    assert last["actor/num_updates"] == actor_expected, (
        f"actor/num_updates={last['actor/num_updates']}, but should be {actor_expected} [{case}]"
    )
    critic_expected = steps * upstream.critic_updates_per_step
    assert last["critic/num_updates"] == critic_expected, (
        f"critic/num_updates={last['critic/num_updates']}, but should be {critic_expected} [{case}]"
    )
    for key in (
        "actor/pg_loss",
        "actor/pg_clipfrac",
        "actor/ppo_kl",
        "actor/entropy",
        "response_length/mean",
        "critic/score/mean",
        "critic/rewards/mean",
        "timing_s/gen",
    ):
        assert key in last, f"metric {key} missing [{case}]"
    if upstream.critic is not None:
        assert {"critic/vf_loss", "critic/vf_clipfrac"} <= last.keys(), case
    if upstream.actor.use_kl_loss:
        assert "actor/kl_loss" in last, case
    if upstream.use_reference_policy:
        # Before the first update the policy is the reference (LoRA: B = 0, adapter disabled).
        first_kl = result.metrics[0]["actor/ref_kl"]
        assert first_kl == 0.0, f"actor/ref_kl={first_kl} at step 1, but should be 0 [{case}]"
    ledger = json.loads((tmp_path / "adaptations.json").read_text())
    fields = {entry["field"] for entry in ledger["adaptations"]}
    assert {
        "data.train_batch_size",
        "actor_rollout_ref.model.path",
        "data.max_response_length",
        "trainer.total_training_steps",
        "trainer.n_gpus_per_node",
    } <= fields, case
    assert (tmp_path / "metrics.csv").is_file() and (tmp_path / "metrics.png").is_file()


@pytest.mark.parametrize("case", ["grpo", "ppo"])
def test_resume_is_bit_identical(
    case: str, configs: dict[str, ReferenceTrainerConfig], tmp_path: Path
) -> None:
    cfg = configs[case]
    budget = quick_budget(steps=4, save_freq=2)
    straight = ReferenceTrainer(cfg, budget, tmp_path / "straight", progress=False)
    uninterrupted = straight.run()

    interrupted = ReferenceTrainer(cfg, budget, tmp_path / "resumed", progress=False)
    interrupted.run(stop_after=3)  # checkpoints at 2 and at 3 (the stop)
    # Drop the stop checkpoint: resume from step 2 while metrics for step 3 exist on disk.
    import shutil

    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "global_step_3")
    resumed = ReferenceTrainer(cfg, budget, tmp_path / "resumed", progress=False)
    finished = resumed.run(resume=True)

    assert finished.final_step == 4
    assert_same_state(straight.policy, resumed.policy, case)
    if straight.critic is not None:
        assert_same_state(straight.critic, resumed.critic, case)
    assert without_clock(finished.metrics) == without_clock(uninterrupted.metrics), case


def test_hf_export_reloads_to_identical_logits(
    configs: dict[str, ReferenceTrainerConfig], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    trainer = ReferenceTrainer(configs["grpo"], quick_budget(), tmp_path, progress=False)
    result = trainer.run()
    assert result.export is not None
    reloaded = AutoModelForCausalLM.from_pretrained(result.export, attn_implementation=ATTENTION)
    tokenizer = AutoTokenizer.from_pretrained(result.export)
    assert tokenizer.eos_token_id != tokenizer.pad_token_id
    assert GenerationConfig.from_pretrained(result.export).eos_token_id == tokenizer.eos_token_id
    ids = tokenizer(["12+7=", "ann has 3 pens"], return_tensors="pt", padding=True)
    trainer.policy.eval()
    with torch.no_grad():
        expected = trainer.policy(**ids).logits
        observed = reloaded(**ids).logits
    assert torch.equal(expected, observed), "reloaded logits differ [grpo]"


def test_lora_trains_only_the_adapter_and_exports_adapter_and_merged(
    configs: dict[str, ReferenceTrainerConfig], tmp_path: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    trainer = ReferenceTrainer(configs["grpo_lora"], quick_budget(), tmp_path, progress=False)
    before = {k: v.clone() for k, v in trainer.policy.named_parameters()}
    trainable = {k for k, v in trainer.policy.named_parameters() if v.requires_grad}
    assert trainable and all("lora_" in k for k in trainable)
    result = trainer.run()
    after = dict(trainer.policy.named_parameters())
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed, "no parameter changed [grpo_lora]"
    assert changed <= trainable, f"frozen parameters changed={sorted(changed - trainable)[:5]}"

    final = tmp_path / "final"
    assert (final / "adapter" / "adapter_config.json").is_file()
    assert result.export == final / "hf"
    base = AutoModelForCausalLM.from_pretrained(final / "base", attn_implementation=ATTENTION)
    merged = AutoModelForCausalLM.from_pretrained(final / "hf", attn_implementation=ATTENTION)
    differing = [
        k for k, v in merged.state_dict().items() if not torch.equal(v, base.state_dict()[k])
    ]
    assert differing, "merged export equals the base model (verl #4553)"
    adapted = PeftModel.from_pretrained(base, final / "adapter")
    ids = trainer.tokenizer(["3*4="], return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(
            adapted(**ids).logits, merged(**ids).logits, rtol=1e-4, atol=1e-5
        )


def test_corrupted_checkpoint_is_detected_naming_the_file(
    configs: dict[str, ReferenceTrainerConfig], tmp_path: Path
) -> None:
    budget = quick_budget(steps=2, save_freq=1)
    train(configs["grpo"], tmp_path, budget)
    found = complete_checkpoints(tmp_path / "checkpoints")
    assert [p.name for p in found] == ["global_step_1", "global_step_2"]
    weights = found[-1] / "actor.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # truncated
    with pytest.raises(CheckpointError, match=r"actor\.safetensors"):
        train(configs["grpo"], tmp_path, budget, resume=True)
    assert (found[0] / "COMPLETE").is_file(), "the previous checkpoint must be kept"


def test_grpo_length_reward_rises_within_two_minutes(
    configs: dict[str, ReferenceTrainerConfig], tmp_path: Path
) -> None:
    start = time.perf_counter()
    budget = LocalBudget(steps=12, reward="length", val_prompts=8, test_freq=6)
    result = train(configs["grpo"], tmp_path, budget)
    elapsed = time.perf_counter() - start
    rewards = [r["critic/score/mean"] for r in result.metrics if "critic/score/mean" in r]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert elapsed < 120, f"run time={elapsed:.0f}s, but should be < 120s [grpo]"
    assert last > first + 0.1, f"reward of last steps={last:.3f}, but should exceed {first:.3f}"
    assert "val/reward/mean" in result.metrics[0] and "val/acc" in result.metrics[-1]


def test_group_filtering_refills_to_full_groups(
    configs: dict[str, ReferenceTrainerConfig], tmp_path: Path
) -> None:
    cfg = configs["grpo"]
    filtered = dataclasses.replace(
        cfg,
        algorithm=dataclasses.replace(
            cfg.algorithm,
            filter_groups_enable=True,
            filter_groups_metric="acc",
            max_num_gen_batches=10,
        ),
    )
    result = train(filtered, tmp_path, quick_budget(steps=1, n=4))
    last = result.metrics[-1]
    assert last["train/num_gen_batches"] >= 1
    assert last["actor/num_updates"] == cfg.actor_updates_per_step


def _cli(*argv: str) -> int:
    from pytest_verl_compat.cli.train import add_train_parser

    parser = argparse.ArgumentParser()
    add_train_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["train", *argv])
    return int(args.func(args))


def test_cli_trains_a_case(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = _cli(
        "rloo",
        "--steps",
        "1",
        "--out",
        str(tmp_path),
        "--response-length",
        "8",
        "--no-progress",
        "--test-freq",
        "-1",
    )
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "final" / "hf" / "model.safetensors").is_file()
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) >= 1
    assert (tmp_path / "samples.jsonl").is_file()
    # The export is a --model for the next run (any local HF causal-LM folder is).
    code = _cli(
        "grpo",
        "--model",
        str(tmp_path / "final" / "hf"),
        "--steps",
        "1",
        "--out",
        str(tmp_path / "again"),
        "--response-length",
        "8",
        "--no-progress",
        "--test-freq",
        "-1",
    )
    assert code == 0, capsys.readouterr().err
    ledger = json.loads((tmp_path / "again" / "adaptations.json").read_text())
    paths = [
        a["local"] for a in ledger["adaptations"] if a["field"] == "actor_rollout_ref.model.path"
    ]
    assert paths == [str(tmp_path / "final" / "hf")]


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["grpo_reward_model"], "reward.reward_model.model_path"),
        (["grpo", "--model", "/nonexistent/model"], "actor_rollout_ref.model.path"),
        (["no_such_case"], "no_such_case"),
    ],
)
def test_cli_bad_bindings_fail_before_training(
    argv: list[str], field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _cli(*argv, "--out", str(tmp_path), "--no-progress") == 2
    assert field in capsys.readouterr().err
    assert not (tmp_path / "metrics.jsonl").exists()


def test_critic_warmup_holds_the_actor_like_verl(
    configs: dict[str, ReferenceTrainerConfig], tmp_path: Path
) -> None:
    cfg = configs["ppo"]
    assert cfg.critic is not None
    warm = dataclasses.replace(cfg, critic=dataclasses.replace(cfg.critic, warmup_steps=2))
    result = train(warm, tmp_path, quick_budget(steps=2))
    # verl: actor skipped while critic_warmup > global_steps (from 1), so only step 2 updates it.
    assert [r["actor/num_updates"] for r in result.metrics] == [0, cfg.actor_updates_per_step]
    assert result.metrics[-1]["critic/num_updates"] == 2 * cfg.critic_updates_per_step


# Only the resume runs in a new process: the straight and interrupted runs train in this one,
# from the same config (each subprocess costs an interpreter, torch and transformers, ~15 s).
RESUME_IN_NEW_PROCESS = """
import json, sys
from reference_trainer.budget import LocalBudget
from reference_trainer.config import ReferenceTrainerConfig
from reference_trainer.trainer import ReferenceTrainer
cfg = ReferenceTrainerConfig.from_dict(json.loads(sys.argv[2]))
budget = LocalBudget(**json.loads(sys.argv[3]))
ReferenceTrainer(cfg, budget, sys.argv[1], progress=False).run(resume=True)
"""
NEW_PROCESS_BUDGET = {
    "steps": 4,
    "save_freq": 2,
    "reward": "length",
    "test_freq": -1,
    "val_before_train": False,
    "max_response_length": 8,
}


@pytest.mark.slow
def test_resume_in_a_new_process_is_bit_identical(
    configs: dict[str, ReferenceTrainerConfig], tmp_path: Path
) -> None:
    import subprocess
    import sys

    from safetensors.torch import load_file

    cfg, budget = configs["grpo"], LocalBudget(**NEW_PROCESS_BUDGET)
    train(cfg, tmp_path / "a", budget)
    train(cfg, tmp_path / "b", budget, stop_after=2)
    subprocess.run(
        [
            sys.executable,
            "-c",
            RESUME_IN_NEW_PROCESS,
            str(tmp_path / "b"),
            json.dumps(cfg.to_dict()),
            json.dumps(NEW_PROCESS_BUDGET),
        ],
        check=True,
        capture_output=True,
    )
    final = Path("checkpoints") / "global_step_4" / "actor.safetensors"
    a, b = load_file(tmp_path / "a" / final), load_file(tmp_path / "b" / final)
    assert all(torch.equal(a[k], b[k]) for k in a), "parameters differ after a resume [grpo]"

    def rows(out: Path) -> list[dict[str, float]]:
        lines = (out / "metrics.jsonl").read_text().splitlines()
        return without_clock([json.loads(line) for line in lines])

    assert rows(tmp_path / "a") == rows(tmp_path / "b")


@pytest.mark.parametrize("case", ["grpo", "dr_grpo", "ppo"])
def test_micro_batches_do_not_change_the_update(
    case: str, configs: dict[str, ReferenceTrainerConfig], tmp_path: Path
) -> None:
    """Gradient accumulation with the global normalisers equals one micro-batch (verl #5625)."""
    cfg = configs[case]
    # One mini-batch per step: the logged loss and gradient norm are then computed before any
    # optimizer step. With several, Adam's first steps (~ lr * sign(g)) turn float32 rounding
    # of near-zero gradient components into visible parameter differences for later ones.
    cfg = dataclasses.replace(
        cfg, actor=dataclasses.replace(cfg.actor, ppo_mini_batch_size=cfg.data.train_batch_size)
    )
    if cfg.critic is not None:
        cfg = dataclasses.replace(
            cfg,
            critic=dataclasses.replace(cfg.critic, ppo_mini_batch_size=cfg.data.train_batch_size),
        )
    split = dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, micro_batch_size=3))
    if cfg.critic is not None:
        split = dataclasses.replace(
            split, critic=dataclasses.replace(cfg.critic, micro_batch_size=3)
        )
    budget = quick_budget(steps=1)
    whole = train(cfg, tmp_path / "whole", budget).metrics[-1]
    micro = train(split, tmp_path / "micro", budget).metrics[-1]
    keys = ["actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/pg_clipfrac"]
    if cfg.critic is not None:
        keys += ["critic/vf_loss", "critic/grad_norm"]
    # Packed rows depend on the micro-batch, so log-probs differ by float32 rounding (~1e-7);
    # a wrong normaliser would be off by a factor (e.g. 3/8).
    for key in keys:
        assert micro[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-7), (
            f"{key}={micro[key]} with micro-batches of 3, but should be {whole[key]} [{case}]"
        )


def test_rollout_masks_come_from_positions() -> None:
    from reference_trainer.data import load_prompts
    from reference_trainer.generation import SamplingSettings, generate, response_logits
    from reference_trainer.tiny import build_tiny_policy, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    policy = build_tiny_policy(tokenizer, seed=0).eval()
    prompts = load_prompts(split="val")[:6]
    batch = generate(
        policy,
        tokenizer,
        prompts,
        sampling=SamplingSettings(n=4, temperature=1.0, top_k=-1, top_p=1.0),
        max_new_tokens=24,
        generator=torch.Generator().manual_seed(0),
    )
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    assert batch.truncated.any() and not batch.truncated.all(), "want both kinds of rows"
    for row, mask, truncated in zip(
        batch.responses, batch.response_mask, batch.truncated, strict=True
    ):
        length = int(mask.sum())
        assert mask[:length].all() and not mask[length:].any(), "mask must be a prefix"
        assert (row[length:] == pad).all()
        if truncated:
            assert length == row.shape[0] and eos not in row.tolist()
        else:
            # The stop token is inside the mask, and it is the first EOS.
            assert row[length - 1] == eos and eos not in row[: length - 1].tolist()
    # The cached sampler agrees with a full forward pass: greedy picks the full pass's argmax.
    greedy = generate(
        policy,
        tokenizer,
        prompts,
        sampling=SamplingSettings(n=1, temperature=0.0, top_k=-1, top_p=1.0),
        max_new_tokens=12,
        generator=torch.Generator(),
    )
    with torch.no_grad():
        argmax = response_logits(policy, greedy).argmax(-1)
    valid = greedy.response_mask.bool()
    assert torch.equal(argmax[valid], greedy.responses[valid])
