"""The compiler: profile rules, classification of every leaf, semantic checks, the audit JSON."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
from corpus_facts import AUDIT, OFFICIAL_RL

from pytest_verl_compat.model import LEAF_CLASSES
from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
from pytest_verl_compat.pipeline.compile import compile_resolved
from pytest_verl_compat.pipeline.compose import count_leaves
from pytest_verl_compat.pipeline.manifest import embedded_root
from pytest_verl_compat.pipeline.profile import load_profile

GOLDEN = embedded_root() / "golden"


def resolved(case_id: str) -> dict:
    return json.loads((GOLDEN / "compose" / f"{case_id}.json").read_text())["resolved"]


@pytest.fixture(scope="module")
def profile():
    return load_profile()


@pytest.mark.parametrize("case_id", OFFICIAL_RL)
def test_official_cases_are_accepted_with_every_leaf_classified(case_id: str, profile) -> None:
    mapping = resolved(case_id)
    report = compile_resolved(mapping, case_id=case_id, profile=profile)
    assert report.outcome == "accepted", report.reason
    assert sum(report.counts.values()) == count_leaves(mapping)
    assert report.counts["unknown"] == 0
    assert not [leaf for leaf in report.leaves if leaf.klass == "unsupported" and leaf.problem]
    assert all(leaf.klass in LEAF_CLASSES for leaf in report.leaves)
    assert not [f for f in report.findings if f.level == "error"]


def test_named_fields_get_the_issue_classes(profile) -> None:
    report = compile_resolved(resolved("ppo"), case_id="ppo", profile=profile)
    by_path = {leaf.path: leaf for leaf in report.leaves}
    exact = [
        "algorithm.gamma",
        "algorithm.lam",
        "actor_rollout_ref.actor.clip_ratio_low",
        "actor_rollout_ref.actor.optim.lr",
        "actor_rollout_ref.rollout.n",
        "data.train_batch_size",
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        "actor_rollout_ref.actor.ppo_epochs",
        "actor_rollout_ref.actor.loss_agg_mode",
        "actor_rollout_ref.actor.kl_loss_coef",
        "actor_rollout_ref.actor.entropy_coeff",
        "algorithm.norm_adv_by_std_in_grpo",
    ]
    assert {p: by_path[p].klass for p in exact} == dict.fromkeys(exact, "exact")
    lowered = [
        "actor_rollout_ref.actor.fsdp_config.param_offload",
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
        "actor_rollout_ref.rollout.gpu_memory_utilization",
        "actor_rollout_ref.actor.use_dynamic_bsz",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
        "trainer.n_gpus_per_node",
        "actor_rollout_ref.model.use_remove_padding",
        "actor_rollout_ref.model.enable_gradient_checkpointing",
    ]
    assert {p: by_path[p].klass for p in lowered} == dict.fromkeys(lowered, "lowered")
    assert all(report.lowered[p] for p in lowered), "every lowered field records its lowering"
    assert by_path["actor_rollout_ref.model.path"].klass == "binding"
    assert by_path["trainer.logger[1]"].klass == "binding"
    for inert in (
        "reward_model.enable",
        "custom_reward_function.path",
        "sandbox_fusion.url",
        "trainer.project_name",
    ):
        assert by_path[inert].klass == "inert", inert
    assert (
        by_path["actor_rollout_ref.actor.profiler.tool_config.precision_debugger.steps"].klass
        == "inert"
    )
    assert "actor_rollout_ref.model.path" in report.bindings


def test_a_field_no_rule_knows_rejects_the_case(profile) -> None:
    mapping = copy.deepcopy(resolved("grpo"))
    mapping["algorithm"]["brand_new_knob"] = 3
    report = compile_resolved(mapping, case_id="grpo+new", profile=profile)
    assert report.outcome == "semantic_rejection"
    assert report.counts["unknown"] == 1
    assert "algorithm.brand_new_knob: unknown field" in report.reason


def test_an_unsupported_feature_switched_on_rejects_with_the_neutral_value(profile) -> None:
    mapping = copy.deepcopy(resolved("grpo"))
    mapping["distillation"]["enabled"] = True
    report = compile_resolved(mapping, case_id="grpo+distill", profile=profile)
    assert report.outcome == "semantic_rejection"
    assert (
        "distillation.enabled=True is not supported" in report.reason
        and "supported: False" in report.reason
    )


def test_batch_sizes_that_do_not_divide_are_rejected_with_derived_numbers(profile) -> None:
    mapping = copy.deepcopy(resolved("grpo"))
    mapping["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"] = 300
    report = compile_resolved(mapping, case_id="grpo+bad-mini", profile=profile)
    assert report.outcome == "semantic_rejection"
    # verl 0.9.0's V1 trainer pads the step (a warning with the numbers); the reference trainer,
    # which does not pad, refuses it.
    assert "does not pad a step" in report.reason
    (padded,) = [f for f in report.findings if f.check == "batch.padded-step"]
    assert padded.level == "warning"
    # lcm(8 data-parallel ranks, 1500 responses) = 3000: 5120 rows become 6000.
    assert "5120 responses per step are not a multiple of 3000" in padded.message
    assert "appends 880 no-op padding responses" in padded.message
    # The legacy trainer splits the batch instead: there it is an error, with the numbers.
    mapping["trainer"]["use_v1"] = False
    legacy = compile_resolved(mapping, case_id="grpo+bad-mini+v0", profile=profile)
    assert "1024 prompts × n=5 = 5120 responses per step" in legacy.reason
    assert "300 prompts × 5 = 1500 responses" in legacy.reason
    assert not [f for f in legacy.findings if f.check == "batch.padded-step"]


def test_profile_patterns_stay_inside_segments(profile) -> None:
    assert profile.rule_for("actor_rollout_ref.model.mtp.enable").klass == "unsupported"
    assert profile.rule_for("algorithm.gammaX") is None
    assert profile.rule_for("data.train_files[3]").klass == "binding"


@pytest.fixture(scope="module")
def session(upstream_checkout: Path) -> AuditSession:
    return AuditSession.start(AuditOptions(upstream=str(upstream_checkout)))


def test_every_case_reaches_its_expected_outcome_and_findings(session: AuditSession) -> None:
    entries = [session.audit_entry(case) for case in session.cases]
    assert len(entries) == len(AUDIT["cases"])
    assert sum(1 for e in entries if e["kind"] != "field") == AUDIT["totals"]["cases"]
    for case, entry in zip(session.cases, entries, strict=True):
        assert entry["outcome"] == (case.expected or {}).get("outcome", "accepted"), case.id
        found = {f"{f['level']}:{f['path']}" for f in entry["findings"]}
        assert set((case.expected or {}).get("findings", [])) <= found, case.id
        if case.kind == "official":
            assert not [f for f in entry["findings"] if f["level"] == "error"], case.id
        if entry["outcome"] != "composition_rejection":
            assert sum(entry["leaf_classes"].values()) == entry["resolved_leaf_count"]


def test_reference_config_needs_an_accepted_case(session: AuditSession) -> None:
    from pytest_verl_compat.model import StageFailed

    config = session.reference_config(session.manifest.case("ppo"))
    assert config.critic is not None and config.actor_updates_per_step == 4
    assert "actor_rollout_ref.model.path" in config.bindings
    with pytest.raises(StageFailed, match="rejected by profile"):
        session.reference_config(session.manifest.case("derived/unsupported-loss-mode"))


def test_audit_check_passes_and_pytest_report_has_the_same_bytes(
    pytester: pytest.Pytester, upstream_checkout: Path, shared_cache_dir: Path
) -> None:
    check = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_verl_compat.cli",
            "--upstream",
            str(upstream_checkout),
            "audit",
            "--check",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stderr
    report = pytester.path / "audit.json"
    result = pytester.runpytest_subprocess(
        "--verl-corpus",
        f"--verl-corpus-upstream={upstream_checkout}",
        f"--verl-corpus-report={report}",
        "--verl-corpus-trusted=off",
        "-o",
        f"cache_dir={shared_cache_dir}",
        "-k",
        "compile",
        "-n",
        "2",
    )
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "18 cases; 16 composed; 14 accepted; 2 semantic rejections; 2 composition rejections",
            "resolved leaves by class: *",
        ]
    )
    assert report.read_bytes() == (GOLDEN / "audit.json").read_bytes()
