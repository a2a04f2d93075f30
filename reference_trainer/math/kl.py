"""KL estimators between the policy and the reference policy, the KL loss, and KL in the reward.

Estimators take per-token log-probs `(batch, response_length)` of the sampled tokens under the
policy (`log_prob`) and under the reference (`ref_log_prob`) and return a tensor of that shape
(no masking; callers mask). With r = ref_log_prob - log_prob (the log ratio ref/policy):

- `kl`/`k1`: -r, unbiased for KL(policy || ref), high variance, can be negative;
- `abs`: |r|;
- `mse`/`k2`: r^2 / 2, biased but its gradient is the KL's gradient in expectation;
- `low_var_kl`/`k3`: exp(r) - r - 1, unbiased and non-negative (Schulman, "Approximating KL
  divergence", 2020), with r clamped to [-20, 20] and the estimate to [-10, 10] as verl does.

A name with a trailing `+` (`k1+`, `k3+`, ...) is straight-through: the value of the named
estimator with the gradient of `k2`, since k1 and k3 have the right value but not the right
gradient in expectation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from reference_trainer.math.aggregation import agg_loss
from reference_trainer.math.masked import masked_mean
from reference_trainer.math.registry import Registry

KlEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

# verl clamps the log ratio before exp() and the k3 estimate after, so one far-off token cannot
# blow up the loss; outside these bounds the gradient is zero.
LOG_RATIO_BOUND = 20.0
K3_BOUND = 10.0


def k1(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    return log_prob - ref_log_prob


def absolute(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    return (log_prob - ref_log_prob).abs()


def k2(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    return 0.5 * (log_prob - ref_log_prob) ** 2


def k3(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    log_ratio = torch.clamp(ref_log_prob - log_prob, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    estimate = torch.exp(log_ratio) - log_ratio - 1
    return torch.clamp(estimate, -K3_BOUND, K3_BOUND)


def straight_through(forward: KlEstimator) -> KlEstimator:
    """`forward`'s value with k2's gradient."""

    def estimator(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
        surrogate = k2(log_prob, ref_log_prob)
        # value: forward; gradient: surrogate's (the detached terms contribute none).
        return forward(log_prob, ref_log_prob).detach() + (surrogate - surrogate.detach())

    estimator.__name__ = f"{forward.__name__}_straight_through"
    return estimator


_BASE: dict[str, KlEstimator] = {
    "kl": k1,
    "k1": k1,
    "abs": absolute,
    "mse": k2,
    "k2": k2,
    "low_var_kl": k3,
    "k3": k3,
}

KL_PENALTIES: Registry[KlEstimator] = Registry(
    "kl penalty",
    {**_BASE, **{f"{name}+": straight_through(fn) for name, fn in _BASE.items()}},
)


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate `(batch, response_length)`, by verl's `kl_penalty`/`kl_loss_type`."""
    return KL_PENALTIES[kl_penalty](log_prob, ref_log_prob)


def kl_loss(
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_loss_type: str,
    loss_agg_mode: str,
    *,
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """The actor's KL loss term: the estimator aggregated like every other loss term."""
    return agg_loss(
        kl_penalty(log_prob, ref_log_prob, kl_loss_type),
        response_mask,
        loss_agg_mode,
        dp_size=dp_size,
        batch_num_tokens=batch_num_tokens,
        global_batch_size=global_batch_size,
        loss_scale_factor=loss_scale_factor,
    )


@dataclass
class FixedKLController:
    """A constant KL coefficient (`algorithm.kl_ctrl.type=fixed`)."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt."""


@dataclass
class AdaptiveKLController:
    """Ziegler et al. 2019 (arXiv:1909.08593): move the coefficient toward a target KL.

    The proportional error is clipped to +-0.2 and scaled by `n_steps / horizon`, so one batch
    moves the coefficient by at most 20% * n_steps / horizon.
    """

    value: float
    target: float
    horizon: float

    def __post_init__(self) -> None:
        if self.horizon <= 0:
            raise ValueError(f"horizon must be positive, got {self.horizon}")

    def update(self, current_kl: float, n_steps: int) -> None:
        """Multiply the coefficient by 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon."""
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


KLController = FixedKLController | AdaptiveKLController


def kl_controller(algorithm: Any) -> KLController:
    """The in-reward KL controller of `algorithm.kl_ctrl` (verl's get_kl_controller)."""
    if algorithm.kl_ctrl_type == "adaptive":
        return AdaptiveKLController(algorithm.kl_coef, algorithm.kl_target, algorithm.kl_horizon)
    return FixedKLController(algorithm.kl_coef)


def apply_kl_in_reward(
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    controller: KLController,
    kl_penalty_name: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level rewards = scores - beta * KL on valid tokens (`algorithm.use_kl_in_reward`).

    All tensors are `(batch, response_length)`. beta is the controller's value before this batch;
    the controller is then updated (in place) with the batch's KL: the per-sequence mean over
    valid tokens, averaged over sequences (an empty sequence counts as 0), and `n_steps` = batch
    size. Returns the rewards and verl's metrics.
    """
    mask = response_mask.to(old_log_prob.dtype)
    kl = kl_penalty(old_log_prob, ref_log_prob, kl_penalty_name) * mask
    beta = controller.value
    rewards = token_level_scores - beta * kl
    current_kl = float(masked_mean(kl, response_mask, dim=-1).mean())
    controller.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    metrics = {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
    return rewards, metrics
