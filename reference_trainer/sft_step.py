"""One supervised fine-tuning step, as verl 0.9.0's TrainingWorker runs it on its FSDP engine.

Per batch (verl/workers/engine/base.py:113-132, verl/workers/engine_workers.py:337-390):
zero the gradients; split the batch into micro-batches (a fixed size, or a token budget:
verl/workers/engine/utils.py:92-130); for each, the SFT loss normalised by the whole batch's
trained tokens (verl/workers/engine/fsdp/transformer_impl.py:706-711), backward; clip the
gradient norm at `optim.clip_grad` and step unless it is not finite (:759-805); step the
learning-rate scheduler (`update_lr_scheduler`, verl/trainer/sft_trainer.py:379). The metrics
are verl's: the summed micro-batch losses (`train/loss`, engine_workers.py:186-192), the norm
before clipping and the learning rate after the scheduler's step (engine_workers.py:366-374).

With `use_remove_padding` a micro-batch's sequences are packed into one row whose positions
restart at each sequence (transformers then masks attention block-causally, as verl's
flash-attention varlen pass does); without, they are right-padded under an attention mask.
Either way each position's log-prob is the same function, to float32 rounding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from reference_trainer.config import OptimConfig
from reference_trainer.math.logprobs import log_probs_from_logits
from reference_trainer.math.sft import next_token_loss_mask, sft_loss
from reference_trainer.models import schedule
from reference_trainer.packing import packing_supported
from reference_trainer.sft_data import TokenizedConversation

OPTIMIZERS = ("AdamW", "SGD")


def build_sft_optimizer(
    model: torch.nn.Module, name: str, optim: OptimConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """torch.optim's `name` with verl's arguments: lr and weight decay, betas for Adam
    (verl/workers/config/optimizer.py:326-336), and verl's warm-up/decay schedule."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer: torch.optim.Optimizer
    if name == "AdamW":
        optimizer = torch.optim.AdamW(
            params, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay
        )
    elif name == "SGD":
        optimizer = torch.optim.SGD(params, lr=optim.lr, weight_decay=optim.weight_decay)
    else:
        raise ValueError(f"optim.optimizer: unknown {name!r}; valid: {', '.join(OPTIMIZERS)}")
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(optim, total_steps))


def micro_batches(
    lengths: Sequence[int], micro_batch_size: int | None, max_token_len: int | None
) -> list[list[int]]:
    """The batch's rows in micro-batches: consecutive groups of `micro_batch_size`, or as many
    groups as the token budget needs (ceil(tokens / budget)), longest rows first into the least
    filled one (verl balances by token count too, verl/utils/seqlen_balancing.py)."""
    rows = list(range(len(lengths)))
    if max_token_len is None:
        size = micro_batch_size or len(rows)
        return [rows[i : i + size] for i in range(0, len(rows), size)]
    if max(lengths) > max_token_len:
        # verl asserts the same (verl/utils/seqlen_balancing.py:384-386).
        raise ValueError(
            f"data.max_token_len_per_gpu={max_token_len} is shorter than a sequence of "
            f"{max(lengths)} tokens"
        )
    count = max(1, -(-sum(lengths) // max_token_len))
    groups: list[list[int]] = [[] for _ in range(min(count, len(rows)))]
    fill = [0] * len(groups)
    for row in sorted(rows, key=lambda r: (-lengths[r], r)):
        k = min(range(len(groups)), key=lambda g: (fill[g], g))
        groups[k].append(row)
        fill[k] += lengths[row]
    return [sorted(group) for group in groups if group]


def next_token_log_probs(
    model: torch.nn.Module, sequences: Sequence[torch.Tensor], pad_id: int, *, packed: bool
) -> torch.Tensor:
    """`(batch, longest)`: at position t of each sequence, the log-prob of its token t + 1; zero
    at its last position and past its end."""
    lengths = [len(s) for s in sequences]
    width = max(lengths)
    if packed and packing_supported(model):
        ids = torch.cat(list(sequences)).unsqueeze(0)
        positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
        logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0]
        starts = [0, *torch.tensor(lengths).cumsum(0).tolist()]
        rows = [logits[starts[i] : starts[i + 1]] for i in range(len(sequences))]
    else:
        ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(sequences), width), dtype=torch.long)
        for i, sequence in enumerate(sequences):
            ids[i, : len(sequence)] = sequence
            attention[i, : len(sequence)] = 1
        logits = model(input_ids=ids, attention_mask=attention, use_cache=False).logits
        rows = [logits[i, :n] for i, n in enumerate(lengths)]
    picked = []
    for row, sequence in zip(rows, sequences, strict=True):
        picked.append(log_probs_from_logits(row[:-1].unsqueeze(0), sequence[1:].unsqueeze(0))[0])
    return torch.stack([torch.nn.functional.pad(p, (0, width - len(p))) for p in picked])


def padded_masks(batch: Sequence[TokenizedConversation]) -> torch.Tensor:
    width = max(len(s.loss_mask) for s in batch)
    return torch.stack(
        [torch.nn.functional.pad(s.loss_mask, (0, width - len(s.loss_mask))) for s in batch]
    )


def sft_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    batch: Sequence[TokenizedConversation],
    *,
    pad_id: int,
    grad_clip: float,
    micro_batch_size: int | None,
    max_token_len: int | None,
    packed: bool,
) -> dict[str, float]:
    """One optimizer step on `batch`; verl's metrics (`train/loss`, `train/grad_norm`,
    `train/lr`)."""
    model.train()
    tokens = int(sum(int(s.loss_mask.sum()) for s in batch))
    optimizer.zero_grad()
    total = 0.0
    groups = micro_batches([len(s.input_ids) for s in batch], micro_batch_size, max_token_len)
    for rows in groups:
        micro = [batch[r] for r in rows]
        log_prob = next_token_log_probs(model, [s.input_ids for s in micro], pad_id, packed=packed)
        mask = next_token_loss_mask(padded_masks(micro))
        loss = sft_loss(log_prob, mask, batch_num_tokens=tokens)
        loss.backward()
        total += float(loss.detach())
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    if torch.isfinite(grad_norm):
        optimizer.step()
    else:  # verl skips the update and drops the gradients (transformer_impl.py:791-796)
        optimizer.zero_grad()
    scheduler.step()
    return {
        "train/loss": total,
        "train/grad_norm": float(grad_norm),
        "train/lr": scheduler.get_last_lr()[0],
        "train/global_tokens": float(sum(len(s.input_ids) for s in batch)),
    }


@torch.no_grad()
def sft_validation_loss(
    model: torch.nn.Module,
    batches: Sequence[Sequence[TokenizedConversation]],
    *,
    pad_id: int,
    packed: bool,
) -> float:
    """verl's `val/loss`: the mean over validation batches of each batch's token-mean loss
    (verl/trainer/sft_trainer.py:416-436)."""
    model.eval()
    losses = []
    for batch in batches:
        log_prob = next_token_log_probs(model, [s.input_ids for s in batch], pad_id, packed=packed)
        mask = next_token_loss_mask(padded_masks(batch))
        losses.append(float(sft_loss(log_prob, mask)))
    return sum(losses) / max(1, len(losses))
