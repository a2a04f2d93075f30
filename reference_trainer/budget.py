"""The local budget of a CPU run and the adaptations ledger.

`LocalBudget` says what a run on one CPU changes from the upstream 8-GPU configuration;
`adapt()` applies it to a resolved `ReferenceTrainerConfig` and returns, next to the local config,
the ledger of every field it changes or omits, with the upstream value, the local value and the
reason (the trainer writes it to the run's `adaptations.json`). `check_bindings()` fails before
any training on a local binding (model, prompts, reward) that cannot work.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reference_trainer.config import (
    ActorConfig,
    CriticConfig,
    DataConfig,
    ModelConfig,
    OptimConfig,
    ReferenceTrainerConfig,
    TrainerConfig,
)
from reference_trainer.data import PROMPTS_PATH
from reference_trainer.tiny import TINY

REWARDS = ("rule", "length", "reasoning-gym")
TINY_LR = 2e-3


@dataclass(frozen=True)
class LocalBudget:
    """What a CPU run changes from the upstream 8-GPU configuration."""

    steps: int | None = 20
    """Training steps; None keeps upstream's: ``trainer.total_training_steps``, else
    ``total_epochs`` over the local prompts (verl/trainer/ppo/v1/trainer_base.py:710-716)."""
    train_batch_size: int = 8
    """Prompts per step; mini-batches keep upstream's train_batch_size / ppo_mini_batch_size."""
    max_response_length: int = 16
    max_prompt_length: int = 64
    actor_lr: float | None = None
    """None: 2e-3 for the tiny model (at upstream's 1e-6 a 0.3M-parameter model would not move
    in a few dozen steps), upstream's learning rate for a real `model` folder."""
    critic_lr: float | None = None
    n: int | None = None
    """Responses per prompt; None keeps upstream's rollout.n."""
    reward: str = "rule"
    """``rule`` (first integer equals the answer), ``length`` (learning-signal test),
    ``reasoning-gym`` (the task's scorer; prompts from `verl-compat prompts`) or ``model``
    (the reward model folder of ``reward_model_path``)."""
    length_target: int = 4
    """Target response length in tokens (EOS included) of the length reward."""
    reward_model_path: str | None = None
    model: str = TINY
    critic_model: str | None = None
    """Critic initialisation; None: a value head on the tiny trunk (or the policy folder)."""
    prompts_path: str = str(PROMPTS_PATH)
    val_prompts: int = 16
    save_freq: int | None = None
    """None keeps upstream's trainer.save_freq (as verl, no checkpoint when it is not positive)."""
    test_freq: int | None = None
    val_before_train: bool | None = None
    lora_rank: int | None = None
    """None keeps upstream's rank, capped at the tiny model's hidden size."""
    seed: int = 0


@dataclass
class Adaptation:
    field: str
    upstream: Any
    local: Any
    reason: str


class _Ledger:
    """The adaptations in the order they are noted (the order `adaptations.json` lists them)."""

    def __init__(self) -> None:
        self.entries: list[Adaptation] = []

    def note(self, name: str, upstream: Any, local: Any, reason: str) -> Any:
        """`local`, recorded when it differs from `upstream`."""
        if upstream != local:
            self.entries.append(Adaptation(name, upstream, local, reason))
        return local


def adapt(
    cfg: ReferenceTrainerConfig, budget: LocalBudget
) -> tuple[ReferenceTrainerConfig, list[Adaptation]]:
    """The config a CPU run uses and the ledger of every field it changes or omits."""
    ledger = _Ledger()
    tbs = ledger.note(
        "data.train_batch_size", cfg.data.train_batch_size, budget.train_batch_size, "CPU budget"
    )
    actor, n, lora_rank = _actor_and_rollout(cfg, budget, tbs, ledger)
    critic = _critic(cfg, budget, tbs, ledger)
    data = _data(cfg, budget, tbs, ledger)
    trainer = _trainer(cfg, budget, ledger)
    model, critic_model, reward_model_path = _model_paths(cfg, budget, lora_rank, ledger)
    _note_substitutions(cfg, budget, model, ledger)
    # The compiler's lowered leaves: their distributed effect is replaced on one device.
    for path in sorted(cfg.lowered):
        ledger.entries.append(
            Adaptation(
                path,
                cfg.lowered_values.get(path),
                cfg.lowered[path],
                f"lowered by the compiler (profile {cfg.profile})",
            )
        )
    local = dataclasses.replace(
        cfg,
        data=data,
        actor=actor,
        critic=critic,
        rollout=dataclasses.replace(cfg.rollout, n=n),
        model=model,
        critic_model=critic_model,
        reward=dataclasses.replace(cfg.reward, reward_model_path=reward_model_path),
        trainer=trainer,
    )
    return local, ledger.entries


def _scaled_mini_batch(upstream_train: int, upstream_mini: int, local_train: int) -> int:
    ratio = max(1, upstream_train // upstream_mini)
    return max(1, local_train // ratio)


def _optim(
    base: OptimConfig, name: str, lr: float | None, budget: LocalBudget, ledger: _Ledger
) -> OptimConfig:
    if lr is None:
        lr = TINY_LR if budget.model == TINY else base.lr
    reason = "tiny model, few steps" if budget.model == TINY else "local choice"
    return dataclasses.replace(base, lr=ledger.note(f"{name}.lr", base.lr, lr, reason))


def _actor_and_rollout(
    cfg: ReferenceTrainerConfig, budget: LocalBudget, tbs: int, ledger: _Ledger
) -> tuple[ActorConfig, int, int]:
    """The actor's mini-batch and learning rate, rollout.n and the LoRA rank."""
    actor_mini = ledger.note(
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        cfg.actor.ppo_mini_batch_size,
        _scaled_mini_batch(cfg.data.train_batch_size, cfg.actor.ppo_mini_batch_size, tbs),
        "scaled to keep train_batch_size / ppo_mini_batch_size (updates per step)",
    )
    n = ledger.note(
        "actor_rollout_ref.rollout.n", cfg.rollout.n, budget.n or cfg.rollout.n, "CPU budget"
    )
    lora_rank = cfg.model.lora_rank
    if lora_rank > 0:
        lora_rank = ledger.note(
            "actor_rollout_ref.model.lora_rank",
            lora_rank,
            budget.lora_rank or min(lora_rank, 32),
            "tiny model hidden size is 96",
        )
    actor = dataclasses.replace(
        cfg.actor,
        ppo_mini_batch_size=actor_mini,
        optim=_optim(
            cfg.actor.optim, "actor_rollout_ref.actor.optim", budget.actor_lr, budget, ledger
        ),
    )
    return actor, n, lora_rank


def _critic(
    cfg: ReferenceTrainerConfig, budget: LocalBudget, tbs: int, ledger: _Ledger
) -> CriticConfig | None:
    critic = cfg.critic
    if critic is None:
        return None
    return dataclasses.replace(
        critic,
        ppo_mini_batch_size=ledger.note(
            "critic.ppo_mini_batch_size",
            critic.ppo_mini_batch_size,
            _scaled_mini_batch(cfg.data.train_batch_size, critic.ppo_mini_batch_size, tbs),
            "scaled to keep train_batch_size / ppo_mini_batch_size",
        ),
        optim=_optim(critic.optim, "critic.optim", budget.critic_lr, budget, ledger),
    )


def _data(
    cfg: ReferenceTrainerConfig, budget: LocalBudget, tbs: int, ledger: _Ledger
) -> DataConfig:
    return dataclasses.replace(
        cfg.data,
        train_batch_size=tbs,
        max_response_length=ledger.note(
            "data.max_response_length",
            cfg.data.max_response_length,
            budget.max_response_length,
            "CPU budget",
        ),
        max_prompt_length=ledger.note(
            "data.max_prompt_length",
            cfg.data.max_prompt_length,
            budget.max_prompt_length,
            "the shipped prompts are short",
        ),
    )


def _trainer(cfg: ReferenceTrainerConfig, budget: LocalBudget, ledger: _Ledger) -> TrainerConfig:
    """The step budget, and the checkpoint and validation schedule requested locally."""
    upstream = cfg.trainer
    total_training_steps, total_epochs = upstream.total_training_steps, upstream.total_epochs
    if budget.steps is not None:
        total_training_steps = ledger.note(
            "trainer.total_training_steps",
            upstream.total_training_steps,
            budget.steps,
            f"CPU budget (upstream: {upstream.total_epochs} epochs over the full data set)",
        )
        # verl's loop also ends with the last epoch (v1/trainer_base.py:443); an epoch has at
        # least one step, so as many epochs as steps never end the budgeted run first.
        total_epochs = ledger.note(
            "trainer.total_epochs",
            upstream.total_epochs,
            max(upstream.total_epochs, budget.steps),
            "the CPU budget's steps decide the run's length",
        )
    return dataclasses.replace(
        upstream,
        total_training_steps=total_training_steps,
        total_epochs=total_epochs,
        save_freq=ledger.note(
            "trainer.save_freq",
            upstream.save_freq,
            upstream.save_freq if budget.save_freq is None else budget.save_freq,
            "requested locally",
        ),
        test_freq=ledger.note(
            "trainer.test_freq",
            upstream.test_freq,
            upstream.test_freq if budget.test_freq is None else budget.test_freq,
            "requested locally",
        ),
        val_before_train=ledger.note(
            "trainer.val_before_train",
            upstream.val_before_train,
            upstream.val_before_train
            if budget.val_before_train is None
            else budget.val_before_train,
            "requested locally",
        ),
    )


def _model_paths(
    cfg: ReferenceTrainerConfig, budget: LocalBudget, lora_rank: int, ledger: _Ledger
) -> tuple[ModelConfig, ModelConfig | None, str | None]:
    """Local folders (or the tiny model) for the policy, the critic and the reward model."""
    lora_alpha = cfg.model.lora_alpha
    if lora_rank != cfg.model.lora_rank and cfg.model.lora_rank > 0:
        # peft scales the adapter's output by lora_alpha / r: keep that scale when r shrinks.
        scaled = cfg.model.lora_alpha * lora_rank / cfg.model.lora_rank
        lora_alpha = ledger.note(
            "actor_rollout_ref.model.lora_alpha",
            cfg.model.lora_alpha,
            int(scaled) if float(scaled).is_integer() else scaled,
            "scaled with lora_rank to keep the adapter's scale lora_alpha / lora_rank",
        )
    model = dataclasses.replace(
        cfg.model,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        path=ledger.note(
            "actor_rollout_ref.model.path", cfg.model.path, budget.model, "no hub; local model"
        ),
    )
    critic_model = cfg.critic_model
    if critic_model is not None:
        critic_model = dataclasses.replace(
            critic_model,
            path=ledger.note(
                "critic.model.path",
                critic_model.path,
                budget.critic_model or budget.model,
                "no hub; value head on the local model",
            ),
        )
    reward_model_path = cfg.reward.reward_model_path
    if cfg.reward.reward_model_enable:
        reward_model_path = ledger.note(
            "reward.reward_model.model_path",
            reward_model_path,
            budget.reward_model_path,
            "no hub; locally trained reward model",
        )
    return model, critic_model, reward_model_path


def _note_substitutions(
    cfg: ReferenceTrainerConfig, budget: LocalBudget, model: ModelConfig, ledger: _Ledger
) -> None:
    """Ledger-only entries: what the run uses instead of upstream's reward, data and hardware."""
    reward_kind = "model" if cfg.reward.reward_model_enable else budget.reward
    ledger.note(
        "reward.reward_manager",
        cfg.reward.reward_manager,
        f"{cfg.reward.reward_manager}/{reward_kind}",
        {
            "model": "a local sequence-classification reward model",
            "rule": "first integer equals the answer",
            "length": f"stop at {budget.length_target} tokens",
            "reasoning-gym": "the reasoning-gym task's own answer scorer",
        }.get(reward_kind, reward_kind),
    )
    ledger.note(
        "data.train_files",
        "gsm8k/math parquet (launch script)",
        budget.prompts_path,
        "shipped arithmetic and word problems"
        if budget.prompts_path == str(PROMPTS_PATH)
        else "local prompt file",
    )
    ledger.note(
        "data.val_files",
        "upstream test split",
        f"{budget.val_prompts} held-out prompts",
        "CPU budget",
    )
    ledger.note(
        "trainer.n_gpus_per_node",
        "8 GPUs, vLLM rollout, FSDP, bf16",
        "1 CPU thread, KV-cache sampling loop, float32",
        "hardware",
    )
    if model.enable_gradient_checkpointing:
        ledger.note(
            "actor_rollout_ref.model.enable_gradient_checkpointing",
            True,
            False,
            "no memory pressure at this size",
        )


def check_bindings(cfg: ReferenceTrainerConfig, budget: LocalBudget) -> None:
    """Fail before any training on a binding that cannot work, naming the field.

    `cfg` is the local config (`adapt()`'s result).
    """
    if cfg.model.path != TINY and not (Path(cfg.model.path) / "config.json").is_file():
        raise FileNotFoundError(
            f"actor_rollout_ref.model.path: {cfg.model.path!r} is "
            "not a local model folder (no config.json)"
        )
    if not Path(budget.prompts_path).is_file():
        raise FileNotFoundError(
            f"data.train_files: prompt file {budget.prompts_path!r} does not exist"
        )
    if cfg.reward.reward_model_enable:
        path = cfg.reward.reward_model_path
        if not path or not (Path(path) / "config.json").is_file():
            raise FileNotFoundError(
                f"reward.reward_model.model_path: {path!r} is not a "
                "local reward model folder (no config.json); pass one with "
                "`verl-compat train --reward-model DIR` (`--reward-model tiny` trains one)"
            )
    elif budget.reward not in REWARDS:
        raise ValueError(f"reward: unknown {budget.reward!r}; valid: {', '.join(REWARDS)}")
    if (
        cfg.critic_model is not None
        and budget.critic_model is not None
        and not (Path(budget.critic_model) / "config.json").is_file()
    ):
        raise FileNotFoundError(
            f"critic.model.path: {budget.critic_model!r} is not a local model folder"
        )
