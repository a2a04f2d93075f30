"""The corpus audit end to end, through pytester: stages, embedded default, snapshots, reports."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from corpus_facts import OFFICIAL, OFFICIAL_RL, PINNED_VERSION, release_ready

from pytest_verl_compat.pipeline.manifest import embedded_root

pytestmark = pytest.mark.slow
CASES = 27  # nine official (seven RL, two SFT), nine derived and nine field cases
COMPOSED = 25  # all but the two composition rejections


def run_audit(pytester: pytest.Pytester, cache: Path, *args: str) -> pytest.RunResult:
    """``pytest --verl-corpus`` in a subprocess (it imports Hydra), sharing one trusted cache."""
    return pytester.runpytest_subprocess(
        "--verl-corpus", "-p", "no:randomly", "-o", f"cache_dir={cache}", "-rs", *args
    )


def copy_corpus(tmp: Path) -> tuple[Path, Path]:
    """A writable copy of the embedded manifest and golden files."""
    root = embedded_root()
    shutil.copytree(root / "corpus", tmp / "corpus")
    shutil.copytree(root / "golden", tmp / "golden")
    manifest = tmp / "corpus" / "manifest.yaml"
    data = yaml.safe_load(manifest.read_text())
    data["golden_dir"] = "../golden"
    manifest.write_text(yaml.safe_dump(data, sort_keys=False))
    return manifest, tmp / "golden"


def test_checkout_all_stages_pass(
    pytester: pytest.Pytester, upstream_checkout: Path, shared_cache_dir: Path
) -> None:
    report = pytester.path / "audit.json"
    junit = pytester.path / "junit.xml"
    result = run_audit(
        pytester,
        shared_cache_dir,
        f"--verl-corpus-upstream={upstream_checkout}",
        f"--verl-corpus-report={report}",
        f"--junitxml={junit}",
        # Per-case properties have a place in xunit1 testcases only (pytest's xunit2 schema).
        "-o",
        "junit_family=xunit1",
        "-n",
        "2",
        "-k",
        "not conformance",
    )
    # read, compose, compile, snapshot per case; trusted and verdict per composed case
    # (a rejected case never reaches upstream's code); the tree and the orphans check.
    result.assert_outcomes(passed=CASES * 4 + COMPOSED * 2 + 2, skipped=4)
    result.stdout.fnmatch_lines(
        [
            "*verl corpus audit*",
            "18 cases; 16 composed; 14 accepted; 2 semantic rejections; 2 composition rejections",
            "resolved leaves by class: *",
            # A field case verl runs (V1 pads the step) but the reference trainer refuses is not
            # counted as an error caught.
            "field corpus: 9 cases; 6 errors caught; 1 refused by the reference trainer only; *",
            "stages: 27 read (0 skipped); 25 equal to upstream's entry point (2 skipped); 27 match golden;*",
            "check (static and upstream's own early checks): 25 cases; 18 valid for verl; *",
        ]
    )
    audit = json.loads(report.read_text())
    assert [case["id"] for case in audit["cases"]][: len(OFFICIAL)] == OFFICIAL
    assert audit["upstream"]["commit"] == "483b8a009ba3a97563edee3a19887e4862b8094a"
    assert audit["profile"] == "verl-0.9.0-single-device"
    for case in audit["cases"][: len(OFFICIAL)]:
        assert case["outcome"] == "accepted"
        # main_ppo's tree has ~880 leaves, the SFT trainer's sft_trainer_engine ~190.
        assert case["resolved_leaf_count"] > (800 if case["id"] in OFFICIAL_RL else 150)
        assert case["inputs"] and all(len(pin["sha256"]) == 64 for pin in case["inputs"])
    grpo = next(case for case in audit["cases"] if case["id"] == "grpo")
    assert (
        "data.train_files=['/home/verl/data/gsm8k/train.parquet', '/home/verl/data/math/train.parquet']"
        in grpo["explicit_fields"]
    )
    dr_grpo = next(case for case in audit["cases"] if case["id"] == "dr_grpo")
    assert dr_grpo["explicit_fields"][-3:] == [
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "algorithm.norm_adv_by_std_in_grpo=False",
    ]
    suite = ET.parse(junit).getroot().find("testsuite")
    totals = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert totals["verl_corpus_cases"] == "18"
    assert totals["verl_corpus_composed"] == "16"
    assert totals["verl_corpus_accepted"] == "14"
    assert totals["verl_corpus_leaf_classes_unknown"] == "0"
    case_props = [
        {p.get("name"): p.get("value") for p in tc.find("properties")}
        for tc in suite.iter("testcase")
        if tc.get("name").startswith("test_compose")
    ]
    assert {props["verl_case"] for props in case_props} >= set(OFFICIAL)
    assert all(props["input_sha256"] for props in case_props)


def test_embedded_default_skips_read_with_reason(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, shared_cache_dir: Path
) -> None:
    if not release_ready():
        pytest.skip("the embedded default runs upstream's checks in the release's environment")
    monkeypatch.delenv("VERL_UPSTREAM", raising=False)
    result = run_audit(pytester, shared_cache_dir, "-k", "not conformance")
    result.assert_outcomes(passed=CASES * 3 + COMPOSED * 2 + 2, skipped=CASES + 4)
    result.stdout.fnmatch_lines(
        [
            f"release: verl {PINNED_VERSION} (the corpus manifest's release)",
            f"upstream: verl {PINNED_VERSION}'s own files (its pinned wheel, at *",
            "18 cases; 16 composed; 14 accepted;*",
            "stages: 0 read (27 skipped); 25 equal to upstream's entry point (2 skipped)*",
            "*has no launch scripts; explicit fields come from the golden snapshot*",
        ]
    )


def test_snapshot_change_is_shown_by_dotted_path_and_accepted_by_update(
    pytester: pytest.Pytester, upstream_checkout: Path, shared_cache_dir: Path
) -> None:
    manifest, golden = copy_corpus(pytester.path)
    grpo = golden / "compose" / "grpo.json"
    data = json.loads(grpo.read_text())
    data["resolved"]["actor_rollout_ref"]["actor"]["optim"]["lr"] = 5e-7
    del data["resolved"]["trainer"]["project_name"]
    grpo.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    args = (
        f"--verl-corpus-upstream={upstream_checkout}",
        f"--verl-corpus-manifest={manifest}",
        "-k",
        "test_snapshot",
    )

    failed = run_audit(pytester, shared_cache_dir, *args)
    failed.assert_outcomes(passed=CASES - 1, failed=1)
    failed.stdout.fnmatch_lines(
        [
            "*~ resolved.actor_rollout_ref.actor.optim.lr: 5e-07 -> 1e-06*",
            '*+ resolved.trainer.project_name: "verl_grpo_gsm8k_math"*',
            "*--snapshot-update*",
        ]
    )
    before = {p.name: p.read_bytes() for p in (golden / "compose").glob("*.json")}

    updated = run_audit(pytester, shared_cache_dir, *args, "--snapshot-update", "-n", "2")
    assert updated.ret == 0
    after = {p.name: p.read_bytes() for p in (golden / "compose").glob("*.json")}
    assert after.keys() == before.keys(), "an update must never delete other cases' golden files"
    assert after["grpo.json"] == (embedded_root() / "golden" / "compose" / "grpo.json").read_bytes()
    assert all(after[name] == before[name] for name in before if name != "grpo.json")

    run_audit(pytester, shared_cache_dir, *args).assert_outcomes(passed=CASES)


def test_deselecting_a_case_keeps_its_golden_file(
    pytester: pytest.Pytester, upstream_checkout: Path, shared_cache_dir: Path
) -> None:
    manifest, golden = copy_corpus(pytester.path)
    before = sorted(p.name for p in (golden / "compose").glob("*.json"))
    result = run_audit(
        pytester,
        shared_cache_dir,
        f"--verl-corpus-upstream={upstream_checkout}",
        f"--verl-corpus-manifest={manifest}",
        "-k",
        "grpo and not lora and not reward and not StepConformance",
        "--snapshot-update",
    )
    assert result.ret == 0
    assert sorted(p.name for p in (golden / "compose").glob("*.json")) == before


def test_pinned_hash_mismatch_fails_only_that_case(
    pytester: pytest.Pytester, upstream_checkout: Path, shared_cache_dir: Path
) -> None:
    manifest, _ = copy_corpus(pytester.path)
    data = yaml.safe_load(manifest.read_text())
    ppo = next(case for case in data["cases"] if case["id"] == "ppo")
    ppo["inputs"][0]["sha256"] = "0" * 64
    manifest.write_text(yaml.safe_dump(data, sort_keys=False))
    result = run_audit(
        pytester,
        shared_cache_dir,
        f"--verl-corpus-upstream={upstream_checkout}",
        f"--verl-corpus-manifest={manifest}",
        "--verl-corpus-trusted=off",
        "-k",
        "read or compose",
    )
    # The read stage fails with the mismatch and the command that re-pins it; the case's compose
    # stage is skipped and points at it, so the mismatch is printed once.
    result.assert_outcomes(passed=(CASES - 1) * 2, failed=1, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*ppo_trainer/run_qwen3_8b_fsdp.sh: pinned sha256 "
            + "0" * 64
            + ", found 6923473eb21475130725e9194120c18536dea3e107b01cda9d82ba4785eed6de; "
            f"review the change, then re-pin the manifest: verl-compat pin {manifest} "
            f"--upstream {upstream_checkout}",
            "*[[]ppo[]] its inputs changed since they were pinned (verl-corpus::test_read[[]ppo[]] says how)",
        ]
    )
    assert result.stdout.str().count("pinned sha256 " + "0" * 64) == 1


def test_conformance_stage_writes_matrix_and_json(
    pytester: pytest.Pytester, shared_cache_dir: Path
) -> None:
    if not release_ready():
        pytest.skip("upstream verl 0.9.0 not installed")
    report = pytester.path / "conformance.json"
    result = run_audit(
        pytester,
        shared_cache_dir,
        "-k",
        "conformance and kl",
        f"--verl-corpus-conformance-report={report}",
    )
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        ["conformance with upstream verl: */* cases within tolerance", "  kl  *k3 4/4*"]
    )
    data = json.loads(report.read_text())
    assert data["upstream"] == {"verl": "0.9.0"}
    components = {r["component"] for r in data["results"]}
    assert components == {"kl", "kl_in_reward"}
    first = data["results"][0]
    assert set(first) == {
        "component",
        "variant",
        "case",
        "samples",
        "max_abs_err",
        "max_grad_abs_err",
        "passed",
    }
    assert all(r["passed"] and r["samples"] > 0 for r in data["results"])
