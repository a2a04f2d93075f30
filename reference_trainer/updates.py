"""One training step's PPO updates of the critic and the actor, as verl's workers run them.

For each of `ppo_epochs`, the rollout batch splits into mini-batches of
`ppo_mini_batch_size × rollout.n` trajectories (one optimizer step each, after gradient
clipping), each mini-batch into micro-batches whose gradients accumulate. Every micro-batch loss
is already divided by its mini-batch's global normalisers (token count, row count), so the
accumulated gradient is the mini-batch's. The scheduler steps once per training step.

The row count of a mini-batch is its configured size, `ppo_mini_batch_size × rollout.n`, as V1
passes it (`global_batch_size`, verl/trainer/ppo/v1/trainer_base.py:1654 and :1696): V1 pads a
batch that does not fill its last mini-batch with no-op rows (trainer_base.py:1434-1466,
padding_utils.py:127), which count there though they hold no token, so a short last mini-batch
here is divided by the full size too.
"""

from __future__ import annotations

import numpy as np
import torch

from reference_trainer.batching import Batch, micro_batches, minibatches, shuffle_generator
from reference_trainer.config import ActorConfig, CriticConfig
from reference_trainer.generation import response_logits, response_values
from reference_trainer.math.aggregation import unpadded_scale
from reference_trainer.math.logprobs import entropy_from_logits, log_probs_from_logits
from reference_trainer.math.losses import actor_loss, value_loss


def critic_update(
    critic: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    batch: Batch,
    spec: CriticConfig,
    *,
    n: int,
    step: int,
    pad_id: int | None,
) -> tuple[dict[str, float], int]:
    """The critic's update of training step `step`: its metrics and its optimizer steps."""
    critic.train()
    rows_out: list[dict[str, float]] = []
    updates = 0
    mini = spec.ppo_mini_batch_size * n
    shuffle = shuffle_generator(spec.shuffle, spec.data_loader_seed)
    for _ in range(spec.ppo_epochs):
        for rows in minibatches(len(batch), mini, shuffle):
            tokens = batch.response_mask[rows].sum()
            optimizer.zero_grad()
            accumulated: dict[str, float] = {}
            for micro_rows in micro_batches(rows, spec.micro_batch_size):
                micro = batch.select(micro_rows)
                loss, metrics = value_loss(
                    response_values(critic, micro, pad_id),
                    micro.tensors["values"],
                    micro.tensors["returns"],
                    micro.response_mask,
                    cliprange_value=spec.cliprange_value,
                    loss_agg_mode=spec.loss_agg_mode,
                    batch_num_tokens=tokens,
                    global_batch_size=mini,
                    loss_scale_factor=unpadded_scale(
                        spec.loss_scale_factor, spec.loss_agg_mode, micro.response_mask
                    ),
                )
                loss.backward()
                _weighted(accumulated, metrics, float(micro.response_mask.sum() / tokens))
            grad_norm = torch.nn.utils.clip_grad_norm_(critic.parameters(), spec.optim.grad_clip)
            _step_if_finite(optimizer, grad_norm)
            updates += 1
            rows_out.append({**accumulated, "critic/grad_norm": float(grad_norm)})
    scheduler.step()
    return {**_mean_rows(rows_out), "critic/lr": scheduler.get_last_lr()[0]}, updates


def actor_update(
    policy: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    batch: Batch,
    spec: ActorConfig,
    *,
    n: int,
    temperature: float,
    step: int,
    pad_id: int | None,
) -> tuple[dict[str, float], int]:
    """The actor's update of training step `step`: its metrics and its optimizer steps."""
    policy.train()
    rows_out: list[dict[str, float]] = []
    updates = 0
    mini = spec.ppo_mini_batch_size * n
    shuffle = shuffle_generator(spec.shuffle, spec.data_loader_seed)
    for _ in range(spec.ppo_epochs):
        for rows in minibatches(len(batch), mini, shuffle):
            tokens = batch.response_mask[rows].sum()
            optimizer.zero_grad()
            accumulated: dict[str, float] = {}
            micros = list(micro_batches(rows, spec.micro_batch_size))
            for micro_rows in micros:
                micro = batch.select(micro_rows)
                logits = response_logits(policy, micro, pad_id)
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
                    global_batch_size=mini,
                    loss_scale_factor=unpadded_scale(
                        spec.loss_scale_factor, spec.loss_agg_mode, micro.response_mask
                    ),
                )
                loss.backward()
                share = float(micro.response_mask.sum() / tokens)
                # actor/entropy is the old-log-prob pass's (trainer.log_probs), as in verl's V1.
                _weighted(accumulated, metrics, share, 1.0 / len(micros))
            params = [p for p in policy.parameters() if p.requires_grad]
            grad_norm = torch.nn.utils.clip_grad_norm_(params, spec.optim.grad_clip)
            _step_if_finite(optimizer, grad_norm)
            updates += 1
            rows_out.append({**accumulated, "actor/grad_norm": float(grad_norm)})
    scheduler.step()
    return {**_mean_rows(rows_out), "actor/lr": scheduler.get_last_lr()[0]}, updates


# The policy loss's own metrics: verl averages them over micro-batches unweighted
# (AggregationType.MEAN, verl/workers/utils/losses.py:116), whatever each micro-batch's tokens.
_MICRO_MEAN = frozenset({"actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"})


def _step_if_finite(optimizer: torch.optim.Optimizer, grad_norm: torch.Tensor) -> None:
    """verl's engine skips the update (and drops the gradients) when the norm is not finite
    (verl/workers/engine/fsdp/transformer_impl.py:791-796)."""
    if torch.isfinite(grad_norm):
        optimizer.step()
    else:
        optimizer.zero_grad()


def _weighted(
    into: dict[str, float], metrics: dict[str, float], share: float, micro_share: float = 1.0
) -> None:
    """Sum micro-batch metrics into mini-batch ones.

    Loss terms are already divided by the mini-batch's global normalisers, so they add up;
    the policy loss's metrics are a plain mean over micro-batches (`micro_share` = 1 / their
    count), as verl's; other per-token means are weighted by the micro-batch's share of the
    mini-batch's tokens; coefficients are constants.
    """
    for key, value in metrics.items():
        if key.endswith("_coef") or key.endswith("_coeff"):
            into[key] = value
        elif key in _MICRO_MEAN:
            into[key] = into.get(key, 0.0) + value * micro_share
        elif key.endswith("_loss"):
            into[key] = into.get(key, 0.0) + value
        else:
            into[key] = into.get(key, 0.0) + value * share


def _mean_rows(rows: list[dict[str, float]]) -> dict[str, float]:
    """The training step's metrics: the mean over its mini-batches (optimizer steps)."""
    keys = sorted({k for row in rows for k in row})
    return {k: float(np.mean([row[k] for row in rows if k in row])) for k in keys}
