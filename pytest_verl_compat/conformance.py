"""Conformance stage: our reference math against upstream verl 0.9.0, values and gradients.

Each case feeds the same seeded inputs to one of our functions (`reference_trainer`) and to
upstream's (`verl.trainer.ppo.core_algos`, `verl.workers.utils.losses`) and compares outputs,
metrics and gradients (`torch.autograd.grad` w.r.t. log-probs, values, logits) within the
case's tolerance. Case ids read `<component>.<variant>[<family>-<dtype>]`.

Our functions are resolved by name through a namespace (`reference_namespace()`); the mutation
check substitutes deliberately wrong functions in a copy of it and expects cases to fail.

verl is imported lazily (it takes seconds) and only by the upstream side of a case.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import torch

from pytest_verl_compat.conformance_plan import (
    AGG_MODE_NAMES,
    DTYPE_NAMES,
    ConformanceCase,
    upstream_missing_reason,
)

DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_NAMES}

# Settings shared by every case (the data, not the tolerances, vary between cases).
CLIP = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}
ACTOR_TERMS = {
    "entropy_coeff": 0.05,
    "use_kl_loss": True,
    "kl_loss_coef": 0.1,
    "kl_loss_type": "low_var_kl",
}
CLIPRANGE_VALUE = 0.5
GAMMA, LAM = 0.99, 0.95
LOSS_SCALE_FACTOR = 37
TEMPERATURE = 0.6
KL_STEPS = 4


# --------------------------------------------------------------------------- public types


@dataclass(frozen=True)
class ConformanceResult:
    case_id: str
    component: str
    variant: str
    samples: int
    max_abs_err: float
    max_grad_abs_err: float
    passed: bool
    message: str


@dataclass(frozen=True)
class Mutation:
    """A deliberate bug in our math: `patch` maps our namespace to the functions it replaces."""

    name: str
    description: str
    replaces: tuple[str, ...]
    patch: Callable[[Mapping[str, Any]], dict[str, Any]]

    def apply(self, namespace: Mapping[str, Any]) -> dict[str, Any]:
        replaced = self.patch(namespace)
        assert set(replaced) == set(self.replaces), (self.name, sorted(replaced))
        return {**namespace, **replaced}


# --------------------------------------------------------------------------- our namespace


def reference_namespace() -> dict[str, Any]:
    """Our functions by the names the cases resolve them with (the names mutations replace)."""
    from reference_trainer import aggregation, kl, logprobs, losses
    from reference_trainer.advantages import ADVANTAGE_ESTIMATORS

    namespace: dict[str, Any] = {fn.__name__: fn for fn in ADVANTAGE_ESTIMATORS.values()}
    namespace.update(
        agg_loss=aggregation.agg_loss,
        vanilla_policy_loss=losses.vanilla_policy_loss,
        actor_loss=losses.actor_loss,
        value_loss=losses.value_loss,
        kl_penalty=kl.kl_penalty,
        apply_kl_in_reward=kl.apply_kl_in_reward,
        FixedKLController=kl.FixedKLController,
        AdaptiveKLController=kl.AdaptiveKLController,
        entropy_from_logits=logprobs.entropy_from_logits,
        log_probs_from_logits=logprobs.log_probs_from_logits,
    )
    return namespace


def _resolve(ours: ModuleType | Mapping[str, Any] | None) -> dict[str, Any]:
    default = reference_namespace()
    if ours is None:
        return default
    if isinstance(ours, ModuleType):
        return {key: getattr(ours, key, fn) for key, fn in default.items()}
    return {**default, **ours}


def _advantage_key(variant: str) -> str:
    from reference_trainer.advantages import ADVANTAGE_ESTIMATORS

    return ADVANTAGE_ESTIMATORS[variant].__name__


def _uses(case: ConformanceCase) -> frozenset[str]:
    """The namespace entries the candidate side of a case calls."""
    match case.component:
        case "advantage":
            return frozenset({_advantage_key(case.variant)})
        case "agg_loss":
            return frozenset({"agg_loss"})
        case "policy_loss":
            return frozenset({"vanilla_policy_loss" if case.variant == "vanilla" else "actor_loss"})
        case "value_loss":
            return frozenset({"value_loss"})
        case "kl":
            return frozenset({"kl_penalty"})
        case "kl_in_reward":
            controller = "FixedKLController" if case.variant == "fixed" else "AdaptiveKLController"
            return frozenset({"apply_kl_in_reward", controller})
        case "entropy":
            return frozenset({"entropy_from_logits"})
        case "log_prob":
            return frozenset({"log_probs_from_logits"})
        case "microbatch":
            if case.family.startswith("upstream-"):
                return frozenset()
            return frozenset({"actor_loss" if case.family.endswith("actor") else "value_loss"})
    raise ValueError(f"unknown component {case.component!r}")


# --------------------------------------------------------------------------- upstream access


@functools.cache
def _upstream() -> SimpleNamespace:
    """verl's modules, imported once, on first use."""
    import verl.utils.torch_functional as verl_F
    from tensordict import TensorDict
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo import core_algos
    from verl.utils import tensordict_utils
    from verl.workers.config import ActorConfig, CriticConfig
    from verl.workers.utils import losses

    return SimpleNamespace(
        core_algos=core_algos,
        losses=losses,
        F=verl_F,
        tu=tensordict_utils,
        TensorDict=TensorDict,
        AlgoConfig=AlgoConfig,
        ActorConfig=ActorConfig,
        CriticConfig=CriticConfig,
    )


def _metric_value(value: Any) -> float:
    """A verl metric (a `Metric`, a tensor or a number) as a float."""
    if hasattr(value, "aggregate"):
        return float(value.aggregate())
    if isinstance(value, torch.Tensor):
        return float(value.detach())
    return float(value)


def _logged_name(key: str) -> str:
    """The name verl's trainer logs an actor metric under (it prefixes unprefixed keys)."""
    return key if key.startswith("actor/") else f"actor/{key}"


# --------------------------------------------------------------------------- inputs


def _generator(case: ConformanceCase, sample: int) -> torch.Generator:
    # crc32, not hash(): the same inputs on every run, machine and PYTHONHASHSEED.
    return torch.Generator().manual_seed(zlib.crc32(f"{case.id}#{sample}".encode()))


def _shape(scenario: str) -> tuple[int, int]:
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
class _Masks:
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


def _masks(g: torch.Generator, batch: int, width: int, scenario: str) -> _Masks:
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
    return _Masks(mask, lengths)


def _index(g: torch.Generator, batch: int, scenario: str) -> np.ndarray:
    """One uid per row, rows shuffled; `groups` mixes group sizes, groups of one included."""
    sizes = [4, 1, 3, 2, 1, 1] if scenario == "groups" else [4] * (batch // 4)
    assert sum(sizes) == batch
    uids = [f"uid-{k:02d}" for k, size in enumerate(sizes) for _ in range(size)]
    order = torch.randperm(batch, generator=g).tolist()
    return np.array([uids[i] for i in order], dtype=object)


def _outcome_rewards(
    g: torch.Generator, masks: _Masks, index: np.ndarray, scenario: str, dtype: torch.dtype
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


def _normalisers(g: torch.Generator, masks: _Masks, family: str) -> dict[str, int | None]:
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


def _split_family(family: str) -> tuple[str, str]:
    """`<agg mode>-<scenario>` into its parts (agg modes contain dashes)."""
    for mode in sorted(AGG_MODE_NAMES, key=len, reverse=True):
        if family.startswith(mode + "-"):
            return mode, family[len(mode) + 1 :]
    raise ValueError(f"family {family!r} does not start with an agg mode")


def _scenario(family: str) -> str:
    return family.split("-")[0]


def _actor_inputs(g: torch.Generator, masks: _Masks, dtype: torch.dtype) -> dict[str, torch.Tensor]:
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


def _critic_inputs(
    g: torch.Generator, masks: _Masks, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    batch, width = masks.response_mask.shape
    values = _normal(g, (batch, width), dtype)
    vpreds = values + _normal(g, (batch, width), dtype, 0.6)
    vpreds = torch.where(masks.within, vpreds, torch.zeros((), dtype=dtype))
    return {
        "vpreds": vpreds,
        "values": values,
        "returns": values + _normal(g, (batch, width), dtype),
    }


# --------------------------------------------------------------------------- upstream batches


@dataclass
class _Flat:
    """Model outputs as verl's engine hands them to its losses: one flat row of all tokens."""

    prompt_lengths: torch.Tensor
    positions: torch.Tensor  # (batch, width): flat index of each response token, -1 past the end

    @classmethod
    def layout(cls, g: torch.Generator, masks: _Masks, prompt_width: int) -> _Flat:
        """Random prompt lengths (left-padded to `prompt_width`) in front of the responses."""
        return cls.for_prompts(masks, _randint(g, 1, prompt_width + 1, (masks.lengths.shape[0],)))

    @classmethod
    def for_prompts(cls, masks: _Masks, prompt_lengths: torch.Tensor) -> _Flat:
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


def _tensordict(
    masks: _Masks,
    flat: _Flat,
    tensors: Mapping[str, torch.Tensor],
    normalisers: Mapping[str, Any],
) -> Any:
    up = _upstream()
    batch, width = masks.response_mask.shape
    prompt_width = int(flat.prompt_lengths.max())
    prompt_attention = (
        torch.arange(prompt_width).unsqueeze(0) >= (prompt_width - flat.prompt_lengths).unsqueeze(1)
    ).long()
    attention = torch.cat([prompt_attention, masks.within.long()], dim=1)
    data = up.TensorDict(
        {
            "prompts": torch.zeros(batch, prompt_width, dtype=torch.long),
            "responses": torch.zeros(batch, width, dtype=torch.long),
            "attention_mask": attention,
            "response_mask": masks.response_mask,
            **{key: value.detach() for key, value in tensors.items()},
        },
        batch_size=[batch],
    )
    up.tu.assign_non_tensor(
        data,
        dp_size=normalisers["dp_size"],
        batch_num_tokens=normalisers["batch_num_tokens"],
        global_batch_size=normalisers["global_batch_size"],
    )
    return data


def _actor_config(loss_agg_mode: str, loss_scale_factor: int | None) -> Any:
    return _upstream().ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=loss_agg_mode,
        loss_scale_factor=loss_scale_factor,
        **CLIP,
        **ACTOR_TERMS,
    )


def _upstream_actor(
    x: Mapping[str, Any], masks: _Masks, flat: _Flat, mode: str, normalisers: Mapping[str, Any]
) -> dict[str, Any]:
    """verl's `ppo_loss` (policy loss + entropy bonus + KL loss) on one micro-batch."""
    up = _upstream()
    config = _actor_config(mode, normalisers["loss_scale_factor"])
    log_probs, entropy = flat.flatten(x["log_prob"]), flat.flatten(x["entropy"])
    data = _tensordict(
        masks,
        flat,
        {
            "old_log_probs": x["old_log_prob"],
            "advantages": x["advantages"],
            "ref_log_prob": x["ref_log_prob"],
        },
        normalisers,
    )
    loss, metrics = up.losses.ppo_loss(config, {"log_probs": log_probs, "entropy": entropy}, data)
    grads = torch.autograd.grad(loss, (log_probs, entropy))
    out: dict[str, Any] = {"loss": loss.detach()}
    out.update({_logged_name(k): _metric_value(v) for k, v in metrics.items()})
    out["grad/log_prob"] = flat.unflatten(grads[0])
    out["grad/entropy"] = flat.unflatten(grads[1])
    return out


def _ours_actor(
    ns: Mapping[str, Any],
    x: Mapping[str, Any],
    masks: _Masks,
    mode: str,
    normalisers: Mapping[str, Any],
) -> dict[str, Any]:
    log_prob = x["log_prob"].detach().requires_grad_(True)
    entropy = x["entropy"].detach().requires_grad_(True)
    loss, metrics = ns["actor_loss"](
        x["old_log_prob"],
        log_prob,
        x["advantages"],
        masks.response_mask,
        entropy=entropy,
        ref_log_prob=x["ref_log_prob"],
        loss_agg_mode=mode,
        **CLIP,
        **ACTOR_TERMS,
        **normalisers,
    )
    grads = torch.autograd.grad(loss, (log_prob, entropy))
    return {"loss": loss.detach(), **metrics, "grad/log_prob": grads[0], "grad/entropy": grads[1]}


def _upstream_critic(
    x: Mapping[str, Any], masks: _Masks, flat: _Flat, mode: str, normalisers: Mapping[str, Any]
) -> dict[str, Any]:
    """verl's `value_loss` on one micro-batch."""
    up = _upstream()
    config = up.CriticConfig(
        strategy="fsdp",
        ppo_micro_batch_size_per_gpu=1,
        cliprange_value=CLIPRANGE_VALUE,
        loss_agg_mode=mode,
        loss_scale_factor=normalisers["loss_scale_factor"],
    )
    vpreds = flat.flatten(x["vpreds"])
    data = _tensordict(masks, flat, {"values": x["values"], "returns": x["returns"]}, normalisers)
    loss, metrics = up.losses.value_loss(config, {"values": vpreds}, data)
    (grad,) = torch.autograd.grad(loss, (vpreds,))
    out: dict[str, Any] = {"loss": loss.detach()}
    out.update({k: _metric_value(v) for k, v in metrics.items()})
    out["grad/vpreds"] = flat.unflatten(grad)
    return out


def _ours_critic(
    ns: Mapping[str, Any],
    x: Mapping[str, Any],
    masks: _Masks,
    mode: str,
    normalisers: Mapping[str, Any],
) -> dict[str, Any]:
    vpreds = x["vpreds"].detach().requires_grad_(True)
    loss, metrics = ns["value_loss"](
        vpreds,
        x["values"],
        x["returns"],
        masks.response_mask,
        cliprange_value=CLIPRANGE_VALUE,
        loss_agg_mode=mode,
        **normalisers,
    )
    (grad,) = torch.autograd.grad(loss, (vpreds,))
    return {"loss": loss.detach(), **metrics, "grad/vpreds": grad}


# --------------------------------------------------------------------------- components


@dataclass(frozen=True)
class _Component:
    """How to build a case's inputs and compute its two sides.

    `reference` is upstream (cached per case and sample) except for the micro-batch cases of
    our own losses, where it is our mini-batch computation (`reference_uses_ours`).
    """

    inputs: Callable[[ConformanceCase, torch.Generator], dict[str, Any]]
    reference: Callable[[ConformanceCase, dict[str, Any], Mapping[str, Any]], dict[str, Any]]
    candidate: Callable[[ConformanceCase, dict[str, Any], Mapping[str, Any]], dict[str, Any]]
    labels: tuple[str, str] = ("ours", "upstream")
    reference_uses_ours: Callable[[ConformanceCase], bool] = lambda case: False


# advantage ------------------------------------------------------------------


def _advantage_inputs(case: ConformanceCase, g: torch.Generator) -> dict[str, Any]:
    dtype = DTYPES[case.dtype]
    scenario = case.family.removeprefix("no-std-")
    batch, width = _shape(scenario)
    masks = _masks(g, batch, width, scenario)
    index = _index(g, batch, scenario)
    rewards = _outcome_rewards(g, masks, index, scenario, dtype)
    if case.variant in ("gae", "reinforce_plus_plus"):
        # Token-level rewards too (a KL penalty in the reward makes them dense).
        rewards = rewards + _normal(g, (batch, width), dtype, 0.1) * masks.response_mask
    return {
        "token_level_rewards": rewards,
        "values": _normal(g, (batch, width), dtype),
        "response_mask": masks.response_mask,
        "index": index,
        "norm_adv_by_std_in_grpo": not case.family.startswith("no-std-"),
    }


def _advantage_upstream(
    case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any]
) -> dict[str, Any]:
    up = _upstream()
    fn = up.core_algos.get_adv_estimator_fn(case.variant)
    rewards, mask = x["token_level_rewards"], x["response_mask"]
    if case.variant == "gae":
        adv, ret = fn(rewards, x["values"], mask, gamma=GAMMA, lam=LAM)
    elif case.variant == "grpo":
        adv, ret = fn(
            rewards, mask, x["index"], norm_adv_by_std_in_grpo=x["norm_adv_by_std_in_grpo"]
        )
    elif case.variant == "reinforce_plus_plus":
        adv, ret = fn(rewards, mask, config=up.AlgoConfig(gamma=GAMMA))
    else:  # rloo, reinforce_plus_plus_baseline
        adv, ret = fn(rewards, mask, x["index"])
    return {"advantages": adv, "returns": ret}


def _advantage_ours(
    case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any]
) -> dict[str, Any]:
    fn = ns[_advantage_key(case.variant)]
    rewards, mask = x["token_level_rewards"], x["response_mask"]
    if case.variant == "gae":
        adv, ret = fn(rewards, x["values"], mask, gamma=GAMMA, lam=LAM)
    elif case.variant == "grpo":
        adv, ret = fn(
            rewards, mask, x["index"], norm_adv_by_std_in_grpo=x["norm_adv_by_std_in_grpo"]
        )
    elif case.variant == "reinforce_plus_plus":
        adv, ret = fn(rewards, mask, gamma=GAMMA)
    else:
        adv, ret = fn(rewards, mask, x["index"])
    return {"advantages": adv, "returns": ret}


# agg_loss -------------------------------------------------------------------


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


def _agg_side(
    case: ConformanceCase, x: dict[str, Any], agg: Callable[..., torch.Tensor]
) -> dict[str, Any]:
    loss_mat = x["loss_mat"].detach().requires_grad_(True)
    loss = agg(loss_mat, x["masks"].valid, case.variant, **x["normalisers"])
    (grad,) = torch.autograd.grad(loss, (loss_mat,))
    return {"loss": loss.detach(), "grad/loss_mat": grad}


# policy_loss ----------------------------------------------------------------


def _policy_inputs(case: ConformanceCase, g: torch.Generator) -> dict[str, Any]:
    dtype = DTYPES[case.dtype]
    mode, rest = _split_family(case.family)
    batch, width = _shape(_scenario(rest))
    masks = _masks(g, batch, width, _scenario(rest))
    x = _actor_inputs(g, masks, dtype)
    x.update(masks=masks, mode=mode, normalisers=_normalisers(g, masks, rest))
    x["flat"] = _Flat.layout(g, masks, prompt_width=3)
    return x


def _vanilla_upstream(
    case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any]
) -> dict[str, Any]:
    up = _upstream()
    norms = x["normalisers"]
    config = _actor_config(x["mode"], norms["loss_scale_factor"])
    # What ppo_loss puts there before calling the policy loss.
    config.global_batch_info.update(norms)
    log_prob = x["log_prob"].detach().requires_grad_(True)
    loss, metrics = up.core_algos.compute_policy_loss_vanilla(
        old_log_prob=x["old_log_prob"],
        log_prob=log_prob,
        advantages=x["advantages"],
        response_mask=x["masks"].valid,
        loss_agg_mode=x["mode"],
        config=config,
    )
    (grad,) = torch.autograd.grad(loss, (log_prob,))
    return {"loss": loss.detach(), **metrics, "grad/log_prob": grad}


def _vanilla_ours(
    case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any]
) -> dict[str, Any]:
    log_prob = x["log_prob"].detach().requires_grad_(True)
    loss, metrics = ns["vanilla_policy_loss"](
        x["old_log_prob"],
        log_prob,
        x["advantages"],
        x["masks"].response_mask,
        loss_agg_mode=x["mode"],
        **CLIP,
        **x["normalisers"],
    )
    (grad,) = torch.autograd.grad(loss, (log_prob,))
    return {"loss": loss.detach(), **metrics, "grad/log_prob": grad}


def _policy_upstream(
    case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any]
) -> dict[str, Any]:
    if case.variant == "vanilla":
        return _vanilla_upstream(case, x, ns)
    return _upstream_actor(x, x["masks"], x["flat"], x["mode"], x["normalisers"])


def _policy_ours(case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any]) -> dict[str, Any]:
    if case.variant == "vanilla":
        return _vanilla_ours(case, x, ns)
    return _ours_actor(ns, x, x["masks"], x["mode"], x["normalisers"])


# value_loss -----------------------------------------------------------------


def _value_inputs(case: ConformanceCase, g: torch.Generator) -> dict[str, Any]:
    dtype = DTYPES[case.dtype]
    batch, width = _shape(_scenario(case.family))
    masks = _masks(g, batch, width, _scenario(case.family))
    x = _critic_inputs(g, masks, dtype)
    x.update(masks=masks, normalisers=_normalisers(g, masks, case.family))
    x["flat"] = _Flat.layout(g, masks, prompt_width=3)
    return x


# kl -------------------------------------------------------------------------


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


def _kl_side(
    case: ConformanceCase, x: dict[str, Any], kl_penalty: Callable[..., torch.Tensor]
) -> dict[str, Any]:
    log_prob = x["log_prob"].detach().requires_grad_(True)
    ref = x["ref_log_prob"].detach().requires_grad_(True)
    kl = kl_penalty(log_prob, ref, case.variant)
    grads = torch.autograd.grad(kl, (log_prob, ref), grad_outputs=x["cotangent"], allow_unused=True)
    # An estimator may ignore one input entirely; its gradient is then zero.
    zero = torch.zeros_like(log_prob)
    return {
        "kl": kl.detach(),
        "grad/log_prob": zero if grads[0] is None else grads[0],
        "grad/ref_log_prob": zero if grads[1] is None else grads[1],
    }


# kl_in_reward ---------------------------------------------------------------


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


def _controller_args(case: ConformanceCase) -> dict[str, float]:
    if case.variant == "fixed":
        return {"kl_coef": 0.05}
    return {"init_kl_coef": 0.05, "target_kl": 0.05, "horizon": 40}


def _kl_reward_upstream(
    case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any]
) -> dict[str, Any]:
    # verl.trainer.ppo.ray_trainer.apply_kl_penalty does exactly this on a DataProto; that module
    # cannot be imported without its rollout dependencies (cachetools, ray), so its six lines
    # are repeated here around upstream's kl_penalty, masked_mean and controllers.
    up = _upstream()
    args = _controller_args(case)
    if case.variant == "fixed":
        controller = up.core_algos.FixedKLController(**args)
    else:
        controller = up.core_algos.AdaptiveKLController(**args)
    out: dict[str, Any] = {}
    for step, batch in enumerate(x["steps"]):
        mask = batch["response_mask"]
        kld = up.core_algos.kl_penalty(
            batch["old_log_prob"], batch["ref_log_prob"], kl_penalty=x["penalty"]
        )
        kld = kld * mask
        beta = controller.value
        rewards = batch["token_level_scores"] - beta * kld
        current_kl = torch.mean(up.F.masked_mean(kld, mask=mask, axis=-1), dim=0).item()
        controller.update(current_kl=current_kl, n_steps=mask.shape[0])
        out[f"step{step}/token_level_rewards"] = rewards
        out[f"step{step}/actor/reward_kl_penalty"] = current_kl
        out[f"step{step}/actor/reward_kl_penalty_coeff"] = beta
        out[f"step{step}/kl_coef_after"] = float(controller.value)
    return out


def _kl_reward_ours(
    case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any]
) -> dict[str, Any]:
    args = _controller_args(case)
    if case.variant == "fixed":
        controller = ns["FixedKLController"](value=args["kl_coef"])
    else:
        controller = ns["AdaptiveKLController"](
            value=args["init_kl_coef"], target=args["target_kl"], horizon=args["horizon"]
        )
    out: dict[str, Any] = {}
    for step, batch in enumerate(x["steps"]):
        rewards, metrics = ns["apply_kl_in_reward"](
            batch["token_level_scores"],
            batch["old_log_prob"],
            batch["ref_log_prob"],
            batch["response_mask"],
            controller,
            x["penalty"],
        )
        out[f"step{step}/token_level_rewards"] = rewards
        out.update({f"step{step}/{key}": value for key, value in metrics.items()})
        out[f"step{step}/kl_coef_after"] = float(controller.value)
    return out


# entropy and log_prob ------------------------------------------------------


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


def _logit_side(
    x: dict[str, Any], fn: Callable[[torch.Tensor], torch.Tensor], name: str
) -> dict[str, Any]:
    logits = x["logits"].detach().requires_grad_(True)
    out = fn(logits)
    (grad,) = torch.autograd.grad(out, (logits,), grad_outputs=x["cotangent"])
    return {name: out.detach(), "grad/logits": grad}


def _entropy_upstream(
    case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any]
) -> dict[str, Any]:
    # verl's actor divides the logits by the temperature before every log-prob and entropy.
    F = _upstream().F
    return _logit_side(x, lambda z: F.entropy_from_logits(z / x["temperature"]), "entropy")


def _entropy_ours(
    case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any]
) -> dict[str, Any]:
    fn = ns["entropy_from_logits"]
    return _logit_side(x, lambda z: fn(z, temperature=x["temperature"]), "entropy")


def _log_prob_upstream(
    case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any]
) -> dict[str, Any]:
    F = _upstream().F
    return _logit_side(
        x, lambda z: F.logprobs_from_logits(z / x["temperature"], x["labels"]), "log_prob"
    )


def _log_prob_ours(
    case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any]
) -> dict[str, Any]:
    fn = ns["log_probs_from_logits"]
    return _logit_side(x, lambda z: fn(z, x["labels"], temperature=x["temperature"]), "log_prob")


# microbatch -----------------------------------------------------------------

# Two data-parallel ranks of four rows each, split unevenly into micro-batches.
_RANKS: tuple[tuple[tuple[int, ...], ...], ...] = (((0, 1, 2), (3,)), ((4, 5), (6, 7)))


def _microbatch_inputs(case: ConformanceCase, g: torch.Generator) -> dict[str, Any]:
    dtype = DTYPES[case.dtype]
    masks = _masks(g, 8, 16, "empty")
    critic = case.family.endswith("critic")
    x = _critic_inputs(g, masks, dtype) if critic else _actor_inputs(g, masks, dtype)
    x["masks"] = masks
    x["prompt_lengths"] = _randint(g, 1, 4, (8,))
    return x


def _rows(x: Mapping[str, Any], rows: Sequence[int]) -> tuple[dict[str, Any], _Masks, _Flat]:
    """The micro-batch of `rows`, padded to the mini-batch's width as verl's engine keeps it."""
    index = torch.tensor(list(rows))
    masks: _Masks = x["masks"]
    part = {k: v[index] for k, v in x.items() if isinstance(v, torch.Tensor) and v.dim() == 2}
    sub = _Masks(masks.response_mask[index], masks.lengths[index])
    return part, sub, _Flat.for_prompts(sub, x["prompt_lengths"][index])


def _microbatch_side(
    case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any], split: bool
) -> dict[str, Any]:
    side, loss_name = case.family.split("-")
    masks: _Masks = x["masks"]
    total_tokens = int(masks.valid.sum())
    batch = masks.response_mask.shape[0]

    def one(rows: Sequence[int], dp_size: int) -> dict[str, Any]:
        part, sub, flat = _rows(x, rows)
        norms = {
            "dp_size": dp_size,
            "batch_num_tokens": total_tokens,
            "global_batch_size": batch,
            "loss_scale_factor": None,  # the padded width, the same in every micro-batch here
        }
        if side == "ours":
            fn = _ours_actor if loss_name == "actor" else _ours_critic
            return fn(ns, part, sub, case.variant, norms)
        fn = _upstream_actor if loss_name == "actor" else _upstream_critic
        return fn(part, sub, flat, case.variant, norms)

    if not split:
        full = one(range(batch), 1)
        return {k: v for k, v in full.items() if k == "loss" or k.startswith("grad/")}
    dp_size = len(_RANKS)
    loss = torch.zeros((), dtype=DTYPES[case.dtype])
    grads: dict[str, torch.Tensor] = {}
    for rank in _RANKS:
        for rows in rank:
            out = one(rows, dp_size)
            # DDP averages the ranks' gradients; each rank sums its micro-batches.
            loss = loss + out["loss"] / dp_size
            for key in (k for k in out if k.startswith("grad/")):
                grads.setdefault(key, torch.zeros_like(x[key.removeprefix("grad/")]))
                grads[key][list(rows)] = out[key] / dp_size
    return {"loss": loss, **grads}


# registry ---------------------------------------------------------------------

_COMPONENTS: dict[str, _Component] = {
    "advantage": _Component(_advantage_inputs, _advantage_upstream, _advantage_ours),
    "agg_loss": _Component(
        _agg_inputs,
        lambda case, x, ns: _agg_side(case, x, _upstream().core_algos.agg_loss),
        lambda case, x, ns: _agg_side(case, x, ns["agg_loss"]),
    ),
    "policy_loss": _Component(_policy_inputs, _policy_upstream, _policy_ours),
    "value_loss": _Component(
        _value_inputs,
        lambda case, x, ns: _upstream_critic(
            x, x["masks"], x["flat"], case.variant, x["normalisers"]
        ),
        lambda case, x, ns: _ours_critic(ns, x, x["masks"], case.variant, x["normalisers"]),
    ),
    "kl": _Component(
        _kl_inputs,
        lambda case, x, ns: _kl_side(case, x, _upstream().core_algos.kl_penalty),
        lambda case, x, ns: _kl_side(case, x, ns["kl_penalty"]),
    ),
    "kl_in_reward": _Component(_kl_reward_inputs, _kl_reward_upstream, _kl_reward_ours),
    "entropy": _Component(_logit_inputs, _entropy_upstream, _entropy_ours),
    "log_prob": _Component(_logit_inputs, _log_prob_upstream, _log_prob_ours),
    "microbatch": _Component(
        _microbatch_inputs,
        lambda case, x, ns: _microbatch_side(case, x, ns, split=False),
        lambda case, x, ns: _microbatch_side(case, x, ns, split=True),
        labels=("micro-batches", "mini-batch"),
        reference_uses_ours=lambda case: case.family.startswith("ours-"),
    ),
}


# --------------------------------------------------------------------------- comparison

_TABLE_ROWS = 5


@dataclass
class _Check:
    """One quantity of one sample compared; `problem` is set when it does not conform."""

    quantity: str
    sample: int
    max_abs: float
    problem: str | None = None


def _as_array(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().to(torch.float64).numpy()
    return np.asarray(value, dtype=np.float64)


def _describe_dtype(value: Any) -> str:
    return str(value.dtype).removeprefix("torch.") if isinstance(value, torch.Tensor) else "float"


def _compare(
    case: ConformanceCase,
    quantity: str,
    sample: int,
    actual: Any,
    expected: Any,
    labels: tuple[str, str],
) -> _Check:
    """Shapes, dtypes, then closeness; a readable table of the first mismatches on failure."""
    tag = f"[{case.id} sample {sample}]"
    if isinstance(expected, torch.Tensor) or isinstance(actual, torch.Tensor):
        shape_a = tuple(getattr(actual, "shape", ()))
        shape_e = tuple(getattr(expected, "shape", ()))
        if shape_a != shape_e:
            return _Check(
                quantity,
                sample,
                math.inf,
                f"{quantity}.shape={shape_a}, but should be {shape_e} {tag}",
            )
        if _describe_dtype(actual) != _describe_dtype(expected):
            return _Check(
                quantity,
                sample,
                math.inf,
                f"{quantity}.dtype={_describe_dtype(actual)}, "
                f"but should be {_describe_dtype(expected)} {tag}",
            )
    a, e = _as_array(actual), _as_array(expected)
    fraction = "clipfrac" in quantity
    rtol = case.fraction_rtol if fraction else case.rtol
    atol = case.fraction_atol if fraction else case.atol
    close = np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        abs_err = np.where(close, 0.0, np.abs(a - e))
        abs_err = np.where(np.isnan(abs_err), np.inf, abs_err)
        all_abs = np.abs(a - e)
        both_finite = np.isfinite(a) & np.isfinite(e)
        finite_abs = np.where(both_finite, all_abs, 0.0)
        rel = np.where(both_finite & (e != 0), all_abs / np.abs(e), 0.0)
    max_abs = (
        float(abs_err.max(initial=0.0)) if not close.all() else float(finite_abs.max(initial=0.0))
    )
    if close.all():
        return _Check(quantity, sample, max_abs)
    bad = np.argwhere(~close.reshape(a.shape)) if a.ndim else np.zeros((1, 0), dtype=int)
    count, total = int((~close).sum()), int(close.size)
    nonfinite = int((~close & ~both_finite).sum())
    nonfinite_note = f" ({nonfinite} non-finite on one side only)" if nonfinite else ""
    lines = [
        f"{quantity}: {count} of {total} elements ({count / total:.1%}) differ{nonfinite_note}, "
        f"max abs err={float(finite_abs.max(initial=0.0)):.3g}, "
        f"but should be within rtol={rtol:g}, atol={atol:g} {tag}",
        f"  abs err: max {float(finite_abs.max(initial=0.0)):.3g}, "
        f"mean {float(finite_abs.mean()):.3g}; "
        f"rel err: max {float(rel.max(initial=0.0)):.3g}, mean {float(rel.mean()):.3g}",
        f"  {'index':<14} {labels[0]:>24} {labels[1]:>24} {'abs err':>10} {'rel err':>10}",
    ]
    for position in bad[:_TABLE_ROWS]:
        key = tuple(int(i) for i in position)
        lines.append(
            f"  {str(key) if key else '()':<14} {a[key]:>24.17g} {e[key]:>24.17g} "
            f"{float(all_abs[key]):>10.3g} {float(rel[key]):>10.3g}"
        )
    if count > _TABLE_ROWS:
        lines.append(f"  ... {count - _TABLE_ROWS} more")
    return _Check(quantity, sample, max_abs, "\n".join(lines))


def _compare_outputs(
    case: ConformanceCase,
    sample: int,
    actual: Mapping[str, Any],
    expected: Mapping[str, Any],
    labels: tuple[str, str],
) -> list[_Check]:
    if set(actual) != set(expected):
        extra, missing = sorted(set(actual) - set(expected)), sorted(set(expected) - set(actual))
        return [
            _Check(
                "keys",
                sample,
                math.inf,
                f"keys={sorted(actual)}, but should be {sorted(expected)} "
                f"(extra {extra}, missing {missing}) [{case.id} sample {sample}]",
            )
        ]
    return [
        _compare(case, key, sample, actual[key], expected[key], labels) for key in sorted(expected)
    ]


@functools.cache
def _cached_reference(case: ConformanceCase, sample: int) -> dict[str, Any]:
    """Upstream's side of a case: it never changes, so the mutation check reuses it."""
    component = _COMPONENTS[case.component]
    return component.reference(case, component.inputs(case, _generator(case, sample)), {})


def run_case(
    case: ConformanceCase, ours: ModuleType | Mapping[str, Any] | None = None
) -> ConformanceResult:
    """Compare our functions (or the substitutes in `ours`) with upstream on the case's samples."""
    reason = upstream_missing_reason()
    if reason is not None:
        raise RuntimeError(reason)
    namespace = _resolve(ours)
    component = _COMPONENTS[case.component]
    checks: list[_Check] = []
    for sample in range(case.samples):
        inputs = component.inputs(case, _generator(case, sample))
        if component.reference_uses_ours(case):
            expected = component.reference(case, inputs, namespace)
        else:
            expected = _cached_reference(case, sample)
        try:
            actual = component.candidate(case, inputs, namespace)
        except Exception as error:  # a mutant may raise; that is a failure, not a crash
            checks.append(
                _Check(
                    "call",
                    sample,
                    math.inf,
                    f"{component.labels[0]} raised {error!r} [{case.id} sample {sample}]",
                )
            )
            continue
        checks.extend(_compare_outputs(case, sample, actual, expected, component.labels))
    return _result(case, checks)


def _result(case: ConformanceCase, checks: Sequence[_Check]) -> ConformanceResult:
    values = [c.max_abs for c in checks if not c.quantity.startswith("grad/")]
    grads = [c.max_abs for c in checks if c.quantity.startswith("grad/")]
    problems = [c.problem for c in checks if c.problem]
    if problems:
        shown = problems[:3]
        more = f"\n... and {len(problems) - 3} more failing quantities" if len(problems) > 3 else ""
        message = "\n".join(shown) + more
        if case.divergence:
            message += f"\n(tolerance loosened for a known upstream divergence: {case.divergence})"
    else:
        message = (
            f"{len(checks)} comparisons over {case.samples} samples within rtol={case.rtol:g}, "
            f"atol={case.atol:g} [{case.id}]"
        )
    return ConformanceResult(
        case_id=case.id,
        component=case.component,
        variant=case.variant,
        samples=case.samples,
        max_abs_err=max(values, default=0.0),
        max_grad_abs_err=max(grads, default=0.0),
        passed=not problems,
        message=message,
    )


# --------------------------------------------------------------------------- mutation check
#
# Each mutant is a bug someone could plausibly write (several have verl or TRL issues behind
# them), applied to a copy of our namespace by wrapping or replacing one of our functions.
# The conformance cases must notice every one of them.

Namespace = Mapping[str, Any]


def _agg_mutant(transform: Callable[..., torch.Tensor]) -> Callable[[Namespace], dict[str, Any]]:
    """Replace `agg_loss` by `transform(original, loss_mat, loss_mask, mode, **normalisers)`."""

    def patch(ns: Namespace) -> dict[str, Any]:
        original = ns["agg_loss"]

        def agg_loss(
            loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str, **norms: Any
        ) -> torch.Tensor:
            return transform(original, loss_mat, loss_mask, loss_agg_mode, **norms)

        return {"agg_loss": agg_loss}

    return patch


def _with_kwargs(keys: Sequence[str], **overrides: Any) -> Callable[[Namespace], dict[str, Any]]:
    """Call the originals with some keyword arguments forced."""

    def patch(ns: Namespace) -> dict[str, Any]:
        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            return lambda *args, **kwargs: fn(*args, **{**kwargs, **overrides})

        return {key: wrap(ns[key]) for key in keys}

    return patch


def _swap_clip(ns: Namespace) -> dict[str, Any]:
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def swapped(*args: Any, **kwargs: Any) -> Any:
            low, high = kwargs.get("clip_ratio_low"), kwargs.get("clip_ratio_high")
            return fn(*args, **{**kwargs, "clip_ratio_low": high, "clip_ratio_high": low})

        return swapped

    return {key: wrap(ns[key]) for key in ("vanilla_policy_loss", "actor_loss")}


def _ppo_kl_sign(ns: Namespace) -> dict[str, Any]:
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def flipped(*args: Any, **kwargs: Any) -> Any:
            loss, metrics = fn(*args, **kwargs)
            return loss, {**metrics, "actor/ppo_kl": -metrics["actor/ppo_kl"]}

        return flipped

    return {key: wrap(ns[key]) for key in ("vanilla_policy_loss", "actor_loss")}


def _local_normalisers(keys: Sequence[str]) -> Callable[[Namespace], dict[str, Any]]:
    """Normalise by the micro-batch's own counts (verl #7110 for the critic, #5625 the actor)."""

    def patch(ns: Namespace) -> dict[str, Any]:
        def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
            def local(*args: Any, **kwargs: Any) -> Any:
                local_kwargs = {
                    **kwargs,
                    "dp_size": 1,
                    "batch_num_tokens": None,
                    "global_batch_size": None,
                }
                return fn(*args, **local_kwargs)

            return local

        return {key: wrap(ns[key]) for key in keys}

    return patch


def _groups_of(index: np.ndarray) -> list[torch.Tensor]:
    return [torch.as_tensor(index == uid) for uid in np.unique(index)]


def _grpo_biased_std(ns: Namespace) -> dict[str, Any]:
    def grpo(
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        index: np.ndarray,
        epsilon: float = 1e-6,
        norm_adv_by_std_in_grpo: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        scores = token_level_rewards.sum(-1)
        per_row = torch.empty_like(scores)
        for rows in _groups_of(index):
            group = scores[rows]
            if len(group) == 1:
                per_row[rows] = group
                continue
            centred = group - group.mean()
            std = group.std(unbiased=False)  # the bug: population std
            per_row[rows] = centred / (std + epsilon) if norm_adv_by_std_in_grpo else centred
        advantages = per_row.unsqueeze(-1) * response_mask.to(scores.dtype)
        return advantages, advantages

    return {"grpo_advantages": grpo}


def _grpo_singleton_zero(ns: Namespace) -> dict[str, Any]:
    fn = ns["grpo_advantages"]

    def grpo(
        token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray, **kw: Any
    ) -> Any:
        advantages, _ = fn(token_level_rewards, response_mask, index, **kw)
        for rows in _groups_of(index):
            if int(rows.sum()) == 1:  # the bug: a lone response is its own baseline
                advantages[rows] = 0.0
        return advantages, advantages

    return {"grpo_advantages": grpo}


def _rloo_denominator(ns: Namespace) -> dict[str, Any]:
    grpo = ns["grpo_advantages"]

    def rloo(
        token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray
    ) -> Any:
        # The bug: the baseline is the mean over the group including the response itself,
        # i.e. (n - 1) / n of the leave-one-out advantage.
        return grpo(token_level_rewards, response_mask, index, norm_adv_by_std_in_grpo=False)

    return {"rloo_advantages": rloo}


def _gae_returns_whitened(ns: Namespace) -> dict[str, Any]:
    fn = ns["gae_advantages"]

    def gae(
        token_level_rewards: torch.Tensor,
        values: torch.Tensor,
        response_mask: torch.Tensor,
        **kw: Any,
    ) -> Any:
        advantages, _ = fn(token_level_rewards, values, response_mask, **kw)
        return advantages, advantages + values  # the bug: returns from whitened advantages

    return {"gae_advantages": gae}


def _whiten_biased(ns: Namespace) -> dict[str, Any]:
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def biased(
            token_level_rewards: torch.Tensor, response_mask: torch.Tensor, *args: Any, **kw: Any
        ) -> Any:
            advantages, returns = fn(token_level_rewards, response_mask, *args, **kw)
            n = int(response_mask.bool().sum())
            # Whitening by the population variance scales by sqrt(n / (n - 1)).
            scaled = advantages * math.sqrt(n / (n - 1))
            same = returns is advantages
            return scaled, scaled if same else returns

        return biased

    keys = ("reinforce_plus_plus_advantages", "reinforce_plus_plus_baseline_advantages")
    return {key: wrap(ns[key]) for key in keys}


def _value_clip_wrong_side(ns: Namespace) -> dict[str, Any]:
    fn, agg = ns["value_loss"], ns["agg_loss"]

    def value_loss(
        vpreds: torch.Tensor,
        values: torch.Tensor,
        returns: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        cliprange_value: float,
        loss_agg_mode: str = "token-mean",
        **norms: Any,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        _, metrics = fn(
            vpreds.detach(),
            values,
            returns,
            response_mask,
            cliprange_value=cliprange_value,
            loss_agg_mode=loss_agg_mode,
            **norms,
        )
        clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
        # The bug: the optimistic (smaller) of the two errors.
        errors = torch.minimum((vpreds - returns) ** 2, (clipped - returns) ** 2)
        loss = 0.5 * agg(errors, response_mask, loss_agg_mode, **norms)
        return loss, {**metrics, "critic/vf_loss": float(loss.detach())}

    return {"value_loss": value_loss}


def _kl_mutant(transform: Callable[..., torch.Tensor]) -> Callable[[Namespace], dict[str, Any]]:
    def patch(ns: Namespace) -> dict[str, Any]:
        original = ns["kl_penalty"]

        def kl_penalty(
            log_prob: torch.Tensor, ref_log_prob: torch.Tensor, name: str
        ) -> torch.Tensor:
            return transform(original, log_prob, ref_log_prob, name)

        return {"kl_penalty": kl_penalty}

    return patch


def _k3_unclamped(
    original: Callable[..., torch.Tensor], lp: torch.Tensor, ref: torch.Tensor, name: str
) -> torch.Tensor:
    if name.rstrip("+") not in ("low_var_kl", "k3"):
        return original(lp, ref, name)
    log_ratio = ref - lp
    estimate = torch.exp(log_ratio) - log_ratio - 1
    if name.endswith("+"):
        surrogate = 0.5 * (lp - ref) ** 2
        return estimate.detach() + surrogate - surrogate.detach()
    return estimate


def _adaptive_unclipped(ns: Namespace) -> dict[str, Any]:
    base = ns["AdaptiveKLController"]

    class Unclipped(base):  # type: ignore[misc, valid-type]
        def update(self, current_kl: float, n_steps: int) -> None:
            self.value *= 1.0 + (current_kl / self.target - 1.0) * n_steps / self.horizon

    return {"AdaptiveKLController": Unclipped}


def _kl_reward_unmasked(ns: Namespace) -> dict[str, Any]:
    fn = ns["apply_kl_in_reward"]

    def apply(
        scores: torch.Tensor, old: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor, *rest: Any
    ) -> Any:
        return fn(
            scores, old, ref, torch.ones_like(mask), *rest
        )  # the bug: padding is penalised too

    return {"apply_kl_in_reward": apply}


def _shift_right(mask: torch.Tensor) -> torch.Tensor:
    shifted = torch.zeros_like(mask)
    shifted[:, 1:] = mask[:, :-1]
    return shifted


MUTATIONS: list[Mutation] = [
    Mutation(
        "agg-loss-scaled",
        "every aggregated loss 1% too large",
        ("agg_loss",),
        _agg_mutant(lambda agg, mat, mask, mode, **n: agg(mat, mask, mode, **n) * 1.01),
    ),
    Mutation(
        "seq-mean-token-mean-padded-width",
        "seq-mean-token-mean divides each sequence by the padded width, not its own length",
        ("agg_loss",),
        _agg_mutant(
            lambda agg, mat, mask, mode, **n: (
                agg(
                    mat,
                    mask,
                    "seq-mean-token-sum-norm",
                    **{**n, "loss_scale_factor": mask.shape[-1]},
                )
                if mode == "seq-mean-token-mean"
                else agg(mat, mask, mode, **n)
            )
        ),
    ),
    Mutation(
        "mask-off-by-one",
        "the loss mask shifted one token right: the first token dropped, one past EOS included",
        ("agg_loss",),
        _agg_mutant(lambda agg, mat, mask, mode, **n: agg(mat, _shift_right(mask), mode, **n)),
    ),
    Mutation(
        "dp-size-ignored",
        "the dp_size factor left out, so averaging over ranks shrinks the loss",
        ("agg_loss",),
        _agg_mutant(lambda agg, mat, mask, mode, **n: agg(mat, mask, mode, **{**n, "dp_size": 1})),
    ),
    Mutation(
        "token-mean-local-count",
        "token-mean divides by the micro-batch's tokens instead of the mini-batch's (verl #5625)",
        ("agg_loss",),
        _agg_mutant(
            lambda agg, mat, mask, mode, **n: (
                agg(mat, mask, mode, **{**n, "dp_size": 1, "batch_num_tokens": None})
                * n.get("dp_size", 1)
                if mode == "token-mean"
                else agg(mat, mask, mode, **n)
            )
        ),
    ),
    Mutation(
        "actor-local-normalisers",
        "the actor loss normalised per micro-batch: gradient depends on the split",
        ("actor_loss",),
        _local_normalisers(("actor_loss",)),
    ),
    Mutation(
        "critic-local-normalisers",
        "the value loss normalised per micro-batch (verl #7110)",
        ("value_loss",),
        _local_normalisers(("value_loss",)),
    ),
    Mutation(
        "grpo-no-epsilon",
        "GRPO divides by the group std without the 1e-6 epsilon",
        ("grpo_advantages",),
        _with_kwargs(("grpo_advantages",), epsilon=0.0),
    ),
    Mutation(
        "grpo-biased-std",
        "GRPO normalises by the population (biased) std instead of the sample std",
        ("grpo_advantages",),
        _grpo_biased_std,
    ),
    Mutation(
        "grpo-singleton-zero",
        "a group of one gets advantage 0 instead of mean 0, std 1",
        ("grpo_advantages",),
        _grpo_singleton_zero,
    ),
    Mutation(
        "rloo-denominator-n",
        "RLOO's baseline averages over n responses including itself instead of the n - 1 others",
        ("rloo_advantages",),
        _rloo_denominator,
    ),
    Mutation(
        "gae-lambda-ignored",
        "GAE run with lambda = 1 (Monte-Carlo returns) instead of the configured lambda",
        ("gae_advantages",),
        _with_kwargs(("gae_advantages",), lam=1.0),
    ),
    Mutation(
        "gae-returns-whitened",
        "GAE returns built from the whitened advantages instead of the raw ones",
        ("gae_advantages",),
        _gae_returns_whitened,
    ),
    Mutation(
        "whiten-biased-variance",
        "REINFORCE++ whitening by the population variance instead of the unbiased one",
        ("reinforce_plus_plus_advantages", "reinforce_plus_plus_baseline_advantages"),
        _whiten_biased,
    ),
    Mutation(
        "ppo-clip-swapped",
        "clip_ratio_low and clip_ratio_high swapped",
        ("vanilla_policy_loss", "actor_loss"),
        _swap_clip,
    ),
    Mutation(
        "dual-clip-dropped",
        "no dual clip: negative advantages with huge ratios are not capped at clip_ratio_c",
        ("vanilla_policy_loss", "actor_loss"),
        _with_kwargs(("vanilla_policy_loss", "actor_loss"), clip_ratio_c=1e30),
    ),
    Mutation(
        "ppo-kl-sign",
        "actor/ppo_kl reported as log_prob - old_log_prob (sign flipped)",
        ("vanilla_policy_loss", "actor_loss"),
        _ppo_kl_sign,
    ),
    Mutation(
        "value-clip-wrong-side",
        "value loss takes the smaller of the clipped and unclipped errors",
        ("value_loss",),
        _value_clip_wrong_side,
    ),
    Mutation(
        "kl-sign-flipped",
        "KL estimators fed (ref, policy) instead of (policy, ref)",
        ("kl_penalty",),
        _kl_mutant(lambda kl, lp, ref, name: kl(ref, lp, name)),
    ),
    Mutation(
        "k3-unclamped",
        "low_var_kl without verl's clamps of the log ratio and of the estimate",
        ("kl_penalty",),
        _kl_mutant(_k3_unclamped),
    ),
    Mutation(
        "straight-through-dropped",
        "k1+/k3+ use their own gradient instead of k2's",
        ("kl_penalty",),
        _kl_mutant(lambda kl, lp, ref, name: kl(lp, ref, name.rstrip("+"))),
    ),
    Mutation(
        "adaptive-kl-unclipped",
        "the adaptive KL controller's proportional error not clipped to +-0.2",
        ("AdaptiveKLController",),
        _adaptive_unclipped,
    ),
    Mutation(
        "kl-reward-unmasked",
        "the in-reward KL penalty applied on padding tokens too",
        ("apply_kl_in_reward",),
        _kl_reward_unmasked,
    ),
    Mutation(
        "temperature-forgotten",
        "log-probs and entropies of the raw logits, not logits / temperature (TRL #3029)",
        ("log_probs_from_logits", "entropy_from_logits"),
        _with_kwargs(("log_probs_from_logits", "entropy_from_logits"), temperature=1.0),
    ),
]


def mutation_cases(mutation: Mutation, cases: Iterable[ConformanceCase]) -> list[ConformanceCase]:
    """The cases that call at least one function the mutant replaces."""
    replaced = set(mutation.replaces)
    return [case for case in cases if _uses(case) & replaced]


def run_mutation_check(
    cases: Iterable[ConformanceCase], mutations: Sequence[Mutation] = MUTATIONS
) -> list[tuple[str, bool, list[str]]]:
    """For each mutant: (name, killed?, ids of the cases that failed against it).

    Only the cases calling a replaced function run; upstream's side is cached, so this costs
    about one run of our own math per such case.
    """
    cases = list(cases)
    base = reference_namespace()
    outcome: list[tuple[str, bool, list[str]]] = []
    for mutation in mutations:
        namespace = mutation.apply(base)
        failed = [
            case.id
            for case in mutation_cases(mutation, cases)
            if not run_case(case, namespace).passed
        ]
        outcome.append((mutation.name, bool(failed), failed))
    return outcome
