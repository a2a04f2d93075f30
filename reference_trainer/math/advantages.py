"""Advantage estimators, registered under verl's `algorithm.adv_estimator` names.

Every estimator takes `(batch, response_length)` tensors and a `response_mask` of the same shape
(1 on tokens the policy generated, 0 on padding and on observation tokens of multi-turn
rollouts), and returns `(advantages, returns)` of that shape. Nothing here carries gradient:
advantages are constants for the policy update. Group estimators take `index`, one group id
(the prompt's uid) per row, as a numpy array.

Where this departs from the textbook algorithm, it is to do what verl 0.9.0 does:
- a group of one response has mean 0 and standard deviation 1 (its unbiased std is undefined);
- outcome scores are the sum of the whole reward row, mask or not (rewards sit on valid tokens);
- GAE and REINFORCE++ skip masked tokens: values and running sums carry across them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from reference_trainer.math.masked import masked_whiten
from reference_trainer.math.registry import Registry

# verl's default epsilon in the GRPO denominator `std + epsilon`.
GRPO_EPSILON = 1e-6


def _group_rows(index: np.ndarray) -> torch.Tensor:
    """Dense group number (0..groups-1) for each row, from any hashable uid per row."""
    _, inverse = np.unique(np.asarray(index), return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long)


def _group_sizes(groups: torch.Tensor) -> torch.Tensor:
    return torch.bincount(groups)


def _group_mean_std(
    scores: torch.Tensor, groups: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row mean and unbiased std of the row's group; a group of one has mean 0, std 1."""
    sizes = _group_sizes(groups)
    sums = torch.zeros(len(sizes), dtype=scores.dtype).index_add_(0, groups, scores)
    mean = sums / sizes.to(scores.dtype)
    squares = torch.zeros_like(sums).index_add_(0, groups, (scores - mean[groups]) ** 2)
    # A group of one divides 0 by 0 here; torch.where below replaces that NaN.
    std = torch.sqrt(squares / (sizes - 1).to(scores.dtype))
    single = sizes == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[groups], std[groups]


def _broadcast(per_row: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """A per-row scalar on every valid token of its row, 0 elsewhere."""
    return per_row.unsqueeze(-1) * response_mask.to(per_row.dtype)


@torch.no_grad()
def gae_advantages(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation, whitened over the mask; returns = raw advantages + values.

    All inputs are `(batch, response_length)`. A masked token neither bootstraps nor
    accumulates: the next value and the running advantage pass through it unchanged.
    """
    batch, length = token_level_rewards.shape
    advantages = torch.zeros_like(token_level_rewards)
    valid = response_mask.bool()
    next_value = torch.zeros(batch, dtype=values.dtype)
    running = torch.zeros(batch, dtype=values.dtype)
    for t in range(length - 1, -1, -1):
        td_error = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(valid[:, t], td_error + gamma * lam * running, running)
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        advantages[:, t] = running
    returns = advantages + values
    return masked_whiten(advantages, response_mask), returns


@torch.no_grad()
def grpo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = GRPO_EPSILON,
    norm_adv_by_std_in_grpo: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage: (score - group mean) / (group std + epsilon) on every valid token.

    `norm_adv_by_std_in_grpo=False` is Dr. GRPO: the score minus the group mean, unscaled.
    Inputs are `(batch, response_length)`; `index` holds one group id per row.
    """
    scores = token_level_rewards.sum(dim=-1)
    mean, std = _group_mean_std(scores, _group_rows(index))
    centred = scores - mean
    per_row = centred / (std + epsilon) if norm_adv_by_std_in_grpo else centred
    advantages = _broadcast(per_row, response_mask)
    return advantages, advantages


@torch.no_grad()
def rloo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE leave-one-out: the score minus the mean score of the other responses of its group.

    A response alone in its group keeps its score (there is nobody to compare with).
    Inputs are `(batch, response_length)`; `index` holds one group id per row.
    """
    scores = token_level_rewards.sum(dim=-1)
    groups = _group_rows(index)
    sizes = _group_sizes(groups)[groups].to(scores.dtype)
    group_sums = torch.zeros(int(groups.max()) + 1, dtype=scores.dtype).index_add_(
        0, groups, scores
    )
    others = (group_sums[groups] - scores) / (sizes - 1).clamp_min(1)
    per_row = torch.where(sizes > 1, scores - others, scores)
    advantages = _broadcast(per_row, response_mask)
    return advantages, advantages


@torch.no_grad()
def reinforce_plus_plus_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted reward-to-go on valid tokens, whitened over the whole batch's mask.

    Inputs are `(batch, response_length)`. A masked token has return 0 and leaves the running
    return untouched, so rewards after an observation span still reach the tokens before it.
    """
    batch, length = token_level_rewards.shape
    valid = response_mask.bool()
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros(batch, dtype=token_level_rewards.dtype)
    for t in range(length - 1, -1, -1):
        running = torch.where(valid[:, t], token_level_rewards[:, t] + gamma * running, running)
        returns[:, t] = torch.where(valid[:, t], running, torch.zeros_like(running))
    mask = response_mask.to(returns.dtype)
    return masked_whiten(returns, response_mask) * mask, returns


@torch.no_grad()
def reinforce_plus_plus_baseline_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group-mean baseline: score - group mean, whitened over the batch's mask.

    Inputs are `(batch, response_length)`; `index` holds one group id per row.
    """
    scores = token_level_rewards.sum(dim=-1)
    mean, _ = _group_mean_std(scores, _group_rows(index))
    centred = _broadcast(scores - mean, response_mask)
    advantages = masked_whiten(centred, response_mask) * response_mask.to(centred.dtype)
    return advantages, advantages


AdvantageEstimator = Callable[..., tuple[torch.Tensor, torch.Tensor]]

ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry(
    "advantage estimator",
    {
        "gae": gae_advantages,
        "grpo": grpo_advantages,
        "rloo": rloo_advantages,
        "reinforce_plus_plus": reinforce_plus_plus_advantages,
        "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline_advantages,
    },
)
