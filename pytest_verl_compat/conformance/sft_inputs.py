"""The `sft_loss` component's seeded inputs (its sides: `sft`): rows of prompt then response
tokens, loss masks over whole sequences, log-probs of every position, and the normalisers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from pytest_verl_compat.conformance.plan import SFT_DP_SIZES, SFT_LAYOUTS, ConformanceCase

# Each data-parallel size's ranks, each rank's rows in micro-batches of uneven sizes.
RANK_SPLITS: dict[int, tuple[tuple[tuple[int, ...], ...], ...]] = {
    1: (((0, 1, 2), (3,), (4, 5, 6, 7)),),
    2: (((0, 1, 2), (3,)), ((4, 5), (6, 7))),
    4: (((0,), (1,)), ((2, 3),), ((4,), (5,)), ((6, 7),)),
}
assert tuple(RANK_SPLITS) == SFT_DP_SIZES
ROWS = 8


def sft_layout(family: str) -> str:
    return next(layout for layout in SFT_LAYOUTS if family.startswith(layout + "-"))


def sft_inputs(case: ConformanceCase, g: torch.Generator) -> dict[str, Any]:
    """Rows of prompt then response tokens: lengths, the loss mask over each whole sequence (0 on
    the prompt, 1 on trained response tokens), the log-probs of every position (zero past a
    row's end, as the engine's padding) and the normalisers of the family's scenario."""
    dtype = getattr(torch, case.dtype)
    scenario = case.family.rsplit("-", 1)[-1]
    prompts = torch.randint(1, 5, (ROWS,), generator=g)
    responses = torch.randint(1, 9, (ROWS,), generator=g)
    responses[0] = 8  # a row reaching the padded width
    lengths = prompts + responses
    width = int(lengths.max())
    positions = torch.arange(width).unsqueeze(0)
    inside = positions < lengths.unsqueeze(1)
    loss_mask = (inside & (positions >= prompts.unsqueeze(1))).long()
    if scenario == "multiturn":
        for row in range(ROWS):
            start, end = int(prompts[row]), int(lengths[row])
            if end - start >= 4:  # a user turn inside the response, left untrained
                cut = int(torch.randint(start + 1, end - 2, (), generator=g))
                loss_mask[row, cut : cut + 2] = 0
        loss_mask[ROWS - 1] = 0  # a row with no trained token (a turn truncated away)
    log_prob = -(torch.rand((ROWS, width), generator=g, dtype=torch.float64) * 4).to(dtype)
    log_prob = torch.where(inside, log_prob, torch.zeros((), dtype=dtype))
    tokens = int(loss_mask.sum())
    global_ = scenario == "global"
    dp_size, extra = (2, int(torch.randint(1, 40, (), generator=g))) if global_ else (1, 0)
    return {
        "prompts": prompts,
        "lengths": lengths,
        "loss_mask": loss_mask,
        "log_prob": log_prob,
        "dp_size": dp_size,
        "batch_num_tokens": tokens + extra,
    }


def response_view(x: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The padded branch's inputs: per row, the log-probs predicting the response tokens and
    the response mask, left-aligned to the longest response; and each entry's place in the
    whole-sequence layout (row, position) for mapping gradients back."""
    prompts, lengths = x["prompts"], x["lengths"]
    width = int((lengths - prompts).max())
    log_prob = torch.zeros((ROWS, width), dtype=x["log_prob"].dtype)
    mask = torch.zeros((ROWS, width), dtype=torch.long)
    where = torch.full((ROWS, width), -1, dtype=torch.long)
    for row in range(ROWS):
        p, r = int(prompts[row]), int(lengths[row] - prompts[row])
        # Response token t (sequence position p + t) is predicted at position p + t - 1.
        log_prob[row, :r] = x["log_prob"][row, p - 1 : p + r - 1]
        mask[row, :r] = x["loss_mask"][row, p : p + r]
        where[row, :r] = torch.arange(p - 1, p + r - 1)
    return log_prob, mask, where
