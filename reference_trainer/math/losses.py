"""Policy and value losses of PPO-style training, all aggregated by `agg_loss`.

Tensors are `(batch, response_length)` with a `response_mask` of that shape. Each loss returns
its micro-batch scalar (see `reference_trainer.math.aggregation` for the global normalisers that make
micro-batch losses add up to the mini-batch loss) and a dict of metrics named as verl logs them.
Metrics are means over the micro-batch's valid tokens, as verl computes them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from reference_trainer.math.aggregation import agg_loss
from reference_trainer.math.kl import kl_loss
from reference_trainer.math.masked import masked_mean
from reference_trainer.math.registry import Registry

# verl clamps the log importance ratio before exp() for numerical safety.
LOG_RATIO_BOUND = 20.0


def vanilla_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate with dual clip (arXiv:1707.06347, arXiv:1912.09729).

    Per token, with ratio = exp(log_prob - old_log_prob) and A the advantage:
    loss = max(-A * ratio, -A * clip(ratio, 1 - low, 1 + high)), and for A < 0 additionally
    capped at -A * clip_ratio_c, so a huge ratio on a bad token cannot dominate the batch.
    `clip_ratio_low`/`clip_ratio_high` default to `clip_ratio` (DAPO's clip-higher sets high).

    Metrics: `actor/pg_clipfrac` (share of valid tokens where the clipped term is the larger),
    `actor/pg_clipfrac_lower` (share where the dual clip binds), `actor/ppo_kl` (mean of
    old_log_prob - log_prob, the k1 estimate of KL(old || new)).
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(
            f"clip_ratio_c must be greater than 1.0 for dual-clip PPO, got {clip_ratio_c}"
        )
    low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high

    log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    pessimistic = torch.maximum(unclipped, clipped)
    dual_cap = -advantages * clip_ratio_c
    negative = advantages < 0
    token_loss = torch.where(negative, torch.minimum(pessimistic, dual_cap), pessimistic)
    if rollout_is_weights is not None:
        token_loss = token_loss * rollout_is_weights

    loss = agg_loss(
        token_loss,
        response_mask,
        loss_agg_mode,
        dp_size=dp_size,
        batch_num_tokens=batch_num_tokens,
        global_batch_size=global_batch_size,
        loss_scale_factor=loss_scale_factor,
    )
    with torch.no_grad():
        dtype = token_loss.dtype
        metrics = {
            "actor/pg_clipfrac": masked_mean((clipped > unclipped).to(dtype), response_mask),
            "actor/ppo_kl": masked_mean(-log_ratio, response_mask),
            "actor/pg_clipfrac_lower": masked_mean(
                ((pessimistic > dual_cap) & negative).to(dtype), response_mask
            ),
        }
    return loss, {key: float(value) for key, value in metrics.items()}


PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, float]]]

POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", {"vanilla": vanilla_policy_loss})


def actor_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    entropy: torch.Tensor | None = None,
    ref_log_prob: torch.Tensor | None = None,
    policy_loss: str = "vanilla",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    entropy_coeff: float = 0.0,
    use_kl_loss: bool = False,
    kl_loss_coef: float = 0.001,
    kl_loss_type: str = "low_var_kl",
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The actor's micro-batch loss: policy loss - entropy_coeff * entropy + kl_loss_coef * KL loss.

    `entropy` (per-token, `(batch, response_length)`) adds the entropy bonus when given;
    `ref_log_prob` is required with `use_kl_loss`. Every term goes through `agg_loss` with the
    same mode and normalisers, so the sum splits over micro-batches like each term does.
    """
    normalisers: dict[str, Any] = {
        "dp_size": dp_size,
        "batch_num_tokens": batch_num_tokens,
        "global_batch_size": global_batch_size,
        "loss_scale_factor": loss_scale_factor,
    }
    loss, metrics = POLICY_LOSSES[policy_loss](
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        clip_ratio=clip_ratio,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        clip_ratio_c=clip_ratio_c,
        loss_agg_mode=loss_agg_mode,
        **normalisers,
    )
    metrics = {**metrics, "actor/pg_loss": float(loss.detach())}
    if entropy is not None:
        entropy_term = agg_loss(entropy, response_mask, loss_agg_mode, **normalisers)
        loss = loss - entropy_coeff * entropy_term
        metrics["actor/entropy_loss"] = float(entropy_term.detach())
    if use_kl_loss:
        if ref_log_prob is None:
            raise ValueError("use_kl_loss needs ref_log_prob")
        kl_term = kl_loss(
            log_prob, ref_log_prob, response_mask, kl_loss_type, loss_agg_mode, **normalisers
        )
        loss = loss + kl_loss_coef * kl_term
        metrics["actor/kl_loss"] = float(kl_term.detach())
        metrics["actor/kl_coef"] = kl_loss_coef
    return loss, metrics


def value_loss(
    vpreds: torch.Tensor,
    values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss: 0.5 * max((v - R)^2, (clip(v, V - c, V + c) - R)^2), aggregated.

    `vpreds` are the critic's current predictions (with gradient), `values` the predictions at
    rollout time, `returns` the targets; all `(batch, response_length)`. The clip keeps the
    critic within `cliprange_value` of its rollout-time prediction, pessimistically.
    Metrics: `critic/vf_loss`, `critic/vf_clipfrac` (share of valid tokens where the clipped
    error is the larger), `critic/vpred_mean`.
    """
    clipped_vpreds = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    error = (vpreds - returns) ** 2
    clipped_error = (clipped_vpreds - returns) ** 2
    loss = 0.5 * agg_loss(
        torch.maximum(error, clipped_error),
        response_mask,
        loss_agg_mode,
        dp_size=dp_size,
        batch_num_tokens=batch_num_tokens,
        global_batch_size=global_batch_size,
        loss_scale_factor=loss_scale_factor,
    )
    with torch.no_grad():
        clipfrac = masked_mean((clipped_error > error).to(error.dtype), response_mask)
        vpred_mean = masked_mean(vpreds, response_mask)
    metrics = {
        "critic/vf_loss": float(loss.detach()),
        "critic/vf_clipfrac": float(clipfrac),
        "critic/vpred_mean": float(vpred_mean),
    }
    return loss, metrics
