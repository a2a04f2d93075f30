"""The step oracle: training steps of the reference trainer against verl 0.9.0's engine steps."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from corpus_facts import MANIFEST, OFFICIAL_RL, needs_release
from step_mutants import SOURCE_MUTANTS, SourceMutant

from pytest_verl_compat.conformance.step.cases import step_case_ids, step_cases
from pytest_verl_compat.conformance.step.plan import (
    QUANTITIES,
    CoverageTable,
    StepCase,
    fixed_rollout,
    load_coverage,
    load_step_plan,
    step_settings,
    upstream_key,
)
from pytest_verl_compat.conformance.step.run import (
    StepOracleError,
    UpstreamSteps,
    case_failures,
    compare_case,
    report_json,
    run_steps,
)
from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
from reference_trainer.config import ReferenceTrainerConfig

# The manifest's step cases: the official ones, then the derived ones the compiler must accept.
TRAINED = OFFICIAL_RL + [
    case["id"]
    for case in MANIFEST["cases"]
    if case["kind"] == "derived"
    and (case.get("expected") or {}).get("outcome", "accepted") == "accepted"
]
PLAN = load_step_plan()
STEP_ONLY = [spec.id for spec in PLAN.cases]
ALL_STEP_CASES = TRAINED + STEP_ONLY
needs_verl = needs_release()


@pytest.fixture(scope="module")
def official_configs() -> dict[str, ReferenceTrainerConfig]:
    session = AuditSession.start(AuditOptions(manifest=None, upstream=None))
    return {
        c.id: session.reference_config(c)
        for c in session.cases
        if c.kind == "official" and not session.launches_sft(c)
    }


def test_the_plan_names_every_quantity_and_rejects_a_bad_file(tmp_path: Path) -> None:
    assert set(PLAN.tolerances) == set(PLAN.variants)
    assert all(set(t) == set(QUANTITIES) for t in PLAN.tolerances.values())
    good = yaml.safe_load((Path(__file__).parents[1] / "corpus" / "step.yaml").read_text())
    bad = tmp_path / "step.yaml"
    bad.write_text(yaml.safe_dump({**good, "tolerances": {**good["tolerances"], "sgd": {}}}))
    with pytest.raises(ValueError, match=r"tolerances\.sgd lacks"):
        load_step_plan(bad)
    bad.write_text(yaml.safe_dump({**good, "cases": [{**good["cases"][0], "variants": ["sgdd"]}]}))
    with pytest.raises(ValueError, match=r"cases\[0\]: unknown variants \['sgdd'\]"):
        load_step_plan(bad)


def test_every_official_case_steps_through_several_mini_and_micro_batches_and_epochs(
    official_configs: dict[str, ReferenceTrainerConfig],
) -> None:
    session = AuditSession.start(AuditOptions(manifest=None, upstream=None))
    table = CoverageTable(load_coverage())
    for case in step_cases(session, OFFICIAL_RL):
        shape = case.shape
        s = step_settings(case, PLAN.variants["sgd"], table)["overrides"]
        roles = {"actor": shape.actor}
        if case.config.critic is not None:
            roles["critic"] = shape.critic
        for role in roles.values():
            mini = role.ppo_mini_batch_size * shape.n
            assert shape.trajectories // mini >= 2 and mini // role.micro_batch_size >= 2
            assert role.ppo_epochs >= 2
        # The case's own algorithm travels to upstream as its verl leaves.
        cfg = official_configs[case.id]
        assert s["algorithm.adv_estimator"] == cfg.algorithm.adv_estimator
        assert s["actor_rollout_ref.actor.loss_agg_mode"] == cfg.actor.loss_agg_mode
        assert s["actor_rollout_ref.model.lora_rank"] == cfg.model.lora_rank


def test_fixed_rollouts_are_deterministic_ragged_and_grouped_with_distinct_scores() -> None:
    spec = {"prompts": 4, "n": 3, "seed": 0}
    first, second = fixed_rollout(range(4, 40), 1, spec), fixed_rollout(range(4, 40), 1, spec)
    assert first == second
    assert fixed_rollout(range(4, 40), 1, {**spec, "seed": 1}) != first  # step 2 trains others
    assert len({len(r) for r in first["responses"]}) > 1
    assert len({len(p) for p in first["prompts"]}) > 1
    n = spec["n"]
    for g in range(spec["prompts"]):
        rows = range(g * n, (g + 1) * n)
        assert len({tuple(first["prompts"][i]) for i in rows}) == 1
        # Every response of a group scores differently: rank and magnitude both matter.
        assert len({first["scores"][i] for i in rows}) == n


def test_report_is_deterministic_and_names_failures() -> None:
    entry: dict[str, Any] = {
        "sgd": {"actor": {"max_abs_diff": 5.0e-4, "worst": "w", "passed": False}},
        "adamw": {"actor": {"max_abs_diff": 1.23456e-5, "worst": "", "passed": True}},
    }
    assert case_failures(entry) == ["sgd.actor (max |diff| 0.0005 at w)"]
    text = report_json({"grpo": entry})
    assert text == report_json({"grpo": dict(reversed(list(entry.items())))})
    assert json.loads(text)["grpo"]["adamw"]["actor"]["max_abs_diff"] == 1.23e-5


def test_activity_claims_hold_per_variant_and_name_what_fails() -> None:
    from pytest_verl_compat.conformance.step.compare import activity

    up = {
        "steps": [{"raw_metrics": {"actor": {"grad_norm": [0.5, 2.0], "actor/pg_clipfrac": [0.0]}}}]
    }
    leaves = {"actor_rollout_ref.actor.optim.clip_grad": 1.0}
    clip = "actor_rollout_ref.actor.optim.clip_grad"
    [binds] = activity((f"actor/grad_norm > {clip}",), up, leaves, "sgd")
    [idle] = activity((f"actor/grad_norm < {clip}",), up, leaves, "sgd")
    [clipped] = activity(("actor/pg_clipfrac > 0",), up, leaves, "sgd")
    assert binds.passed and not idle.passed and not clipped.passed
    assert clipped.worst == "actor/pg_clipfrac > 0"
    assert activity(("adamw: actor/pg_clipfrac > 0",), up, leaves, "sgd") == []


def test_the_step_stage_trains_the_manifest_cases_and_the_step_only_ones(
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
    assert ids == sorted(ALL_STEP_CASES)
    assert len(TRAINED) > len(OFFICIAL_RL)  # the corpus has accepted derived cases
    session = AuditSession.start(AuditOptions(manifest=None, upstream=None))
    assert step_case_ids(session) == ALL_STEP_CASES


# The pytester project's conftest: upstream's steps are the session's (tests/conftest.py
# step_oracle), so the plugin's stage runs ours and compares without a second upstream run.
_SHARED_UPSTREAM_CONFTEST = """
from pathlib import Path

import pytest_verl_compat.conformance.step.run as step_run

def shared_upstream(cases, run_module, folder, **kwargs):
    return step_run.load_upstream(Path({folder!r}))

step_run.run_upstream = shared_upstream
"""


@pytest.mark.slow
@needs_verl
def test_the_plugins_step_stage_runs_and_reports(
    pytester: pytest.Pytester, upstream_checkout: Path, step_oracle: UpstreamSteps
) -> None:
    """`test_step[<case>]` through the plugin: its selection, report and verdicts (upstream's
    side is the session's, which `test_every_step_case_matches_upstream` uses too)."""
    pytester.makeconftest(_SHARED_UPSTREAM_CONFTEST.format(folder=str(step_oracle.folder)))
    report = pytester.path / "conformance.json"
    result = pytester.runpytest_subprocess(
        "--verl-corpus",
        "--verl-corpus-step",
        f"--verl-corpus-upstream={upstream_checkout}",
        "--verl-corpus-trusted=off",
        "-p",
        "no:randomly",
        "-p",
        "no:cacheprovider",
        f"--verl-corpus-conformance-report={report}",
        "-k",
        "test_step and (dr_grpo or two-ranks)",
    )
    result.assert_outcomes(passed=2)
    steps = json.loads(report.read_text())["step"]
    assert sorted(steps) == ["dr_grpo", "step/two-ranks"]
    assert set(steps["dr_grpo"]) == set(PLAN.default_variants)
    assert set(steps["step/two-ranks"]) == set(PLAN.variants)
    assert {"actor", "old_log_probs", "advantages", "metrics"} <= set(steps["dr_grpo"]["sgd"])
    assert {"actor@2", "critic@2", "active"} <= set(steps["step/two-ranks"]["adamw"])
    # The tight comparison is tight: SGD leaves the weights within float32 rounding.
    assert steps["dr_grpo"]["sgd"]["actor"]["max_abs_diff"] < 1e-6


def test_cases_with_equal_step_settings_share_one_upstream_run(tmp_path: Path) -> None:
    """Upstream sees only the settings, so it runs once per distinct settings; ours per case."""
    session = AuditSession.start(AuditOptions(manifest=None, upstream=None))
    ids = ("grpo", "derived/legacy-noop-fields", "derived/seq-mean-token-mean", "step/two-ranks")
    cases = [dataclasses.replace(c, variants=("sgd",)) for c in step_cases(session, ids)]
    requests: list[tuple[dict[str, Any], int]] = []

    def fake_run_module(module: str, args: Any, *, stdin: str, timeout: float, ranks: int) -> Any:
        from pytest_verl_compat.upstream.oracle.runner import UpstreamRun

        requests.append((json.loads(stdin), ranks))
        return UpstreamRun(0 if ranks == 1 else 1, "", "stopped after the request")

    with pytest.raises(StepOracleError, match="stopped after the request"):
        run_steps(cases, fake_run_module)
    (one_rank, ranks1), (two_ranks, ranks2) = requests
    # The legacy no-op fields change nothing the step reads: one run stands for them and grpo
    # (named by the first of them in sorted order); the two-rank case runs on its own.
    assert [s["case"] for s in one_rank["cases"]] == [
        "derived/legacy-noop-fields",
        "derived/seq-mean-token-mean",
    ]
    assert (ranks1, ranks2) == (1, 2) and [s["case"] for s in two_ranks["cases"]] == [
        "step/two-ranks"
    ]
    by_id = {c.id: c for c in cases}
    table = CoverageTable(load_coverage())
    sgd = PLAN.variants["sgd"]
    assert upstream_key(step_settings(by_id["grpo"], sgd, table)) == upstream_key(
        step_settings(by_id["derived/legacy-noop-fields"], sgd, table)
    )


# The pytester project's conftest: run_steps replaced by one that records each start and
# takes a second (so the second worker asks while the first computes).
_COUNTING_CONFTEST = """
import os, time
from pathlib import Path

import pytest_verl_compat.conformance.step.run as step_run

def counting_run_steps(cases, run_module, **kwargs):
    with open(Path(__file__).parent / "oracle-starts.txt", "a") as out:
        out.write(os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")
    time.sleep(1.0)
    row = {"max_abs_diff": 0.0, "worst": "", "passed": True}
    return {case.id: {"sgd": {"actor": row}} for case in cases}

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
    selected = [
        c for c in ALL_STEP_CASES if any(k in c for k in ("ppo", "rloo", "reinforce", "dr_grpo"))
    ]
    result.assert_outcomes(passed=len(selected) * (2 if dist == "each" else 1))
    starts = (pytester.path / "oracle-starts.txt").read_text().split()
    assert len(starts) == 1 and starts[0].startswith("gw"), starts


# ------------------------------------------------------------------ every case, bugs and all


@pytest.fixture(scope="session")
def session_step_cases() -> dict[str, StepCase]:
    session = AuditSession.start(AuditOptions(manifest=None, upstream=None))
    return {case.id: case for case in step_cases(session)}


@pytest.mark.slow
@needs_verl
@pytest.mark.parametrize("case_id", ALL_STEP_CASES)
def test_every_step_case_matches_upstream(
    case_id: str, step_oracle: UpstreamSteps, session_step_cases: dict[str, StepCase]
) -> None:
    """Every step case, each variant and step, within the tolerances and with its claims."""
    case = session_step_cases[case_id]
    entry = {v: compare_case(step_oracle, case, v) for v in case.variants}
    assert not case_failures(entry), (case_id, case_failures(entry))


@pytest.mark.slow
@needs_verl
@pytest.mark.parametrize("mutant", SOURCE_MUTANTS, ids=lambda m: m.name)
def test_a_seeded_training_loop_bug_fails_the_step(
    mutant: SourceMutant,
    step_oracle: UpstreamSteps,
    session_step_cases: dict[str, StepCase],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A one-line bug in the trainer's loop fails every step case named to catch it."""
    mutant.apply(monkeypatch)
    survived = []
    for case_id, variant in mutant.caught_by:
        try:
            entry = compare_case(step_oracle, session_step_cases[case_id], variant)
        except Exception:  # a bug may also crash the step: that fails the stage too
            continue
        if not case_failures({variant: entry}):
            survived.append(f"{case_id} ({variant})")
    assert not survived, f"{mutant.name} survives {survived}"


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
@needs_verl
def test_shuffled_mini_batches_follow_verls_iterator_across_epochs() -> None:
    """One generator per update, seeded data_loader_seed + rank (engine_workers.py:276)."""
    from release_python import run_in_release

    from reference_trainer.batching import minibatches, shuffle_generator

    rows, size, epochs, seed = 12, 4, 3, 42
    theirs = run_in_release(
        f"""
        import torch
        from tensordict import TensorDict
        from verl.utils.tensordict_utils import make_iterator

        td = TensorDict({{"row": torch.arange({rows})}}, batch_size=[{rows}])
        result = [
            mb["row"].tolist()
            for mb in make_iterator(
                td, {size}, {epochs}, seed={seed}, dataloader_kwargs={{"shuffle": True}}
            )
        ]
        """
    )
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


@pytest.mark.parametrize("case_id", OFFICIAL_RL)
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
        "RolloutConfig.val_do_sample": "actor_rollout_ref.rollout.val_kwargs.do_sample",
    }
    profile = load_profile()
    for field_name, leaf in not_exact.items():
        rule = profile.rule_for(leaf)
        assert rule is not None
        assert rule.klass != "exact" or len(rule.values or ()) == 1, (field_name, rule.klass)
    assert unread <= set(not_exact), f"config fields nothing in reference_trainer reads: {unread}"


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
    result.assert_outcomes(skipped=len(ALL_STEP_CASES))
    result.stdout.fnmatch_lines(["*the step stage runs with --verl-corpus-step*"])
