"""verl's supervised fine-tuning loss: the negative log-likelihood of the trained tokens.

verl 0.9.0's `sft_loss` (verl/workers/utils/losses.py:28-54) is one aggregation, whatever the
configuration: the sum of the trained tokens' log-probs over `batch_num_tokens`, the trained
tokens of the whole global batch (the FSDP engine all-reduces the loss mask's sum over the
data-parallel group, verl/workers/engine/fsdp/transformer_impl.py:706-711), times `dp_size` to
undo the ranks' gradient average. It reads neither `global_batch_size` nor a `loss_agg_mode`
(the trainer passes `config=None`, verl/trainer/sft_trainer.py:163), so `token-mean` is the one
mode registered here, and the sum of the micro-batches' losses is the batch's loss for any split.

Layouts. verl's no-padding batches (the only `pad_mode` its FSDP engine runs,
transformer_impl.py:1137) give one log-prob per position of each whole sequence, the log-prob
of the next token, and a loss mask over the sequence's own tokens, which the loss shifts left by
one (losses.py:43-44). Ours takes both already aligned, `(batch, length)`: `next_token_loss_mask`
makes that shift row by row. verl shifts the flat batch, so the last position of a sequence
takes the mask of the next sequence's first token; a sequence that starts with a trained token
(no prompt) would train its predecessor's last position on it. Ours never trains across rows;
the SFT data sets start every sequence with an untrained prompt token, where both agree.
"""

from __future__ import annotations

import torch

from reference_trainer.math.aggregation import agg_loss
from reference_trainer.math.registry import Registry

# The aggregation verl's sft_loss applies (losses.py:49 and :52): a global token mean.
SFT_LOSS_AGG_MODES: Registry[str] = Registry("SFT loss_agg_mode", {"token-mean": "token-mean"})


def next_token_loss_mask(loss_mask: torch.Tensor) -> torch.Tensor:
    """The mask of each position's prediction: position t predicts token t + 1, so it is trained
    where token t + 1 is; the last position of a row predicts nothing. `(batch, length)`."""
    shifted = torch.zeros_like(loss_mask)
    shifted[:, :-1] = loss_mask[:, 1:]
    return shifted


def sft_loss(
    log_prob: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    loss_agg_mode: str = "token-mean",
) -> torch.Tensor:
    """The micro-batch's share of the batch's mean negative log-likelihood.

    `log_prob` `(batch, length)` holds the log-prob of each position's target token, `loss_mask`
    the same shape (already aligned, see `next_token_loss_mask`). `batch_num_tokens` counts the
    trained tokens of the whole batch on every rank; left None, this micro-batch's (one rank).
    """
    mode = SFT_LOSS_AGG_MODES[loss_agg_mode]
    return -agg_loss(
        log_prob, loss_mask.bool(), mode, dp_size=dp_size, batch_num_tokens=batch_num_tokens
    )
