"""Algorithm settings: KL control, group filtering, group estimators, registered names."""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from typing import Any

from pytest_verl_compat.checks.examples import FILTER
from pytest_verl_compat.checks.registry import CheckFunction, CheckInput, Example, Hit, check
from pytest_verl_compat.checks.roles import GROUP_ESTIMATORS, get
from pytest_verl_compat.checks.upstream_names import FILTER_METRICS, LOOKED_UP_WHEN, REGISTRIES


@check(
    "kl.adaptive-controller-needs-horizon-and-target",
    level="error",
    evidence="verl/trainer/ppo/core_algos.py AdaptiveKLController.update divides by horizon and target",
    summary="The adaptive KL controller (KL in the reward, kl_ctrl.type=adaptive) with a horizon or target KL that is not positive: its update divides by both.",
    fix="set positive algorithm.kl_ctrl.horizon and algorithm.kl_ctrl.target_kl, or use kl_ctrl.type=fixed",
    example=Example(
        fires=(
            "algorithm.use_kl_in_reward=True",
            "algorithm.kl_ctrl.type=adaptive",
            "algorithm.kl_ctrl.horizon=0",
        ),
        twin=(
            "algorithm.use_kl_in_reward=True",
            "algorithm.kl_ctrl.type=adaptive",
            "algorithm.kl_ctrl.horizon=10000",
        ),
    ),
)
def adaptive_kl_controller(inp: CheckInput) -> Iterator[Hit]:
    algo = inp.resolved["algorithm"]
    ctrl = algo["kl_ctrl"]
    if (
        algo["use_kl_in_reward"]
        and ctrl["type"] == "adaptive"
        and (ctrl["horizon"] <= 0 or ctrl["target_kl"] <= 0)
    ):
        yield Hit(
            "algorithm.kl_ctrl.horizon, algorithm.kl_ctrl.target_kl",
            f"the adaptive KL controller needs a positive horizon and target (got {ctrl['horizon']}, {ctrl['target_kl']})",
        )


@check(
    "kl.negative-coefficient",
    level="error",
    evidence="verl/workers/utils/losses.py:140 (policy_loss += kl_loss * kl_loss_coef); verl/trainer/ppo/ray_trainer.py:106 (token_level_rewards = token_level_scores - beta * kld)",
    summary="A negative KL coefficient (in the reward or as a loss), which rewards moving away from the reference policy instead of staying near it.",
    fix="use a coefficient of 0 or more",
    example=Example(
        fires=("actor_rollout_ref.actor.kl_loss_coef=-0.001",),
        twin=("actor_rollout_ref.actor.kl_loss_coef=0.001",),
    ),
)
def negative_kl_coefficient(inp: CheckInput) -> Iterator[Hit]:
    algo = inp.resolved["algorithm"]
    actor = inp.resolved["actor_rollout_ref"]["actor"]
    if (algo["use_kl_in_reward"] and algo["kl_ctrl"]["kl_coef"] < 0) or (
        actor["use_kl_loss"] and actor["kl_loss_coef"] < 0
    ):
        yield Hit(
            "algorithm.kl_ctrl.kl_coef, actor_rollout_ref.actor.kl_loss_coef",
            "a negative KL coefficient rewards moving away from the reference",
        )


@check(
    "kl.applied-twice",
    level="warning",
    evidence="verl/utils/config.py:170 prints only a NOTICE (verl #265)",
    summary="KL to the reference applied both in the reward (algorithm.use_kl_in_reward) and as an actor loss (use_kl_loss): verl only prints a notice.",
    fix="keep one of them (GRPO recipes use the KL loss)",
    example=Example(
        fires=("algorithm.use_kl_in_reward=True",), twin=("algorithm.use_kl_in_reward=False",)
    ),
)
def kl_applied_twice(inp: CheckInput) -> Iterator[Hit]:
    if (
        inp.resolved["algorithm"]["use_kl_in_reward"]
        and inp.resolved["actor_rollout_ref"]["actor"]["use_kl_loss"]
    ):
        yield Hit(
            "algorithm.use_kl_in_reward, actor_rollout_ref.actor.use_kl_loss",
            "KL to the reference is applied twice: once in the reward and once as a loss",
            fix="keep one of them (GRPO recipes use the KL loss)",
        )


@check(
    "filter-groups.no-metric",
    level="error",
    evidence="verl/trainer/ppo/v1/trainer_base.py:199 (_resolve_filter_groups_metric)",
    summary="Group filtering (DAPO's dynamic sampling) switched on without the metric to filter on; the V1 trainer raises only when it starts.",
    fix="set algorithm.filter_groups.metric to acc, score, seq_reward or seq_final_reward",
    example=Example(fires=("algorithm.filter_groups.enable=True",), twin=(*FILTER,)),
)
def filter_groups_without_metric(inp: CheckInput) -> Iterator[Hit]:
    groups = inp.resolved["algorithm"]["filter_groups"]
    if groups["enable"] and not groups["metric"]:
        yield Hit(
            "algorithm.filter_groups.metric",
            "group filtering is enabled but no metric is set; upstream raises only at trainer start",
            fix=f"set algorithm.filter_groups.metric to one of {', '.join(FILTER_METRICS)}",
        )


@check(
    "filter-groups.colocated-reward-model",
    level="error",
    evidence="verl/trainer/ppo/v1/trainer_base.py:203",
    summary="Group filtering with a reward model colocated with the actor: filtering needs rewards while sampling, which a colocated reward model does not give.",
    fix="set reward.reward_model.enable_resource_pool=True, or use a rule reward",
    example=Example(
        fires=(
            *FILTER,
            "reward.reward_model.enable=True",
            "reward.reward_model.enable_resource_pool=False",
        ),
        twin=(
            *FILTER,
            "reward.reward_model.enable=True",
            "reward.reward_model.enable_resource_pool=True",
        ),
    ),
)
def filter_groups_with_colocated_reward_model(inp: CheckInput) -> Iterator[Hit]:
    groups = inp.resolved["algorithm"]["filter_groups"]
    reward_model = inp.resolved["reward"]["reward_model"]
    if groups["enable"] and reward_model["enable"] and not reward_model["enable_resource_pool"]:
        yield Hit(
            "algorithm.filter_groups.enable, reward.reward_model.enable_resource_pool",
            "group filtering needs rewards at sampling time, which a colocated reward model does not give",
            fix="set reward.reward_model.enable_resource_pool=True or use a rule reward",
        )


@check(
    "filter-groups.max-num-gen-batches-ignored",
    level="warning",
    evidence="verl/trainer/ppo/v1/trainer_base.py:211",
    summary="algorithm.filter_groups.max_num_gen_batches with group filtering on: the V1 replay buffer ignores it (the reference trainer honours it as the refill limit).",
    fix="bound concurrency with algorithm.filter_groups.max_inflight_gen_batches instead",
    example=Example(
        fires=(*FILTER, "algorithm.filter_groups.max_num_gen_batches=10"),
        twin=(*FILTER, "algorithm.filter_groups.max_num_gen_batches=0"),
    ),
)
def filter_groups_refill_limit(inp: CheckInput) -> Iterator[Hit]:
    groups = inp.resolved["algorithm"]["filter_groups"]
    if groups["enable"] and groups["max_num_gen_batches"] > 0:
        yield Hit(
            "algorithm.filter_groups.max_num_gen_batches",
            f"upstream {inp.version}'s V1 replay buffer ignores max_num_gen_batches={groups['max_num_gen_batches']}; "
            "the reference trainer honours it as the refill limit",
            fix="bound concurrency with algorithm.filter_groups.max_inflight_gen_batches",
        )


# What each group estimator does with a group of one response, from verl 0.9.0's core_algos.py.
_GROUP_OF_ONE = {
    "grpo": "GRPO then uses mean 0 and std 1 (core_algos.py compute_grpo_outcome_advantage), so the advantage is the raw score",
    "rloo": "RLOO then uses baseline 0 (core_algos.py:622-623), so the advantage is the raw score",
    "rloo_vectorized": "the vectorized RLOO multiplies by (count > 1) (core_algos.py:864), so every advantage is 0 and the policy gradient vanishes",
}


def _advantage_discarded(resolved: Mapping[str, Any]) -> bool:
    """Distillation without task rewards zeroes the policy loss (verl/trainer/distillation/losses.py:216-217)."""
    distillation = resolved.get("distillation")
    if not isinstance(distillation, Mapping) or not distillation.get("enabled"):
        return False
    loss = distillation.get("distillation_loss") or {}
    return not loss.get("use_task_rewards", True)


def _group_of_one(inp: CheckInput, grpo: bool) -> Iterator[Hit]:
    estimator = inp.resolved["algorithm"]["adv_estimator"]
    n = inp.resolved["actor_rollout_ref"]["rollout"]["n"]
    if (
        estimator in GROUP_ESTIMATORS
        and int(n) < 2
        and estimator.startswith("grpo") == grpo
        and not _advantage_discarded(inp.resolved)
    ):
        effect = _GROUP_OF_ONE.get(
            estimator, "every group has one response, so the group baseline is degenerate"
        )
        yield Hit(
            "actor_rollout_ref.rollout.n",
            f"{estimator} compares responses within a group, but n={n}: every group has one response; {effect}",
            fix="set actor_rollout_ref.rollout.n to 2 or more",
        )


_GROUP_EVIDENCE = "verl/trainer/ppo/core_algos.py compute_grpo_outcome_advantage (groups of one)"


@check(
    "group.one-response-grpo",
    level="warning",
    evidence=_GROUP_EVIDENCE,
    summary="GRPO with one response per prompt (rollout.n < 2): every group has one response, so its mean is 0 and its std 1 and the advantage is the raw score.",
    fix="set actor_rollout_ref.rollout.n to 2 or more",
    example=Example(
        fires=("actor_rollout_ref.rollout.n=1",), twin=("actor_rollout_ref.rollout.n=2",)
    ),
)
def grpo_group_of_one(inp: CheckInput) -> Iterator[Hit]:
    """GRPO's groups of one still train on the raw score: a warning."""
    return _group_of_one(inp, grpo=True)


@check(
    "group.one-response",
    level="warning",
    evidence=_GROUP_EVIDENCE,
    summary="A group baseline other than GRPO's (RLOO, its vectorized form, …) with one response per prompt: the baseline is degenerate (RLOO: the raw score; vectorized RLOO: zero advantages).",
    fix="set actor_rollout_ref.rollout.n to 2 or more",
    example=Example(
        base="rloo",
        fires=("actor_rollout_ref.rollout.n=1",),
        twin=("actor_rollout_ref.rollout.n=2",),
    ),
)
def group_of_one(inp: CheckInput) -> Iterator[Hit]:
    """Leave-one-out and the other group baselines: 0.9.0 runs them, degenerately (a warning)."""
    return _group_of_one(inp, grpo=False)


def _registered_name(path: str) -> CheckFunction:
    names, _ = REGISTRIES[path]

    def run(inp: CheckInput) -> Iterator[Hit]:
        value = get(inp.resolved, path)
        if value in names:
            return
        selector = LOOKED_UP_WHEN.get(path)
        if selector is not None and get(inp.resolved, selector[0]) != selector[1]:
            return  # another loading source: the name is not looked up in the registry
        close = difflib.get_close_matches(str(value), names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        yield Hit(
            path,
            f"{value!r} is not registered in verl {inp.version}; valid: {', '.join(names)}",
            fix=f"{hint}use one of the registered names",
        )

    return run


# One check per upstream registry, each citing where upstream registers its names; its example
# names nothing registered, its twin the first registered name.
for _path, (_names, _evidence) in REGISTRIES.items():
    check(
        f"registry.{_path}",
        level="error",
        evidence=_evidence,
        summary=f"{_path} must name one of the {len(_names)} names verl registers for it "
        "(a typo fails only when the trainer looks the name up).",
        fix="use one of the registered names (the finding lists them and the closest)",
        example=Example(fires=(f"{_path}=not_registered",), twin=(f"{_path}={_names[0]}",)),
    )(_registered_name(_path))
