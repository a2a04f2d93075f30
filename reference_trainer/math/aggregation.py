"""The one aggregation every loss term goes through, registered under verl's `loss_agg_mode` names.

A loss is computed per micro-batch, but it must mean the same thing whatever the split: the
gradients of the micro-batches of a mini-batch, summed within a data-parallel rank and averaged
across ranks (what DDP/FSDP do), must equal the gradient of the whole mini-batch. So the
denominators are the *global* ones of the mini-batch, passed in:

- `batch_num_tokens`: valid tokens in the whole mini-batch, all ranks together;
- `global_batch_size`: sequences in the whole mini-batch, all ranks together;
- `dp_size`: number of data-parallel ranks, multiplied in to undo the cross-rank average;
- `loss_scale_factor`: the constant divisor of `seq-mean-token-sum-norm` (Dr. GRPO); without it
  the divisor is the padded width, which changes with padding.

Left as None, each falls back to the local micro-batch (only valid with `dp_size == 1`), which
gives the mini-batch loss when the micro-batch *is* the mini-batch.
"""

from __future__ import annotations

from typing import Protocol

import torch

from reference_trainer.math.masked import masked_sum, valid_count
from reference_trainer.math.registry import Registry


class Aggregator(Protocol):
    def __call__(
        self,
        loss_mat: torch.Tensor,
        loss_mask: torch.Tensor,
        *,
        dp_size: int,
        batch_num_tokens: int | torch.Tensor | None,
        global_batch_size: int | torch.Tensor | None,
        loss_scale_factor: float | None,
    ) -> torch.Tensor: ...


def _local(value: torch.Tensor, dp_size: int, name: str) -> torch.Tensor:
    """A local stand-in for a global normaliser, refused when other ranks hold part of the batch."""
    if dp_size > 1:
        raise ValueError(f"{name} (global, all ranks) is required when dp_size > 1")
    return value


def _sequence_mean(
    per_sequence: torch.Tensor,
    loss_mask: torch.Tensor,
    dp_size: int,
    global_batch_size: int | torch.Tensor | None,
) -> torch.Tensor:
    """Sum of per-sequence losses over the mini-batch's sequence count, times `dp_size`.

    The local fallback counts only sequences with at least one valid token, as verl does; a
    global size counts every sequence, empty or not (verl passes `ppo_mini_batch_size * n`).
    """
    if global_batch_size is None:
        live = valid_count(loss_mask, dim=-1) > 0
        global_batch_size = _local(live.sum(), dp_size, "global_batch_size")
    return per_sequence.sum() * dp_size / global_batch_size


def token_mean(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Mean over every valid token of the mini-batch: long sequences weigh more."""
    if batch_num_tokens is None:
        batch_num_tokens = _local(valid_count(loss_mask), dp_size, "batch_num_tokens")
    return masked_sum(loss_mat, loss_mask) * dp_size / batch_num_tokens


def token_sum(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Sum over every valid token of the mini-batch, no normalisation."""
    return masked_sum(loss_mat, loss_mask) * dp_size


def seq_mean_token_sum(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Mean over sequences of each sequence's token sum."""
    per_sequence = masked_sum(loss_mat, loss_mask, dim=-1)
    return _sequence_mean(per_sequence, loss_mask, dp_size, global_batch_size)


def seq_mean_token_sum_norm(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """`seq-mean-token-sum` over a constant (Dr. GRPO): `loss_scale_factor`, else padded width."""
    per_sequence = masked_sum(loss_mat, loss_mask, dim=-1)
    divisor = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
    return _sequence_mean(per_sequence, loss_mask, dp_size, global_batch_size) / divisor


def seq_mean_token_mean(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Mean over sequences of each sequence's token mean; every sequence weighs the same."""
    lengths = valid_count(loss_mask, dim=-1)
    # An empty sequence has token mean 0 (verl: 0 / (0 + 1e-8)) and, locally, is not counted.
    per_sequence = masked_sum(loss_mat, loss_mask, dim=-1) / lengths.clamp_min(1).to(loss_mat.dtype)
    return _sequence_mean(per_sequence, loss_mask, dp_size, global_batch_size)


AGG_MODES: Registry[Aggregator] = Registry(
    "loss_agg_mode",
    {
        "token-mean": token_mean,
        "token-sum": token_sum,
        "seq-mean-token-sum": seq_mean_token_sum,
        "seq-mean-token-mean": seq_mean_token_mean,
        "seq-mean-token-sum-norm": seq_mean_token_sum_norm,
    },
)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    *,
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Reduce a `(batch, response_length)` loss matrix under `loss_mask` to a micro-batch scalar.

    Summing the results of the micro-batches of a mini-batch (and averaging over ranks) gives the
    mini-batch loss, provided the global normalisers described in the module docstring are passed.
    """
    aggregate = AGG_MODES[loss_agg_mode]
    return aggregate(
        loss_mat,
        loss_mask,
        dp_size=dp_size,
        batch_num_tokens=batch_num_tokens,
        global_batch_size=global_batch_size,
        loss_scale_factor=loss_scale_factor,
    )


def unpadded_scale(
    loss_scale_factor: float | None, loss_agg_mode: str, response_mask: torch.Tensor
) -> float | None:
    """The divisor of `seq-mean-token-sum-norm` as verl's V1 engine applies it.

    Without `loss_scale_factor`, `agg_loss` divides by the loss mask's width
    (verl/trainer/ppo/core_algos.py:1190-1192). V1's micro-batches are unpadded nested tensors,
    padded only inside the loss (verl/workers/utils/losses.py:91 and :181), so that width is the
    micro-batch's longest response, not `data.max_response_length` nor our batch's width.
    A response's length runs to its last valid token, masked tokens inside it (a multi-turn
    response's observations) included: its valid-token count would divide by less. (A response
    ending in masked tokens is longer in V1 than its mask shows; ours end in a valid token.)
    """
    if loss_scale_factor is not None or loss_agg_mode != "seq-mean-token-sum-norm":
        return loss_scale_factor
    positions = torch.arange(1, response_mask.shape[-1] + 1, device=response_mask.device)
    return float((positions * (response_mask != 0)).max())
