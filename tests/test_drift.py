"""Drift check against the real verl 0.9.1 tree, and the retarget workflow that follows it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from corpus_facts import OFFICIAL_RL

from pytest_verl_compat.cli.drift import add_drift_parsers
from pytest_verl_compat.files.digests import sha256_file, tree_sha256
from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
from pytest_verl_compat.pipeline.manifest import embedded_root
from pytest_verl_compat.pipeline.profile import load_profile, profile_path
from pytest_verl_compat.upstream.drift.report import (
    OUTCOME_NOTE,
    drift_report,
    has_drift,
    render_markdown,
    section_of,
)
from pytest_verl_compat.upstream.drift.retarget import (
    is_observing,
    new_rules,
    retarget_cases,
    retarget_profile,
)

pytestmark = pytest.mark.slow

METRIC = "algorithm.filter_groups.metric"
CASE_KEYS = {"id", "added", "removed", "changed", "unclassified", "outcome", "composition_error"}


@pytest.fixture(scope="module")
def pinned(upstream_checkout: Path) -> AuditSession:
    session = AuditSession.start(AuditOptions(upstream=str(upstream_checkout)))
    assert not session.manifest_error, session.manifest_error
    return session


@pytest.fixture(scope="module")
def report_091(pinned: AuditSession, upstream_091: Path) -> dict[str, Any]:
    return drift_report(pinned, upstream_091)


def by_id(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {case["id"]: case for case in report["cases"]}


def test_report_shape(report_091: dict[str, Any], pinned: AuditSession) -> None:
    assert set(report_091) == {
        "pinned",
        "against",
        "files",
        "cases",
        "outcome_note",
        "outcome_reasons",
    }
    assert set(report_091["pinned"]) == {"version", "commit", "tree_sha256", "profile"}
    assert report_091["pinned"]["profile"] == "verl-0.9.0-single-device"
    assert set(report_091["against"]) == {"path", "tree_sha256", "version"}
    # A folder of 0.9.1's config files only (no version file) is named from the known releases.
    assert not (Path(report_091["against"]["path"]) / "verl" / "version" / "version").exists()
    assert report_091["against"]["version"] == "0.9.1"
    assert render_markdown(report_091).startswith("## verl config drift: 0.9.0 → 0.9.1\n")
    assert report_091["against"]["tree_sha256"] != report_091["pinned"]["tree_sha256"]
    assert report_091["outcome_note"] == OUTCOME_NOTE
    # A config-only tree has none of the scripts: every pinned file is reported as missing.
    assert report_091["files"] and all(f["found"] is None for f in report_091["files"])
    assert [f["path"] for f in report_091["files"]] == sorted(
        f["path"] for f in report_091["files"]
    )
    assert [c["id"] for c in report_091["cases"]] == sorted(c.id for c in pinned.cases)
    for case in report_091["cases"]:
        # A composed case names the profile its leaves were classified against.
        assert set(case) in (CASE_KEYS, CASE_KEYS | {"profile"}), set(case)
        assert set(case["outcome"]) == {"pinned", "against"}
        assert case["added"] == sorted(case["added"])
        assert case["removed"] == sorted(case["removed"])
        assert list(case["changed"]) == sorted(case["changed"])
    # The report is plain JSON.
    assert json.loads(json.dumps(report_091)) == report_091


def test_official_cases_drift(report_091: dict[str, Any]) -> None:
    cases = by_id(report_091)
    for case_id in OFFICIAL_RL:
        case = cases[case_id]
        assert case["composition_error"] is None, case_id
        assert case["changed"][METRIC] == [None, "reward"], case_id
        assert "actor_rollout_ref.actor.router_replay.mode" in case["removed"], case_id
        assert "data.continuous_token.enable" in case["removed"], case_id
        assert any(".profiler." in path for path in case["added"]), case_id
        assert case["outcome"] == {"pinned": "accepted", "against": "accepted"}, case_id
    assert has_drift(report_091)


def test_missing_filter_metric_flips(report_091: dict[str, Any]) -> None:
    case = by_id(report_091)["derived/missing-filter-metric"]
    assert case["outcome"] == {"pinned": "semantic_rejection", "against": "accepted"}
    assert case["changed"][METRIC] == [None, "reward"]
    why = report_091["outcome_reasons"]["derived/missing-filter-metric"]
    assert METRIC in why["pinned"]
    flipped = [
        c["id"] for c in report_091["cases"] if c["outcome"]["pinned"] != c["outcome"]["against"]
    ]
    assert list(report_091["outcome_reasons"]) == flipped


def test_against_pinned_tree_is_empty(pinned: AuditSession, upstream_checkout: Path) -> None:
    report = drift_report(pinned, upstream_checkout)
    assert report["against"]["tree_sha256"] == report["pinned"]["tree_sha256"]
    assert report["against"]["version"] == "0.9.0"
    assert all(f["found"] == f["pinned"] for f in report["files"])
    for case in report["cases"]:
        assert not case["added"] and not case["removed"] and not case["changed"], case["id"]
        assert not case["unclassified"] and case["composition_error"] is None, case["id"]
        assert case["outcome"]["pinned"] == case["outcome"]["against"], case["id"]
    assert report["outcome_reasons"] == {}
    assert not has_drift(report)
    assert "No drift" in render_markdown(report)


def test_markdown_summary(report_091: dict[str, Any]) -> None:
    text = render_markdown(report_091)
    assert METRIC in text
    assert "`derived/missing-filter-metric`: semantic_rejection → accepted" in text
    assert "#### `algorithm`: 0 added, 0 removed, 1 changed" in text
    assert "#### `actor_rollout_ref.actor`" in text
    assert "more" in text  # long lists are capped
    assert len(text.splitlines()) < 150


def test_section_of() -> None:
    assert section_of("algorithm.filter_groups.metric") == "algorithm"
    assert section_of("actor_rollout_ref.actor.optim.lr") == "actor_rollout_ref.actor"
    assert section_of("trainer.logger[0]") == "trainer"


def test_cli_drift_exit_code_and_determinism(
    report_091: dict[str, Any],
    upstream_checkout: Path,
    upstream_091: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--manifest")
    parser.add_argument("--upstream")
    add_drift_parsers(parser.add_subparsers(dest="command", required=True))
    out_json, out_md = tmp_path / "drift.json", tmp_path / "drift.md"
    args = parser.parse_args(
        [
            f"--upstream={upstream_checkout}",
            "drift",
            f"--against={upstream_091}",
            f"--json={out_json}",
            f"--markdown={out_md}",
        ]
    )
    assert args.func(args) == 1
    # It says where it wrote each report (stdout stays empty: nothing was asked of it).
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"verl-compat drift: wrote the drift report (JSON) to {out_json}",
        f"verl-compat drift: wrote the drift summary (Markdown) to {out_md}",
    ]
    # Another process-level session, same bytes: the report does not depend on run order.
    assert json.loads(out_json.read_text()) == report_091
    assert out_md.read_text() == render_markdown(report_091)


def test_new_rules_never_accept_silently() -> None:
    rules = new_rules(
        {"global_profiler.new_knob": 3, "trainer.new_switch": False, "x.profiler.y": None},
        "9.9.9",
    )
    assert rules[0]["class"] == "inert"
    assert rules[0]["match"] == ["global_profiler.new_knob", "x.profiler.y"]
    assert "not yet reviewed" in rules[0]["reason"] and "9.9.9" in rules[0]["reason"]
    assert rules[1] == {
        "match": "trainer.new_switch",
        "class": "unsupported",
        "neutral": [False],
        "reason": rules[1]["reason"],
    }
    assert is_observing("actor_rollout_ref.rollout.trace.backend")
    assert not is_observing("algorithm.filter_groups.metric")


def _combined_upstream(root: Path, checkout: Path, tree_091: Path) -> Path:
    """The 0.9.0 example scripts beside the 0.9.1 verl/ tree, as symlinks."""
    root.mkdir()
    (root / "examples").symlink_to(checkout / "examples")
    (root / "verl").symlink_to(tree_091 / "verl")
    return root


def test_retarget_workflow(
    pytester: pytest.Pytester,
    pinned: AuditSession,
    report_091: dict[str, Any],
    upstream_checkout: Path,
    upstream_091: Path,
    shared_cache_dir: Path,
) -> None:
    pinned_profile = profile_path("verl-0.9.0-single-device")
    before = sha256_file(pinned_profile)
    new = retarget_profile(
        "verl-0.9.0-single-device",
        upstream_091,
        "verl-0.9.1-single-device",
        out_dir=pytester.path / "profiles",
        cases=retarget_cases(pinned),
    )
    assert sha256_file(pinned_profile) == before, "the pinned profile must never change"
    assert new.name == "verl-0.9.1-single-device.yaml"
    profile = load_profile(str(new))
    digest_091 = tree_sha256(upstream_091 / "verl" / "trainer" / "config")
    assert (profile.name, profile.version, profile.tree_sha256) == (
        "verl-0.9.1-single-device",
        "0.9.1",
        digest_091,
    )
    old = load_profile("verl-0.9.0-single-device")
    assert profile.rules[: len(old.rules)] == old.rules
    # The leaves the RL profile cannot classify (an SFT case's are its own profile's).
    unclassified = {
        path
        for case in report_091["cases"]
        if case.get("profile") == "verl-0.9.0-single-device"
        for path in case["unclassified"]
    }
    assert unclassified
    for path in unclassified:
        rule = profile.rule_for(path)
        assert rule is not None and "not yet reviewed" in rule.reason, path
        assert rule.klass == ("inert" if is_observing(path) else "unsupported"), path

    # The manifest moved to 0.9.1: new profile, new tree pin, its own golden folder, the
    # expectations the manifest gives for 0.9.1 and those the drift report says have changed.
    data = yaml.safe_load((embedded_root() / "corpus" / "manifest.yaml").read_text())
    data["profile"] = str(new)
    data["upstream"]["tree_sha256"] = digest_091
    data["upstream"]["version"] = "0.9.1"
    data["upstream"]["tag"] = "v0.9.1"
    data["golden_dir"] = str(pytester.path / "golden-091")
    data["conformance"] = str(embedded_root() / "corpus" / "conformance.yaml")
    flips = {
        case["id"]: case["outcome"]["against"]
        for case in report_091["cases"]
        if case["outcome"]["pinned"] != case["outcome"]["against"]
    }
    assert flips["derived/missing-filter-metric"] == "accepted"
    for case in data["cases"]:
        # what the manifest already says 0.9.1's code judges otherwise (not a tree's drift)
        expected = case.get("expected") or {}
        moved = (expected.get("releases") or {}).get("0.9.1")
        if moved:
            case["expected"] = {**{k: v for k, v in expected.items() if k != "releases"}, **moved}
        if case["id"] in flips:
            case["expected"] = {
                "outcome": flips[case["id"]],
                "reason": report_091["outcome_reasons"][case["id"]]["against"],
            }
    manifest = pytester.path / "manifest-091.yaml"
    manifest.write_text(yaml.safe_dump(data, sort_keys=False))
    upstream = _combined_upstream(pytester.path / "upstream-091", upstream_checkout, upstream_091)

    args = [
        "--verl-corpus",
        "-p",
        "no:randomly",
        "-o",
        f"cache_dir={shared_cache_dir}",
        f"--verl-corpus-upstream={upstream}",
        f"--verl-corpus-manifest={manifest}",
        "-k",
        "not conformance and not verdict and not trusted",
    ]
    first = pytester.runpytest_subprocess(*args, "--snapshot-update")
    assert first.ret == 0, first.stdout.str()[-4000:]
    rerun = pytester.runpytest_subprocess(*args)
    assert rerun.ret == 0, rerun.stdout.str()[-4000:]
    rerun.stdout.fnmatch_lines([f"upstream: *verl 0.9.1; tree sha256 {digest_091}"])
    compile_golden = json.loads(
        (pytester.path / "golden-091" / "compile" / "grpo.json").read_text()
    )
    assert compile_golden["profile"] == "verl-0.9.1-single-device"
    assert compile_golden["leaf_classes"]["unknown"] == 0
    compose_golden = json.loads(
        (pytester.path / "golden-091" / "compose" / "grpo.json").read_text()
    )
    assert compose_golden["resolved"]["algorithm"]["filter_groups"]["metric"] == "reward"


def test_retarget_refuses_to_overwrite_the_pinned_profile(upstream_091: Path) -> None:
    from pytest_verl_compat.upstream.drift.retarget import RetargetError

    with pytest.raises(RetargetError, match="pinned profile"):
        retarget_profile("verl-0.9.0-single-device", upstream_091, "verl-0.9.0-single-device")


def test_resolved_case_reports_leaves_the_new_tree_lacks_or_adds(
    tmp_path: Path, upstream_checkout: Path, upstream_091: Path
) -> None:
    golden = json.loads((embedded_root() / "golden" / "compose" / "grpo.json").read_text())
    run = tmp_path / "grpo-run.yaml"
    run.write_text(yaml.safe_dump(golden["resolved"], sort_keys=False))
    data = yaml.safe_load((embedded_root() / "corpus" / "manifest.yaml").read_text())
    data.pop("conformance", None)
    data["cases"] = [
        {
            "id": "run/grpo",
            "kind": "resolved",
            "resolved": run.name,
            "inputs": [{"path": run.name, "sha256": sha256_file(run)}],
        }
    ]
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(yaml.safe_dump(data, sort_keys=False))
    session = AuditSession.start(
        AuditOptions(manifest=str(manifest), upstream=str(upstream_checkout))
    )
    (case,) = drift_report(session, upstream_091)["cases"]
    assert case["outcome"] == {"pinned": "accepted", "against": "accepted"}
    assert "actor_rollout_ref.actor.router_replay.mode" in case["removed"]
    assert "trainer.checkpoint_callback_class" in case["added"]
    assert case["changed"] == {} and case["composition_error"] is None
