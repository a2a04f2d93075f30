"""Our side of the step oracle: the reference trainer's own step code on the fixed rollout.

`prepare_models` writes the shared starting point once: the tiny policy (and its tokenizer), a
value model on the same trunk, and a LoRA adapter with non-zero A and B (so both adapter
matrices train and the reference — the adapter switched off — differs from the policy). Upstream
loads the same folders.

`reference_step` runs the reference trainer's phases (`ReferenceTrainer.log_probs`,
`.advantages`, `.update_critic`, `.update_actor`: the trainer's own methods, on a state holding
only what they read) with the case's config at the small shape, and returns the same
quantities as `step_upstream`.
"""

from __future__ import annotations

import dataclasses
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pytest_verl_compat.conformance.step_plan import SHAPE, fixed_rollout
from reference_trainer.batching import Batch
from reference_trainer.config import OptimConfig, ReferenceTrainerConfig
from reference_trainer.data import Prompt
from reference_trainer.math.kl import FixedKLController
from reference_trainer.math.logprobs import entropy_from_logits
from reference_trainer.models import build_optimizer, schedule, wrap_lora
from reference_trainer.tiny import build_tiny_policy, build_tiny_tokenizer, build_tiny_value_model
from reference_trainer.trainer import ReferenceTrainer

SEED = 0
# Ordinary tokens of the tiny tokenizer: pad, eos, bos and unk come first.
FIRST_TOKEN = 4


def prepare_models(folder: Path, adapters: list[dict[str, Any]]) -> dict[str, Any]:
    """policy/, critic/ and one folder per LoRA adapter under `folder`; the fixed rollout."""
    from peft import LoraConfig, get_peft_model

    tokenizer = build_tiny_tokenizer()
    policy = build_tiny_policy(tokenizer, SEED)
    policy.config.architectures = ["Qwen2ForCausalLM"]
    policy.save_pretrained(folder / "policy")
    tokenizer.save_pretrained(folder / "policy")
    critic = build_tiny_value_model(policy.config, SEED + 2)  # type: ignore[arg-type]
    critic.load_state_dict(policy.state_dict(), strict=False)  # the same trunk as the policy
    critic.config.architectures = ["Qwen2ForTokenClassification"]
    critic.save_pretrained(folder / "critic")
    tokenizer.save_pretrained(folder / "critic")
    for lora in adapters:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED + 1)
            targets = lora["target_modules"]
            peft = get_peft_model(
                build_tiny_policy(tokenizer, SEED),
                LoraConfig(
                    r=lora["rank"],
                    lora_alpha=lora["alpha"],
                    target_modules=targets,
                    lora_dropout=0.0,
                    task_type="CAUSAL_LM",
                ),
            )
            for name, param in peft.named_parameters():
                if "lora_B" in name:  # peft starts B at zero; a step from zero trains B only
                    torch.nn.init.normal_(param, std=0.02)
        peft.save_pretrained(folder / lora["adapter"])
    vocab = range(FIRST_TOKEN, len(tokenizer))
    return fixed_rollout(vocab, int(tokenizer.eos_token_id))


def step_config(cfg: ReferenceTrainerConfig, settings: dict[str, Any]) -> ReferenceTrainerConfig:
    """The case's lowered config at the oracle's shape and optimizer settings."""

    def optim(base: OptimConfig, o: dict[str, Any]) -> OptimConfig:
        return dataclasses.replace(base, lr=o["lr"], grad_clip=o["clip_grad"])

    a = settings["actor"]
    actor = dataclasses.replace(
        cfg.actor,
        ppo_mini_batch_size=a["ppo_mini_batch_size"],
        micro_batch_size=a["micro_batch_size"],
        ppo_epochs=a["ppo_epochs"],
        optim=optim(cfg.actor.optim, a["optim"]),
    )
    critic = None
    if cfg.critic is not None:
        c = settings["critic"]
        critic = dataclasses.replace(
            cfg.critic,
            ppo_mini_batch_size=c["ppo_mini_batch_size"],
            micro_batch_size=c["micro_batch_size"],
            ppo_epochs=c["ppo_epochs"],
            optim=optim(cfg.critic.optim, c["optim"]),
        )
    return dataclasses.replace(
        cfg,
        actor=actor,
        critic=critic,
        rollout=dataclasses.replace(cfg.rollout, n=settings["n"]),
        data=dataclasses.replace(cfg.data, train_batch_size=SHAPE["prompts"]),
    )


def _optimizer(
    model: torch.nn.Module, optim: OptimConfig, o: dict[str, Any]
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    if o["name"] == "AdamW":
        return build_optimizer(model, optim, 1)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=optim.lr, weight_decay=optim.weight_decay)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(optim, 1))


def _batch(rollout: dict[str, Any], pad_id: int) -> Batch:
    prompts, responses = rollout["prompts"], rollout["responses"]
    rows = len(prompts)
    plen = max(len(p) for p in prompts)
    rlen = max(len(r) for r in responses)
    prompt_ids = torch.full((rows, plen), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((rows, plen), dtype=torch.long)
    response_ids = torch.full((rows, rlen), pad_id, dtype=torch.long)
    response_mask = torch.zeros((rows, rlen))
    scores = torch.zeros((rows, rlen))
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        prompt_ids[i, plen - len(p) :] = torch.tensor(p)
        prompt_mask[i, plen - len(p) :] = 1
        response_ids[i, : len(r)] = torch.tensor(r)
        response_mask[i, : len(r)] = 1
        scores[i, len(r) - 1] = rollout["scores"][i]
    batch = Batch(
        prompt_ids,
        prompt_mask,
        response_ids,
        response_mask,
        torch.zeros(rows, dtype=torch.bool),
        np.array(rollout["uids"]),
        [Prompt(uid, "", "", "train") for uid in rollout["uids"]],
    )
    batch.tensors["token_level_scores"] = scores
    return batch


def _trainable(model: torch.nn.Module, trainable_only: bool) -> dict[str, torch.Tensor]:
    if trainable_only:
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def reference_step(
    cfg: ReferenceTrainerConfig, settings: dict[str, Any], folder: Path, rollout: dict[str, Any]
) -> dict[str, Any]:
    """One training step of the reference trainer on the fixed rollout; what `step_upstream` returns."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    from reference_trainer.tiny import ATTENTION

    torch.set_num_threads(1)
    cfg = step_config(cfg, settings)
    tokenizer = build_tiny_tokenizer()
    policy: torch.nn.Module = AutoModelForCausalLM.from_pretrained(
        folder / "policy", attn_implementation=ATTENTION, dtype=torch.float32
    )
    lora = cfg.model.lora_rank > 0
    if lora:
        policy = wrap_lora(policy, cfg.model, SEED)
        set_peft_model_state_dict(
            policy, load_file(folder / settings["lora"]["adapter"] / "adapter_model.safetensors")
        )
    critic = None
    if cfg.critic is not None:
        critic = AutoModelForTokenClassification.from_pretrained(
            folder / "critic", attn_implementation=ATTENTION, dtype=torch.float32
        )
    state = types.SimpleNamespace(
        cfg=cfg,
        policy=policy,
        lora=lora,
        pad_id=tokenizer.pad_token_id,
        ref=None,
        critic=critic,
        step=0,
        actor_updates=0,
        critic_updates=0,
        kl_controller=FixedKLController(cfg.algorithm.kl_coef),
    )
    if cfg.use_reference_policy and not lora:
        import copy

        state.ref = copy.deepcopy(policy).train(False).requires_grad_(False)
    state.reference_context = lambda: ReferenceTrainer.reference_context(state)  # type: ignore[arg-type]
    state.actor_optimizer, state.actor_scheduler = _optimizer(
        policy, cfg.actor.optim, settings["actor"]["optim"]
    )
    if critic is not None and cfg.critic is not None:
        state.critic_optimizer, state.critic_scheduler = _optimizer(
            critic, cfg.critic.optim, settings["critic"]["optim"]
        )
    batch = _batch(rollout, tokenizer.pad_token_id)
    t = batch.tensors
    passes_started = time.perf_counter()
    pass_metrics = ReferenceTrainer.log_probs(state, batch)  # type: ignore[arg-type]
    pass_seconds = time.perf_counter() - passes_started
    with torch.no_grad():  # the per-token entropy, for the comparison only (not timed)
        policy.train(False)
        from reference_trainer.generation import inference_logits

        logits = inference_logits(policy, batch, state.pad_id)
        entropy = entropy_from_logits(logits, cfg.rollout.temperature)
        del logits
    result: dict[str, Any] = {
        "old_log_probs": t["old_log_probs"].clone(),
        "entropy": entropy,
    }
    if "ref_log_prob" in t:
        result["ref_log_prob"] = t["ref_log_prob"].clone()
        offsets = torch.zeros_like(t["ref_log_prob"])
        for i, row in enumerate(rollout["ref_offsets"]):
            offsets[i, : len(row)] = torch.tensor(row)
        t["ref_log_prob"] = t["ref_log_prob"] + offsets
    if "values" in t:
        result["values"] = t["values"].clone()
    advantages_started = time.perf_counter()
    ReferenceTrainer.advantages(state, batch)  # type: ignore[arg-type]
    pass_seconds += time.perf_counter() - advantages_started
    for key in ("token_level_rewards", "advantages", "returns"):
        result[key] = t[key].clone()
    metrics: dict[str, dict[str, float]] = {}
    updates_started = time.perf_counter()
    result["pass_seconds"] = pass_seconds
    if critic is not None:
        metrics["critic"] = ReferenceTrainer.update_critic(state, batch)  # type: ignore[arg-type]
        result["critic"] = _trainable(critic, trainable_only=True)
    metrics["actor"] = {
        **ReferenceTrainer.update_actor(state, batch),  # type: ignore[arg-type]
        **pass_metrics,
    }
    result["actor"] = _trainable(policy, trainable_only=lora)
    result["metrics"] = metrics
    result["update_seconds"] = time.perf_counter() - updates_started
    return result
