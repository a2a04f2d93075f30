"""A first step's batch in V1's layout, of a few rows: what the losses and the advantage read.

Two prompts × the configuration's ``rollout.n`` responses, prompts of 2 and 3 tokens, responses of
1 to 3 tokens (62 to 64 in the effects' batch), every per-token field a jagged nested tensor of the response's length (as
``trainer_base`` keeps them in TransferQueue and hands them to the engine, ``response_to_nested``),
model outputs flat over prompt and response tokens (``FSDPEngineWithLMHead``'s unpadded output),
and the global normalisers the engine sets (verl/workers/engine/fsdp/transformer_impl.py:706-711).
Values spread widely (``_per_token``): importance ratios from about 0.05 to 20 with advantages of
both signs, so that every clip, the dual clip and each estimator's branches bind on some token;
a probe that perturbs a setting (``effects``) then sees its effect wherever it has one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Responses per prompt are capped: the checks depend on the grouping, not on how many there are.
_MAX_N = 4
_PROMPTS = 2


@dataclass(frozen=True)
class TinyBatch:
    """The rows' shape, and the batch keys V1 gives them (``{uid}_{session}_{index}``)."""

    n: int
    prompt_lengths: tuple[int, ...]
    response_lengths: tuple[int, ...]

    @property
    def rows(self) -> int:
        return len(self.response_lengths)

    @property
    def keys(self) -> list[str]:
        return [f"p{row // self.n}_{row % self.n}_0" for row in range(self.rows)]


def shape(n: int, tokens: int = 3) -> TinyBatch:
    """Two prompts × ``n`` responses of ``tokens - 2`` to ``tokens`` tokens (rows of different
    lengths)."""
    n = max(1, min(int(n), _MAX_N))
    rows = _PROMPTS * n
    return TinyBatch(
        n=n,
        prompt_lengths=tuple(2 + (row // n) % 2 for row in range(rows)),
        response_lengths=tuple(tokens - 2 + row % 3 for row in range(rows)),
    )


def _nested(rows: list[Any]) -> Any:
    import torch

    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def _per_token(batch: TinyBatch, name: str, scale: float, offset: float = 0.0) -> Any:
    """``offset + scale × sin(1.7·row + 2.3·token + phase)``: distinct, of both signs around the
    offset, with a phase of its own per field so that no two fields move together (an advantage
    that falls whenever the ratio rises would never meet a clip)."""
    import torch

    phase = sum(map(ord, name)) % 97 / 7.0
    return _nested(
        [
            offset
            + scale * torch.sin(1.7 * row + 2.3 * torch.arange(length, dtype=torch.float32) + phase)
            for row, length in enumerate(batch.response_lengths)
        ]
    )


def trajectories(batch: TinyBatch, *, rollout_log_probs: bool) -> Any:
    """What ``_compute_advantage`` reads from TransferQueue (trainer_base.py:1590)."""
    import torch
    from tensordict import TensorDict

    fields: dict[str, Any] = {
        "uid": torch.tensor([row // batch.n for row in range(batch.rows)]),
        "response_mask": _nested([torch.ones(n, dtype=torch.long) for n in batch.response_lengths]),
        "rm_scores": _per_token(batch, "rm_scores", 0.7, 0.5),
        "old_log_probs": _per_token(batch, "old_log_probs", 3.0, -1.0),
        "ref_log_prob": _per_token(batch, "ref_log_prob", 0.9, -1.1),
        "values": _per_token(batch, "values", 0.3, 0.2),
    }
    if rollout_log_probs:
        fields["rollout_log_probs"] = _per_token(batch, "rollout_log_probs", 1.2, -1.05)
    return TensorDict(fields, batch_size=[batch.rows])


class BatchMeta:
    """What TransferQueue hands the trainer for a batch: its keys, partition and knobs."""

    def __init__(self, keys: list[str]) -> None:
        self.keys, self.partition_id = keys, "train"
        self.extra_info: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self.keys)


def through_transfer_queue(
    compute_advantage: Callable[[BatchMeta], Any], n: int, rollout_log_probs: bool, tokens: int = 3
) -> dict[str, Any]:
    """``compute_advantage(meta)`` (the trainer's ``_compute_advantage``) on a tiny batch of
    ``trajectories``, TransferQueue's get and put standing in: the fields it put back."""
    import transfer_queue

    from pytest_verl_compat.upstream.probes.patching import all_patched

    batch = shape(n, tokens)
    stored = trajectories(batch, rollout_log_probs=rollout_log_probs)
    meta = BatchMeta(batch.keys)
    put: dict[str, Any] = {}

    def kv_batch_get(
        keys: Any = None, partition_id: Any = None, select_fields: Any = (), *_: Any, **__: Any
    ) -> Any:
        return stored.select(*[name for name in select_fields if name in stored.keys()])

    def kv_batch_put(
        keys: Any = None, partition_id: Any = None, fields: Any = None, *_: Any, **__: Any
    ) -> Any:
        put.update({name: fields[name] for name in fields.keys()})
        return meta

    patches = [
        (transfer_queue, "kv_batch_get", kv_batch_get),
        (transfer_queue, "kv_batch_put", kv_batch_put),
    ]
    with all_patched(patches):
        compute_advantage(meta)
    return put


def micro_batch(batch: TinyBatch, dp_size: int, fields: dict[str, tuple[float, float]]) -> Any:
    """A micro-batch as the engine hands it to a loss: prompts and responses, the response mask,
    one nested field per ``fields`` entry (name → (offset, spread)), and the normalisers."""
    import torch
    from verl.utils import tensordict_utils as tu

    data = tu.get_tensordict(
        {
            "prompts": _nested([torch.zeros(n, dtype=torch.long) for n in batch.prompt_lengths]),
            "responses": _nested(
                [torch.zeros(n, dtype=torch.long) for n in batch.response_lengths]
            ),
            "response_mask": _nested(
                [torch.ones(n, dtype=torch.long) for n in batch.response_lengths]
            ),
            **{
                name: _per_token(batch, name, spread, offset)
                for name, (offset, spread) in fields.items()
            },
        }
    )
    tu.assign_non_tensor(
        data,
        dp_size=dp_size,
        batch_num_tokens=sum(batch.response_lengths) * dp_size,
        global_batch_size=batch.rows * dp_size,
    )
    return data


class MissingModelOutput(KeyError):
    """A model output the stand-in does not make (the distillation losses the engine's top-k
    logits processor computes, verl/trainer/distillation/fsdp/losses.py:144): the probe's limit."""


class StandInOutput(dict[str, Any]):
    """The outputs a loss receives from the model: what the probe computes, and a
    ``MissingModelOutput`` for any other the loss asks for."""

    def __missing__(self, key: str) -> Any:
        raise MissingModelOutput(f"model output {key!r} is computed by the model's forward")


def model_output(batch: TinyBatch, offset: float, spread: float = 1.0) -> tuple[Any, Any]:
    """One value per prompt and response token (``offset + spread × sin(1.3·k)``): the flat leaf
    to take gradients against, and its view per sequence (what the engine returns on unpadded
    input)."""
    import torch

    lengths = [p + r for p, r in zip(batch.prompt_lengths, batch.response_lengths, strict=True)]
    position = torch.arange(sum(lengths), dtype=torch.float32)
    values = (offset + spread * torch.sin(1.3 * position)).requires_grad_()
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    return values, torch.nested.nested_tensor_from_jagged(values, offsets=offsets)
