"""Deliberate bugs in our reference math, and the check that the conformance cases catch them.

A helper module for `test_conformance.py`, not a test file: the stage itself never runs it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pytest_verl_compat.conformance.components import case_uses
from pytest_verl_compat.conformance.plan import ConformanceCase
from pytest_verl_compat.conformance.run import ReferenceSource, run_case
from pytest_verl_compat.conformance.sides import reference_namespace


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


def _sft_last_token_dropped(ns: Namespace) -> dict[str, Any]:
    """The last trained token of each row not trained (the EOS never learned, nanochat #810)."""
    original = ns["next_token_loss_mask"]

    def next_token_loss_mask(loss_mask: torch.Tensor) -> torch.Tensor:
        shifted = original(loss_mask).clone()
        for row in shifted:
            trained = row.nonzero()
            if len(trained):
                row[trained[-1]] = 0
        return shifted

    return {"next_token_loss_mask": next_token_loss_mask}


def _sft_sequence_mean(ns: Namespace) -> dict[str, Any]:
    """Each sequence's token mean, then the mean over sequences (verl's SFT is a token mean)."""

    def sft_loss(log_prob: torch.Tensor, loss_mask: torch.Tensor, **norms: Any) -> torch.Tensor:
        mask = loss_mask.to(log_prob.dtype)
        per_row = (log_prob * mask).sum(-1) / mask.sum(-1).clamp_min(1)
        live = (mask.sum(-1) > 0).sum()
        return -per_row.sum() * norms.get("dp_size", 1) / live

    return {"sft_loss": sft_loss}


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
        "dr-grpo-padded-width",
        "seq-mean-token-sum-norm without loss_scale_factor divides by our padded batch's width, "
        "not by the V1 micro-batch's longest response",
        ("unpadded_scale",),
        lambda ns: {"unpadded_scale": lambda scale, mode, mask: scale},
    ),
    Mutation(
        "dr-grpo-valid-count",
        "the unpadded width taken as the most valid tokens of a response, so a multi-turn "
        "response's masked observations shorten it",
        ("unpadded_scale",),
        lambda ns: {
            "unpadded_scale": lambda scale, mode, mask: (
                float(mask.sum(-1).max())
                if scale is None and mode == "seq-mean-token-sum-norm"
                else scale
            )
        },
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
        "dual-clip-at-its-default",
        "clip_ratio_c read from nowhere: the dual clip stays at verl's default 3.0 whatever the "
        "setting (killed only by the dual-clip families, whose bound is 1.45)",
        ("vanilla_policy_loss", "actor_loss"),
        _with_kwargs(("vanilla_policy_loss", "actor_loss"), clip_ratio_c=3.0),
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
    Mutation(
        "sft-mask-unshifted",
        "the SFT loss mask not shifted to the predicting positions: each token's log-prob is "
        "counted at its own position, so the last prompt token is never the one trained",
        ("next_token_loss_mask",),
        lambda ns: {"next_token_loss_mask": lambda mask: mask},
    ),
    Mutation(
        "sft-last-token-dropped",
        "the last trained token of every sequence left out of the SFT loss",
        ("next_token_loss_mask",),
        _sft_last_token_dropped,
    ),
    Mutation(
        "sft-local-token-mean",
        "each SFT micro-batch normalised by its own tokens on one rank (verl #5625)",
        ("sft_loss",),
        _with_kwargs(("sft_loss",), dp_size=1, batch_num_tokens=None),
    ),
    Mutation(
        "sft-dp-size-ignored",
        "the SFT loss not multiplied by dp_size, so DDP's average over ranks divides it again",
        ("sft_loss",),
        _with_kwargs(("sft_loss",), dp_size=1),
    ),
    Mutation(
        "sft-sequence-mean",
        "the SFT loss averaged per sequence, then over sequences, not over the batch's tokens",
        ("sft_loss",),
        _sft_sequence_mean,
    ),
]


def mutation_cases(mutation: Mutation, cases: Iterable[ConformanceCase]) -> list[ConformanceCase]:
    """The cases that call at least one function the mutant replaces."""
    replaced = set(mutation.replaces)
    return [case for case in cases if case_uses(case) & replaced]


def run_mutation_check(
    cases: Iterable[ConformanceCase],
    mutations: Sequence[Mutation] = MUTATIONS,
    reference: ReferenceSource | None = None,
) -> list[tuple[str, bool, list[str]]]:
    """For each mutant: (name, killed?, ids of the cases that failed against it).

    Only the cases calling a replaced function run; upstream's side (``reference``: the release's
    oracle, its answers kept) is asked once per case, so this costs about one run of our own math
    per such case.
    """
    cases = list(cases)
    base = reference_namespace()
    outcome: list[tuple[str, bool, list[str]]] = []
    for mutation in mutations:
        namespace = mutation.apply(base)
        failed = [
            case.id
            for case in mutation_cases(mutation, cases)
            if not run_case(case, namespace, reference=reference).passed
        ]
        outcome.append((mutation.name, bool(failed), failed))
    return outcome
