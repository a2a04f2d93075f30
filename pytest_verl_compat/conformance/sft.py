"""The `sft_loss` component: our SFT loss against verl 0.9.0's `sft_loss`, values and gradients.

verl's loss (verl/workers/utils/losses.py:28-54) has two branches, chosen by the batch's
`pad_mode`: no padding (losses.py:35-49), where the engine hands it the log-probs of whole
sequences as a jagged nested tensor and the loss mask of each sequence's own tokens, which it
shifts left by one over the flat batch; and padded (losses.py:50-52), log-probs of the responses
`(batch, response_length)` under `response_mask`. Families, `<layout>-<scenario>`:

- layouts: `nested` (no padding, the log-probs a jagged nested tensor built from its rows),
  `remove-padding` (no padding, the log-probs one flat row viewed as a nested tensor, as the
  FSDP engine returns them with `use_remove_padding`, transformer_impl.py:1405-1409, so the
  gradient reaches the flat values), `padded` (the padded branch, `pad_mode=left_right`);
- scenarios: `local` (one rank, the batch is the global batch), `global` (rank 0 of two, more
  trained tokens on the other rank), `multiturn` (assistant turns between untrained turns, a row
  with no trained token);
- `microbatch-dp<N>`: the batch split over N ranks into uneven micro-batches; each micro-batch
  is normalised by the whole batch's tokens and `dp_size`, micro-batch losses summed per rank and
  averaged over ranks as DDP averages gradients; held against verl's loss on the whole batch.

The only aggregation verl's SFT applies is a global token mean (it reads no `loss_agg_mode`),
so `token-mean` is the one variant (`reference_trainer.math.sft.SFT_LOSS_AGG_MODES`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from pytest_verl_compat.conformance.plan import ConformanceCase
from pytest_verl_compat.conformance.sft_inputs import (
    RANK_SPLITS,
    ROWS,
    response_view,
    sft_layout,
)
from pytest_verl_compat.conformance.sides import upstream_modules

# --------------------------------------------------------------------------- upstream


def _upstream_call(
    x: Mapping[str, Any], rows: Sequence[int], layout: str, dp_size: int, tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's sft_loss on `rows`: (loss, gradient w.r.t. the whole-sequence log-probs)."""
    up = upstream_modules()
    index = torch.tensor(list(rows))
    lengths = [int(n) for n in x["lengths"][index]]
    padded = x["log_prob"][index].detach().clone()
    grad = torch.zeros_like(padded)
    normalisers = {"dp_size": dp_size, "batch_num_tokens": tokens}
    if layout == "padded":
        view, mask, where = response_view(x)
        leaf = view[index].detach().requires_grad_(True)
        data = up.TensorDict({"response_mask": mask[index]}, batch_size=[len(rows)])
        up.tu.assign_non_tensor(data, pad_mode="left_right", **normalisers)
        loss, _ = up.losses.sft_loss(None, {"log_probs": leaf}, data)
        (leaf_grad,) = torch.autograd.grad(loss, (leaf,))
        keep = where[index] >= 0
        grad[keep.nonzero(as_tuple=True)[0], where[index][keep]] = leaf_grad[keep]
        return loss.detach(), grad
    masks = [x["loss_mask"][row, :n] for row, n in zip(rows, lengths, strict=True)]
    if layout == "remove-padding":
        values = torch.cat([padded[i, :n] for i, n in enumerate(lengths)]).requires_grad_(True)
        offsets = torch.tensor([0, *lengths]).cumsum(0)
        log_probs = torch.nested.nested_tensor_from_jagged(values, offsets=offsets)
        leaves: tuple[torch.Tensor, ...] = (values,)
    else:
        leaf = padded.requires_grad_(True)
        log_probs = torch.nested.as_nested_tensor(
            [leaf[i, :n] for i, n in enumerate(lengths)], layout=torch.jagged
        )
        leaves = (leaf,)
    data = up.tu.get_tensordict(
        {"loss_mask": torch.nested.as_nested_tensor(masks, layout=torch.jagged)}
    )
    up.tu.assign_non_tensor(data, pad_mode="no_padding", **normalisers)
    loss, _ = up.losses.sft_loss(None, {"log_probs": log_probs}, data)
    (leaf_grad,) = torch.autograd.grad(loss, leaves)
    if layout == "remove-padding":
        start = 0
        for i, n in enumerate(lengths):
            grad[i, :n] = leaf_grad[start : start + n]
            start += n
    else:
        grad = leaf_grad
    return loss.detach(), grad


def sft_upstream(case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any]) -> dict[str, Any]:
    """verl's loss on the whole batch; the micro-batch families hold theirs against this."""
    if case.family.startswith("microbatch-"):
        tokens = int(x["loss_mask"].sum())
        loss, grad = _upstream_call(x, range(ROWS), "nested", 1, tokens)
    else:
        loss, grad = _upstream_call(
            x, range(ROWS), sft_layout(case.family), x["dp_size"], x["batch_num_tokens"]
        )
    return {"loss": loss, "grad/log_prob": grad}


# --------------------------------------------------------------------------- ours


def _ours_call(
    ns: Mapping[str, Any],
    x: Mapping[str, Any],
    rows: Sequence[int],
    layout: str,
    dp_size: int,
    tokens: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    index = torch.tensor(list(rows))
    if layout == "padded":
        view, mask, where = response_view(x)
        leaf = view[index].detach().requires_grad_(True)
        loss = ns["sft_loss"](leaf, mask[index], dp_size=dp_size, batch_num_tokens=tokens)
        (leaf_grad,) = torch.autograd.grad(loss, (leaf,))
        grad = torch.zeros_like(x["log_prob"][index])
        keep = where[index] >= 0
        grad[keep.nonzero(as_tuple=True)[0], where[index][keep]] = leaf_grad[keep]
        return loss.detach(), grad
    leaf = x["log_prob"][index].detach().requires_grad_(True)
    mask = ns["next_token_loss_mask"](x["loss_mask"][index])
    loss = ns["sft_loss"](leaf, mask, dp_size=dp_size, batch_num_tokens=tokens)
    (grad,) = torch.autograd.grad(loss, (leaf,))
    return loss.detach(), grad


def sft_ours(case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any]) -> dict[str, Any]:
    if not case.family.startswith("microbatch-"):
        loss, grad = _ours_call(
            ns, x, range(ROWS), sft_layout(case.family), x["dp_size"], x["batch_num_tokens"]
        )
        return {"loss": loss, "grad/log_prob": grad}
    ranks = RANK_SPLITS[int(case.family.removeprefix("microbatch-dp"))]
    dp_size, tokens = len(ranks), int(x["loss_mask"].sum())
    total = torch.zeros((), dtype=x["log_prob"].dtype)
    grad = torch.zeros_like(x["log_prob"])
    for rank in ranks:
        for rows in rank:
            loss, part = _ours_call(ns, x, rows, "nested", dp_size, tokens)
            # Each rank sums its micro-batches; DDP averages the ranks' gradients.
            total = total + loss / dp_size
            grad[list(rows)] = part / dp_size
    return {"loss": total, "grad/log_prob": grad}


def sft_uses(case: ConformanceCase) -> frozenset[str]:
    if case.family.startswith("padded-"):
        return frozenset({"sft_loss"})
    return frozenset({"sft_loss", "next_token_loss_mask"})
