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
    attention_mask: torch.Tensor | None = None
    """(rows, 1, length, length) additive block mask when prompts are shared; None: the
    position ids alone separate the trajectories."""


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
    share_prompts: bool = True,
) -> PackedBatch:
    """Each trajectory's real prompt and its response up to the last predicted token.

    With `share_prompts`, trajectories with the same prompt (GRPO's n responses) form one
    segment: the prompt once, then each response, which attends to the prompt and to itself
    only (verl's prefix grouper); an explicit block mask then replaces the position-id one.
    Segments are packed into balanced rows: as many as `max_tokens` requires, each segment
    into the least filled row, longest first, so the tail padding stays small.
    """
    prompt_lengths = prompt_mask.sum(-1).tolist()
    response_lengths = response_mask.sum(-1).long().tolist()
    width = prompt_ids.shape[1]
    groups: dict[tuple, list[int]] = {}
    for i in range(len(prompt_lengths)):
        key = tuple(prompt_ids[i, width - prompt_lengths[i] :].tolist()) if share_prompts else i
        groups.setdefault(key, []).append(i)
    # A segment: one prompt, then the fed tokens of each member. The output at the last prompt
    # token predicts response token 0 of every member; the last response token predicts
    # nothing that is trained, so it is not fed.
    segments = [
        (members, [max(response_lengths[i] - 1, 0) for i in members]) for members in groups.values()
    ]
    sizes = [prompt_lengths[m[0]] + sum(fed) for m, fed in segments]
    row_count = max(1, min(len(segments), -(-sum(sizes) // max_tokens)))
    rows: list[list[int]] = [[] for _ in range(row_count)]
    fill = [0] * row_count
    for s in sorted(range(len(segments)), key=lambda s: (-sizes[s], s)):
        k = min(range(row_count), key=lambda k: (fill[k], k))
        rows[k].append(s)
        fill[k] += sizes[s]
    length = max(fill)
    input_ids = torch.full((row_count, length), pad_id, dtype=torch.long)
    position_ids = torch.zeros((row_count, length), dtype=torch.long)
    # Per column: its segment (the tail is one more) and whose response it is (-1: shared).
    segment_of = torch.full((row_count, length), -1, dtype=torch.long)
    member_of = torch.full((row_count, length), -1, dtype=torch.long)
    source_rows, source_cols, target_rows, target_cols = [], [], [], []
    for k, row in enumerate(rows):
        column = 0
        for s in sorted(row):
            members, fed = segments[s]
            p = prompt_lengths[members[0]]
            input_ids[k, column : column + p] = prompt_ids[members[0], width - p :]
            position_ids[k, column : column + p] = torch.arange(p)
            segment_of[k, column : column + p] = s
            prompt_end = column + p
            column = prompt_end
            for i, f in zip(members, fed, strict=True):
                input_ids[k, column : column + f] = responses[i, :f]
                position_ids[k, column : column + f] = torch.arange(p, p + f)
                segment_of[k, column : column + f] = s
                member_of[k, column : column + f] = i
                r = response_lengths[i]
                source_rows.extend([k] * r)
                source_cols.extend([prompt_end - 1, *range(column, column + r - 1)][:r])
                target_rows.extend([i] * r)
                target_cols.extend(range(r))
                column += f
        # The tail padding restarts at 0: a separate run that nothing real attends to.
        position_ids[k, column:] = torch.arange(length - column)
        segment_of[k, column:] = len(segments)
    attention_mask = None
    if any(len(members) > 1 for members, _ in segments):
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        same_segment = segment_of[:, :, None] == segment_of[:, None, :]
        visible = (member_of[:, None, :] == -1) | (member_of[:, :, None] == member_of[:, None, :])
        allowed = causal & same_segment & visible
        attention_mask = torch.zeros(allowed.shape, dtype=torch.float32).masked_fill_(
            ~allowed, torch.finfo(torch.float32).min
        )[:, None]
    return PackedBatch(
        input_ids,
        position_ids,
        (torch.tensor(source_rows, dtype=torch.long), torch.tensor(source_cols, dtype=torch.long)),
        (torch.tensor(target_rows, dtype=torch.long), torch.tensor(target_cols, dtype=torch.long)),
        (prompt_ids.shape[0], responses.shape[1]),
        tuple(fill),
        attention_mask,
    )


def unpack(outputs: torch.Tensor, packed: PackedBatch) -> torch.Tensor:
    """`(rows, length, ...)` packed outputs → `(batch, response_length, ...)`, zeros at padding."""
    picked = outputs[packed.source]
    out = outputs.new_zeros((*packed.shape, *outputs.shape[2:]))
    # index_put is differentiable: gradients reach exactly the packed positions picked here.
    return out.index_put(packed.target, picked)
