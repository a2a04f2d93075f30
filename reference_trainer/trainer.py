"""The reference RL trainer: verl's update semantics on a tiny model, on one CPU.

One training step, in labelled and timed phases (`timing_s/<phase>`):
rollout → score → old/ref log-probs (→ values) → advantages (KL in reward first, when set)
→ update critic, then actor → log → checkpoint.

Where this departs from verl 0.9.0, and why (each change is also written to the run's
`adaptations.json` ledger with the upstream and local values):
- sampling is our KV-cache engine (`rollout.py`, falling back to the HF model) with an explicit
  generator, not vLLM/SGLang; the no-gradient old/ref log-prob passes run on it too, and the
  training passes pack real tokens (`packing.py`, verl's use_remove_padding);
- batch sizes, lengths, learning rates and the step budget are scaled to a CPU (`LocalBudget`);
- prompts are the shipped arithmetic set (`reference_trainer/data/prompts.jsonl`), not gsm8k;
- float32 on one device, one torch thread (bit-reproducible; 2 threads were *slower* here);
- the learning-rate scheduler steps once per training step, as verl's workers do.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import inspect
import json
import math
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from reference_trainer.advantages import ADVANTAGE_ESTIMATORS
from reference_trainer.checkpoint import (
    CheckpointError,
    complete_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from reference_trainer.config import OptimConfig, ReferenceTrainerConfig
from reference_trainer.data import PROMPTS_PATH, Prompt, PromptSampler, load_prompts, prompt_text
from reference_trainer.kl import AdaptiveKLController, FixedKLController, apply_kl_in_reward
from reference_trainer.logprobs import entropy_from_logits, log_probs_from_logits
from reference_trainer.losses import actor_loss, value_loss
from reference_trainer.masked import masked_mean
from reference_trainer.packing import pack, packing_supported, unpack
from reference_trainer.reasoning_gym_prompts import (
    check_reasoning_gym_prompts,
    reasoning_gym_reward,
)
from reference_trainer.reward import RewardModelScorer, length_reward, rule_correct, rule_reward
from reference_trainer.rollout import DecoderSnapshot, KVCacheDecoder
from reference_trainer.tiny import ATTENTION, TINY, build_tiny_value_model, load_policy

# ---------------------------------------------------------------------------------------------
# Local budget and the adaptation ledger

REWARDS = ("rule", "length", "reasoning-gym")
TINY_LR = 2e-3


@dataclass(frozen=True)
class LocalBudget:
    """What a CPU run changes from the upstream 8-GPU configuration."""

    steps: int = 20
    """Training steps (upstream: total_epochs over the full data set)."""
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
    """None keeps upstream's trainer.save_freq (a final checkpoint is always written)."""
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


def _scaled_mini_batch(upstream_train: int, upstream_mini: int, local_train: int) -> int:
    ratio = max(1, upstream_train // upstream_mini)
    return max(1, local_train // ratio)


def adapt(
    cfg: ReferenceTrainerConfig, budget: LocalBudget
) -> tuple[ReferenceTrainerConfig, list[Adaptation]]:
    """The config a CPU run uses and the ledger of every field it changes or omits."""
    ledger: list[Adaptation] = []

    def note(name: str, upstream: Any, local: Any, reason: str) -> Any:
        if upstream != local:
            ledger.append(Adaptation(name, upstream, local, reason))
        return local

    tbs = note(
        "data.train_batch_size", cfg.data.train_batch_size, budget.train_batch_size, "CPU budget"
    )
    actor_mini = note(
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        cfg.actor.ppo_mini_batch_size,
        _scaled_mini_batch(cfg.data.train_batch_size, cfg.actor.ppo_mini_batch_size, tbs),
        "scaled to keep train_batch_size / ppo_mini_batch_size (updates per step)",
    )
    n = note("actor_rollout_ref.rollout.n", cfg.rollout.n, budget.n or cfg.rollout.n, "CPU budget")
    lora_rank = cfg.model.lora_rank
    if lora_rank > 0:
        lora_rank = note(
            "actor_rollout_ref.model.lora_rank",
            lora_rank,
            budget.lora_rank or min(lora_rank, 32),
            "tiny model hidden size is 96",
        )

    def optim(base: OptimConfig, name: str, lr: float | None) -> OptimConfig:
        if lr is None:
            lr = TINY_LR if budget.model == TINY else base.lr
        reason = "tiny model, few steps" if budget.model == TINY else "local choice"
        return dataclasses.replace(base, lr=note(f"{name}.lr", base.lr, lr, reason))

    actor = dataclasses.replace(
        cfg.actor,
        ppo_mini_batch_size=actor_mini,
        optim=optim(cfg.actor.optim, "actor_rollout_ref.actor.optim", budget.actor_lr),
    )
    critic = cfg.critic
    if critic is not None:
        critic = dataclasses.replace(
            critic,
            ppo_mini_batch_size=note(
                "critic.ppo_mini_batch_size",
                critic.ppo_mini_batch_size,
                _scaled_mini_batch(cfg.data.train_batch_size, critic.ppo_mini_batch_size, tbs),
                "scaled to keep train_batch_size / ppo_mini_batch_size",
            ),
            optim=optim(critic.optim, "critic.optim", budget.critic_lr),
        )
    data = dataclasses.replace(
        cfg.data,
        train_batch_size=tbs,
        max_response_length=note(
            "data.max_response_length",
            cfg.data.max_response_length,
            budget.max_response_length,
            "CPU budget",
        ),
        max_prompt_length=note(
            "data.max_prompt_length",
            cfg.data.max_prompt_length,
            budget.max_prompt_length,
            "the shipped prompts are short",
        ),
        seed=cfg.data.seed if cfg.data.seed is not None else budget.seed,
    )
    trainer = dataclasses.replace(
        cfg.trainer,
        total_training_steps=note(
            "trainer.total_training_steps",
            cfg.trainer.total_training_steps,
            budget.steps,
            f"CPU budget (upstream: {cfg.trainer.total_epochs} epochs over the full data set)",
        ),
        save_freq=note(
            "trainer.save_freq",
            cfg.trainer.save_freq,
            cfg.trainer.save_freq if budget.save_freq is None else budget.save_freq,
            "requested locally",
        ),
        test_freq=note(
            "trainer.test_freq",
            cfg.trainer.test_freq,
            cfg.trainer.test_freq if budget.test_freq is None else budget.test_freq,
            "requested locally",
        ),
        val_before_train=note(
            "trainer.val_before_train",
            cfg.trainer.val_before_train,
            cfg.trainer.val_before_train
            if budget.val_before_train is None
            else budget.val_before_train,
            "requested locally",
        ),
    )
    model = dataclasses.replace(
        cfg.model,
        lora_rank=lora_rank,
        path=note(
            "actor_rollout_ref.model.path", cfg.model.path, budget.model, "no hub; local model"
        ),
    )
    critic_model = cfg.critic_model
    if critic_model is not None:
        critic_model = dataclasses.replace(
            critic_model,
            path=note(
                "critic.model.path",
                critic_model.path,
                budget.critic_model or budget.model,
                "no hub; value head on the local model",
            ),
        )
    reward_model_path = cfg.reward.reward_model_path
    if cfg.reward.reward_model_enable:
        reward_model_path = note(
            "reward.reward_model.model_path",
            reward_model_path,
            budget.reward_model_path,
            "no hub; locally trained reward model",
        )
    reward_kind = "model" if cfg.reward.reward_model_enable else budget.reward
    note(
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
    note(
        "data.train_files",
        "gsm8k/math parquet (launch script)",
        budget.prompts_path,
        "shipped arithmetic and word problems"
        if budget.prompts_path == str(PROMPTS_PATH)
        else "local prompt file",
    )
    note(
        "data.val_files",
        "upstream test split",
        f"{budget.val_prompts} held-out prompts",
        "CPU budget",
    )
    note(
        "trainer.n_gpus_per_node",
        "8 GPUs, vLLM rollout, FSDP, bf16",
        "1 CPU thread, KV-cache sampling loop, float32",
        "hardware",
    )
    if model.enable_gradient_checkpointing:
        note(
            "actor_rollout_ref.model.enable_gradient_checkpointing",
            True,
            False,
            "no memory pressure at this size",
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
    return local, ledger


# ---------------------------------------------------------------------------------------------
# Rollout batches


@dataclass
class Batch:
    """Trajectories: left-padded prompts then right-padded responses of fixed width."""

    prompt_ids: torch.Tensor  # (batch, prompt_length), left padded
    prompt_mask: torch.Tensor  # (batch, prompt_length)
    responses: torch.Tensor  # (batch, response_length), pad after the first EOS
    response_mask: torch.Tensor  # (batch, response_length) float, 1 up to and incl. first EOS
    truncated: torch.Tensor  # (batch,) bool: no EOS within response_length
    uids: np.ndarray  # (batch,) group id: the prompt of each trajectory
    prompts: list[Prompt]
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    """Per-trajectory results filled by later phases (scores, log-probs, values, ...)."""
    texts: list[str] = field(default_factory=list)
    """Decoded responses (filled by the score phase), for the samples log."""

    def __len__(self) -> int:
        return self.responses.shape[0]

    def model_inputs(self) -> dict[str, torch.Tensor]:
        attention = torch.cat([self.prompt_mask, self.response_mask.long()], dim=1)
        return {
            "input_ids": torch.cat([self.prompt_ids, self.responses], dim=1),
            "attention_mask": attention,
            # Positions count real tokens only, so left padding does not shift them.
            "position_ids": (attention.cumsum(-1) - 1).clamp_min(0),
        }

    def select(self, rows: list[int] | torch.Tensor) -> Batch:
        index = torch.as_tensor(rows, dtype=torch.long)
        return Batch(
            self.prompt_ids[index],
            self.prompt_mask[index],
            self.responses[index],
            self.response_mask[index],
            self.truncated[index],
            self.uids[index.numpy()],
            [self.prompts[i] for i in index.tolist()],
            {k: v[index] for k, v in self.tensors.items()},
            [self.texts[i] for i in index.tolist()] if self.texts else [],
        )


def concat_batches(batches: list[Batch], pad_id: int) -> Batch:
    width = max(b.prompt_ids.shape[1] for b in batches)

    def left(t: torch.Tensor, value: int) -> torch.Tensor:
        return F.pad(t, (width - t.shape[1], 0), value=value)

    keys = set.intersection(*(set(b.tensors) for b in batches))
    return Batch(
        torch.cat([left(b.prompt_ids, pad_id) for b in batches]),
        torch.cat([left(b.prompt_mask, 0) for b in batches]),
        torch.cat([b.responses for b in batches]),
        torch.cat([b.response_mask for b in batches]),
        torch.cat([b.truncated for b in batches]),
        np.concatenate([b.uids for b in batches]),
        [p for b in batches for p in b.prompts],
        {k: torch.cat([b.tensors[k] for b in batches]) for k in sorted(keys)},
        [t for b in batches for t in b.texts],
    )


def _filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """vLLM's conventions: top_k <= 0 and top_p >= 1 disable the filter."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token once the mass before it already reaches top_p (the first always stays).
        drop = (cumulative - sorted_logits.softmax(-1)) >= top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


class _HFSteps:
    """Next-token logits from the HF model with its own key/value cache."""

    def __init__(
        self, policy: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor
    ):
        self.policy = policy
        self.attention = prompt_mask.clone()
        self.cache = None
        self.first = self._run(prompt_ids, (prompt_mask.cumsum(-1) - 1).clamp_min(0))

    def _run(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        output = self.policy(
            input_ids=ids,
            attention_mask=self.attention,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
        )
        self.cache = output.past_key_values
        return output.logits[:, -1, :]

    def __call__(self, tokens: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        # The new token's position is the count of real tokens before it.
        positions = self.attention.sum(-1, keepdim=True)
        self.attention = torch.cat([self.attention, live[:, None].long()], dim=1)
        return self._run(tokens[:, None], positions)


class _EngineSteps:
    """Next-token logits from the rollout engine's static cache."""

    def __init__(self, decoder: KVCacheDecoder):
        self.decoder = decoder
        self.first = decoder.logits

    def __call__(self, tokens: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        return self.decoder.advance(tokens, live)


@torch.no_grad()
def generate(
    policy: torch.nn.Module,
    tokenizer: Any,
    prompts: list[Prompt],
    *,
    n: int,
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    do_sample: bool,
    generator: torch.Generator,
    uid_prefix: str = "",
    fast: bool = True,
) -> Batch:
    """Sample `n` responses per prompt; masks come from positions, never from token values.

    `fast=False` forces the HF model's own forward (the engine's reference in tests).
    """
    expanded = [p for p in prompts for _ in range(n)]
    encoded = tokenizer(
        [prompt_text(tokenizer, p) for p in prompts],
        return_tensors="pt",
        padding=True,
        add_special_tokens=False,
    )
    # Row i of the rollout is response i % n of prompt i // n.
    prompt_rows = torch.arange(len(prompts)).repeat_interleave(n)
    prompt_ids = encoded["input_ids"][prompt_rows]
    prompt_mask = encoded["attention_mask"][prompt_rows]
    rows = len(expanded)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    responses = torch.full((rows, max_new_tokens), pad, dtype=torch.long)
    response_mask = torch.zeros(rows, max_new_tokens)
    finished = torch.zeros(rows, dtype=torch.bool)
    greedy = not do_sample or temperature <= 0
    # The rollout engine (`rollout.py`) when it covers the model, else the HF model with its
    # own cache; both encode the prompt once, then one token per row per step.
    snapshot = DecoderSnapshot.from_model(policy) if fast else None
    next_logits = (
        # The n responses of a prompt share its prompt pass.
        _EngineSteps(
            snapshot.start(
                encoded["input_ids"], encoded["attention_mask"], max_new_tokens, prompt_rows
            )
        )
        if snapshot is not None
        else _HFSteps(policy, prompt_ids, prompt_mask)
    )
    logits = next_logits.first
    for t in range(max_new_tokens):
        if greedy:
            token = logits.argmax(-1)
        else:
            probs = _filter_logits(logits / temperature, top_k, top_p).softmax(-1)
            token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        live = ~finished
        responses[:, t] = torch.where(live, token, torch.full_like(token, pad))
        # The stop token itself is in the mask, so stopping is learned (nanochat #810).
        response_mask[:, t] = live.float()
        finished |= live & (token == eos)
        if bool(finished.all()) or t + 1 == max_new_tokens:
            break
        logits = next_logits(responses[:, t], response_mask[:, t])
    uids = np.array([f"{uid_prefix}{p.uid}" for p in expanded])
    return Batch(prompt_ids, prompt_mask, responses, response_mask, ~finished, uids, expanded)


# ---------------------------------------------------------------------------------------------
# Model passes


def _response_outputs(model: torch.nn.Module, batch: Batch, pad_id: int | None) -> torch.Tensor:
    """Model outputs at the positions that predict each response token, `(batch, width, ...)`.

    With `pad_id` the real tokens are packed (padding removed, see `packing`); without it the
    padded rectangle runs as is (models whose forward reads the attention mask itself).
    """
    width = batch.responses.shape[1]
    if pad_id is None or not packing_supported(model):
        return model(**batch.model_inputs()).logits[:, -width - 1 : -1]
    packed = pack(batch.prompt_ids, batch.prompt_mask, batch.responses, batch.response_mask, pad_id)
    # No cache: transformers only derives the block-causal mask when none is passed.
    outputs = model(
        input_ids=packed.input_ids,
        position_ids=packed.position_ids,
        attention_mask=packed.attention_mask,
        use_cache=False,
    ).logits
    return unpack(outputs, packed)


def response_logits(
    model: torch.nn.Module, batch: Batch, pad_id: int | None = None
) -> torch.Tensor:
    """Logits `(batch, response_length, vocab)` predicting each response token."""
    return _response_outputs(model, batch, pad_id)


def response_values(
    critic: torch.nn.Module, batch: Batch, pad_id: int | None = None
) -> torch.Tensor:
    """Values `(batch, response_length)` of the state before each response token (verl's slice)."""
    return _response_outputs(critic, batch, pad_id)[..., 0]


def micro_batches(rows: torch.Tensor, size: int | None) -> Iterator[torch.Tensor]:
    step = len(rows) if not size else min(size, len(rows))
    for start in range(0, len(rows), step):
        yield rows[start : start + step]


def schedule(optim: OptimConfig, total_steps: int) -> Callable[[int], float]:
    """verl's warm-up then constant or cosine multiplier, per training step."""
    warmup = (
        optim.lr_warmup_steps
        if optim.lr_warmup_steps >= 0
        else int(optim.lr_warmup_steps_ratio * total_steps)
    )

    def factor(step: int) -> float:
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


def _generator(*parts: int) -> torch.Generator:
    """A generator seeded from a tuple such as (seed, step, purpose): no hidden global state."""
    seed = 0
    for part in parts:
        seed = (seed * 1_000_003 + part) % (2**63 - 1)
    return torch.Generator().manual_seed(seed)


def _mean_rows(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = sorted({k for row in rows for k in row})
    return {k: float(np.mean([row[k] for row in rows if k in row])) for k in keys}


# ---------------------------------------------------------------------------------------------
# The trainer


@dataclass
class RunResult:
    out: Path
    metrics: list[dict[str, float]]
    final_step: int
    export: Path | None


class ReferenceTrainer:
    """Holds the whole training state; `run()` is the loop."""

    def __init__(
        self,
        cfg: ReferenceTrainerConfig,
        budget: LocalBudget,
        out: str | Path,
        *,
        progress: bool = True,
    ) -> None:
        torch.set_num_threads(1)
        # Nothing here should draw from the global generators (sampling, data order and
        # mini-batch order have their own); seeding them once anyway makes a stray use
        # reproducible, and resume restores their saved state instead of re-seeding.
        torch.manual_seed(budget.seed)
        np.random.seed(budget.seed)
        random.seed(budget.seed)
        self.upstream = cfg
        self.cfg, self.ledger = adapt(cfg, budget)
        self.budget = budget
        self.out = Path(out)
        self.progress = progress
        self.seed = budget.seed
        self._check_bindings()
        loaded = load_policy(self.cfg.model.path, self.seed)
        self.tokenizer = loaded.tokenizer
        # Training-side passes drop the padding (verl's use_remove_padding; same function).
        self.pad_id = self.tokenizer.pad_token_id
        self.train_prompts = self._fitting(load_prompts(budget.prompts_path, "train"))
        self.val_prompts = self._fitting(load_prompts(budget.prompts_path, "val"))
        self.val_prompts = self.val_prompts[: budget.val_prompts]
        if budget.reward == "reasoning-gym" and not self.cfg.reward.reward_model_enable:
            check_reasoning_gym_prompts(self.train_prompts + self.val_prompts, budget.prompts_path)
        self.base_model = loaded.model
        self.lora = self.cfg.model.lora_rank > 0
        self.policy = self._wrap_lora(loaded.model) if self.lora else loaded.model
        # LoRA: the reference is the policy with its adapter disabled, so the frozen base
        # (never a trained adapter, TRL #3194). Full fine-tuning: a frozen copy of the start.
        self.ref: torch.nn.Module | None = None
        if self.cfg.use_reference_policy and not self.lora:
            self.ref = copy.deepcopy(self.policy).eval().requires_grad_(False)
        self.critic = self._build_critic() if self.cfg.algorithm.adv_estimator == "gae" else None
        self.scorer = (
            RewardModelScorer.load(self.cfg.reward.reward_model_path or "")
            if self.cfg.reward.reward_model_enable
            else None
        )
        total = self.cfg.trainer.total_training_steps or budget.steps
        self.actor_optimizer, self.actor_scheduler = self._optimizer(
            self.policy, self.cfg.actor.optim, total
        )
        self.critic_optimizer = self.critic_scheduler = None
        if self.critic is not None and self.cfg.critic is not None:
            self.critic_optimizer, self.critic_scheduler = self._optimizer(
                self.critic, self.cfg.critic.optim, total
            )
        self.sampler = PromptSampler(
            len(self.train_prompts),
            self.cfg.data.train_batch_size,
            seed=self.cfg.data.seed or 0,
            shuffle=self.cfg.data.shuffle,
        )
        alg = self.cfg.algorithm
        self.kl_controller: FixedKLController | AdaptiveKLController = (
            AdaptiveKLController(alg.kl_coef, alg.kl_target, alg.kl_horizon)
            if alg.kl_ctrl_type == "adaptive"
            else FixedKLController(alg.kl_coef)
        )
        self.step = 0
        self.actor_updates = 0
        self.critic_updates = 0
        self.total_steps = total

    # -- construction --------------------------------------------------------------------------

    def _check_bindings(self) -> None:
        """Fail before any training on a binding that cannot work, naming the field."""
        if (
            self.cfg.model.path != TINY
            and not (Path(self.cfg.model.path) / "config.json").is_file()
        ):
            raise FileNotFoundError(
                f"actor_rollout_ref.model.path: {self.cfg.model.path!r} is "
                "not a local model folder (no config.json)"
            )
        if not Path(self.budget.prompts_path).is_file():
            raise FileNotFoundError(
                f"data.train_files: prompt file {self.budget.prompts_path!r} does not exist"
            )
        if self.cfg.reward.reward_model_enable:
            path = self.cfg.reward.reward_model_path
            if not path or not (Path(path) / "config.json").is_file():
                raise FileNotFoundError(
                    f"reward.reward_model.model_path: {path!r} is not a "
                    "local reward model folder (no config.json)"
                )
        elif self.budget.reward not in REWARDS:
            raise ValueError(f"reward: unknown {self.budget.reward!r}; valid: {', '.join(REWARDS)}")
        if (
            self.cfg.critic_model is not None
            and self.budget.critic_model is not None
            and not (Path(self.budget.critic_model) / "config.json").is_file()
        ):
            raise FileNotFoundError(
                f"critic.model.path: {self.budget.critic_model!r} is not a local model folder"
            )

    def _fitting(self, prompts: list[Prompt]) -> list[Prompt]:
        """Prompts within max_prompt_length: dropped with filter_overlong_prompts, else an error."""
        limit = self.cfg.data.max_prompt_length
        lengths = [
            len(
                self.tokenizer(prompt_text(self.tokenizer, p), add_special_tokens=False)[
                    "input_ids"
                ]
            )
            for p in prompts
        ]
        if self.cfg.data.filter_overlong_prompts:
            return [p for p, n in zip(prompts, lengths, strict=True) if n <= limit]
        if max(lengths) > limit:
            raise ValueError(
                f"data.max_prompt_length={limit}: a prompt has {max(lengths)} "
                "tokens (set data.filter_overlong_prompts to drop such prompts)"
            )
        return prompts

    def _wrap_lora(self, model: torch.nn.Module) -> torch.nn.Module:
        from peft import LoraConfig, get_peft_model

        spec = self.cfg.model
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
            torch.manual_seed(self.seed + 1)
            return get_peft_model(model, lora)

    def _build_critic(self) -> torch.nn.Module:
        path = self.cfg.critic_model.path if self.cfg.critic_model else TINY
        if path == TINY:
            return build_tiny_value_model(self.base_model.config, self.seed + 2)
        from transformers import AutoModelForTokenClassification

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed + 2)
            return AutoModelForTokenClassification.from_pretrained(
                path,
                num_labels=1,
                classifier_dropout=0.0,
                local_files_only=True,
                attn_implementation=ATTENTION,
                dtype=torch.float32,
            )

    def _optimizer(
        self, model: torch.nn.Module, optim: OptimConfig, total: int
    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
        params = [p for p in model.parameters() if p.requires_grad]
        # fused: one kernel for all parameters instead of a Python loop of small ops per tensor.
        optimizer = torch.optim.AdamW(
            params, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay, fused=True
        )
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(optim, total))

    def reference_context(self):
        return self.policy.disable_adapter() if self.lora else nullcontext()

    # -- phases ----------------------------------------------------------------------------------

    def score(self, batch: Batch) -> None:
        """Token-level scores: the sequence reward on the last valid token, as verl places it."""
        lengths = batch.response_mask.sum(-1).long()
        texts = [
            self.tokenizer.decode(row[: int(n)], skip_special_tokens=True)
            for row, n in zip(batch.responses, lengths, strict=True)
        ]
        pairs = list(zip(texts, batch.prompts, strict=True))
        acc = [float(rule_correct(t, p.answer)) for t, p in pairs]
        if self.scorer is not None:
            rewards = self.scorer.score([p.prompt for p in batch.prompts], texts)
        elif self.budget.reward == "length":
            width = batch.responses.shape[1]
            rewards = [length_reward(int(n), self.budget.length_target, width) for n in lengths]
        elif self.budget.reward == "reasoning-gym":
            rewards = [reasoning_gym_reward(t, p) for t, p in pairs]
            # The task's scorer decides correctness; full marks count as accurate.
            acc = [float(r >= 1.0) for r in rewards]
        else:
            rewards = [rule_reward(t, p.answer) for t, p in pairs]
        scores = torch.zeros_like(batch.response_mask)
        scores[torch.arange(len(batch)), (lengths - 1).clamp_min(0)] = torch.tensor(rewards)
        batch.tensors["token_level_scores"] = scores
        batch.tensors["acc"] = torch.tensor(acc)
        batch.tensors["score"] = torch.tensor(rewards, dtype=torch.float32)
        batch.texts = texts

    @torch.no_grad()
    def log_probs(self, batch: Batch) -> None:
        temperature = self.cfg.rollout.temperature
        self.policy.eval()
        logits = self._inference_logits(self.policy, batch)
        batch.tensors["old_log_probs"] = log_probs_from_logits(logits, batch.responses, temperature)
        if self.cfg.use_reference_policy:
            with self.reference_context():
                ref_model = self.policy if self.lora else self.ref
                ref_logits = self._inference_logits(ref_model, batch)
            batch.tensors["ref_log_prob"] = log_probs_from_logits(
                ref_logits, batch.responses, temperature
            )
        if self.critic is not None:
            self.critic.eval()
            batch.tensors["values"] = response_values(self.critic, batch, self.pad_id)

    def _inference_logits(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        """Old and reference log-prob passes: no gradient, so the rollout engine may run them.

        verl, too, computes these in a separate no-grad pass whose kernels and micro-batches
        differ from the update's; the engine computes the same float32 function (tested against
        the HF forward), at about twice the speed of the packed HF pass here.
        """
        snapshot = DecoderSnapshot.from_model(model)
        if snapshot is None:
            return response_logits(model, batch, self.pad_id)
        return snapshot.response_logits(
            batch.prompt_ids, batch.prompt_mask, batch.responses, batch.response_mask
        )

    def advantages(self, batch: Batch) -> dict[str, float]:
        metrics: dict[str, float] = {}
        alg = self.cfg.algorithm
        rewards = batch.tensors["token_level_scores"]
        if alg.use_kl_in_reward:
            rewards, metrics = apply_kl_in_reward(
                rewards,
                batch.tensors["old_log_probs"],
                batch.tensors["ref_log_prob"],
                batch.response_mask,
                self.kl_controller,
                alg.kl_penalty,
            )
        batch.tensors["token_level_rewards"] = rewards
        estimator = ADVANTAGE_ESTIMATORS[alg.adv_estimator]
        available: dict[str, Any] = {
            "token_level_rewards": rewards,
            "values": batch.tensors.get("values"),
            "response_mask": batch.response_mask,
            "index": batch.uids,
            "gamma": alg.gamma,
            "lam": alg.lam,
            "norm_adv_by_std_in_grpo": alg.norm_adv_by_std_in_grpo,
        }
        wanted = inspect.signature(estimator).parameters
        adv, returns = estimator(**{k: v for k, v in available.items() if k in wanted})
        batch.tensors["advantages"], batch.tensors["returns"] = adv, returns
        return metrics

    def _minibatches(
        self, rows: int, size: int, shuffle: bool, seed: int, epoch: int
    ) -> list[torch.Tensor]:
        order = (
            torch.randperm(rows, generator=_generator(seed, self.step, epoch))
            if shuffle
            else torch.arange(rows)
        )
        return list(order.split(size))

    def update_critic(self, batch: Batch) -> dict[str, float]:
        assert self.critic is not None and self.cfg.critic is not None
        spec = self.cfg.critic
        self.critic.train()
        rows_out: list[dict[str, float]] = []
        mini = spec.ppo_mini_batch_size * self.cfg.rollout.n
        for epoch in range(spec.ppo_epochs):
            for rows in self._minibatches(
                len(batch), mini, spec.shuffle, spec.data_loader_seed + 1, epoch
            ):
                tokens = batch.response_mask[rows].sum()
                self.critic_optimizer.zero_grad()
                accumulated: dict[str, float] = {}
                for micro_rows in micro_batches(rows, spec.micro_batch_size):
                    micro = batch.select(micro_rows)
                    loss, metrics = value_loss(
                        response_values(self.critic, micro, self.pad_id),
                        micro.tensors["values"],
                        micro.tensors["returns"],
                        micro.response_mask,
                        cliprange_value=spec.cliprange_value,
                        loss_agg_mode=spec.loss_agg_mode,
                        batch_num_tokens=tokens,
                        global_batch_size=len(rows),
                        loss_scale_factor=spec.loss_scale_factor,
                    )
                    loss.backward()
                    _weighted(accumulated, metrics, float(micro.response_mask.sum() / tokens))
                grad_norm = torch.nn.utils.clip_grad_norm_(
                    self.critic.parameters(), spec.optim.grad_clip
                )
                self.critic_optimizer.step()
                self.critic_updates += 1
                rows_out.append({**accumulated, "critic/grad_norm": float(grad_norm)})
        self.critic_scheduler.step()
        return {**_mean_rows(rows_out), "critic/lr": self.critic_scheduler.get_last_lr()[0]}

    def update_actor(self, batch: Batch) -> dict[str, float]:
        spec = self.cfg.actor
        temperature = self.cfg.rollout.temperature
        self.policy.train()
        rows_out: list[dict[str, float]] = []
        mini = spec.ppo_mini_batch_size * self.cfg.rollout.n
        for epoch in range(spec.ppo_epochs):
            for rows in self._minibatches(
                len(batch), mini, spec.shuffle, spec.data_loader_seed, epoch
            ):
                tokens = batch.response_mask[rows].sum()
                self.actor_optimizer.zero_grad()
                accumulated: dict[str, float] = {}
                for micro_rows in micro_batches(rows, spec.micro_batch_size):
                    micro = batch.select(micro_rows)
                    logits = response_logits(self.policy, micro, self.pad_id)
                    log_prob = log_probs_from_logits(logits, micro.responses, temperature)
                    entropy = entropy_from_logits(logits, temperature)
                    if spec.entropy_coeff == 0:
                        entropy = entropy.detach()
                    loss, metrics = actor_loss(
                        micro.tensors["old_log_probs"],
                        log_prob,
                        micro.tensors["advantages"],
                        micro.response_mask,
                        entropy=entropy,
                        ref_log_prob=micro.tensors.get("ref_log_prob"),
                        policy_loss=spec.policy_loss_mode,
                        clip_ratio=spec.clip_ratio,
                        clip_ratio_low=spec.clip_ratio_low,
                        clip_ratio_high=spec.clip_ratio_high,
                        clip_ratio_c=spec.clip_ratio_c,
                        entropy_coeff=spec.entropy_coeff,
                        use_kl_loss=spec.use_kl_loss,
                        kl_loss_coef=spec.kl_loss_coef,
                        kl_loss_type=spec.kl_loss_type,
                        loss_agg_mode=spec.loss_agg_mode,
                        batch_num_tokens=tokens,
                        global_batch_size=len(rows),
                        loss_scale_factor=spec.loss_scale_factor,
                    )
                    loss.backward()
                    share = float(micro.response_mask.sum() / tokens)
                    metrics["actor/entropy"] = float(
                        masked_mean(entropy.detach(), micro.response_mask)
                    )
                    _weighted(accumulated, metrics, share)
                params = [p for p in self.policy.parameters() if p.requires_grad]
                grad_norm = torch.nn.utils.clip_grad_norm_(params, spec.optim.grad_clip)
                self.actor_optimizer.step()
                self.actor_updates += 1
                rows_out.append({**accumulated, "actor/grad_norm": float(grad_norm)})
        self.actor_scheduler.step()
        return {**_mean_rows(rows_out), "actor/lr": self.actor_scheduler.get_last_lr()[0]}

    def rollout(self) -> tuple[Batch, dict[str, float]]:
        """One step's batch; with group filtering, generate until enough informative groups."""
        alg = self.cfg.algorithm
        rollout = self.cfg.rollout
        kept: list[Batch] = []
        groups = 0
        generated = 0
        while True:
            indices = self.sampler.next_batch()
            prompts = [self.train_prompts[i] for i in indices]
            batch = generate(
                self.policy,
                self.tokenizer,
                prompts,
                n=rollout.n,
                max_new_tokens=self.cfg.data.max_response_length,
                temperature=rollout.temperature,
                top_k=rollout.top_k,
                top_p=rollout.top_p,
                do_sample=rollout.do_sample,
                generator=_generator(self.seed, self.step, generated),
                uid_prefix=f"{generated}:",
            )
            generated += 1
            self.score(batch)
            if not alg.filter_groups_enable:
                return batch, {}
            # acc is the rule check; score, seq_reward and seq_final_reward are all the
            # sequence score here, since the KL penalty is applied after filtering.
            name = alg.filter_groups_metric or "acc"
            metric = batch.tensors["acc" if name == "acc" else "score"]
            informative = [
                uid
                for uid in dict.fromkeys(batch.uids.tolist())
                if float(metric[batch.uids == uid].std(unbiased=False)) > 0
            ]
            rows = [i for i, uid in enumerate(batch.uids.tolist()) if uid in set(informative)]
            kept.append(batch.select(rows))
            groups += len(informative)
            if groups >= self.cfg.data.train_batch_size:
                merged = concat_batches(kept, self.tokenizer.pad_token_id)
                merged = merged.select(list(range(self.cfg.data.train_batch_size * rollout.n)))
                return merged, {"train/num_gen_batches": float(generated)}
            if alg.max_num_gen_batches > 0 and generated >= alg.max_num_gen_batches:
                raise RuntimeError(
                    f"algorithm.filter_groups: {generated} generation batches gave {groups} "
                    f"groups with non-zero {alg.filter_groups_metric} variance, "
                    f"{self.cfg.data.train_batch_size} needed (max_num_gen_batches)"
                )

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        rollout = self.cfg.rollout
        self.policy.eval()
        batch = generate(
            self.policy,
            self.tokenizer,
            self.val_prompts,
            n=rollout.val_n,
            max_new_tokens=self.cfg.data.max_response_length,
            temperature=rollout.val_temperature,
            top_k=rollout.val_top_k,
            top_p=rollout.val_top_p,
            do_sample=rollout.val_do_sample,
            generator=_generator(self.seed, self.step, 10_000),
        )
        self.score(batch)
        return {
            "val/reward/mean": float(batch.tensors["score"].mean()),
            "val/acc": float(batch.tensors["acc"].mean()),
            "val/response_length/mean": float(batch.response_mask.sum(-1).mean()),
        }

    # -- one step --------------------------------------------------------------------------------

    def train_step(self) -> dict[str, float]:
        timing: dict[str, float] = {}

        @contextmanager
        def phase(name: str) -> Iterator[None]:
            start = time.perf_counter()
            yield
            timing[f"timing_s/{name}"] = time.perf_counter() - start

        metrics: dict[str, float] = {}
        with phase("step"):
            with phase("gen"):
                self.policy.eval()
                batch, gen_metrics = self.rollout()
            metrics.update(gen_metrics)
            self.last_batch = batch
            with phase("old_log_prob"):
                self.log_probs(batch)
            with phase("adv"):
                metrics.update(self.advantages(batch))
            if self.critic is not None:
                with phase("update_critic"):
                    metrics.update(self.update_critic(batch))
            # verl skips the actor while critic_warmup > global_steps, global_steps counting
            # from 1: the actor first updates at step critic_warmup (step 1 when it is 0 or 1).
            warmup = self.cfg.critic.warmup_steps if self.cfg.critic else 0
            if self.step + 1 >= warmup:
                with phase("update_actor"):
                    metrics.update(self.update_actor(batch))
        self.step += 1
        metrics.update(self._batch_metrics(batch))
        metrics.update(timing)
        metrics["actor/num_updates"] = float(self.actor_updates)
        metrics["critic/num_updates"] = float(self.critic_updates)
        tokens = float(batch.response_mask.sum() + batch.prompt_mask.sum())
        metrics["perf/throughput"] = tokens / max(timing["timing_s/step"], 1e-9)
        return metrics

    def _batch_metrics(self, batch: Batch) -> dict[str, float]:
        t = batch.tensors
        lengths = batch.response_mask.sum(-1)
        mask = batch.response_mask
        out = {
            "critic/score/mean": float(t["token_level_scores"].sum(-1).mean()),
            "critic/rewards/mean": float(t["token_level_rewards"].sum(-1).mean()),
            "critic/advantages/mean": float(masked_mean(t["advantages"], mask)),
            "critic/returns/mean": float(masked_mean(t["returns"], mask)),
            "response_length/mean": float(lengths.mean()),
            "response_length/clip_ratio": float(batch.truncated.float().mean()),
            "train/acc": float(t["acc"].mean()),
        }
        if "ref_log_prob" in t:
            out["actor/ref_kl"] = float(masked_mean(t["old_log_probs"] - t["ref_log_prob"], mask))
        if "values" in t:
            out["critic/values/mean"] = float(masked_mean(t["values"], mask))
        return out

    # -- state -----------------------------------------------------------------------------------

    def _policy_tensors(self) -> dict[str, torch.Tensor]:
        if self.lora:
            # Only the adapter trains; the base is rebuilt from the seed or the folder.
            return {k: v for k, v in self.policy.named_parameters() if v.requires_grad}
        return dict(self.policy.state_dict())

    def save(self) -> Path:
        tensors = {"actor": self._policy_tensors()}
        torch_objects: dict[str, Any] = {
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "actor_scheduler": self.actor_scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
        }
        if self.critic is not None:
            tensors["critic"] = dict(self.critic.state_dict())
            torch_objects["critic_optimizer"] = self.critic_optimizer.state_dict()
            torch_objects["critic_scheduler"] = self.critic_scheduler.state_dict()
        np_state = np.random.get_state()
        py_state = random.getstate()
        state = {
            "step": self.step,
            "actor_updates": self.actor_updates,
            "critic_updates": self.critic_updates,
            "sampler": self.sampler.state_dict(),
            "kl_controller": dataclasses.asdict(self.kl_controller),
            "numpy_rng": [np_state[0], np_state[1].tolist(), *np_state[2:]],
            "python_rng": [py_state[0], list(py_state[1]), py_state[2]],
            "seed": self.seed,
        }
        return save_checkpoint(
            self.out / "checkpoints",
            self.step,
            tensors=tensors,
            torch_objects=torch_objects,
            json_objects={
                "trainer_state": state,
                "config": self.cfg.to_dict(),
                "budget": dataclasses.asdict(self.budget),
            },
        )

    def load(self, folder: Path) -> None:
        loaded = load_checkpoint(folder)
        if loaded["config"] != json.loads(json.dumps(self.cfg.to_dict())):
            raise CheckpointError(
                f"{folder / 'config.json'}: the checkpoint's resolved config "
                "differs from this run's"
            )
        actor = loaded["actor"]
        if self.lora:
            params = dict(self.policy.named_parameters())
            if set(actor) != {k for k, v in params.items() if v.requires_grad}:
                raise CheckpointError(f"{folder / 'actor.safetensors'}: adapter keys differ")
            with torch.no_grad():
                for name, value in actor.items():
                    params[name].copy_(value)
        else:
            self.policy.load_state_dict(actor)
        self.actor_optimizer.load_state_dict(loaded["actor_optimizer"])
        self.actor_scheduler.load_state_dict(loaded["actor_scheduler"])
        if self.critic is not None:
            self.critic.load_state_dict(loaded["critic"])
            self.critic_optimizer.load_state_dict(loaded["critic_optimizer"])
            self.critic_scheduler.load_state_dict(loaded["critic_scheduler"])
        state = loaded["trainer_state"]
        self.step = state["step"]
        self.actor_updates, self.critic_updates = state["actor_updates"], state["critic_updates"]
        self.sampler.load_state_dict(state["sampler"])
        for key, value in state["kl_controller"].items():
            setattr(self.kl_controller, key, value)
        torch.set_rng_state(loaded["torch_rng"])
        np_state = state["numpy_rng"]
        np.random.set_state((np_state[0], np.array(np_state[1], dtype=np.uint32), *np_state[2:]))
        py_state = state["python_rng"]
        random.setstate((py_state[0], tuple(py_state[1]), py_state[2]))

    # -- the loop --------------------------------------------------------------------------------

    def run(self, *, resume: bool = False, stop_after: int | None = None) -> RunResult:
        """Train to `total_training_steps`; `stop_after` ends early (a simulated interruption)."""
        self.out.mkdir(parents=True, exist_ok=True)
        metrics_path = self.out / "metrics.jsonl"
        history: list[dict[str, float]] = []
        if resume:
            found = complete_checkpoints(self.out / "checkpoints")
            if not found:
                raise CheckpointError(f"{self.out / 'checkpoints'}: no complete checkpoint")
            self.load(found[-1])
            if metrics_path.is_file():
                # Rows logged after the checkpoint belong to the interrupted attempt.
                rows = [json.loads(line) for line in metrics_path.read_text().splitlines()]
                history = [r for r in rows if r["step"] <= self.step]
        metrics_path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in history))
        samples_path = self.out / "samples.jsonl"
        if resume and samples_path.is_file():
            kept = [
                line
                for line in samples_path.read_text().splitlines()
                if json.loads(line)["step"] <= self.step
            ]
            samples_path.write_text("".join(line + "\n" for line in kept))
        elif samples_path.is_file():
            samples_path.unlink()
        self._write_ledger()
        trainer_cfg = self.cfg.trainer
        if not resume and trainer_cfg.val_before_train:
            history.append(self._log(metrics_path, {"step": 0, **self.validate()}))
        last = self.total_steps if stop_after is None else min(stop_after, self.total_steps)
        bar = _progress(self.progress, self.step, self.total_steps, self.cfg.case_id)
        while self.step < last:
            metrics = self.train_step()
            if trainer_cfg.test_freq > 0 and (
                self.step % trainer_cfg.test_freq == 0 or self.step == self.total_steps
            ):
                metrics.update(self.validate())
            history.append(self._log(metrics_path, {"step": self.step, **metrics}))
            self._log_samples(self.last_batch)
            # Checkpoints only at rollout boundaries, and always at the last step of this run.
            if (trainer_cfg.save_freq > 0 and self.step % trainer_cfg.save_freq == 0) or (
                self.step == last
            ):
                self.save()
            if bar is not None:
                bar.update(1)
                live = {
                    "reward": f"{metrics['critic/score/mean']:.3f}",
                    "tok/s": f"{metrics['perf/throughput']:.0f}",
                }
                if "actor/ref_kl" in metrics:
                    live["kl"] = f"{metrics['actor/ref_kl']:.4f}"
                bar.set_postfix(live)
        if bar is not None:
            bar.close()
        export = None
        if self.step >= self.total_steps:
            export = self.export(self.out / "final")
            write_csv(self.out / "metrics.csv", history)
            plot_metrics(self.out / "metrics.png", history)
        return RunResult(self.out, history, self.step, export)

    def _log_samples(self, batch: Batch, count: int = 4) -> None:
        """A few completions per step, so a run can be read, not only plotted."""
        with (self.out / "samples.jsonl").open("a") as handle:
            for i in range(min(count, len(batch))):
                sample = {
                    "step": self.step,
                    "prompt": batch.prompts[i].prompt,
                    "response": batch.texts[i] if batch.texts else "",
                    "score": float(batch.tensors["score"][i]),
                    "truncated": bool(batch.truncated[i]),
                }
                handle.write(json.dumps(sample) + "\n")

    def _log(self, path: Path, row: dict[str, float]) -> dict[str, float]:
        with path.open("a") as handle:
            handle.write(json.dumps(row, sort_keys=True) + "\n")
        return row

    def _write_ledger(self) -> None:
        payload = {
            "case": self.cfg.case_id,
            "profile": self.cfg.profile,
            "adaptations": [dataclasses.asdict(a) for a in self.ledger],
            "updates_per_step": {
                "actor": self.cfg.actor_updates_per_step,
                "critic": self.cfg.critic_updates_per_step,
                "upstream_actor": self.upstream.actor_updates_per_step,
                "upstream_critic": self.upstream.critic_updates_per_step,
            },
        }
        (self.out / "adaptations.json").write_text(json.dumps(payload, indent=1, default=str))

    # -- handoff ---------------------------------------------------------------------------------

    def export(self, folder: Path) -> Path:
        """The final actor in HF format; LoRA: the adapter, its base, and a merged model."""
        from transformers import GenerationConfig

        folder.mkdir(parents=True, exist_ok=True)
        generation = GenerationConfig(
            eos_token_id=self.tokenizer.eos_token_id,
            pad_token_id=self.tokenizer.pad_token_id,
            bos_token_id=self.tokenizer.bos_token_id,
            do_sample=self.cfg.rollout.do_sample,
            temperature=self.cfg.rollout.temperature,
            max_new_tokens=self.cfg.data.max_response_length,
        )
        if not self.lora:
            hf = folder / "hf"
            self.policy.save_pretrained(hf)
        else:
            self.policy.save_pretrained(folder / "adapter")
            # unload() strips the adapter without merging: the frozen base, exported so the
            # adapter folder loads offline on top of it.
            base = copy.deepcopy(self.policy).unload()
            base.save_pretrained(folder / "base")
            self.tokenizer.save_pretrained(folder / "base")
            merged = copy.deepcopy(self.policy).merge_and_unload()
            hf = folder / "hf"
            merged.save_pretrained(hf)
            base_state = base.state_dict()
            # verl #4553: a "merged" export that is the unchanged base is a silent failure.
            if all(torch.equal(v, base_state[k]) for k, v in merged.state_dict().items()):
                raise RuntimeError(f"{hf}: merged LoRA export equals the base model")
        self.tokenizer.save_pretrained(hf)
        generation.save_pretrained(hf)
        return hf


def _weighted(into: dict[str, float], metrics: dict[str, float], share: float) -> None:
    """Sum micro-batch metrics into mini-batch ones.

    Loss terms are already divided by the mini-batch's global normalisers, so they add up;
    per-token means are weighted by the micro-batch's share of the mini-batch's tokens;
    coefficients are constants.
    """
    for key, value in metrics.items():
        if key.endswith("_coef") or key.endswith("_coeff"):
            into[key] = value
        elif key.endswith("_loss"):
            into[key] = into.get(key, 0.0) + value
        else:
            into[key] = into.get(key, 0.0) + value * share


def _progress(enabled: bool, initial: int, total: int, case: str):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=f"train {case}", unit="step")


def write_csv(path: Path, rows: list[dict[str, float]]) -> None:
    keys = sorted({k for row in rows for k in row}, key=lambda k: (k != "step", k))
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def plot_metrics(path: Path, rows: list[dict[str, float]]) -> None:
    """Reward, KL, entropy and response length per step, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    panels = [
        ("critic/score/mean", "reward"),
        ("actor/ref_kl", "KL to reference"),
        ("actor/entropy", "entropy"),
        ("response_length/mean", "response length"),
    ]
    figure, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3))
    for axis, (key, title) in zip(axes, panels, strict=True):
        points = [(r["step"], r[key]) for r in rows if key in r]
        if points:
            axis.plot(*zip(*points, strict=True), marker=".")
        axis.set_title(title)
        axis.set_xlabel("step")
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
