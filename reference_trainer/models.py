"""The trainable parts of a run: the LoRA-wrapped policy, the critic, and their optimizers.

Each draws any random initialisation from its own seed (seed + 1 for LoRA, seed + 2 for the
critic) under a forked global generator, so building them never shifts another stream.
`schedule` is verl's learning-rate multiplier, stepped once per training step.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from reference_trainer.config import ModelConfig, OptimConfig, ReferenceTrainerConfig
from reference_trainer.tiny import (
    ATTENTION,
    FROM_PRETRAINED_SAFELY,
    TINY,
    build_tiny_value_model,
    refuse_pickled_weights,
)


def wrap_lora(model: torch.nn.Module, spec: ModelConfig, seed: int) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    targets = spec.target_modules
    lora = LoraConfig(
        r=spec.lora_rank,
        lora_alpha=spec.lora_alpha,
        target_modules=targets if isinstance(targets, str) else list(targets),
        exclude_modules=(
            spec.exclude_modules
            if isinstance(spec.exclude_modules, str | None)
            else list(spec.exclude_modules)
        ),
        lora_dropout=0.0,
    )
    with torch.random.fork_rng(devices=[]):
        # LoRA's A matrices are drawn from the global generator: seed it, then restore it.
        torch.manual_seed(seed + 1)
        return get_peft_model(model, lora)


def frozen_reference(
    cfg: ReferenceTrainerConfig, policy: torch.nn.Module
) -> torch.nn.Module | None:
    """The reference policy of full fine-tuning: a frozen copy of the starting policy. None
    without a reference, and with LoRA, whose reference is the policy with its adapter off."""
    if not cfg.use_reference_policy or cfg.model.lora_rank > 0:
        return None
    return copy.deepcopy(policy).eval().requires_grad_(False)


def build_critic(critic_model: ModelConfig | None, base_config: Any, seed: int) -> torch.nn.Module:
    """A value head on the tiny trunk (`base_config`: the policy's), or a local HF folder's."""
    path = critic_model.path if critic_model else TINY
    if path == TINY:
        return build_tiny_value_model(base_config, seed + 2)
    from transformers import AutoModelForTokenClassification

    refuse_pickled_weights(Path(path), "critic.model.path")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 2)
        return AutoModelForTokenClassification.from_pretrained(
            path,
            num_labels=1,
            classifier_dropout=0.0,
            **FROM_PRETRAINED_SAFELY,
            attn_implementation=ATTENTION,
            dtype=torch.float32,
        )


def build_optimizer(
    model: torch.nn.Module, optim: OptimConfig, total: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    params = [p for p in model.parameters() if p.requires_grad]
    # fused: one kernel for all parameters instead of a Python loop of small ops per tensor.
    optimizer = torch.optim.AdamW(
        params, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay, fused=True
    )
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(optim, total))


def schedule(optim: OptimConfig, total_steps: int) -> Callable[[int], float]:
    """verl's warm-up then constant or cosine multiplier, per training step.

    As verl/workers/engine/fsdp/transformer_impl.py:495-497: `lr_warmup_steps <= 0` (0 included)
    takes the warm-up from the ratio; the cosine schedule shifts its step by one when
    `zero_indexed_step` is false (verl/utils/torch_functional.py:757-758), the constant one never.
    """
    warmup = (
        optim.lr_warmup_steps
        if optim.lr_warmup_steps > 0
        else int(optim.lr_warmup_steps_ratio * total_steps)
    )

    def factor(step: int) -> float:
        if optim.lr_scheduler_type == "cosine" and not optim.zero_indexed_step:
            step += 1
        if step < warmup:
            return step / max(1, warmup)
        if optim.lr_scheduler_type == "constant":
            return 1.0
        if optim.lr_scheduler_type != "cosine":
            raise ValueError(
                f"optim.lr_scheduler_type: unknown {optim.lr_scheduler_type!r}; "
                "valid: constant, cosine"
            )
        progress = (step - warmup) / max(1, total_steps - warmup)
        cosine = 0.5 * (1.0 + math.cos(math.pi * optim.num_cycles * 2.0 * progress))
        return max(0.0, cosine) * (1.0 - optim.min_lr_ratio) + optim.min_lr_ratio

    return factor
