"""The reference trainer's typed configuration, produced by the compiler from a resolved verl config.

Every field names the verl key it comes from. Units follow upstream exactly: batch sizes
marked "prompts" count prompts and expand by ``rollout.n`` into trajectories, as upstream's
``_update_actor`` / ``_update_critic`` do.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class OptimConfig:
    """AdamW and its schedule (``actor_rollout_ref.actor.optim.*`` or ``critic.optim.*``)."""

    lr: float
    """Peak learning rate (``optim.lr``)."""
    weight_decay: float = 0.01
    """Decoupled weight decay (``optim.weight_decay``)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam betas (``optim.betas``)."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (``optim.clip_grad``; verl's engine never reads ``actor.grad_clip``)."""
    lr_warmup_steps: int = -1
    """Warm-up steps; ``<= 0`` means use the ratio, as verl's engine does (``optim.lr_warmup_steps``)."""
    lr_warmup_steps_ratio: float = 0.0
    """Warm-up as a share of total training steps (``optim.lr_warmup_steps_ratio``)."""
    lr_scheduler_type: str = "constant"
    """``constant`` or ``cosine`` after warm-up (``optim.lr_scheduler_type``)."""
    min_lr_ratio: float = 0.0
    """Floor of the cosine schedule as a share of ``lr`` (``optim.min_lr_ratio``)."""
    num_cycles: float = 0.5
    """Cosine cycles (``optim.num_cycles``)."""
    zero_indexed_step: bool = True
    """Cosine schedule counts steps from 0; ``False`` shifts it by one (``optim.zero_indexed_step``)."""


@dataclass(frozen=True)
class ActorConfig:
    """Policy update (``actor_rollout_ref.actor.*``)."""

    optim: OptimConfig
    ppo_mini_batch_size: int
    """Prompts per mini-batch; trajectories per mini-batch = this × ``rollout.n``."""
    ppo_epochs: int = 1
    """Passes over the rollout batch per training step (``actor.ppo_epochs``)."""
    micro_batch_size: int | None = None
    """Trajectories per gradient-accumulation micro-batch on one device (lowered from
    ``ppo_micro_batch_size_per_gpu`` or the dynamic token budget); ``None`` means one micro-batch."""
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = 0.2
    """Lower bound of the ratio's clip; None means ``clip_ratio`` (as verl's vanilla loss)."""
    clip_ratio_high: float | None = 0.2
    """Upper bound of the ratio's clip; None means ``clip_ratio``."""
    clip_ratio_c: float = 3.0
    """Dual-clip bound for negative advantages (``actor.clip_ratio_c``)."""
    policy_loss_mode: str = "vanilla"
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: float | None = None
    """Constant divisor of ``seq-mean-token-sum-norm`` (``actor.loss_scale_factor``)."""
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    shuffle: bool = False
    """Shuffle trajectories before splitting into mini-batches (``actor.shuffle``)."""
    data_loader_seed: int = 42


@dataclass(frozen=True)
class CriticConfig:
    """Value model update (``critic.*``); only present for GAE."""

    optim: OptimConfig
    ppo_mini_batch_size: int
    """Prompts per mini-batch, expanded by ``rollout.n`` like the actor's."""
    ppo_epochs: int = 1
    micro_batch_size: int | None = None
    cliprange_value: float = 0.5
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: float | None = None
    shuffle: bool = False
    data_loader_seed: int = 42
    warmup_steps: int = 0
    """Training steps that update only the critic (``trainer.critic_warmup``)."""


@dataclass(frozen=True)
class RolloutConfig:
    """Sampling (``actor_rollout_ref.rollout.*``)."""

    n: int = 1
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    do_sample: bool = True
    """Only the exported model's generation config reads it (`run_files`): verl's V1 agent loop
    never sends it to the server (`generation.sampling_settings`)."""
    val_n: int = 1
    val_temperature: float = 0.0
    val_top_k: int = -1
    val_top_p: float = 1.0
    val_do_sample: bool = False
    """Never read in sampling, as verl's V1 agent loop never reads it; verl's validate_config
    reads it (verl/utils/config.py:185-188)."""


@dataclass(frozen=True)
class AlgorithmConfig:
    """Advantage estimation and KL in reward (``algorithm.*``)."""

    adv_estimator: str
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl_type: str = "fixed"
    kl_coef: float = 0.001
    kl_horizon: int = 10000
    kl_target: float = 0.1
    filter_groups_enable: bool = False
    filter_groups_metric: str | None = None
    """Per-trajectory metric whose variance within a group must be non-zero; the trajectories
    here carry only ``acc`` (`batching.group_filter_metric`)."""
    max_num_gen_batches: int = 0
    """Generation batches allowed to refill filtered groups; 0 means unlimited."""


@dataclass(frozen=True)
class DataConfig:
    """Prompts (``data.*``)."""

    train_batch_size: int
    """Prompts per training step."""
    max_prompt_length: int = 512
    max_response_length: int = 512
    shuffle: bool = True
    seed: int | None = None
    truncation: str = "error"
    filter_overlong_prompts: bool = False
    val_batch_size: int | None = None


@dataclass(frozen=True)
class ModelConfig:
    """Policy model (``actor_rollout_ref.model.*``) or critic model (``critic.model.*``)."""

    path: str
    lora_rank: int = 0
    lora_alpha: float = 16
    target_modules: str | tuple[str, ...] = "all-linear"
    exclude_modules: str | tuple[str, ...] | None = None
    enable_gradient_checkpointing: bool = False


@dataclass(frozen=True)
class RewardConfig:
    """Scoring (``reward.*``)."""

    reward_manager: str = "naive"
    reward_model_enable: bool = False
    reward_model_path: str | None = None
    custom_reward_function_path: str | None = None
    custom_reward_function_name: str = "compute_score"


@dataclass(frozen=True)
class TrainerConfig:
    """The loop (``trainer.*``)."""

    total_epochs: int = 1
    total_training_steps: int | None = None
    save_freq: int = -1
    test_freq: int = -1
    val_before_train: bool = True
    resume_mode: str = "auto"
    """``auto``, ``disable`` or ``resume_path`` (verl/trainer/ppo/v1/trainer_base.py:789-815)."""
    resume_from_path: str | None = None
    max_actor_ckpt_to_keep: int | None = None
    """Checkpoints of this run whose actor part is kept; None or < 1 keeps all
    (verl/utils/checkpoint/checkpoint_manager.py:181-194)."""
    max_critic_ckpt_to_keep: int | None = None
    project_name: str = "verl_examples"
    experiment_name: str = "gsm8k"
    balance_batch: bool = True
    logger: tuple[str, ...] = ("console",)
    """Tracking backends (verl's Tracking: a name or a list of names); see `tracking.py`."""


@dataclass(frozen=True)
class ReferenceTrainerConfig:
    """Everything the reference trainer needs for one accepted case."""

    case_id: str
    profile: str
    algorithm: AlgorithmConfig
    data: DataConfig
    actor: ActorConfig
    rollout: RolloutConfig
    model: ModelConfig
    reward: RewardConfig
    trainer: TrainerConfig
    critic: CriticConfig | None = None
    critic_model: ModelConfig | None = None
    use_reference_policy: bool = False
    """A frozen reference policy is needed (KL loss or KL in reward)."""
    bindings: tuple[str, ...] = ()
    """Dotted paths that need a local runtime binding (model, data, reward)."""
    lowered: dict[str, str] = field(default_factory=dict)
    """Dotted path → how the distributed setting was lowered to one device."""
    lowered_values: dict[str, Any] = field(default_factory=dict)
    """Dotted path → the lowered leaf's upstream value (for the run's adaptations ledger)."""

    @property
    def trajectories_per_step(self) -> int:
        return self.data.train_batch_size * self.rollout.n

    @property
    def actor_updates_per_step(self) -> int:
        """Optimizer steps per training step: epochs × prompt mini-batches."""
        return self.actor.ppo_epochs * (
            self.data.train_batch_size // self.actor.ppo_mini_batch_size
        )

    @property
    def critic_updates_per_step(self) -> int:
        if self.critic is None:
            return 0
        return self.critic.ppo_epochs * (
            self.data.train_batch_size // self.critic.ppo_mini_batch_size
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReferenceTrainerConfig:
        """Inverse of ``to_dict`` (lists back to tuples for the tuple-typed fields)."""

        def optim(raw: dict[str, Any]) -> OptimConfig:
            return OptimConfig(**{**raw, "betas": tuple(raw["betas"])})

        def model(raw: dict[str, Any] | None) -> ModelConfig | None:
            if raw is None:
                return None
            fixed = dict(raw)
            for key in ("target_modules", "exclude_modules"):
                if isinstance(fixed.get(key), list):
                    fixed[key] = tuple(fixed[key])
            return ModelConfig(**fixed)

        critic = data.get("critic")
        return cls(
            case_id=data["case_id"],
            profile=data["profile"],
            algorithm=AlgorithmConfig(**data["algorithm"]),
            data=DataConfig(**data["data"]),
            actor=ActorConfig(**{**data["actor"], "optim": optim(data["actor"]["optim"])}),
            rollout=RolloutConfig(**data["rollout"]),
            model=model(data["model"]),  # type: ignore[arg-type]
            reward=RewardConfig(**data["reward"]),
            trainer=TrainerConfig(
                **{**data["trainer"], "logger": tuple(data["trainer"].get("logger", ("console",)))}
            ),
            critic=CriticConfig(**{**critic, "optim": optim(critic["optim"])}) if critic else None,
            critic_model=model(data.get("critic_model")),
            use_reference_policy=data.get("use_reference_policy", False),
            bindings=tuple(data.get("bindings", ())),
            lowered=dict(data.get("lowered", {})),
            lowered_values=dict(data.get("lowered_values", {})),
        )


# --------------------------------------------------------------------------- supervised fine-tuning


@dataclass(frozen=True)
class SFTDataConfig:
    """Conversations and batches (``data.*`` of verl's ``sft_trainer_engine``)."""

    train_batch_size: int
    """Sequences per optimizer step, every rank together (``data.train_batch_size``)."""
    micro_batch_size: int | None = None
    """Sequences per gradient-accumulation micro-batch (``data.micro_batch_size_per_gpu``, when
    ``use_dynamic_bsz`` is off); ``None`` with a token budget."""
    max_token_len: int | None = None
    """Tokens per micro-batch (``data.max_token_len_per_gpu``, when ``use_dynamic_bsz`` is on)."""
    max_length: int = 1024
    """Tokens per sequence (``data.max_length``)."""
    truncation: str = "error"
    """``error`` refuses a longer sequence, ``right`` keeps its first ``max_length`` tokens."""
    pad_mode: str = "no_padding"
    """The batch layout verl's FSDP engine runs (``data.pad_mode``)."""


@dataclass(frozen=True)
class SFTLoopConfig:
    """The loop (``trainer.*`` of ``sft_trainer_engine``)."""

    total_epochs: int = 1
    total_training_steps: int | None = None
    """Overrides ``len(batches) * total_epochs`` when set (verl/trainer/sft_trainer.py:181-185)."""
    save_freq: int | str = -1
    """Steps between checkpoints; ``after_each_epoch`` is the batches of an epoch (:190-192)."""
    test_freq: int | str = -1
    """Steps between validations; ``after_each_epoch`` as ``save_freq`` (:194-196)."""
    resume_mode: str = "auto"
    """``auto``, ``disable`` or ``resume_path`` (verl/utils/checkpoint/checkpoint_handler.py:196-219)."""
    resume_from_path: str | None = None
    project_name: str = "gsm8k-sft"
    experiment_name: str = "test"
    logger: tuple[str, ...] = ("console",)


@dataclass(frozen=True)
class SFTConfig:
    """Everything the reference trainer's SFT loop needs for one accepted SFT case."""

    case_id: str
    profile: str
    data: SFTDataConfig
    model: ModelConfig
    optim: OptimConfig
    trainer: SFTLoopConfig
    optimizer: str = "AdamW"
    """``optim.optimizer``: torch.optim's ``AdamW`` or ``SGD`` (betas only for AdamW)."""
    use_remove_padding: bool = True
    """``model.use_remove_padding``: the training pass packs the batch's real tokens."""
    bindings: tuple[str, ...] = ()
    lowered: dict[str, str] = field(default_factory=dict)
    lowered_values: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SFTConfig:
        """Inverse of ``to_dict`` (lists back to tuples for the tuple-typed fields)."""
        model = dict(data["model"])
        for key in ("target_modules", "exclude_modules"):
            if isinstance(model.get(key), list):
                model[key] = tuple(model[key])
        return cls(
            case_id=data["case_id"],
            profile=data["profile"],
            data=SFTDataConfig(**data["data"]),
            model=ModelConfig(**model),
            optim=OptimConfig(**{**data["optim"], "betas": tuple(data["optim"]["betas"])}),
            trainer=SFTLoopConfig(
                **{**data["trainer"], "logger": tuple(data["trainer"].get("logger", ()))}
            ),
            optimizer=data["optimizer"],
            use_remove_padding=data["use_remove_padding"],
            bindings=tuple(data.get("bindings", ())),
            lowered=dict(data.get("lowered", {})),
            lowered_values=dict(data.get("lowered_values", {})),
        )
