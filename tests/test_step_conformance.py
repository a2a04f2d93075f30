"""The step oracle: one training step of the reference trainer against verl 0.9.0's engine step."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from corpus_facts import MANIFEST, OFFICIAL

from pytest_verl_compat.conformance.step_plan import (
    QUANTITIES,
    SHAPE,
    VARIANTS,
    fixed_rollout,
    load_step_tolerances,
    step_settings,
    upstream_key,
)
from pytest_verl_compat.conformance.step_run import (
    StepOracleError,
    case_failures,
    report_json,
    run_steps,
)
from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
from pytest_verl_compat.pipeline.pins import installed_verl_root
from pytest_verl_compat.upstream.runner import run_module
from reference_trainer.config import ReferenceTrainerConfig

# The step stage's cases: the official ones, then the derived ones the compiler must accept.
TRAINED = OFFICIAL + [
    case["id"]
    for case in MANIFEST["cases"]
    if case["kind"] == "derived"
    and (case.get("expected") or {}).get("outcome", "accepted") == "accepted"
]


@pytest.fixture(scope="module")
def official_configs() -> dict[str, ReferenceTrainerConfig]:
    session = AuditSession.start(AuditOptions(manifest=None, upstream=None))
    return {c.id: session.reference_config(c) for c in session.cases if c.kind == "official"}


def test_tolerances_cover_every_quantity_and_variant(tmp_path: Path) -> None:
    tolerances = load_step_tolerances()
    assert set(tolerances) == set(VARIANTS)
    assert all(set(t) == set(QUANTITIES) for t in tolerances.values())
    bad = tmp_path / "step.yaml"
    bad.write_text("tolerances:\n  sgd: {actor: {atol: 1, rtol: 0}}\n  adamw: {}\n")
    with pytest.raises(ValueError, match=r"tolerances\.sgd lacks"):
        load_step_tolerances(bad)


def test_every_official_case_steps_through_several_mini_and_micro_batches_and_epochs(
    official_configs: dict[str, ReferenceTrainerConfig],
) -> None:
    assert sorted(official_configs) == sorted(OFFICIAL)
    trajectories = SHAPE["prompts"] * SHAPE["n"]
    for cfg in official_configs.values():
        s = step_settings(cfg, "sgd")
        for role in ("actor", "critic"):
            if s[role] is None:
                continue
            mini = s[role]["ppo_mini_batch_size"] * s["n"]
            assert trajectories // mini >= 2 and mini // s[role]["micro_batch_size"] >= 2
            assert s[role]["ppo_epochs"] >= 2
        # The case's own algorithm travels: estimator, aggregation, KL terms, LoRA.
        assert s["adv_estimator"] == cfg.algorithm.adv_estimator
        assert s["actor"]["loss_agg_mode"] == cfg.actor.loss_agg_mode
        assert (s["lora"] is not None) == (cfg.model.lora_rank > 0)


def test_fixed_rollout_is_deterministic_ragged_and_grouped() -> None:
    first, second = fixed_rollout(range(4, 40), 1), fixed_rollout(range(4, 40), 1)
    assert first == second
    assert len({len(r) for r in first["responses"]}) > 1
    assert len({len(p) for p in first["prompts"]}) > 1
    n = SHAPE["n"]
    for g in range(SHAPE["prompts"]):
        rows = range(g * n, (g + 1) * n)
        assert len({tuple(first["prompts"][i]) for i in rows}) == 1
        assert len({first["scores"][i] for i in rows}) > 1  # group advantages are not all zero


def test_report_is_deterministic_and_names_failures() -> None:
    entry: dict[str, Any] = {
        "sgd": {"actor": {"max_abs_diff": 5.0e-4, "worst": "w", "passed": False}},
        "adamw": {"actor": {"max_abs_diff": 1.23456e-5, "worst": "", "passed": True}},
    }
    assert case_failures(entry) == ["sgd.actor (max |diff| 0.0005 at w)"]
    text = report_json({"grpo": entry})
    assert text == report_json({"grpo": dict(reversed(list(entry.items())))})
    assert json.loads(text)["grpo"]["adamw"]["actor"]["max_abs_diff"] == 1.23e-5


needs_verl = pytest.mark.skipif(installed_verl_root() is None, reason="verl is not installed")


@pytest.mark.slow
@needs_verl
def test_step_stage_passes_for_the_official_and_the_accepted_derived_cases(
    pytester: pytest.Pytester, upstream_checkout: Path
) -> None:
    """The plugin's `test_step[<case>]` stage, once: every trained case, both optimizers."""
    junit = pytester.path / "conformance.json"
    result = pytester.runpytest_subprocess(
        "--verl-corpus",
        "--verl-corpus-step",
        f"--verl-corpus-upstream={upstream_checkout}",
        "--verl-corpus-trusted=off",
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        f"--verl-corpus-conformance-report={junit}",
        "-k",
        "test_step",
    )
    result.assert_outcomes(passed=len(TRAINED))
    # The conformance report carries the step stage's per-case largest differences.
    steps = json.loads(junit.read_text())["step"]
    assert sorted(steps) == sorted(TRAINED)
    for entry in steps.values():
        assert set(entry) == set(VARIANTS)
        assert {"actor", "old_log_probs", "advantages", "metrics"} <= set(entry["sgd"])
    # The tight comparison is tight: SGD leaves the weights within float32 rounding.
    assert max(e["sgd"]["actor"]["max_abs_diff"] for e in steps.values()) < 1e-6
    assert steps["ppo"]["sgd"]["critic"]["passed"] and "values" in steps["ppo"]["sgd"]


def test_the_step_stage_trains_the_official_and_the_accepted_derived_cases(
    pytester: pytest.Pytester,
) -> None:
    """Collected, not run: a derived case expected to be rejected never reaches the step."""
    result = pytester.runpytest_subprocess(
        "--verl-corpus", "-p", "no:cacheprovider", "--collect-only", "-q", "-k", "test_step"
    )
    ids = sorted(
        line.split("test_step[", 1)[1].removesuffix("]")
        for line in result.stdout.lines
        if "::test_step[" in line
    )
    assert ids == sorted(TRAINED)
    assert len(TRAINED) > len(OFFICIAL)  # the corpus has accepted derived cases


def test_cases_with_equal_step_settings_share_one_upstream_run(tmp_path: Path) -> None:
    """Upstream sees only the settings, so it runs once per distinct settings; ours per case."""
    session = AuditSession.start(AuditOptions(manifest=None, upstream=None))
    ids = ("grpo", "derived/legacy-noop-fields", "derived/seq-mean-token-mean")
    configs = {c.id: session.reference_config(c) for c in session.cases if c.id in ids}
    requests: list[dict[str, Any]] = []

    def fake_run_module(module: str, args: Any, *, stdin: str, timeout: float) -> Any:
        from pytest_verl_compat.upstream.runner import UpstreamRun

        requests.append(json.loads(stdin))
        return UpstreamRun(1, "", "stopped after the request")

    with pytest.raises(StepOracleError, match="stopped after the request"):
        run_steps(configs, fake_run_module, variants=("sgd",))
    (request,) = requests
    # The legacy no-op fields change nothing the step reads: one run stands for them and grpo
    # (named by the first of them in sorted order).
    assert [s["case"] for s in request["cases"]] == [
        "derived/legacy-noop-fields",
        "derived/seq-mean-token-mean",
    ]
    assert len({upstream_key(s) for s in request["cases"]}) == len(request["cases"]) == 2
    assert upstream_key(step_settings(configs["grpo"], "sgd")) == upstream_key(
        step_settings(configs["derived/legacy-noop-fields"], "sgd")
    )


# The pytester project's conftest: run_steps replaced by one that records each start and
# takes a second (so the second worker asks while the first computes).
_COUNTING_CONFTEST = """
import os, time
from pathlib import Path

import pytest_verl_compat.conformance.step_run as step_run

def counting_run_steps(configs, run_module, **kwargs):
    with open(Path(__file__).parent / "oracle-starts.txt", "a") as out:
        out.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")
    time.sleep(1.0)
    row = {"max_abs_diff": 0.0, "worst": "", "passed": True}
    return {cid: {"sgd": {"actor": row}} for cid in configs}

step_run.run_steps = counting_run_steps
"""


@needs_verl
@pytest.mark.parametrize("dist", ["load", "each"])
def test_one_upstream_run_per_session_across_xdist_workers(
    pytester: pytest.Pytester, dist: str
) -> None:
    """Under `-n 2` the oracle starts once; the other worker reads its report (plugin/shared.py).

    `each` runs every case on both workers, so both surely ask for the report.
    """
    pytester.makeconftest(_COUNTING_CONFTEST)
    selection = "test_step and (ppo or rloo or reinforce or dr_grpo)"
    result = pytester.runpytest_subprocess(
        "--verl-corpus",
        "--verl-corpus-step",
        "--verl-corpus-trusted=off",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "-k",
        selection,
        "-n",
        "2",
        "--dist",
        dist,
    )
    result.assert_outcomes(passed=4 * (2 if dist == "each" else 1))
    starts = (pytester.path / "oracle-starts.txt").read_text().split()
    assert len(starts) == 1 and starts[0].startswith("gw"), starts


# ------------------------------------------------------------------ divergences settled


def _lowered(mutate: Any) -> ReferenceTrainerConfig:
    """The grpo case's resolved mapping, changed by `mutate`, compiled and lowered."""
    import copy

    from pytest_verl_compat.pipeline.compile import compile_resolved
    from pytest_verl_compat.pipeline.lower import reference_config
    from pytest_verl_compat.pipeline.manifest import embedded_root
    from pytest_verl_compat.pipeline.profile import load_profile

    golden = embedded_root() / "golden" / "compose" / "grpo.json"
    mapping = copy.deepcopy(json.loads(golden.read_text())["resolved"])
    mutate(mapping)
    report = compile_resolved(mapping, case_id="grpo+changed", profile=load_profile())
    assert report.accepted, report.reason
    return reference_config(mapping, report)


def test_the_gradient_clip_is_optim_clip_grad_and_actor_grad_clip_is_not_read() -> None:
    """verl's engine clips at optim.clip_grad (transformer_impl.py:777-782)."""

    def clip(mapping: dict[str, Any]) -> None:
        mapping["actor_rollout_ref"]["actor"]["grad_clip"] = 0.3
        mapping["actor_rollout_ref"]["actor"]["optim"]["clip_grad"] = 0.7

    assert _lowered(clip).actor.optim.grad_clip == 0.7


def test_zero_warmup_steps_take_the_ratio_and_zero_indexed_step_is_read() -> None:
    """lr_warmup_steps <= 0 means the ratio (transformer_impl.py:495-497)."""
    from reference_trainer.models import schedule

    def warm(mapping: dict[str, Any]) -> None:
        optim = mapping["actor_rollout_ref"]["actor"]["optim"]
        optim.update(lr_warmup_steps=0, lr_warmup_steps_ratio=0.5, zero_indexed_step=False)

    optim = _lowered(warm).actor.optim
    assert optim.zero_indexed_step is False
    factor = schedule(optim, 10)
    assert [factor(s) for s in range(3)] == [0.0, 0.2, 0.4]
    cosine = dataclasses.replace(optim, lr_scheduler_type="cosine", lr_warmup_steps=1)
    # Not zero-indexed: step 0 is already step 1 of the schedule (torch_functional.py:757).
    assert schedule(cosine, 10)(0) == 1.0
    assert schedule(dataclasses.replace(cosine, zero_indexed_step=True), 10)(0) == 0.0


def test_a_non_finite_gradient_norm_skips_the_optimizer_step() -> None:
    """verl's engine zeroes the gradients and does not step (transformer_impl.py:791-796)."""
    import torch

    from reference_trainer.updates import _step_if_finite

    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    weight.grad = torch.tensor([1.0, float("nan"), 1.0])
    _step_if_finite(optimizer, torch.linalg.vector_norm(weight.grad))
    assert torch.equal(weight.detach(), torch.ones(3)) and weight.grad is None
    weight.grad = torch.ones(3)
    _step_if_finite(optimizer, torch.linalg.vector_norm(weight.grad))
    assert torch.equal(weight.detach(), torch.zeros(3))


def test_dr_grpo_divides_by_the_micro_batchs_longest_response() -> None:
    """V1's batches are unpadded: agg_loss's width is the micro-batch's longest response."""
    import torch

    from reference_trainer.math.aggregation import unpadded_scale

    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0, 0.0]])
    assert unpadded_scale(None, "seq-mean-token-sum-norm", mask) == 3.0
    assert unpadded_scale(7.0, "seq-mean-token-sum-norm", mask) == 7.0
    assert unpadded_scale(None, "token-mean", mask) is None
    # A multi-turn response's masked observation tokens are part of its nested length.
    turns = torch.tensor([[1.0, 0.0, 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0, 0.0]])
    assert unpadded_scale(None, "seq-mean-token-sum-norm", turns) == 4.0


@needs_verl
def test_shuffled_mini_batches_follow_verls_iterator_across_epochs() -> None:
    """One generator per update, seeded data_loader_seed + rank (engine_workers.py:276)."""
    import torch
    from tensordict import TensorDict
    from verl.utils.tensordict_utils import make_iterator

    from reference_trainer.batching import minibatches, shuffle_generator

    rows, size, epochs, seed = 12, 4, 3, 42
    td = TensorDict({"row": torch.arange(rows)}, batch_size=[rows])
    theirs = [
        mb["row"].tolist()
        for mb in make_iterator(td, size, epochs, seed=seed, dataloader_kwargs={"shuffle": True})
    ]
    generator = shuffle_generator(True, seed)
    ours = [mb.tolist() for _ in range(epochs) for mb in minibatches(rows, size, generator)]
    assert ours == theirs
    assert shuffle_generator(False, seed) is None


def test_filter_groups_keeps_single_response_groups_and_ignores_max_num_gen_batches() -> None:
    """V1 drops only groups of several responses with zero std (replay_buffer.py:295)."""
    import numpy as np
    import torch

    from pytest_verl_compat.pipeline.profile import load_profile
    from reference_trainer.batching import informative_groups

    uids = np.array(["a", "a", "b", "c", "c"])
    rows, groups = informative_groups(uids, torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0]))
    assert (rows, groups) == ([2, 3, 4], 2)
    profile = load_profile()
    rule = profile.rule_for("algorithm.filter_groups.max_num_gen_batches")
    assert rule is not None and rule.klass == "inert" and "trainer_base.py:208" in rule.reason
    source = (Path(__file__).parents[1] / "reference_trainer" / "trainer.py").read_text()
    assert "raise RuntimeError" not in source


def test_the_reward_model_reads_its_chat_template_over_prompt_and_response() -> None:
    """verl's reward loop: [prompt messages, assistant response], no generation prompt."""
    from reference_trainer.data import Prompt
    from reference_trainer.reward import RewardModelScorer
    from reference_trainer.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = (
        "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    scorer = RewardModelScorer(model=None, tokenizer=tokenizer, folder="")  # type: ignore[arg-type]
    prompt = Prompt("u1", "2+2=", "4", "train", system="be brief")
    text = scorer.reward_input(prompt, "4")
    assert text == "<system>be brief<user>2+2=<assistant>4"


def test_a_missing_reward_model_names_the_option_that_binds_it() -> None:
    from reference_trainer.budget import LocalBudget, check_bindings

    session = AuditSession.start(AuditOptions(manifest=None, upstream=None))
    case = next(c for c in session.cases if c.id == "grpo_reward_model")
    cfg = session.reference_config(case)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path="tiny"))
    with pytest.raises(FileNotFoundError, match="--reward-model DIR"):
        check_bindings(cfg, LocalBudget())


def test_a_smaller_lora_rank_keeps_the_adapters_scale() -> None:
    """peft scales by lora_alpha / r; grpo_lora's rank 64 -> 32 keeps 32 / 64 = 0.5."""
    from reference_trainer.budget import LocalBudget, adapt

    session = AuditSession.start(AuditOptions(manifest=None, upstream=None))
    case = next(c for c in session.cases if c.id == "grpo_lora")
    cfg = session.reference_config(case)
    local, ledger = adapt(cfg, LocalBudget())
    assert (
        local.model.lora_alpha / local.model.lora_rank == cfg.model.lora_alpha / cfg.model.lora_rank
    )
    noted = {a.field: a for a in ledger}
    assert noted["actor_rollout_ref.model.lora_alpha"].local == local.model.lora_alpha


# ------------------------------------------------------------------ honest ledgers


def _set_leaf(mapping: Any, dotted: str, change: Any) -> Any:
    """Change one leaf of a resolved mapping in place; the old value."""
    import re

    parts = re.findall(r"[^.\[\]]+|\[\d+\]", dotted)
    holder = mapping
    for part in parts[:-1]:
        holder = holder[int(part[1:-1])] if part.startswith("[") else holder[part]
    key: Any = int(parts[-1][1:-1]) if parts[-1].startswith("[") else parts[-1]
    old = holder[key]
    holder[key] = change(old)
    return old


def _perturbed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 3
    if isinstance(value, float):
        return value * 0.5 + 0.125
    return None  # strings: their supported values are checked by the compiler's value lists


@pytest.mark.parametrize("case_id", OFFICIAL)
def test_every_exact_leaf_reaches_the_trainers_config(case_id: str) -> None:
    """An `exact` leaf is one the reference trainer follows: changing it changes the lowered
    config (or the compiler rejects the new value). Critic leaves count only with a critic."""
    import copy

    from pytest_verl_compat.pipeline.compile import compile_resolved
    from pytest_verl_compat.pipeline.lower import reference_config
    from pytest_verl_compat.pipeline.manifest import embedded_root
    from pytest_verl_compat.pipeline.profile import load_profile

    profile = load_profile()
    golden = embedded_root() / "golden" / "compose" / f"{case_id}.json"
    mapping = json.loads(golden.read_text())["resolved"]
    report = compile_resolved(mapping, case_id=case_id, profile=profile)
    base = reference_config(mapping, report)
    unread = []
    for leaf in report.leaves:
        if leaf.klass != "exact" or (base.critic is None and leaf.path.startswith("critic.")):
            continue
        if base.critic is None and leaf.path == "trainer.critic_warmup":
            continue
        changed = copy.deepcopy(mapping)
        old = _set_leaf(
            changed, leaf.path, lambda v: _perturbed(v) if _perturbed(v) is not None else v
        )
        if _perturbed(old) is None:
            continue
        again = compile_resolved(changed, case_id=case_id, profile=profile)
        if again.accepted and reference_config(changed, again) == base:
            unread.append(f"{leaf.path}={old!r}")
    assert not unread, f"exact leaves the lowered config ignores: {unread} [{case_id}]"


def test_every_trainer_config_field_is_read_by_the_trainer() -> None:
    """Each field of ReferenceTrainerConfig (and its parts) is read somewhere in the trainer."""
    import dataclasses as dc
    import re

    from reference_trainer import config

    trainer_root = Path(config.__file__).parent
    source = "\n".join(
        p.read_text() for p in sorted(trainer_root.rglob("*.py")) if p.name != "config.py"
    )
    parts = [
        config.OptimConfig,
        config.ActorConfig,
        config.CriticConfig,
        config.RolloutConfig,
        config.AlgorithmConfig,
        config.DataConfig,
        config.ModelConfig,
        config.RewardConfig,
        config.TrainerConfig,
        config.ReferenceTrainerConfig,
    ]
    # Read only to describe a run or kept for the ledger, not for training.
    descriptive = {"case_id", "profile", "bindings", "lowered", "project_name", "experiment_name"}
    unread = {
        f"{part.__name__}.{f.name}"
        for part in parts
        for f in dc.fields(part)
        if f.name not in descriptive and not re.search(rf"\.{f.name}\b", source)
    }
    # Fields lowered from leaves that are not `exact` (or exact with one supported value, which
    # is the trainer's only behaviour): the profile's class says what they do in a run.
    from pytest_verl_compat.pipeline.profile import load_profile

    not_exact = {
        "AlgorithmConfig.max_num_gen_batches": "algorithm.filter_groups.max_num_gen_batches",
        "DataConfig.val_batch_size": "data.val_batch_size",
        "RewardConfig.custom_reward_function_path": "reward.custom_reward_function.path",
        "RewardConfig.custom_reward_function_name": "reward.custom_reward_function.name",
        "TrainerConfig.balance_batch": "trainer.balance_batch",
        "DataConfig.truncation": "data.truncation",
    }
    profile = load_profile()
    for field_name, leaf in not_exact.items():
        rule = profile.rule_for(leaf)
        assert rule is not None
        assert rule.klass != "exact" or len(rule.values or ()) == 1, (field_name, rule.klass)
    assert unread <= set(not_exact), f"config fields nothing in reference_trainer reads: {unread}"


@pytest.mark.slow
@needs_verl
def test_the_oracle_sees_shuffling_dual_clip_and_mutants(
    official_configs: dict[str, ReferenceTrainerConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One upstream subprocess for four steps (SGD, lr 0.2):

    - derived/data-order-actor-shuffle: mini-batch membership and V1's shuffle seeding;
    - grpo with clip_ratio_c = 1.05 and clip ratios 0.01, so the dual clip binds in epoch 2;
    - two mutants of our trainer that must fail: tokens normalised per micro-batch instead of
      per mini-batch (the issue's), and clip_ratio_c dropped on its way to the loss.
    """
    import pytest_verl_compat.conformance.step_plan as plan
    import pytest_verl_compat.conformance.step_reference as step_reference
    import reference_trainer.updates as updates

    session = AuditSession.start(AuditOptions(manifest=None, upstream=None))
    shuffled = next(c for c in session.cases if c.id == "derived/data-order-actor-shuffle")
    base = official_configs["grpo"]
    dual = dataclasses.replace(
        base.actor, clip_ratio_c=1.05, clip_ratio_low=0.01, clip_ratio_high=0.01
    )
    configs = {shuffled.id: session.reference_config(shuffled)}
    assert configs[shuffled.id].actor.shuffle
    for cid in ("clip-c", "clip-c-dropped"):
        configs[cid] = dataclasses.replace(base, case_id=cid, actor=dual)
    configs["per-micro"] = dataclasses.replace(base, case_id="per-micro")
    monkeypatch.setitem(plan.LEARNING_RATES, "sgd", 0.2)
    real_step, real_loss = step_reference.reference_step, updates.actor_loss

    def per_micro(*args: Any, **kwargs: Any) -> Any:
        return real_loss(*args, **{**kwargs, "batch_num_tokens": args[3].sum()})

    def dropped_c(*args: Any, **kwargs: Any) -> Any:
        return real_loss(*args, **{**kwargs, "clip_ratio_c": 3.0})

    mutants = {"per-micro": per_micro, "clip-c-dropped": dropped_c}

    def step(cfg: ReferenceTrainerConfig, *args: Any) -> Any:
        monkeypatch.setattr(updates, "actor_loss", mutants.get(cfg.case_id, real_loss))
        try:
            return real_step(cfg, *args)
        finally:
            monkeypatch.setattr(updates, "actor_loss", real_loss)

    monkeypatch.setattr(step_reference, "reference_step", step)
    report = run_steps(configs, run_module, variants=("sgd",))
    for cid in (shuffled.id, "clip-c"):
        assert not case_failures(report[cid]), (cid, report[cid])
    for cid in mutants:
        assert any(f.startswith("sgd.actor ") for f in case_failures(report[cid])), cid


def test_the_ledger_lists_every_lowered_leaf_with_both_values() -> None:
    """adaptations.json: each compiler-lowered field, its upstream value and the lowering."""
    from reference_trainer.budget import LocalBudget, adapt

    session = AuditSession.start(AuditOptions(manifest=None, upstream=None))
    case = next(c for c in session.cases if c.id == "ppo")
    cfg = session.reference_config(case)
    _, ledger = adapt(cfg, LocalBudget())
    noted = {a.field: a for a in ledger}
    assert set(cfg.lowered) <= set(noted)
    balance = noted["trainer.balance_batch"]
    assert balance.upstream is True and "V1's reorder" in balance.local
    assert (
        noted["trainer.n_gpus_per_node"].upstream
        == cfg.lowered_values["trainer.n_gpus_per_node"]
        != 1
    )


def test_rollout_is_weights_are_rejected_by_the_profile() -> None:
    """V1 multiplies the policy loss by rollout_is_weights when rollout correction is on
    (verl/workers/utils/losses.py:87-88); the trainer has no such weights, so the profile
    rejects turning it on instead of training without them."""
    import copy

    from pytest_verl_compat.pipeline.compile import compile_resolved
    from pytest_verl_compat.pipeline.manifest import embedded_root
    from pytest_verl_compat.pipeline.profile import load_profile

    golden = embedded_root() / "golden" / "compose" / "grpo.json"
    mapping = copy.deepcopy(json.loads(golden.read_text())["resolved"])
    profile = load_profile()
    assert compile_resolved(mapping, case_id="grpo", profile=profile).accepted
    mapping["algorithm"]["rollout_correction"]["rollout_is"] = "token"
    report = compile_resolved(mapping, case_id="grpo+is", profile=profile)
    assert not report.accepted and "rollout_correction.rollout_is" in report.reason


@needs_verl
def test_the_default_audit_skips_the_step_stage_with_the_option_to_run_it(
    pytester: pytest.Pytester,
) -> None:
    result = pytester.runpytest_subprocess(
        "--verl-corpus",
        "--verl-corpus-trusted=off",
        "-p",
        "no:cacheprovider",
        "-k",
        "test_step",
        "-rs",
    )
    result.assert_outcomes(skipped=len(TRAINED))
    result.stdout.fnmatch_lines(["*the step stage runs with --verl-corpus-step*"])
