"""The conformance cases' inputs: seeded tensors, ragged and multi-turn masks, group ids.

Every case draws its inputs from a generator seeded with the crc32 of its id and sample, so
both sides of a comparison, and every run, see the same data. `INPUTS` holds one builder per
component of the plan; the sides that consume the inputs live in `components`.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pytest_verl_compat.conformance.plan import (
    AGG_MODE_NAMES,
    COMPONENTS,
    DTYPE_NAMES,
    DUAL_CLIP_FAMILY,
    ESTIMATORS,
    ConformanceCase,
    clip_settings,
)
from pytest_verl_compat.conformance.sft_inputs import sft_inputs

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_NAMES}

LOSS_SCALE_FACTOR = 37
TEMPERATURE = 0.6
KL_STEPS = 4

InputBuilder = Callable[[ConformanceCase, torch.Generator], dict[str, Any]]


# --------------------------------------------------------------------------- shared draws


def case_generator(case: ConformanceCase, sample: int) -> torch.Generator:
    # crc32, not hash(): the same inputs on every run, machine and PYTHONHASHSEED.
    return torch.Generator().manual_seed(zlib.crc32(f"{case.id}#{sample}".encode()))


def _shape(scenario: str) -> tuple[int, int]:
    """(rows, padded width) of a scenario; `nested` as `ragged` (its responses end earlier)."""
    if scenario == "long":
        return 4, 512
    if scenario == "groups":
        return 12, 20
    return 8, 24


def _randint(g: torch.Generator, low: int, high: int, size: Sequence[int] = ()) -> torch.Tensor:
    return torch.randint(low, high, tuple(size), generator=g)


def _normal(
    g: torch.Generator, shape: Sequence[int], dtype: torch.dtype, scale: float = 1.0
) -> torch.Tensor:
    return torch.randn(tuple(shape), generator=g, dtype=torch.float64).to(dtype) * scale


@dataclass
class Masks:
    """A response mask `(batch, length)` int64 and each row's response length.

    The response length (attention) runs to the last valid token; multi-turn rows have
    observation spans (mask 0) inside it; empty rows have length 0.
    """

    response_mask: torch.Tensor
    lengths: torch.Tensor

    @property
    def valid(self) -> torch.Tensor:
        return self.response_mask.bool()

    @property
    def within(self) -> torch.Tensor:
        width = self.response_mask.shape[1]
        return torch.arange(width).unsqueeze(0) < self.lengths.unsqueeze(1)


def _masks(g: torch.Generator, batch: int, width: int, scenario: str) -> Masks:
    lengths = _randint(g, 1, width + 1, (batch,))
    lengths[0] = width  # a row filling the padded width
    lengths[batch - 1] = 1 if scenario != "long" else width // 2
    if scenario == "long":
        lengths = torch.maximum(lengths, torch.full_like(lengths, width // 2))
    if scenario == "empty":
        lengths[1] = 0
        lengths[batch - 2] = 0
    positions = torch.arange(width).unsqueeze(0)
    mask = (positions < lengths.unsqueeze(1)).long()
    if scenario == "multiturn":
        for row in range(batch):
            length = int(lengths[row])
            if length >= 6:
                start = int(_randint(g, 1, length - 3))
                span = int(_randint(g, 1, 4))
                mask[row, start : min(start + span, length - 1)] = 0
    return Masks(mask, lengths)


def _index(g: torch.Generator, batch: int, scenario: str) -> np.ndarray:
    """One uid per row, rows shuffled; `groups` mixes group sizes, groups of one included."""
    sizes = [4, 1, 3, 2, 1, 1] if scenario == "groups" else [4] * (batch // 4)
    assert sum(sizes) == batch
    uids = [f"uid-{k:02d}" for k, size in enumerate(sizes) for _ in range(size)]
    order = torch.randperm(batch, generator=g).tolist()
    return np.array([uids[i] for i in order], dtype=object)


def _outcome_rewards(
    g: torch.Generator, masks: Masks, index: np.ndarray, scenario: str, dtype: torch.dtype
) -> torch.Tensor:
    """One score per row on its last response token; `groups` has all-equal groups (zero std)."""
    batch, width = masks.response_mask.shape
    scores = _normal(g, (batch,), dtype)
    if scenario == "groups":
        # Binary scores, exact in any dtype: the 4-group all 1, the 3-group all 0.
        for uid, value in (("uid-00", 1.0), ("uid-02", 0.0)):
            scores[torch.as_tensor(index == uid)] = value
    rewards = torch.zeros(batch, width, dtype=dtype)
    rows = torch.nonzero(masks.lengths > 0).squeeze(-1)
    rewards[rows, masks.lengths[rows] - 1] = scores[rows]
    return rewards


def _normalisers(g: torch.Generator, masks: Masks, family: str) -> dict[str, int | None]:
    """The global normalisers of a `-local` or `-global` family.

    `-local`: none, the micro-batch is the mini-batch. `-global`: the batch is a micro-batch of
    rank 0 of two; the mini-batch's tokens and sequences continue elsewhere.
    """
    if family.endswith("-local"):
        return {
            "dp_size": 1,
            "batch_num_tokens": None,
            "global_batch_size": None,
            "loss_scale_factor": None,
        }
    batch = masks.response_mask.shape[0]
    return {
        "dp_size": 2,
        "batch_num_tokens": int(masks.valid.sum()) + int(_randint(g, 1, 60)),
        "global_batch_size": batch + int(_randint(g, 1, 9)),
        "loss_scale_factor": LOSS_SCALE_FACTOR,
    }


# Columns past every response in a nested case: our padded batch is wider than the longest
# response of the micro-batch, as a micro-batch cut from a wider batch is.
NESTED_SLACK = 4


def _nested_masks(g: torch.Generator, batch: int, width: int) -> Masks:
    """Multi-turn responses (observation spans masked inside) that all end before `width`.

    As V1's nested rows: a response's length runs to its last token, which is valid.
    """
    inner = _masks(g, batch, width - NESTED_SLACK, "multiturn")
    mask = torch.nn.functional.pad(inner.response_mask, (0, NESTED_SLACK))
    return Masks(mask, inner.lengths)


def _loss_masks(g: torch.Generator, scenario: str) -> Masks:
    """The masks of a loss case's scenario (`ragged-global`, `nested-scaled`, ...)."""
    batch, width = _shape(_scenario(scenario))
    if scenario.startswith("nested-"):
        return _nested_masks(g, batch, width)
    return _masks(g, batch, width, _scenario(scenario))


def _loss_normalisers(g: torch.Generator, masks: Masks, scenario: str) -> dict[str, int | None]:
    """The normalisers of a loss case's scenario; the nested ones are a mini-batch's global ones."""
    if not scenario.startswith("nested-"):
        return _normalisers(g, masks, scenario)
    normalisers = _normalisers(g, masks, "-global")
    if scenario == "nested-global":
        normalisers["loss_scale_factor"] = None
    return normalisers


def _split_family(family: str) -> tuple[str, str]:
    """`<agg mode>-<scenario>` into its parts (agg modes contain dashes)."""
    for mode in sorted(AGG_MODE_NAMES, key=len, reverse=True):
        if family.startswith(mode + "-"):
            return mode, family[len(mode) + 1 :]
    raise ValueError(f"family {family!r} does not start with an agg mode")


def _scenario(family: str) -> str:
    return family.split("-")[0]


def _actor_inputs(g: torch.Generator, masks: Masks, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Old/new/reference log-probs, advantages and entropies with some far-off ratios."""
    batch, width = masks.response_mask.shape
    old = -_normal(g, (batch, width), dtype, 1.5).abs()
    new = old + _normal(g, (batch, width), dtype, 0.7)
    far = torch.rand((batch, width), generator=g) < 0.05  # ratios beyond the +-20 clamp
    new = torch.where(far, old + 25.0 * torch.sign(_normal(g, (batch, width), dtype)), new)
    within = masks.within
    # Upstream pads model outputs with 0 past the response; ours must see the same.
    new = torch.where(within, new, torch.zeros((), dtype=dtype))
    entropy = torch.where(
        within, torch.rand((batch, width), generator=g, dtype=torch.float64).to(dtype) * 3, 0
    )
    return {
        "old_log_prob": old,
        "log_prob": new,
        "advantages": _normal(g, (batch, width), dtype),
        "ref_log_prob": new + _normal(g, (batch, width), dtype, 0.3),
        "entropy": entropy.to(dtype),
    }


def _critic_inputs(g: torch.Generator, masks: Masks, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    batch, width = masks.response_mask.shape
    values = _normal(g, (batch, width), dtype)
    vpreds = values + _normal(g, (batch, width), dtype, 0.6)
    vpreds = torch.where(masks.within, vpreds, torch.zeros((), dtype=dtype))
    return {
        "vpreds": vpreds,
        "values": values,
        "returns": values + _normal(g, (batch, width), dtype),
    }


# --------------------------------------------------------------------------- upstream layout


@dataclass
class Flat:
    """Model outputs as verl's engine hands them to its losses: one flat row of all tokens."""

    prompt_lengths: torch.Tensor
    positions: torch.Tensor  # (batch, width): flat index of each response token, -1 past the end

    @classmethod
    def layout(cls, g: torch.Generator, masks: Masks, prompt_width: int) -> Flat:
        """Random prompt lengths (left-padded to `prompt_width`) in front of the responses."""
        return cls.for_prompts(masks, _randint(g, 1, prompt_width + 1, (masks.lengths.shape[0],)))

    @classmethod
    def for_prompts(cls, masks: Masks, prompt_lengths: torch.Tensor) -> Flat:
        batch, width = masks.response_mask.shape
        positions = torch.full((batch, width), -1, dtype=torch.long)
        offset = 0
        for row in range(batch):
            p, r = int(prompt_lengths[row]), int(masks.lengths[row])
            # verl shifts outputs left by one: token t of the response is predicted at p - 1 + t.
            positions[row, :r] = offset + p - 1 + torch.arange(r)
            offset += p + r
        return cls(prompt_lengths, positions)

    @property
    def total(self) -> int:
        return int(self.prompt_lengths.sum()) + int((self.positions >= 0).sum())

    def flatten(self, padded: torch.Tensor) -> torch.Tensor:
        flat = torch.zeros(self.total, dtype=padded.dtype)
        keep = self.positions >= 0
        flat[self.positions[keep]] = padded[keep].detach()
        return flat.requires_grad_(True)

    def unflatten(self, flat: torch.Tensor) -> torch.Tensor:
        padded = torch.zeros(self.positions.shape, dtype=flat.dtype)
        keep = self.positions >= 0
        padded[keep] = flat[self.positions[keep]]
        return padded


# --------------------------------------------------------------------------- per component


def _advantage_inputs(case: ConformanceCase, g: torch.Generator) -> dict[str, Any]:
    dtype = DTYPES[case.dtype]
    scenario = case.family.removeprefix("no-std-")
    batch, width = _shape(scenario)
    masks = _masks(g, batch, width, scenario)
    index = _index(g, batch, scenario)
    rewards = _outcome_rewards(g, masks, index, scenario, dtype)
    if ESTIMATORS[case.variant].dense_rewards:
        # Token-level rewards too (a KL penalty in the reward makes them dense).
        rewards = rewards + _normal(g, (batch, width), dtype, 0.1) * masks.response_mask
    # Values and group ids are drawn whether the estimator takes them or not.
    return {
        "token_level_rewards": rewards,
        "values": _normal(g, (batch, width), dtype),
        "response_mask": masks.response_mask,
        "index": index,
        "norm_adv_by_std_in_grpo": not case.family.startswith("no-std-"),
    }


def _agg_inputs(case: ConformanceCase, g: torch.Generator) -> dict[str, Any]:
    dtype = DTYPES[case.dtype]
    scenario = _scenario(case.family)
    batch, width = _shape(scenario)
    masks = _masks(g, batch, width, scenario)
    return {
        "loss_mat": _normal(g, (batch, width), dtype),
        "masks": masks,
        "normalisers": _normalisers(g, masks, case.family),
    }


def _policy_inputs(case: ConformanceCase, g: torch.Generator) -> dict[str, Any]:
    dtype = DTYPES[case.dtype]
    mode, rest = _split_family(case.family.removesuffix(DUAL_CLIP_FAMILY))
    masks = _loss_masks(g, rest)
    x: dict[str, Any] = _actor_inputs(g, masks, dtype)
    x.update(masks=masks, mode=mode, normalisers=_loss_normalisers(g, masks, rest))
    x["clip"] = clip_settings(case.family)
    x["flat"] = Flat.layout(g, masks, prompt_width=3)
    return x


def _value_inputs(case: ConformanceCase, g: torch.Generator) -> dict[str, Any]:
    dtype = DTYPES[case.dtype]
    masks = _loss_masks(g, case.family)
    x: dict[str, Any] = _critic_inputs(g, masks, dtype)
    x.update(masks=masks, normalisers=_loss_normalisers(g, masks, case.family))
    x["flat"] = Flat.layout(g, masks, prompt_width=3)
    return x


def _kl_inputs(case: ConformanceCase, g: torch.Generator) -> dict[str, Any]:
    dtype = DTYPES[case.dtype]
    batch, width = _shape("ragged")
    log_prob = -_normal(g, (batch, width), dtype, 2.0).abs()
    # `large` reaches past both clamps of k3 (|log ratio| > 20, estimate > 10).
    spread = 15.0 if case.family == "large" else 0.5
    return {
        "log_prob": log_prob,
        "ref_log_prob": log_prob + _normal(g, (batch, width), dtype, spread),
        "cotangent": _normal(g, (batch, width), dtype),
    }


def _kl_reward_inputs(case: ConformanceCase, g: torch.Generator) -> dict[str, Any]:
    dtype = DTYPES[case.dtype]
    penalty, scenario = case.family.split("-", 1)
    batch, width = _shape(scenario)
    steps = []
    # Per-step KL levels around the adaptive target (0.05): the error is clipped at the extremes.
    for shift, spread in ((0.02, 0.25), (0.045, 0.3), (0.06, 0.35), (0.15, 0.5))[:KL_STEPS]:
        masks = _masks(g, batch, width, scenario)
        index = _index(g, batch, scenario)
        old = -_normal(g, (batch, width), dtype, 1.5).abs()
        steps.append(
            {
                "token_level_scores": _outcome_rewards(g, masks, index, scenario, dtype),
                "old_log_prob": old,
                "ref_log_prob": old + shift + _normal(g, (batch, width), dtype, spread),
                "response_mask": masks.response_mask,
            }
        )
    return {"penalty": penalty, "steps": steps}


def _logit_inputs(case: ConformanceCase, g: torch.Generator) -> dict[str, Any]:
    dtype = DTYPES[case.dtype]
    batch, width, vocab = (2, 512, 16) if case.family == "long" else (4, 16, 48)
    if case.family == "large":
        # +-50 logits with one dominant token per position: near-deterministic distributions.
        logits = (
            torch.rand((batch, width, vocab), generator=g, dtype=torch.float64) * 100 - 50
        ).to(dtype)
    else:
        logits = _normal(
            g, (batch, width, vocab), dtype, 3.0 if case.family == "temperature" else 2.0
        )
    return {
        "logits": logits,
        "labels": _randint(g, 0, vocab, (batch, width)),
        "temperature": TEMPERATURE if case.family == "temperature" else 1.0,
        "cotangent": _normal(g, (batch, width), dtype),
    }


def _microbatch_inputs(case: ConformanceCase, g: torch.Generator) -> dict[str, Any]:
    dtype = DTYPES[case.dtype]
    masks = _masks(g, 8, 16, "empty")
    critic = case.family.endswith("critic")
    x: dict[str, Any] = (
        _critic_inputs(g, masks, dtype) if critic else _actor_inputs(g, masks, dtype)
    )
    x["masks"] = masks
    x["prompt_lengths"] = _randint(g, 1, 4, (8,))
    return x


def microbatch_rows(
    x: Mapping[str, Any], rows: Sequence[int]
) -> tuple[dict[str, Any], Masks, Flat]:
    """The micro-batch of `rows`, padded to the mini-batch's width as verl's engine keeps it."""
    index = torch.tensor(list(rows))
    masks: Masks = x["masks"]
    part = {k: v[index] for k, v in x.items() if isinstance(v, torch.Tensor) and v.dim() == 2}
    sub = Masks(masks.response_mask[index], masks.lengths[index])
    return part, sub, Flat.for_prompts(sub, x["prompt_lengths"][index])


INPUTS: dict[str, InputBuilder] = {
    "advantage": _advantage_inputs,
    "policy_loss": _policy_inputs,
    "agg_loss": _agg_inputs,
    "kl": _kl_inputs,
    "kl_in_reward": _kl_reward_inputs,
    "value_loss": _value_inputs,
    "entropy": _logit_inputs,
    "log_prob": _logit_inputs,
    "microbatch": _microbatch_inputs,
    "sft_loss": sft_inputs,
}
assert tuple(INPUTS) == COMPONENTS
