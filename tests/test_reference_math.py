"""Our reference math on small hand-computed examples; no verl needed."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_trainer.math.advantages import (
    ADVANTAGE_ESTIMATORS,
    gae_advantages,
    grpo_advantages,
    reinforce_plus_plus_advantages,
    reinforce_plus_plus_baseline_advantages,
    rloo_advantages,
)
from reference_trainer.math.aggregation import AGG_MODES, agg_loss
from reference_trainer.math.kl import (
    KL_PENALTIES,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_in_reward,
    kl_penalty,
)
from reference_trainer.math.logprobs import entropy_from_logits, log_probs_from_logits
from reference_trainer.math.losses import POLICY_LOSSES, actor_loss, value_loss, vanilla_policy_loss
from reference_trainer.math.masked import masked_mean, masked_whiten
from reference_trainer.math.registry import UnknownNameError

D = torch.float64


def t(values: object) -> torch.Tensor:
    return torch.tensor(values, dtype=D)


def close(actual: torch.Tensor | float, expected: object, what: str) -> None:
    __tracebackhide__ = True
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=D),
        torch.as_tensor(expected, dtype=D),
        rtol=1e-12,
        atol=1e-12,
        msg=lambda m: f"{what}={actual}, but should be {expected}\n{m}",
    )


# masked reductions ------------------------------------------------------------


def test_masked_mean_ignores_masked_nan_and_is_zero_when_empty() -> None:
    values = t([[1.0, 3.0, math.nan]])
    close(masked_mean(values, torch.tensor([[1, 1, 0]])), 2.0, "masked mean")
    close(masked_mean(values, torch.tensor([[0, 0, 0]])), 0.0, "empty masked mean")


def test_masked_whiten_uses_unbiased_variance() -> None:
    values, mask = t([[1.0, 2.0, 3.0, 100.0]]), torch.tensor([[1, 1, 1, 0]])
    # mean 2, unbiased variance 1
    expected = (values - 2.0) / math.sqrt(1.0 + 1e-8)
    close(masked_whiten(values, mask), expected, "whitened")


def test_masked_whiten_refuses_fewer_than_two_values() -> None:
    with pytest.raises(ValueError, match="at least two"):
        masked_whiten(t([[1.0, 2.0]]), torch.tensor([[1, 0]]))


# advantages ---------------------------------------------------------------------


def outcome(scores: list[float], width: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores on the last token of full-length rows."""
    rewards = torch.zeros(len(scores), width, dtype=D)
    rewards[:, -1] = t(scores)
    return rewards, torch.ones(len(scores), width, dtype=torch.long)


def test_grpo_normalises_by_sample_std_with_epsilon() -> None:
    rewards, mask = outcome([1.0, 0.0, 1.0, 0.0])
    advantages, returns = grpo_advantages(rewards, mask, np.array(["a"] * 4))
    std = math.sqrt(1.0 / 3.0)  # sample std of 1, 0, 1, 0
    close(advantages[:, 0], [0.5 / (std + 1e-6), -0.5 / (std + 1e-6)] * 2, "grpo advantages")
    assert returns is advantages


def test_grpo_groups_of_one_and_all_equal_groups() -> None:
    rewards, mask = outcome([2.0, 1.0, 1.0, 1.0])
    advantages, _ = grpo_advantages(rewards, mask, np.array(["solo", "same", "same", "same"]))
    close(advantages[0, 0], 2.0 / (1.0 + 1e-6), "lone response (mean 0, std 1)")
    close(advantages[1:, 0], [0.0, 0.0, 0.0], "all-equal group")


def test_dr_grpo_does_not_divide_by_std() -> None:
    rewards, mask = outcome([3.0, 1.0])
    advantages, _ = grpo_advantages(rewards, mask, np.array([7, 7]), norm_adv_by_std_in_grpo=False)
    close(advantages[:, 0], [1.0, -1.0], "Dr. GRPO advantages")


def test_group_advantages_sit_on_valid_tokens_only() -> None:
    rewards, _ = outcome([1.0, 0.0])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    advantages, _ = grpo_advantages(rewards, mask, np.array(["a", "a"]))
    assert advantages[0, 2] == 0 and advantages[1, 1] == 0 and advantages[0, 1] != 0


def test_rloo_subtracts_the_mean_of_the_others() -> None:
    rewards, mask = outcome([1.0, 2.0, 3.0, 5.0])
    advantages, _ = rloo_advantages(rewards, mask, np.array(["g", "g", "g", "alone"]))
    close(advantages[:, 1], [1 - 2.5, 2 - 2.0, 3 - 1.5, 5.0], "rloo advantages")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-10, 10, allow_nan=False), min_size=2, max_size=8))
def test_rloo_is_the_rescaled_group_baseline(scores: list[float]) -> None:
    rewards, mask = outcome(scores)
    n = len(scores)
    advantages, _ = rloo_advantages(rewards, mask, np.zeros(n))
    expected = (t(scores) - t(scores).mean()) * n / (n - 1)
    torch.testing.assert_close(advantages[:, 0], expected, rtol=1e-9, atol=1e-9)


def test_gae_skips_masked_tokens() -> None:
    rewards, values = t([[0.0, 5.0, 1.0]]), t([[0.5, 9.0, 0.5]])
    mask = torch.tensor([[1, 0, 1]])
    _, returns = gae_advantages(rewards, values, mask, gamma=0.9, lam=1.0)
    # t=2: delta 0.5. t=1 masked: carries 0.5 and next value 0.5. t=0: -0.05 + 0.9 * 0.5.
    close(returns, [[0.4 + 0.5, 0.5 + 9.0, 0.5 + 0.5]], "gae returns")


def test_gae_lambda_discounts_the_tail() -> None:
    rewards, values = t([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]), torch.zeros(2, 3, dtype=D)
    mask = torch.ones(2, 3, dtype=torch.long)
    _, returns = gae_advantages(rewards, values, mask, gamma=1.0, lam=0.5)
    close(returns, [[0.25, 0.5, 1.0], [1.0, 0.0, 0.0]], "gae returns with lambda 0.5")


def test_reinforce_plus_plus_discounts_and_skips_masked_tokens() -> None:
    rewards = t([[0.0, 0.0, 1.0], [0.0, 7.0, 1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 1]])
    advantages, returns = reinforce_plus_plus_advantages(rewards, mask, gamma=0.5)
    close(returns, [[0.25, 0.5, 1.0], [0.5, 0.0, 1.0]], "reinforce++ returns")
    close(advantages, masked_whiten(returns, mask) * mask, "reinforce++ advantages")


def test_reinforce_plus_plus_baseline_centres_then_whitens() -> None:
    rewards, mask = outcome([1.0, 3.0, 10.0, 14.0], width=2)
    advantages, _ = reinforce_plus_plus_baseline_advantages(rewards, mask, np.array([0, 0, 1, 1]))
    centred = t([-1.0, 1.0, -2.0, 2.0]).unsqueeze(-1).expand(4, 2)
    close(advantages, masked_whiten(centred, mask), "reinforce++ baseline advantages")


# aggregation --------------------------------------------------------------------

LOSS = t([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (6 + 4) / 4),
        ("token-sum", 10.0),
        ("seq-mean-token-sum", (6 + 4) / 2),  # the empty row is not a sequence locally
        ("seq-mean-token-mean", (2 + 4) / 2),
        ("seq-mean-token-sum-norm", (6 + 4) / 2 / 3),  # divided by the padded width
    ],
)
def test_agg_loss_local(mode: str, expected: float) -> None:
    close(agg_loss(LOSS, MASK, mode), expected, f"agg_loss[{mode}]")


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 10 * 2 / 8),
        ("token-sum", 10 * 2),
        ("seq-mean-token-sum", 10 * 2 / 6),
        ("seq-mean-token-mean", 6 * 2 / 6),
        ("seq-mean-token-sum-norm", 10 * 2 / 6 / 4),
    ],
)
def test_agg_loss_global(mode: str, expected: float) -> None:
    loss = agg_loss(
        LOSS, MASK, mode, dp_size=2, batch_num_tokens=8, global_batch_size=6, loss_scale_factor=4
    )
    close(loss, expected, f"agg_loss[{mode}] with global normalisers")


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_agg_loss_refuses_local_normalisers_across_ranks(mode: str) -> None:
    with pytest.raises(ValueError, match="required when dp_size > 1"):
        agg_loss(LOSS, MASK, mode, dp_size=2)


# policy and value losses --------------------------------------------------------


def test_vanilla_policy_loss_clip_and_dual_clip() -> None:
    old = torch.zeros(1, 3, dtype=D)
    log_prob = t([[math.log(1.5), math.log(0.5), math.log(5.0)]])
    advantages = t([[1.0, 1.0, -1.0]])
    mask = torch.ones(1, 3, dtype=torch.long)
    loss, metrics = vanilla_policy_loss(
        old, log_prob, advantages, mask, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0
    )
    # ratio 1.5, A=1: clipped at 1.28. ratio 0.5, A=1: the unclipped -0.5 is the larger.
    # ratio 5, A=-1: 5 > 1.28 unclipped wins, then the dual clip caps it at 3.
    close(loss, (-1.28 - 0.5 + 3.0) / 3, "pg_loss")
    close(metrics["actor/pg_clipfrac"], 1 / 3, "pg_clipfrac")
    close(metrics["actor/pg_clipfrac_lower"], 1 / 3, "pg_clipfrac_lower")
    close(metrics["actor/ppo_kl"], -(math.log(1.5) + math.log(0.5) + math.log(5.0)) / 3, "ppo_kl")


def test_vanilla_policy_loss_rejects_dual_clip_at_most_one() -> None:
    ones = torch.ones(1, 1, dtype=D)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        vanilla_policy_loss(ones, ones, ones, ones, clip_ratio_c=1.0)


def test_value_loss_takes_the_larger_error() -> None:
    vpreds, values, returns = t([[2.0, 0.2, 1.8]]), t([[0.0, 1.0, 0.0]]), t([[0.0, 2.0, 3.0]])
    mask = torch.ones(1, 3, dtype=torch.long)
    loss, metrics = value_loss(vpreds, values, returns, mask, cliprange_value=0.5)
    # errors (unclipped, clipped): (4, 0.25), (3.24, 2.25), (1.44, 6.25)
    close(loss, 0.5 * (4.0 + 3.24 + 6.25) / 3, "vf_loss")
    close(metrics["critic/vf_clipfrac"], 1 / 3, "vf_clipfrac")
    close(metrics["critic/vpred_mean"], 4.0 / 3, "vpred_mean")


# KL -----------------------------------------------------------------------------


def test_kl_estimators() -> None:
    log_prob, ref = t([math.log(0.5)]), t([math.log(0.25)])
    r = math.log(0.5)  # ref - policy
    expected = {"k1": -r, "abs": abs(r), "k2": 0.5 * r * r, "k3": math.exp(r) - r - 1}
    for name, value in expected.items():
        close(kl_penalty(log_prob, ref, name), [value], f"kl[{name}]")
    assert set(KL_PENALTIES) >= {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k1+", "k3+"}


def test_low_var_kl_is_clamped() -> None:
    log_prob = torch.zeros(3, dtype=D, requires_grad=True)
    estimate = kl_penalty(log_prob, t([30.0, -30.0, -2.5]), "low_var_kl")
    close(estimate, [10.0, 10.0, math.exp(-2.5) + 2.5 - 1], "clamped k3")
    (grad,) = torch.autograd.grad(estimate.sum(), log_prob)
    close(grad, [0.0, 0.0, 1 - math.exp(-2.5)], "k3 gradient (zero where clamped)")


@pytest.mark.parametrize("name", ["k1+", "k3+"])
def test_straight_through_has_k2_gradient(name: str) -> None:
    log_prob = t([math.log(0.5)]).requires_grad_(True)
    ref = t([math.log(0.25)])
    value = kl_penalty(log_prob, ref, name)
    close(value, kl_penalty(log_prob, ref, name[:-1]).detach(), f"kl[{name}] value")
    (grad,) = torch.autograd.grad(value.sum(), log_prob)
    close(grad, [math.log(0.5) - math.log(0.25)], f"kl[{name}] gradient")


def test_adaptive_kl_controller_clips_the_error() -> None:
    controller = AdaptiveKLController(value=0.1, target=0.05, horizon=100)
    controller.update(current_kl=0.1, n_steps=10)  # error 1.0, clipped to 0.2
    close(controller.value, 0.1 * (1 + 0.2 * 10 / 100), "kl coef after a large KL")
    controller.update(current_kl=0.05 * 1.1, n_steps=10)  # error 0.1, inside the clip
    close(controller.value, 0.1 * 1.02 * 1.01, "kl coef after a near-target KL")


def test_kl_in_reward_penalises_valid_tokens_and_updates_the_controller() -> None:
    scores = t([[0.0, 1.0], [2.0, 0.0]])
    old, ref = t([[-1.0, -1.0], [-1.0, -1.0]]), t([[-1.5, -2.0], [-1.2, -9.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    controller = FixedKLController(value=0.5)
    rewards, metrics = apply_kl_in_reward(scores, old, ref, mask, controller, "kl")
    close(rewards, [[-0.25, 0.5], [1.9, 0.0]], "token_level_rewards")
    close(metrics["actor/reward_kl_penalty"], ((0.5 + 1.0) / 2 + 0.2) / 2, "reward_kl_penalty")
    assert controller.value == 0.5


# log-probs and entropy ----------------------------------------------------------


def test_log_probs_with_temperature() -> None:
    logits = t([[[0.0, math.log(3.0)]]])
    labels = torch.tensor([[1]])
    close(log_probs_from_logits(logits, labels), [[math.log(0.75)]], "log-prob at T=1")
    tempered = math.sqrt(3.0) / (1 + math.sqrt(3.0))
    close(log_probs_from_logits(logits, labels, 2.0), [[math.log(tempered)]], "log-prob at T=2")


def test_log_probs_match_log_softmax_for_large_logits() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.rand(3, 5, 11, generator=g, dtype=D) * 100 - 50
    labels = torch.randint(0, 11, (3, 5), generator=g)
    expected = torch.log_softmax(logits / 0.7, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    close(log_probs_from_logits(logits, labels, 0.7), expected, "log-probs")


def test_entropy() -> None:
    close(entropy_from_logits(torch.zeros(1, 1, 8, dtype=D)), [[math.log(8)]], "uniform entropy")
    peaked = t([[[50.0, -50.0, -50.0]]])
    assert 0 <= float(entropy_from_logits(peaked)) < 1e-30
    with pytest.raises(ValueError, match="temperature"):
        entropy_from_logits(peaked, temperature=0.0)


# registries ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("registry", "typo", "suggestion"),
    [
        (ADVANTAGE_ESTIMATORS, "grpoo", "grpo"),
        (AGG_MODES, "token_mean", "token-mean"),
        (POLICY_LOSSES, "vanila", "vanilla"),
        (KL_PENALTIES, "low-var-kl", "low_var_kl"),
    ],
)
def test_registry_typo_lists_valid_names(registry: object, typo: str, suggestion: str) -> None:
    with pytest.raises(ValueError, match=f"did you mean '{suggestion}'") as caught:
        registry[typo]  # type: ignore[index]
    assert all(name in str(caught.value) for name in registry)  # type: ignore[attr-defined]
    assert isinstance(caught.value, KeyError) and isinstance(caught.value, UnknownNameError)


def test_registries_hold_verls_names() -> None:
    assert set(ADVANTAGE_ESTIMATORS) == {
        "gae",
        "grpo",
        "rloo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
    }
    assert set(AGG_MODES) >= {
        "token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-mean",
        "seq-mean-token-sum-norm",
    }
    assert "vanilla" in POLICY_LOSSES and POLICY_LOSSES.get("nope") is None
    with pytest.raises(ValueError, match="valid names"):
        agg_loss(LOSS, MASK, "mean")


# micro-batch invariance ---------------------------------------------------------

RANKS = (((0, 1, 2), (3,)), ((4, 5), (6, 7)))  # two ranks, uneven micro-batches


def minibatch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    lengths = torch.tensor([16, 3, 0, 9, 12, 1, 16, 7])  # one empty row
    mask = (torch.arange(16).unsqueeze(0) < lengths.unsqueeze(1)).long()
    old = -torch.rand(8, 16, generator=g, dtype=D) * 3
    return {
        "mask": mask,
        "old": old,
        "log_prob": old + torch.randn(8, 16, generator=g, dtype=D) * 0.5,
        "ref": old + torch.randn(8, 16, generator=g, dtype=D) * 0.3,
        "advantages": torch.randn(8, 16, generator=g, dtype=D),
        "entropy": torch.rand(8, 16, generator=g, dtype=D),
        "values": torch.randn(8, 16, generator=g, dtype=D),
        "returns": torch.randn(8, 16, generator=g, dtype=D),
        "vpreds": torch.randn(8, 16, generator=g, dtype=D),
    }


def actor(x: dict[str, torch.Tensor], rows: list[int], mode: str, **norms: object) -> torch.Tensor:
    log_prob = x["log_prob"].detach().requires_grad_(True)
    entropy = x["entropy"].detach().requires_grad_(True)
    loss, _ = actor_loss(
        x["old"][rows],
        log_prob[rows],
        x["advantages"][rows],
        x["mask"][rows],
        entropy=entropy[rows],
        ref_log_prob=x["ref"][rows],
        entropy_coeff=0.01,
        use_kl_loss=True,
        kl_loss_coef=0.1,
        loss_agg_mode=mode,
        **norms,  # type: ignore[arg-type]
    )
    return torch.cat(torch.autograd.grad(loss, (log_prob, entropy)))


def critic(x: dict[str, torch.Tensor], rows: list[int], mode: str, **norms: object) -> torch.Tensor:
    vpreds = x["vpreds"].detach().requires_grad_(True)
    loss, _ = value_loss(
        vpreds[rows],
        x["values"][rows],
        x["returns"][rows],
        x["mask"][rows],
        cliprange_value=0.2,
        loss_agg_mode=mode,
        **norms,  # type: ignore[arg-type]
    )
    return torch.autograd.grad(loss, (vpreds,))[0]


@pytest.mark.parametrize("loss", [actor, critic], ids=["actor", "critic"])
@pytest.mark.parametrize("mode", sorted(AGG_MODES))
def test_micro_batch_gradients_sum_to_the_mini_batch_gradient(loss: object, mode: str) -> None:
    x = minibatch()
    norms = {"batch_num_tokens": int(x["mask"].sum()), "global_batch_size": 8}
    full = loss(x, list(range(8)), mode, dp_size=1, **norms)  # type: ignore[operator]
    split = sum(
        loss(x, list(rows), mode, dp_size=2, **norms) / 2  # type: ignore[operator]
        for rank in RANKS
        for rows in rank
    )
    torch.testing.assert_close(split, full, rtol=1e-12, atol=1e-12)


def test_local_normalisers_would_break_micro_batch_invariance() -> None:
    """The check above has teeth: per-micro-batch token means do not add up."""
    x = minibatch()
    full = actor(x, list(range(8)), "token-mean")
    split = sum(actor(x, list(rows), "token-mean") for rank in RANKS for rows in rank)
    assert not torch.allclose(split / 2, full)
