"""Rollout batches: the trajectories of a step, how they are filtered and split, their metrics.

`Batch` holds one step's trajectories (left-padded prompts, right-padded responses, and the
per-trajectory tensors later phases add); group filtering keeps the `informative_groups` of
each generation batch and `concat_batches` joins them. An update walks `minibatches` (one
optimizer step each, shuffled with an explicit generator when the config asks for it), and each
mini-batch `micro_batches` (gradient accumulation). `batch_metrics` summarises a step's batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.nn import functional as F

from reference_trainer.config import AlgorithmConfig
from reference_trainer.data import Prompt
from reference_trainer.math.masked import masked_mean


@dataclass
class Batch:
    """Trajectories: left-padded prompts then right-padded responses of fixed width."""

    prompt_ids: torch.Tensor  # (batch, prompt_length), left padded
    prompt_mask: torch.Tensor  # (batch, prompt_length)
    responses: torch.Tensor  # (batch, response_length), pad after the first EOS
    response_mask: torch.Tensor  # (batch, response_length) float, 1 up to and incl. first EOS
    truncated: torch.Tensor  # (batch,) bool: no EOS within response_length
    uids: np.ndarray  # (batch,) group id: the prompt of each trajectory
    prompts: list[Prompt]
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    """Per-trajectory results filled by later phases (scores, log-probs, values, ...)."""
    texts: list[str] = field(default_factory=list)
    """Decoded responses (filled by the score phase), for the samples log."""

    def __len__(self) -> int:
        return self.responses.shape[0]

    def model_inputs(self) -> dict[str, torch.Tensor]:
        attention = torch.cat([self.prompt_mask, self.response_mask.long()], dim=1)
        return {
            "input_ids": torch.cat([self.prompt_ids, self.responses], dim=1),
            "attention_mask": attention,
            # Positions count real tokens only, so left padding does not shift them.
            "position_ids": (attention.cumsum(-1) - 1).clamp_min(0),
        }

    def select(self, rows: list[int] | torch.Tensor) -> Batch:
        index = torch.as_tensor(rows, dtype=torch.long)
        return Batch(
            self.prompt_ids[index],
            self.prompt_mask[index],
            self.responses[index],
            self.response_mask[index],
            self.truncated[index],
            self.uids[index.numpy()],
            [self.prompts[i] for i in index.tolist()],
            {k: v[index] for k, v in self.tensors.items()},
            [self.texts[i] for i in index.tolist()] if self.texts else [],
        )


def concat_batches(batches: list[Batch], pad_id: int) -> Batch:
    width = max(b.prompt_ids.shape[1] for b in batches)

    def left(t: torch.Tensor, value: int) -> torch.Tensor:
        return F.pad(t, (width - t.shape[1], 0), value=value)

    keys = set.intersection(*(set(b.tensors) for b in batches))
    return Batch(
        torch.cat([left(b.prompt_ids, pad_id) for b in batches]),
        torch.cat([left(b.prompt_mask, 0) for b in batches]),
        torch.cat([b.responses for b in batches]),
        torch.cat([b.response_mask for b in batches]),
        torch.cat([b.truncated for b in batches]),
        np.concatenate([b.uids for b in batches]),
        [p for b in batches for p in b.prompts],
        {k: torch.cat([b.tensors[k] for b in batches]) for k in sorted(keys)},
        [t for b in batches for t in b.texts],
    )


# The per-trajectory metric verl's reward loop records for a scorer that returns one float (every
# scorer here does): the score itself, as ``acc`` (verl/experimental/reward_loop/reward_manager/
# naive.py:94-95).
SCORER_METRIC = "acc"


def group_filter_metric(algorithm: AlgorithmConfig) -> str | None:
    """The metric `algorithm.filter_groups` filters groups by, None when it is off; a ValueError
    (one line) for a metric verl would refuse: none named (v1/trainer_base.py:197-199), or one
    the trajectories do not carry (v1/replay_buffer.py:282-291, at its first sampling)."""
    if not algorithm.filter_groups_enable:
        return None
    metric = algorithm.filter_groups_metric
    if not metric:
        raise ValueError(
            "algorithm.filter_groups.metric must be set when group filtering is enabled"
        )
    if metric != SCORER_METRIC:
        raise ValueError(
            f"algorithm.filter_groups.metric={metric!r}: the trajectories carry only "
            f"{SCORER_METRIC!r} (a scorer's one float), so verl's replay buffer refuses the groups "
            "(verl/trainer/ppo/v1/replay_buffer.py:288-291)"
        )
    return metric


def informative_groups(uids: np.ndarray, metric: torch.Tensor) -> tuple[list[int], int]:
    """The rows of the groups DAPO's dynamic sampling keeps, and how many such groups.

    `algorithm.filter_groups` drops a group whose responses all score alike (its group-relative
    advantages are zero); as verl's V1 replay buffer, a group of one response is kept, and the
    spread is numpy's float64 population std, compared with 0 exactly
    (verl/trainer/ppo/v1/replay_buffer.py:294-295).
    """
    values = metric.double().numpy()
    informative = [
        uid
        for uid in dict.fromkeys(uids.tolist())
        if int((uids == uid).sum()) == 1 or float(np.std(values[uids == uid])) != 0.0
    ]
    rows = [i for i, uid in enumerate(uids.tolist()) if uid in set(informative)]
    return rows, len(informative)


def minibatches(rows: int, size: int, generator: torch.Generator | None) -> list[torch.Tensor]:
    """Row indices of one epoch's mini-batches: in order, or shuffled from `generator`.

    Shuffled exactly as verl's `make_iterator` (verl/utils/tensordict_utils.py:593-612): a
    DataLoader over the row indices whose RandomSampler draws from the update's one generator,
    so each epoch continues that generator's stream (see `shuffle_generator`).
    """
    if generator is None:
        return list(torch.arange(rows).split(size))
    from torch.utils.data import DataLoader

    # Each pass of the loader draws its base seed, then the sampler's permutation(s), from
    # the generator; the same loader over the same generator gives verl's stream.
    loader: DataLoader[int] = DataLoader(
        range(rows),  # type: ignore[arg-type]  # a sequence is a map-style dataset
        batch_size=size,
        shuffle=True,
        generator=generator,
        collate_fn=_rows,
    )
    return [torch.as_tensor(mini, dtype=torch.long) for mini in loader]


def _rows(items: list[int]) -> list[int]:
    return [int(i) for i in items]


def shuffle_generator(
    shuffle: bool, data_loader_seed: int, rank: int = 0
) -> torch.Generator | None:
    """The generator of one update's mini-batch shuffles, or None without `shuffle`.

    verl seeds one generator per update call with `data_loader_seed + DP rank`
    (verl/workers/engine_workers.py:276, tensordict_utils.py:593-595): the same seed every
    training step, and the critic's own `critic.data_loader_seed`.
    """
    if not shuffle:
        return None
    return torch.Generator().manual_seed(data_loader_seed + rank)


def micro_batches(rows: torch.Tensor, size: int | None) -> Iterator[torch.Tensor]:
    step = len(rows) if not size else min(size, len(rows))
    for start in range(0, len(rows), step):
        yield rows[start : start + step]


def batch_metrics(batch: Batch) -> dict[str, float]:
    """The step's scores, rewards, advantages, lengths and KL, over the whole rollout batch."""
    t = batch.tensors
    lengths = batch.response_mask.sum(-1)
    mask = batch.response_mask
    out = {
        "critic/score/mean": float(t["token_level_scores"].sum(-1).mean()),
        "critic/rewards/mean": float(t["token_level_rewards"].sum(-1).mean()),
        "critic/advantages/mean": float(masked_mean(t["advantages"], mask)),
        "critic/returns/mean": float(masked_mean(t["returns"], mask)),
        "response_length/mean": float(lengths.mean()),
        "response_length/clip_ratio": float(batch.truncated.float().mean()),
        "train/acc": float(t["acc"].mean()),
    }
    if "ref_log_prob" in t:
        out["actor/ref_kl"] = float(masked_mean(t["old_log_probs"] - t["ref_log_prob"], mask))
    if "values" in t:
        out["critic/values/mean"] = float(masked_mean(t["values"], mask))
    return out
