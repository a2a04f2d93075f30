"""Lowering: an accepted case's resolved verl mapping to the reference trainer's typed configuration.

Lowering takes the compile report, not only the mapping: a case the compiler rejected never
becomes a trainer configuration (the compile gate).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_verl_compat.checks.roles import need_critic
from pytest_verl_compat.model import CompileReport
from reference_trainer.config import (
    ActorConfig,
    AlgorithmConfig,
    CriticConfig,
    DataConfig,
    ModelConfig,
    OptimConfig,
    ReferenceTrainerConfig,
    RewardConfig,
    RolloutConfig,
    TrainerConfig,
)


def _optim(raw: Mapping[str, Any]) -> OptimConfig:
    return OptimConfig(
        lr=float(raw["lr"]),
        weight_decay=float(raw["weight_decay"]),
        betas=(float(raw["betas"][0]), float(raw["betas"][1])),
        # verl 0.9.0's engine clips at optim.clip_grad (verl/workers/engine/fsdp/
        # transformer_impl.py:777-782) and never reads actor.grad_clip / critic.grad_clip; only
        # a deprecated optim.grad_clip overrides it (verl/workers/config/optimizer.py:59-61).
        grad_clip=float(raw["grad_clip"] if raw.get("grad_clip") is not None else raw["clip_grad"]),
        lr_warmup_steps=int(raw["lr_warmup_steps"]),
        lr_warmup_steps_ratio=float(raw["lr_warmup_steps_ratio"]),
        lr_scheduler_type=str(raw["lr_scheduler_type"]),
        min_lr_ratio=float(raw["min_lr_ratio"]),
        num_cycles=float(raw["num_cycles"]),
        zero_indexed_step=bool(raw.get("zero_indexed_step", True)),
    )


def _model(raw: Mapping[str, Any]) -> ModelConfig:
    targets = raw.get("target_modules", "all-linear")
    excluded = raw.get("exclude_modules")
    return ModelConfig(
        path=str(raw["path"]),
        lora_rank=int(raw.get("lora_rank", 0) or 0),
        lora_alpha=int(raw.get("lora_alpha", 16)),
        target_modules=tuple(targets) if isinstance(targets, list) else targets,
        exclude_modules=tuple(excluded) if isinstance(excluded, list) else excluded,
        enable_gradient_checkpointing=bool(raw.get("enable_gradient_checkpointing", False)),
    )


def _micro_batch(raw: Mapping[str, Any], key: str) -> int | None:
    # Per-GPU micro-batches are already local; a dynamic token budget packs a variable count,
    # which the reference trainer lowers to one micro-batch per mini-batch (the gradient is the
    # same because the loss is normalised globally).
    value = raw.get(key)
    return None if raw.get("use_dynamic_bsz") else (int(value) if value else None)


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _ckpt_to_keep(trainer: Mapping[str, Any], key: str) -> int | None:
    """How many checkpoints keep a role's part: 1 under the deprecated
    remove_previous_ckpt_in_save (verl/trainer/ppo/v1/trainer_base.py:893-905); a value that is
    not a positive int keeps all (verl/utils/checkpoint/checkpoint_manager.py:189)."""
    if trainer.get("remove_previous_ckpt_in_save", False):
        return 1
    value = trainer.get(key)
    return int(value) if isinstance(value, int) and value > 0 else None


class NotAccepted(ValueError):
    """Lowering was asked for a case the compiler did not accept."""


def reference_config(resolved: Mapping[str, Any], report: CompileReport) -> ReferenceTrainerConfig:
    """Build the typed config of an accepted case; the compiler has understood every leaf it reads."""
    if not report.accepted:
        raise NotAccepted(
            f"[{report.case_id}] rejected by profile {report.profile}: {report.reason}"
        )
    case_id, profile = report.case_id, report.profile
    bindings, lowered = tuple(report.bindings), report.lowered
    arr = resolved["actor_rollout_ref"]
    actor, rollout, algo = arr["actor"], arr["rollout"], resolved["algorithm"]
    data, trainer, reward = resolved["data"], resolved["trainer"], resolved["reward"]
    uses_critic = need_critic(resolved)
    critic = resolved["critic"]
    val = rollout["val_kwargs"]
    return ReferenceTrainerConfig(
        case_id=case_id,
        profile=profile,
        algorithm=AlgorithmConfig(
            adv_estimator=str(algo["adv_estimator"]),
            gamma=float(algo["gamma"]),
            lam=float(algo["lam"]),
            norm_adv_by_std_in_grpo=bool(algo["norm_adv_by_std_in_grpo"]),
            use_kl_in_reward=bool(algo["use_kl_in_reward"]),
            kl_penalty=str(algo["kl_penalty"]),
            kl_ctrl_type=str(algo["kl_ctrl"]["type"]),
            kl_coef=float(algo["kl_ctrl"]["kl_coef"]),
            kl_horizon=int(algo["kl_ctrl"]["horizon"]),
            kl_target=float(algo["kl_ctrl"]["target_kl"]),
            filter_groups_enable=bool(algo["filter_groups"]["enable"]),
            filter_groups_metric=algo["filter_groups"]["metric"],
            max_num_gen_batches=int(algo["filter_groups"]["max_num_gen_batches"]),
        ),
        data=DataConfig(
            train_batch_size=int(data["train_batch_size"]),
            max_prompt_length=int(data["max_prompt_length"]),
            max_response_length=int(data["max_response_length"]),
            shuffle=bool(data["shuffle"]),
            seed=data["seed"],
            truncation=str(data["truncation"]),
            filter_overlong_prompts=bool(data["filter_overlong_prompts"]),
            val_batch_size=data["val_batch_size"],
        ),
        actor=ActorConfig(
            optim=_optim(actor["optim"]),
            ppo_mini_batch_size=int(actor["ppo_mini_batch_size"]),
            ppo_epochs=int(actor["ppo_epochs"]),
            micro_batch_size=_micro_batch(actor, "ppo_micro_batch_size_per_gpu"),
            clip_ratio=float(actor["clip_ratio"]),
            # A null bound is clip_ratio (verl/trainer/ppo/core_algos.py:1321-1322).
            clip_ratio_low=_optional_float(actor["clip_ratio_low"]),
            clip_ratio_high=_optional_float(actor["clip_ratio_high"]),
            clip_ratio_c=float(actor["clip_ratio_c"]),
            policy_loss_mode=str(actor["policy_loss"]["loss_mode"]),
            loss_agg_mode=str(actor["loss_agg_mode"]),
            loss_scale_factor=actor["loss_scale_factor"],
            entropy_coeff=float(actor["entropy_coeff"]),
            use_kl_loss=bool(actor["use_kl_loss"]),
            kl_loss_coef=float(actor["kl_loss_coef"]),
            kl_loss_type=str(actor["kl_loss_type"]),
            shuffle=bool(actor["shuffle"]),
            data_loader_seed=int(actor["data_loader_seed"]),
        ),
        rollout=RolloutConfig(
            n=int(rollout["n"]),
            temperature=float(rollout["temperature"]),
            top_k=int(rollout["top_k"]),
            top_p=float(rollout["top_p"]),
            do_sample=bool(rollout["do_sample"]),
            val_n=int(val["n"]),
            val_temperature=float(val["temperature"]),
            val_top_k=int(val["top_k"]),
            val_top_p=float(val["top_p"]),
            val_do_sample=bool(val["do_sample"]),
        ),
        model=_model(arr["model"]),
        reward=RewardConfig(
            reward_manager=str(reward["reward_manager"]["name"]),
            reward_model_enable=bool(reward["reward_model"]["enable"]),
            reward_model_path=reward["reward_model"]["model_path"],
            custom_reward_function_path=reward["custom_reward_function"]["path"],
            custom_reward_function_name=str(reward["custom_reward_function"]["name"]),
        ),
        trainer=TrainerConfig(
            total_epochs=int(trainer["total_epochs"]),
            total_training_steps=trainer["total_training_steps"],
            save_freq=int(trainer["save_freq"]),
            test_freq=int(trainer["test_freq"]),
            val_before_train=bool(trainer["val_before_train"]),
            resume_mode=str(trainer["resume_mode"]),
            resume_from_path=trainer["resume_from_path"],
            max_actor_ckpt_to_keep=_ckpt_to_keep(trainer, "max_actor_ckpt_to_keep"),
            max_critic_ckpt_to_keep=_ckpt_to_keep(trainer, "max_critic_ckpt_to_keep"),
            project_name=str(trainer["project_name"]),
            experiment_name=str(trainer["experiment_name"]),
            balance_batch=bool(trainer["balance_batch"]),
            # verl's Tracking takes one name or a list (verl/utils/tracking.py:62-63).
            logger=(
                (str(trainer["logger"]),)
                if isinstance(trainer["logger"], str)
                else tuple(str(name) for name in trainer["logger"] or ())
            ),
        ),
        critic=CriticConfig(
            optim=_optim(critic["optim"]),
            ppo_mini_batch_size=int(critic["ppo_mini_batch_size"]),
            ppo_epochs=int(critic["ppo_epochs"]),
            micro_batch_size=_micro_batch(critic, "ppo_micro_batch_size_per_gpu"),
            cliprange_value=float(critic["cliprange_value"]),
            loss_agg_mode=str(critic["loss_agg_mode"]),
            loss_scale_factor=critic["loss_scale_factor"],
            shuffle=bool(critic["shuffle"]),
            data_loader_seed=int(critic["data_loader_seed"]),
            warmup_steps=int(trainer["critic_warmup"]),
        )
        if uses_critic
        else None,
        critic_model=_model(critic["model"]) if uses_critic else None,
        use_reference_policy=bool(actor["use_kl_loss"] or algo["use_kl_in_reward"]),
        bindings=bindings,
        lowered=dict(lowered),
        lowered_values={leaf.path: leaf.value for leaf in report.leaves if leaf.klass == "lowered"},
    )
