"""Padding removal for the training-side model passes (verl's `use_remove_padding`).

A rollout batch is a rectangle: prompts left-padded to the longest prompt, responses
right-padded to the longest response. On the shipped prompts half of that rectangle is padding
(arithmetic prompts are 4-6 characters, word problems ~50), and the tiny models are compute
bound, so every padded position costs as much as a real one. verl removes the padding and runs
flash-attention over the concatenated real tokens; here the real tokens of consecutive
trajectories are packed into rows of at most `PACK_TOKENS` tokens, positions restart at 0 for
each trajectory and the attention mask is left out, which makes transformers build a
block-causal mask from the position ids (`masking_utils.find_packed_sequence_indices`): a token
attends only to earlier tokens of its own trajectory, exactly as in the padded batch.

Rows are bounded because attention cost grows with the square of a row's length: one row per
batch would turn 32 trajectories of ~50 tokens into a 1600-token row.

The outputs are scattered back into the batch's `(batch, response_length, ...)` layout with
zeros at response padding (masked out by every loss and metric), so callers see the same
shapes as before. Values at real positions agree with the padded pass to float32 rounding
(`tests/test_trainer.py` checks both, and gradients).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PACK_TOKENS = 256
"""Tokens per packed row (rows are balanced, so most hold fewer); 128 to 512 measured within 10%."""


@dataclass(frozen=True)
class PackedBatch:
    input_ids: torch.Tensor  # (rows, length): trajectories back to back, then pad
    position_ids: torch.Tensor  # (rows, length): 0.. per trajectory; the tail pad is its own run
    source: tuple[torch.Tensor, torch.Tensor]
    """(packed row, column) of each output that predicts a real response token."""
    target: tuple[torch.Tensor, torch.Tensor]
    """(batch row, response column) the same output belongs to."""
    shape: tuple[int, int]  # (batch, response_length)
    row_tokens: tuple[int, ...]  # real tokens per packed row (the rest is tail pad)


PACKED_MODEL_TYPES = frozenset({"qwen2", "qwen3", "llama"})
"""Architectures whose masks come from `masking_utils.create_causal_mask`, checked by tests."""


def packing_supported(model: torch.nn.Module) -> bool:
    """Whether `model` turns restarting position ids into a block-causal mask.

    Other architectures (GPT-2's absolute positions, sliding windows) would let packed
    trajectories attend to each other, so they keep the padded pass.
    """
    try:
        from transformers.masking_utils import find_packed_sequence_indices  # noqa: F401
    except ImportError:  # transformers before 4.56
        return False
    config = getattr(model, "config", None)
    return (
        getattr(config, "model_type", None) in PACKED_MODEL_TYPES
        and not getattr(config, "use_sliding_window", False)
        and "sliding_attention" not in (getattr(config, "layer_types", None) or ())
    )


def pack(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    pad_id: int,
    max_tokens: int = PACK_TOKENS,
) -> PackedBatch:
    """Each trajectory's real prompt and its response up to the last predicted token.

    Rows are balanced: as many as `max_tokens` requires, each trajectory into the least
    filled row, longest first, so the tail padding of the rectangle stays small.
    """
    prompt_lengths = prompt_mask.sum(-1).tolist()
    response_lengths = response_mask.sum(-1).long().tolist()
    width = prompt_ids.shape[1]
    # The output at the last prompt token predicts response token 0, and so on; the last
    # response token predicts nothing that is trained, so it is not fed.
    sequences = [
        torch.cat([prompt_ids[i, width - p :], responses[i, : max(r - 1, 0)]])
        for i, (p, r) in enumerate(zip(prompt_lengths, response_lengths, strict=True))
    ]
    total = sum(len(tokens) for tokens in sequences)
    row_count = max(1, min(len(sequences), -(-total // max_tokens)))
    members: list[list[int]] = [[] for _ in range(row_count)]
    fill = [0] * row_count
    for i in sorted(range(len(sequences)), key=lambda i: (-len(sequences[i]), i)):
        k = min(range(row_count), key=lambda k: (fill[k], k))
        members[k].append(i)
        fill[k] += len(sequences[i])
    rows = [[sequences[i] for i in sorted(row)] for row in members]
    source_rows, source_cols, target_rows, target_cols = [], [], [], []
    for k, row in enumerate(members):
        start = 0
        for i in sorted(row):
            p, r = prompt_lengths[i], response_lengths[i]
            source_rows.extend([k] * r)
            source_cols.extend(range(start + p - 1, start + p - 1 + r))
            target_rows.extend([i] * r)
            target_cols.extend(range(r))
            start += len(sequences[i])
    length = max(fill)
    input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    position_ids = torch.zeros((len(rows), length), dtype=torch.long)
    for k, pieces in enumerate(rows):
        column = 0
        for tokens in pieces:
            input_ids[k, column : column + len(tokens)] = tokens
            position_ids[k, column : column + len(tokens)] = torch.arange(len(tokens))
            column += len(tokens)
        # The tail padding restarts at 0 too: a separate run that nothing real attends to.
        position_ids[k, column:] = torch.arange(length - column)
    return PackedBatch(
        input_ids,
        position_ids,
        (torch.tensor(source_rows, dtype=torch.long), torch.tensor(source_cols, dtype=torch.long)),
        (torch.tensor(target_rows, dtype=torch.long), torch.tensor(target_cols, dtype=torch.long)),
        (prompt_ids.shape[0], responses.shape[1]),
        tuple(fill),
    )


def unpack(outputs: torch.Tensor, packed: PackedBatch) -> torch.Tensor:
    """`(rows, length, ...)` packed outputs → `(batch, response_length, ...)`, zeros at padding."""
    picked = outputs[packed.source]
    out = outputs.new_zeros((*packed.shape, *outputs.shape[2:]))
    # index_put is differentiable: gradients reach exactly the packed positions picked here.
    return out.index_put(packed.target, picked)
