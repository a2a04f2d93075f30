"""Both sides of every conformance comparison, one `Component` per component of the plan.

Given a case's inputs (`inputs.INPUTS`), each entry of `SIDES` computes ours
(`reference_trainer.math`, through the namespace of `sides`) and upstream's
(`verl.trainer.ppo.core_algos`, `verl.workers.utils.losses`) outputs, metrics and gradients,
keyed alike, for `run` to compare. The `nested-` families feed V1's losses jagged nested
micro-batches, as its engine does, against our padded ones. Advantage estimators are data: one adapter serves every
entry of `plan.ESTIMATORS`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pytest_verl_compat.conformance.inputs import DTYPES, INPUTS, Masks, microbatch_rows
from pytest_verl_compat.conformance.plan import (
    COMPONENTS,
    ESTIMATORS,
    HYPERPARAMETER_NAMES,
    ConformanceCase,
)
from pytest_verl_compat.conformance.sft import sft_ours, sft_upstream, sft_uses
from pytest_verl_compat.conformance.sides import (
    actor_config,
    advantage_key,
    ours_actor,
    ours_critic,
    unpadded_normalisers,
    upstream_actor,
    upstream_critic,
    upstream_modules,
)

GAMMA, LAM = 0.99, 0.95
# The values of the hyperparameters an estimator's `EstimatorSpec.hyperparameters` names.
HYPERPARAMETERS: dict[str, float] = {"gamma": GAMMA, "lam": LAM}
assert tuple(HYPERPARAMETERS) == HYPERPARAMETER_NAMES

Side = Callable[[ConformanceCase, dict[str, Any], Mapping[str, Any]], dict[str, Any]]


# --------------------------------------------------------------------------- components


@dataclass(frozen=True)
class Component:
    """How to compute a case's two sides from its inputs (`inputs.INPUTS`), and what ours calls.

    `reference` is upstream (cached per case and sample) except for the micro-batch cases of
    our own losses, where it is our mini-batch computation (`reference_uses_ours`). `uses` names
    the namespace entries the candidate side calls (the mutation check runs only those cases).
    """

    reference: Side
    candidate: Side
    uses: Callable[[ConformanceCase], frozenset[str]]
    labels: tuple[str, str] = ("ours", "upstream")
    reference_uses_ours: Callable[[ConformanceCase], bool] = lambda case: False


def _always(*names: str) -> Callable[[ConformanceCase], frozenset[str]]:
    return lambda case: frozenset(names)


# advantage ------------------------------------------------------------------


def _estimator_table_mismatch() -> str | None:
    """Why our estimator registry and the plan's `ESTIMATORS` disagree, or None."""
    from reference_trainer.math.advantages import ADVANTAGE_ESTIMATORS

    unplanned = sorted(set(ADVANTAGE_ESTIMATORS) - set(ESTIMATORS))
    unregistered = sorted(set(ESTIMATORS) - set(ADVANTAGE_ESTIMATORS))
    if not unplanned and not unregistered:
        return None
    return (
        f"advantage estimators registered without an entry in conformance.plan.ESTIMATORS: "
        f"{unplanned}; entries there without a registered estimator: {unregistered}"
    )


def _advantage_call(
    case: ConformanceCase, x: Mapping[str, Any]
) -> tuple[list[Any], dict[str, Any], dict[str, float]]:
    """`(rewards, [values,] mask, [index])`, the std switch and the hyperparameters by name."""
    spec = ESTIMATORS[case.variant]
    args: list[Any] = [x["token_level_rewards"]]
    if spec.values:
        args.append(x["values"])
    args.append(x["response_mask"])
    if spec.index:
        args.append(x["index"])
    kwargs: dict[str, Any] = {}
    if spec.std_switch:
        kwargs["norm_adv_by_std_in_grpo"] = x["norm_adv_by_std_in_grpo"]
    hyperparameters = {name: HYPERPARAMETERS[name] for name in spec.hyperparameters}
    return args, kwargs, hyperparameters


def _advantage_upstream(
    case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any]
) -> dict[str, Any]:
    up = upstream_modules()
    fn = up.core_algos.get_adv_estimator_fn(case.variant)
    args, kwargs, hyperparameters = _advantage_call(case, x)
    if ESTIMATORS[case.variant].upstream_config:
        kwargs["config"] = up.AlgoConfig(**hyperparameters)
    else:
        kwargs.update(hyperparameters)
    adv, ret = fn(*args, **kwargs)
    return {"advantages": adv, "returns": ret}


def _advantage_ours(
    case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any]
) -> dict[str, Any]:
    mismatch = _estimator_table_mismatch()
    if mismatch is not None:
        raise ValueError(mismatch)
    fn = ns[advantage_key(case.variant)]
    args, kwargs, hyperparameters = _advantage_call(case, x)
    adv, ret = fn(*args, **kwargs, **hyperparameters)
    return {"advantages": adv, "returns": ret}


# agg_loss -------------------------------------------------------------------


def _agg_side(
    case: ConformanceCase, x: dict[str, Any], agg: Callable[..., torch.Tensor]
) -> dict[str, Any]:
    loss_mat = x["loss_mat"].detach().requires_grad_(True)
    loss = agg(loss_mat, x["masks"].valid, case.variant, **x["normalisers"])
    (grad,) = torch.autograd.grad(loss, (loss_mat,))
    return {"loss": loss.detach(), "grad/loss_mat": grad}


# policy_loss ----------------------------------------------------------------


def _vanilla_upstream(
    case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any]
) -> dict[str, Any]:
    up = upstream_modules()
    norms = x["normalisers"]
    config = actor_config(x["mode"], norms["loss_scale_factor"], x["clip"])
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
        **x["clip"],
        **x["normalisers"],
    )
    (grad,) = torch.autograd.grad(loss, (log_prob,))
    return {"loss": loss.detach(), **metrics, "grad/log_prob": grad}


def _nested(case: ConformanceCase) -> bool:
    """A case on V1's unpadded (jagged nested) micro-batches (`plan.NESTED_SCENARIOS`)."""
    return "-nested-" in f"-{case.family}"


def _policy_upstream(
    case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any]
) -> dict[str, Any]:
    if case.variant == "vanilla":
        return _vanilla_upstream(case, x, ns)
    return upstream_actor(
        x, x["masks"], x["flat"], x["mode"], x["normalisers"], nested=_nested(case)
    )


def _policy_ours(case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any]) -> dict[str, Any]:
    if case.variant == "vanilla":
        return _vanilla_ours(case, x, ns)
    normalisers = x["normalisers"]
    if _nested(case):  # our padded micro-batch, as the trainer passes it (updates.py)
        normalisers = unpadded_normalisers(ns, x["mode"], x["masks"], normalisers)
    return ours_actor(ns, x, x["masks"], x["mode"], normalisers)


def _value_upstream(
    case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any]
) -> dict[str, Any]:
    return upstream_critic(
        x, x["masks"], x["flat"], case.variant, x["normalisers"], nested=_nested(case)
    )


def _value_ours(case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any]) -> dict[str, Any]:
    normalisers = x["normalisers"]
    if _nested(case):
        normalisers = unpadded_normalisers(ns, case.variant, x["masks"], normalisers)
    return ours_critic(ns, x, x["masks"], case.variant, normalisers)


# kl -------------------------------------------------------------------------


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
    up = upstream_modules()
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
    F = upstream_modules().F
    return _logit_side(x, lambda z: F.entropy_from_logits(z / x["temperature"]), "entropy")


def _entropy_ours(
    case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any]
) -> dict[str, Any]:
    fn = ns["entropy_from_logits"]
    return _logit_side(x, lambda z: fn(z, temperature=x["temperature"]), "entropy")


def _log_prob_upstream(
    case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any]
) -> dict[str, Any]:
    F = upstream_modules().F
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


def _microbatch_side(
    case: ConformanceCase, x: dict[str, Any], ns: Mapping[str, Any], split: bool
) -> dict[str, Any]:
    side, loss_name = case.family.split("-")
    masks: Masks = x["masks"]
    total_tokens = int(masks.valid.sum())
    batch = masks.response_mask.shape[0]

    def one(rows: Sequence[int], dp_size: int) -> dict[str, Any]:
        part, sub, flat = microbatch_rows(x, rows)
        norms = {
            "dp_size": dp_size,
            "batch_num_tokens": total_tokens,
            "global_batch_size": batch,
            "loss_scale_factor": None,  # the padded width, the same in every micro-batch here
        }
        if side == "ours":
            ours = ours_actor if loss_name == "actor" else ours_critic
            return ours(ns, part, sub, case.variant, norms)
        upstream = upstream_actor if loss_name == "actor" else upstream_critic
        return upstream(part, sub, flat, case.variant, norms)

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


def _policy_uses(case: ConformanceCase) -> frozenset[str]:
    if case.variant == "vanilla":
        return frozenset({"vanilla_policy_loss"})
    return frozenset({"actor_loss", "unpadded_scale"} if _nested(case) else {"actor_loss"})


def _value_uses(case: ConformanceCase) -> frozenset[str]:
    return frozenset({"value_loss", "unpadded_scale"} if _nested(case) else {"value_loss"})


def _kl_reward_uses(case: ConformanceCase) -> frozenset[str]:
    controller = "FixedKLController" if case.variant == "fixed" else "AdaptiveKLController"
    return frozenset({"apply_kl_in_reward", controller})


def _microbatch_uses(case: ConformanceCase) -> frozenset[str]:
    if case.family.startswith("upstream-"):
        return frozenset()
    return frozenset({"actor_loss" if case.family.endswith("actor") else "value_loss"})


SIDES: dict[str, Component] = {
    "advantage": Component(
        _advantage_upstream,
        _advantage_ours,
        lambda case: frozenset({advantage_key(case.variant)}),
    ),
    "policy_loss": Component(_policy_upstream, _policy_ours, _policy_uses),
    "agg_loss": Component(
        lambda case, x, ns: _agg_side(case, x, upstream_modules().core_algos.agg_loss),
        lambda case, x, ns: _agg_side(case, x, ns["agg_loss"]),
        _always("agg_loss"),
    ),
    "kl": Component(
        lambda case, x, ns: _kl_side(case, x, upstream_modules().core_algos.kl_penalty),
        lambda case, x, ns: _kl_side(case, x, ns["kl_penalty"]),
        _always("kl_penalty"),
    ),
    "kl_in_reward": Component(_kl_reward_upstream, _kl_reward_ours, _kl_reward_uses),
    "value_loss": Component(_value_upstream, _value_ours, _value_uses),
    "entropy": Component(_entropy_upstream, _entropy_ours, _always("entropy_from_logits")),
    "log_prob": Component(_log_prob_upstream, _log_prob_ours, _always("log_probs_from_logits")),
    "microbatch": Component(
        lambda case, x, ns: _microbatch_side(case, x, ns, split=False),
        lambda case, x, ns: _microbatch_side(case, x, ns, split=True),
        _microbatch_uses,
        labels=("micro-batches", "mini-batch"),
        reference_uses_ours=lambda case: case.family.startswith("ours-"),
    ),
    "sft_loss": Component(sft_upstream, sft_ours, sft_uses),
}
assert tuple(SIDES) == COMPONENTS == tuple(INPUTS)


def case_uses(case: ConformanceCase) -> frozenset[str]:
    """The namespace entries the candidate side of a case calls."""
    return SIDES[case.component].uses(case)
