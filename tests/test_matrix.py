"""``verl-compat matrix``: scripts on every pinned release, the golden table of the official cases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from corpus_facts import OFFICIAL, PINNED_VERSION, needs_release
from launch_scripts import launch_script

from pytest_verl_compat.cli import main
from pytest_verl_compat.model import Finding
from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
from pytest_verl_compat.releases.index import load_release_index
from pytest_verl_compat.upstream.drift.cells import CellCache
from pytest_verl_compat.upstream.drift.matrix import (
    CHECK,
    COMPOSE,
    NOT_IN_TREE,
    explicit_keys,
    matrix_report,
)

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "golden" / "matrix" / "official.md"
INDEX = load_release_index()

pytestmark = pytest.mark.usefixtures("release_cache")


def _matrix(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["matrix", *args])
    out, err = capsys.readouterr()
    return status, out, err


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    status, out, _ = _matrix(capsys, *args, "--format", "json")
    return status, json.loads(out)


@needs_release()
def test_the_official_cases_table_is_the_golden_file(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _matrix(capsys, "--official", "--format", "markdown")
    assert status == 0
    assert out == GOLDEN.read_text(), (
        "regenerate with: verl-compat matrix --official --format markdown --out "
        "golden/matrix/official.md (and say in the commit which cells moved and why)"
    )
    for case_id in OFFICIAL:
        assert f"| `{case_id}` |" in out


@pytest.mark.slow
@needs_release()
def test_the_table_does_not_depend_on_the_hash_seed_or_the_cache() -> None:
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_verl_compat.cli",
            "matrix",
            "--official",
            "--format",
            "markdown",
            "--no-cache",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == GOLDEN.read_text()


def test_cells_say_what_kind_of_verdict_they_are(capsys: pytest.CaptureFixture[str]) -> None:
    status, report = _json(capsys, "grpo", "--no-upstream-checks")
    assert status == 0
    assert [r["version"] for r in report["releases"]] == list(INDEX.versions)
    assert report["pinned"] == PINNED_VERSION
    supported = set(INDEX.supported_versions)
    for release in report["releases"]:
        assert release["tree_sha256"] == INDEX.release(release["version"]).tree_sha256
        assert release["kind"] == (CHECK if release["version"] in supported else COMPOSE)
    (script,) = report["scripts"]
    for version, cell in script["cells"].items():
        assert cell["kind"] == (CHECK if version in supported else COMPOSE)
        assert cell["composed"] is True
    for version in supported:
        verdict = script["cells"][version]
        assert verdict["valid"] is True and verdict["findings"] == []
        assert verdict["upstream_checks"] == "skipped: not asked (--no-upstream-checks)"
    assert set(report["kinds"]) == {CHECK, COMPOSE}


def test_a_key_one_release_lacks_and_its_twin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """critic.fsdp.* is new in 0.8.0: 0.7.0 rejects the script with Hydra's reason and the key is
    listed; the same script without it composes on both, with no key listed."""
    lacks = launch_script(
        tmp_path / "a", "run.sh", "critic.fsdp.param_offload=False", "trainer.total_epochs=2"
    )
    twin = launch_script(tmp_path / "b", "run.sh", "trainer.total_epochs=2")
    status, report = _json(
        capsys,
        str(lacks),
        str(twin),
        "--releases",
        f"0.7.0,{PINNED_VERSION}",
        "--no-upstream-checks",
    )
    assert status == 0
    first, second = report["scripts"]
    assert (first["id"], second["id"]) == (str(lacks), str(twin))  # same name, two scripts
    assert first["cells"]["0.7.0"] == {
        "kind": COMPOSE,
        "composed": False,
        "reason": "ConfigCompositionException: Could not override 'critic.fsdp.param_offload'.\n"
        "To append to your config use +critic.fsdp.param_offload=False",
    }
    assert first["keys"] == {
        "critic.fsdp.param_offload": {"0.7.0": NOT_IN_TREE, PINNED_VERSION: "false"}
    }
    assert second["cells"]["0.7.0"]["composed"] is True and second["keys"] == {}


def test_a_value_a_release_resolves_differently(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key set to an interpolation of a default the release changed (max_num_seqs: 1024 in
    0.8.0, 256 in 0.9.0) composes on both with different values; a literal does not differ."""
    script = launch_script(
        tmp_path,
        "run.sh",
        "'trainer.total_epochs=${actor_rollout_ref.rollout.max_num_seqs}'",
        "trainer.save_freq=7",
    )
    _, report = _json(
        capsys, str(script), "--releases", f"0.8.0,{PINNED_VERSION}", "--no-upstream-checks"
    )
    (entry,) = report["scripts"]
    assert entry["keys"] == {"trainer.total_epochs": {"0.8.0": "1024", PINNED_VERSION: "256"}}


def test_an_invalid_or_unread_script_fails_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    typo = launch_script(tmp_path, "typo.sh", "algorithm.adv_estimator=grpoo")
    status, report = _json(capsys, str(typo), "--releases", PINNED_VERSION, "--no-upstream-checks")
    assert status == 1
    cell = report["scripts"][0]["cells"][PINNED_VERSION]
    assert cell["valid"] is False and any(
        line.startswith("ERROR algorithm.adv_estimator") for line in cell["findings"]
    )
    unread = tmp_path / "unread.sh"
    unread.write_text("#!/bin/bash\necho no launcher\n")
    status, report = _json(capsys, str(unread), "--releases", "0.8.0")
    assert status == 1 and report["scripts"][0]["read"] is False
    assert "no launcher" in report["scripts"][0]["reason"]


def test_a_foreign_target_is_data_on_every_release(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import hydra.utils

    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("a _target_ was instantiated")

    monkeypatch.setattr(hydra.utils, "instantiate", refuse)
    script = launch_script(
        tmp_path, "run.sh", "+trainer.pwn._target_=os.system", "+trainer.pwn.command=id"
    )
    status, report = _json(capsys, str(script), "--no-upstream-checks")
    assert status == 1
    for version, cell in report["scripts"][0]["cells"].items():
        assert cell["composed"] is False, version
        assert (
            "trainer.pwn._target_='os.system': a _target_ must be one of the classes"
            in cell["reason"]
        )


def test_an_unknown_release_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = _matrix(capsys, "grpo", "--releases", "0.7.0,0.6.0")
    assert status == 2 and out == ""
    assert err == (
        "verl-compat matrix: verl 0.6.0 is not a pinned release (known: "
        + ", ".join(INDEX.versions)
        + "; releases.yaml pins them)\n"
    )
    status, _, err = _matrix(capsys)
    assert status == 2 and "name at least one CASE or SCRIPT" in err


def test_the_cell_cache_changes_nothing(tmp_path: Path) -> None:
    session = AuditSession.start(AuditOptions())
    cases = [session.manifest.case(case_id) for case_id in ("ppo", "grpo_reward_model")]
    cache = CellCache(tmp_path / "cells")
    uncached = matrix_report(session, cases, upstream_checks=False)
    cold = matrix_report(session, cases, upstream_checks=False, cache=cache)
    entries = sorted((tmp_path / "cells").glob("*.json"))
    # The releases without a verdict of their own: composition cells, kept.
    assert len(entries) == len(cases) * (len(INDEX.versions) - len(INDEX.supported_versions))
    warm = matrix_report(session, cases, upstream_checks=False, cache=cache)
    for entry in entries:
        entry.write_text('{"composed": "yes"}')  # a malformed entry is a miss
    damaged = matrix_report(session, cases, upstream_checks=False, cache=cache)
    assert uncached == cold == warm == damaged


def test_explicit_keys() -> None:
    keys = explicit_keys(
        [
            "--config-name=ppo_megatron_trainer",
            "model_engine=megatron",
            "+a.b=1",
            "++c.d=2",
            "~e.f",
            "a.b=3",
            "g/h=x",
        ]
    )
    assert [(k.key, k.prefix, k.index, k.group) for k in keys] == [
        ("model_engine", "", 1, True),
        ("a.b", "+", 2, False),
        ("c.d", "++", 3, False),
        ("e.f", "~", 4, False),
        ("g/h", "", 6, True),
    ]


@needs_release()
def test_the_pinned_cell_is_what_check_prints(capsys: pytest.CaptureFixture[str]) -> None:
    for case_id in ("ppo", "field/legacy-reward-manager"):
        assert main(["check", case_id, "--format", "json"]) in (0, 1)
        (checked,) = json.loads(capsys.readouterr().out)["files"]
        # check locates its findings (file:line, rule id); the cell lists the same findings.
        printed = [
            Finding(f["level"], f["path"], f["message"], f["fix"]).line()
            for f in checked["findings"]
        ]
        _, report = _json(capsys, case_id, "--releases", PINNED_VERSION)
        cell = report["scripts"][0]["cells"][PINNED_VERSION]
        assert cell["findings"] == printed, case_id
        assert cell["findings"], f"{case_id}: a case with findings, or the test compares nothing"


def test_without_a_checkout_each_supported_release_is_a_verdict_of_its_own(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No checkout: every supported release's column is the verdict of `check` on that release
    (its own tree from its pinned wheel, its own upstream code); an unsupported release's is its
    tree's composition only."""
    from pytest_verl_compat.releases.index import load_release_index

    supported = load_release_index().supported_versions
    monkeypatch.delenv("VERL_UPSTREAM", raising=False)
    status, report = _json(capsys, "grpo", "--releases", ",".join(["0.7.1", *supported]))
    assert status == 0
    kinds = {release["version"]: release["kind"] for release in report["releases"]}
    assert kinds == {"0.7.1": "compose", **dict.fromkeys(supported, "check")}
    cells = report["scripts"][0]["cells"]
    for version in supported:
        assert cells[version]["valid"] is True and cells[version]["upstream_checks"] == "ran"
