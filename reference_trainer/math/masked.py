"""Masked reductions over `(batch, response_length)` tensors; masked-out entries never leak in."""

from __future__ import annotations

import torch

# verl adds this to the variance before the inverse square root when whitening advantages.
WHITEN_EPSILON = 1e-8


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `values` where `mask` is non-zero, over `dim` (all elements when None).

    `torch.where` rather than a product, so NaN or inf under a zero of the mask stays out and
    receives no gradient.
    """
    kept = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype))
    return kept.sum() if dim is None else kept.sum(dim)


def valid_count(mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Number of non-zero mask entries (int64), over `dim` (all elements when None)."""
    nonzero = mask.bool()
    return nonzero.sum() if dim is None else nonzero.sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` over the valid entries; 0 where there are none.

    verl divides by `count + 1e-8`; with its integer or boolean masks that sum is taken in
    float32, where the 1e-8 rounds away for any count >= 1, so it only guards empty masks.
    Dividing by max(count, 1) is that behaviour, exactly, in every dtype.
    """
    count = valid_count(mask, dim).clamp_min(1).to(values.dtype)
    return masked_sum(values, mask, dim) / count


def masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Shift and scale `values` to zero mean and unit (unbiased) variance over the valid entries.

    Every entry is transformed, valid or not, as verl does; callers multiply by the mask when
    the padded entries must be zero.
    """
    count = int(valid_count(mask))
    if count < 2:
        # The unbiased variance of fewer than two values is undefined; verl raises too.
        raise ValueError(f"whitening needs at least two valid entries, got {count}")
    mean = masked_mean(values, mask)
    variance = masked_sum((values - mean) ** 2, mask) / (count - 1)
    return (values - mean) / torch.sqrt(variance + WHITEN_EPSILON)
