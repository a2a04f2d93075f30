"""Per-token log-probabilities and entropies from logits at a sampling temperature.

`logits` are `(batch, response_length, vocab)`, `labels` (the sampled token ids) are
`(batch, response_length)`. The policy, the old policy and the reference must all see
`logits / temperature`, the distribution the rollout sampled from: a log-prob at temperature 1
of a token sampled at 0.7 is the log-prob of a different policy (TRL #3029).

log softmax(z)[y] = z[y] - logsumexp(z): we gather the label's logit and subtract the
normaliser, one row of the batch at a time, so neither a full `(batch, length, vocab)`
log-softmax nor a full tempered copy of the logits is ever held (TRL #2683).
"""

from __future__ import annotations

import torch


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")


def log_probs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Log-probability `(batch, response_length)` of each label under softmax(logits / T)."""
    _check_temperature(temperature)
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) / temperature
    log_normaliser = torch.stack([torch.logsumexp(row / temperature, dim=-1) for row in logits])
    return picked - log_normaliser


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy `(batch, response_length)` of softmax(logits / temperature) at each position.

    H = logsumexp(z) - sum(softmax(z) * z), which stays finite for logits of any magnitude
    (no log of a probability that underflowed to 0).
    """
    _check_temperature(temperature)
    rows = []
    for row in logits:
        tempered = row / temperature
        rows.append(
            torch.logsumexp(tempered, dim=-1) - (torch.softmax(tempered, dim=-1) * tempered).sum(-1)
        )
    return torch.stack(rows)
