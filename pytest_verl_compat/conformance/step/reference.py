"""Our side of the step oracle: the reference trainer's own step code on the fixed rollouts.

`prepare_models` writes the shared starting point once: the tiny policy (and its tokenizer), a
value model on the same trunk, and one LoRA adapter per adapter setting with non-zero A and B
(so both adapter matrices train and the reference, the adapter switched off, differs from the
policy). Upstream loads the same folders.

`reference_steps` builds the trainer's state the way `ReferenceTrainer.__init__` does (its
`wrap_lora`, `build_critic`, `frozen_reference`, `build_optimizer` and `kl_controller`) and
runs its phases step after step (`ReferenceTrainer.log_probs`, `.advantages`,
`.update_critic`, `.actor_updates_now`, `.update_actor`: the trainer's own methods, on a state
holding only what they read), keeping optimizers, schedulers, the KL controller and the
reference policy across steps; it returns per step the quantities `upstream` returns.
"""

from __future__ import annotations

import dataclasses
import time
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pytest_verl_compat.conformance.step.plan import StepCase, Variant, fixed_rollout
from reference_trainer.batching import Batch
from reference_trainer.config import ModelConfig, OptimConfig, ReferenceTrainerConfig
from reference_trainer.data import Prompt
from reference_trainer.generation import inference_logits
from reference_trainer.math.kl import kl_controller
from reference_trainer.math.logprobs import entropy_from_logits
from reference_trainer.models import (
    build_critic,
    build_optimizer,
    frozen_reference,
    schedule,
    wrap_lora,
)
from reference_trainer.tiny import build_tiny_policy, build_tiny_tokenizer, build_tiny_value_model
from reference_trainer.trainer import ReferenceTrainer

SEED = 0
# Ordinary tokens of the tiny tokenizer: pad, eos, bos and unk come first.
FIRST_TOKEN = 4


def prepare_models(folder: Path, adapters: list[dict[str, Any]]) -> dict[str, Any]:
    """policy/, critic/ and one folder per LoRA adapter under `folder`; the tokens rollouts use."""
    from peft import LoraConfig, get_peft_model

    tokenizer = build_tiny_tokenizer()
    policy = build_tiny_policy(tokenizer, SEED)
    policy.config.architectures = ["Qwen2ForCausalLM"]
    policy.save_pretrained(folder / "policy")
    tokenizer.save_pretrained(folder / "policy")
    critic = build_tiny_value_model(policy.config, SEED + 2)
    critic.load_state_dict(policy.state_dict(), strict=False)  # the same trunk as the policy
    critic.config.architectures = ["Qwen2ForTokenClassification"]
    critic.save_pretrained(folder / "critic")
    tokenizer.save_pretrained(folder / "critic")
    for lora in adapters:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED + 1)
            peft = get_peft_model(
                build_tiny_policy(tokenizer, SEED),
                LoraConfig(
                    r=lora["rank"],
                    lora_alpha=lora["alpha"],
                    target_modules=lora["target_modules"],
                    exclude_modules=lora["exclude_modules"],
                    lora_dropout=0.0,
                    task_type="CAUSAL_LM",
                ),
            )
            for name, param in peft.named_parameters():
                if "lora_B" in name:  # peft starts B at zero; a step from zero trains B only
                    torch.nn.init.normal_(param, std=0.02)
        peft.save_pretrained(folder / lora["adapter"])
    return {"eos": int(tokenizer.eos_token_id), "vocab": [FIRST_TOKEN, len(tokenizer)]}


def step_config(case: StepCase, variant: Variant) -> ReferenceTrainerConfig:
    """The case's lowered config at the oracle's shape and learning rates."""
    cfg, shape = case.config, case.shape

    def role(base: Any, spec: Any, lr: float) -> Any:
        return dataclasses.replace(
            base,
            ppo_mini_batch_size=spec.ppo_mini_batch_size,
            micro_batch_size=spec.micro_batch_size,
            ppo_epochs=spec.ppo_epochs,
            optim=dataclasses.replace(base.optim, lr=lr),
        )

    return dataclasses.replace(
        cfg,
        actor=role(cfg.actor, shape.actor, variant.actor_lr),
        critic=role(cfg.critic, shape.critic, variant.critic_lr) if cfg.critic else None,
        rollout=dataclasses.replace(cfg.rollout, n=shape.n),
        data=dataclasses.replace(cfg.data, train_batch_size=shape.prompts),
    )


def _optimizer(
    model: torch.nn.Module, optim: OptimConfig, variant: Variant, total: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    if variant.optimizer == "AdamW":
        optimizer, scheduler = build_optimizer(model, optim, total)
        if variant.eps is not None:  # upstream's override_optimizer_config (plan.variant_leaves)
            for group in optimizer.param_groups:
                group["eps"] = variant.eps
        return optimizer, scheduler
    # The oracle's SGD: the optimizer is the variant's, the schedule the trainer's.
    params = [p for p in model.parameters() if p.requires_grad]
    sgd = torch.optim.SGD(params, lr=optim.lr, weight_decay=optim.weight_decay)
    return sgd, torch.optim.lr_scheduler.LambdaLR(sgd, schedule(optim, total))


def _batch(rollout: Mapping[str, Any], pad_id: int) -> Batch:
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


def _state(
    cfg: ReferenceTrainerConfig,
    settings: Mapping[str, Any],
    folder: Path,
    variant: Variant,
    total: int,
) -> types.SimpleNamespace:
    """What the trainer's phases read, built as `ReferenceTrainer.__init__` builds it."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from reference_trainer.tiny import ATTENTION

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
        critic = build_critic(ModelConfig(path=str(folder / "critic")), policy.config, SEED)
    state = types.SimpleNamespace(
        cfg=cfg,
        policy=policy,
        lora=lora,
        pad_id=build_tiny_tokenizer().pad_token_id,
        ref=frozen_reference(cfg, policy),
        critic=critic,
        step=0,
        actor_updates=0,
        critic_updates=0,
        kl_controller=kl_controller(cfg.algorithm),
    )
    state.reference_context = lambda: ReferenceTrainer.reference_context(state)  # type: ignore[arg-type]
    state.actor_optimizer, state.actor_scheduler = _optimizer(
        policy, cfg.actor.optim, variant, total
    )
    if critic is not None and cfg.critic is not None:
        state.critic_optimizer, state.critic_scheduler = _optimizer(
            critic, cfg.critic.optim, variant, total
        )
    return state


def reference_steps(
    cfg: ReferenceTrainerConfig,
    settings: Mapping[str, Any],
    folder: Path,
    variant: Variant,
    *,
    eos: int,
    vocab: range,
) -> dict[str, Any]:
    """The reference trainer's consecutive steps on the fixed rollouts; what `upstream` returns.

    The schedules' horizon is the trainer's total steps, else the steps the case runs (V1 sets
    each optimizer's from the trainer's, v1/trainer_base.py:711-729).
    """
    torch.set_num_threads(1)
    total = cfg.trainer.total_training_steps or len(settings["rollouts"])
    state = _state(cfg, settings, folder, variant, total)
    steps = []
    for index, spec in enumerate(settings["rollouts"]):
        state.step = index
        steps.append(_one_step(state, fixed_rollout(vocab, eos, spec)))
    return {"steps": steps}


def _one_step(state: types.SimpleNamespace, rollout: Mapping[str, Any]) -> dict[str, Any]:
    cfg = state.cfg
    batch = _batch(rollout, state.pad_id)
    trainer: Any = ReferenceTrainer  # its methods, called on a state holding what they read
    t = batch.tensors
    passes_started = time.perf_counter()
    pass_metrics = trainer.log_probs(state, batch)
    pass_seconds = time.perf_counter() - passes_started
    with torch.no_grad():  # the per-token entropy, for the comparison only (not timed)
        state.policy.train(False)
        logits = inference_logits(state.policy, batch, state.pad_id)
        entropy = entropy_from_logits(logits, cfg.rollout.temperature)
        del logits
    result: dict[str, Any] = {"old_log_probs": t["old_log_probs"].clone(), "entropy": entropy}
    if "ref_log_prob" in t:
        result["ref_log_prob"] = t["ref_log_prob"].clone()
        offsets = torch.zeros_like(t["ref_log_prob"])
        for i, row in enumerate(rollout["ref_offsets"]):
            offsets[i, : len(row)] = torch.tensor(row)
        t["ref_log_prob"] = t["ref_log_prob"] + offsets
    if "values" in t:
        result["values"] = t["values"].clone()
    advantages_started = time.perf_counter()
    kl_metrics = trainer.advantages(state, batch)
    pass_seconds += time.perf_counter() - advantages_started
    for key in ("token_level_rewards", "advantages", "returns"):
        result[key] = t[key].clone()
    metrics: dict[str, dict[str, float]] = {}
    updates_started = time.perf_counter()
    result["pass_seconds"] = pass_seconds
    if state.critic is not None:
        metrics["critic"] = trainer.update_critic(state, batch)
        result["critic"] = _trainable(state.critic, trainable_only=True)
    metrics["actor"] = {**pass_metrics, **kl_metrics}
    if trainer.actor_updates_now(state):
        metrics["actor"].update(trainer.update_actor(state, batch))
    result["actor"] = _trainable(state.policy, trainable_only=state.lora)
    result["metrics"] = metrics
    result["update_seconds"] = time.perf_counter() - updates_started
    return result
