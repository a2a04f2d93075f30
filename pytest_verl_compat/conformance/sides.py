"""Reaching both sides of a comparison, and the actor and critic losses run on either.

Our functions are resolved by name through a namespace (`reference_namespace()`); the mutation
check substitutes deliberately wrong functions in a copy of it. verl's modules are imported
lazily (it takes seconds) and only by the upstream side of a case. The actor and critic losses,
on one (micro-)batch, serve the policy_loss, value_loss and microbatch components alike.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import ModuleType, SimpleNamespace
from typing import Any

import torch

from pytest_verl_compat.conformance.inputs import Flat, Masks
from pytest_verl_compat.conformance.plan import CLIP

# Settings shared by every case (the data, not the tolerances, vary between cases); the clip
# bounds are the case's family's (``plan.clip_settings``).
ACTOR_TERMS = {
    "entropy_coeff": 0.05,
    "use_kl_loss": True,
    "kl_loss_coef": 0.1,
    "kl_loss_type": "low_var_kl",
}
CLIPRANGE_VALUE = 0.5


# --------------------------------------------------------------------------- our namespace


def reference_namespace() -> dict[str, Any]:
    """Our functions by the names the cases resolve them with (the names mutations replace)."""
    from reference_trainer.math import aggregation, kl, logprobs, losses, sft
    from reference_trainer.math.advantages import ADVANTAGE_ESTIMATORS

    namespace: dict[str, Any] = {fn.__name__: fn for fn in ADVANTAGE_ESTIMATORS.values()}
    namespace.update(
        agg_loss=aggregation.agg_loss,
        unpadded_scale=aggregation.unpadded_scale,
        vanilla_policy_loss=losses.vanilla_policy_loss,
        actor_loss=losses.actor_loss,
        value_loss=losses.value_loss,
        kl_penalty=kl.kl_penalty,
        apply_kl_in_reward=kl.apply_kl_in_reward,
        FixedKLController=kl.FixedKLController,
        AdaptiveKLController=kl.AdaptiveKLController,
        entropy_from_logits=logprobs.entropy_from_logits,
        log_probs_from_logits=logprobs.log_probs_from_logits,
        sft_loss=sft.sft_loss,
        next_token_loss_mask=sft.next_token_loss_mask,
    )
    return namespace


def resolve_namespace(ours: ModuleType | Mapping[str, Any] | None) -> dict[str, Any]:
    """Our namespace with the substitutes of `ours` (a module's or mapping's same names) in."""
    default = reference_namespace()
    if ours is None:
        return default
    if isinstance(ours, ModuleType):
        return {key: getattr(ours, key, fn) for key, fn in default.items()}
    return {**default, **ours}


def advantage_key(variant: str) -> str:
    """The namespace name of our estimator registered as `variant` (its function's name)."""
    from reference_trainer.math.advantages import ADVANTAGE_ESTIMATORS

    return ADVANTAGE_ESTIMATORS[variant].__name__


# --------------------------------------------------------------------------- upstream access


@functools.cache
def upstream_modules() -> SimpleNamespace:
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


# --------------------------------------------------------------------------- upstream batches


def _with_normalisers(data: Any, normalisers: Mapping[str, Any]) -> Any:
    """The batch with the global normalisers the engine sets on it, as non-tensor data."""
    upstream_modules().tu.assign_non_tensor(
        data,
        dp_size=normalisers["dp_size"],
        batch_num_tokens=normalisers["batch_num_tokens"],
        global_batch_size=normalisers["global_batch_size"],
    )
    return data


def _tensordict(
    masks: Masks,
    flat: Flat,
    tensors: Mapping[str, torch.Tensor],
    normalisers: Mapping[str, Any],
) -> Any:
    up = upstream_modules()
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
    return _with_normalisers(data, normalisers)


def _nested_tensordict(
    masks: Masks,
    flat: Flat,
    tensors: Mapping[str, torch.Tensor],
    normalisers: Mapping[str, Any],
) -> Any:
    """A V1 micro-batch: every per-token field a jagged nested tensor of the response's length.

    As `verl/trainer/ppo/v1/trainer_base.py` hands it to the engine (prompts and responses
    unpadded, `response_to_nested` for advantages and returns) with the normalisers the engine
    sets (`verl/workers/engine/fsdp/transformer_impl.py:706-711`).
    """
    up = upstream_modules()
    lengths = [int(r) for r in masks.lengths]

    def nested(rows: list[torch.Tensor]) -> torch.Tensor:
        return torch.nested.as_nested_tensor(rows, layout=torch.jagged)

    def responses(padded: torch.Tensor) -> torch.Tensor:
        return nested([padded[i, :r].detach() for i, r in enumerate(lengths)])

    data = up.tu.get_tensordict(
        {
            "prompts": nested([torch.zeros(int(p), dtype=torch.long) for p in flat.prompt_lengths]),
            "responses": nested([torch.zeros(r, dtype=torch.long) for r in lengths]),
            "response_mask": responses(masks.response_mask),
            **{key: responses(value) for key, value in tensors.items()},
        }
    )
    return _with_normalisers(data, normalisers)


def _nested_output(flat: Flat, padded: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A model output as the FSDP engine returns it on unpadded input
    (`transformer_impl.py:1409`): the flat values over every prompt and response token, and
    the jagged nested tensor of one row per sequence viewing them."""
    values = flat.flatten(padded)
    lengths = flat.prompt_lengths + (flat.positions >= 0).sum(dim=1)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    return values, torch.nested.nested_tensor_from_jagged(values, offsets=offsets)


def actor_config(
    loss_agg_mode: str, loss_scale_factor: int | None, clip: Mapping[str, float] = CLIP
) -> Any:
    return upstream_modules().ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=loss_agg_mode,
        loss_scale_factor=loss_scale_factor,
        **clip,
        **ACTOR_TERMS,
    )


def _actor_fields(x: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The batch fields verl's ppo_loss reads, under verl's names."""
    return {
        "old_log_probs": x["old_log_prob"],
        "advantages": x["advantages"],
        "ref_log_prob": x["ref_log_prob"],
    }


def upstream_actor(
    x: Mapping[str, Any],
    masks: Masks,
    flat: Flat,
    mode: str,
    normalisers: Mapping[str, Any],
    nested: bool = False,
) -> dict[str, Any]:
    """verl's `ppo_loss` (policy loss + entropy bonus + KL loss) on one micro-batch (padded, or
    V1's with `nested`: nested model outputs and nested batch fields)."""
    up = upstream_modules()
    config = actor_config(mode, normalisers["loss_scale_factor"], x.get("clip", CLIP))
    if nested:
        log_probs, log_probs_output = _nested_output(flat, x["log_prob"])
        entropy, entropy_output = _nested_output(flat, x["entropy"])
        data = _nested_tensordict(masks, flat, _actor_fields(x), normalisers)
    else:
        log_probs = log_probs_output = flat.flatten(x["log_prob"])
        entropy = entropy_output = flat.flatten(x["entropy"])
        data = _tensordict(masks, flat, _actor_fields(x), normalisers)
    outputs = {"log_probs": log_probs_output, "entropy": entropy_output}
    loss, metrics = up.losses.ppo_loss(config, outputs, data)
    grads = torch.autograd.grad(loss, (log_probs, entropy))
    out: dict[str, Any] = {"loss": loss.detach()}
    out.update({_logged_name(k): _metric_value(v) for k, v in metrics.items()})
    out["grad/log_prob"] = flat.unflatten(grads[0])
    out["grad/entropy"] = flat.unflatten(grads[1])
    return out


def ours_actor(
    ns: Mapping[str, Any],
    x: Mapping[str, Any],
    masks: Masks,
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
        **x.get("clip", CLIP),
        **ACTOR_TERMS,
        **normalisers,
    )
    grads = torch.autograd.grad(loss, (log_prob, entropy))
    return {"loss": loss.detach(), **metrics, "grad/log_prob": grads[0], "grad/entropy": grads[1]}


def upstream_critic(
    x: Mapping[str, Any],
    masks: Masks,
    flat: Flat,
    mode: str,
    normalisers: Mapping[str, Any],
    nested: bool = False,
) -> dict[str, Any]:
    """verl's `value_loss` on one micro-batch (padded, or V1's nested with `nested`)."""
    up = upstream_modules()
    config = up.CriticConfig(
        strategy="fsdp",
        ppo_micro_batch_size_per_gpu=1,
        cliprange_value=CLIPRANGE_VALUE,
        loss_agg_mode=mode,
        loss_scale_factor=normalisers["loss_scale_factor"],
    )
    tensors = {"values": x["values"], "returns": x["returns"]}
    if nested:  # a V1 micro-batch: nested value predictions and batch fields
        vpreds, output = _nested_output(flat, x["vpreds"])
        data = _nested_tensordict(masks, flat, tensors, normalisers)
    else:
        vpreds = output = flat.flatten(x["vpreds"])
        data = _tensordict(masks, flat, tensors, normalisers)
    loss, metrics = up.losses.value_loss(config, {"values": output}, data)
    (grad,) = torch.autograd.grad(loss, (vpreds,))
    out: dict[str, Any] = {"loss": loss.detach()}
    out.update({k: _metric_value(v) for k, v in metrics.items()})
    out["grad/vpreds"] = flat.unflatten(grad)
    return out


def unpadded_normalisers(
    ns: Mapping[str, Any], mode: str, masks: Masks, normalisers: Mapping[str, Any]
) -> dict[str, Any]:
    """The normalisers the reference trainer passes for a V1 micro-batch (`updates.py`): our
    padded batch, with Dr. GRPO's divisor of the unpadded one (`unpadded_scale`)."""
    scale = ns["unpadded_scale"](normalisers["loss_scale_factor"], mode, masks.response_mask)
    return {**normalisers, "loss_scale_factor": scale}


def ours_critic(
    ns: Mapping[str, Any],
    x: Mapping[str, Any],
    masks: Masks,
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
