"""The two doors agree (issue 22): ``pytest --verl-corpus``'s verdict stage and ``verl-compat
check`` give every case the same verdict and the same findings, on every corpus case and on each of
verl 0.9.0's example scripts (corpus/examples.yaml) as a case of a generated manifest.

The plugin runs in a subprocess with a small plugin of this test's that writes each verdict
stage's recorded facts (what the stage saw ``check_case`` return) to a JSON file; ``check`` runs as
a user runs it, on the same manifest, with ``--format json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from corpus_facts import needs_release

from pytest_verl_compat.model import Finding
from pytest_verl_compat.pipeline.manifest import default_examples_path, default_manifest_path

REPO = Path(__file__).resolve().parents[1]
CLI = (sys.executable, "-m", "pytest_verl_compat.cli")

pytestmark = [
    pytest.mark.slow,
    needs_release(),
]

COLLECTOR = """
import json, os
from pytest_verl_compat.model import KEY_CASE, KEY_FACTS, KEY_STAGE
from pytest_verl_compat.plugin.keys import REPORT_ATTRIBUTE

FACTS = {}


def pytest_runtest_logreport(report):
    payload = getattr(report, REPORT_ATTRIBUTE, None) or {}
    if report.when == "call" and payload.get(KEY_STAGE) == "verdict":
        FACTS[payload[KEY_CASE]] = payload.get(KEY_FACTS, {})


def pytest_sessionfinish(session):
    with open(os.environ["PARITY_OUT"], "w") as out:
        json.dump(FACTS, out, sort_keys=True)
"""


def parity_manifest(folder: Path) -> tuple[Path, list[str]]:
    """The embedded manifest's cases plus one case per readable example script."""
    manifest = yaml.safe_load(default_manifest_path().read_text(encoding="utf-8"))
    examples = yaml.safe_load(default_examples_path().read_text(encoding="utf-8"))
    ids = [case["id"] for case in manifest["cases"]]
    for script in examples["scripts"]:
        if script.get("read_error"):
            continue
        case_id = "example/" + script["path"].removeprefix("examples/").removesuffix(".sh")
        case: dict[str, Any] = {
            "id": case_id,
            "kind": "user",
            "launch": script["path"],
            "inputs": [{"path": script["path"], "sha256": script["sha256"]}],
        }
        if script.get("environment"):
            case["environment"] = script["environment"]
        manifest["cases"].append(case)
        ids.append(case_id)
    embedded = default_manifest_path().parent
    manifest["conformance"] = str(embedded / manifest["conformance"])
    manifest["golden_dir"] = str(folder / "golden")
    # The corpus cases' recorded answers, as the embedded default reads them (what upstream
    # answers for them is tests/test_recorded_answers.py's to check, live).
    shutil.copytree(REPO / "golden" / "answers", folder / "golden" / "answers")
    path = folder / "manifest.yaml"
    path.write_text(yaml.safe_dump(manifest, sort_keys=False), encoding="utf-8")
    return path, ids


def test_the_plugin_and_check_give_every_case_the_same_verdict(
    pytester: pytest.Pytester, upstream_checkout: Path, tmp_path: Path, example_answers: Path
) -> None:
    manifest, ids = parity_manifest(tmp_path)
    assert len(ids) > 100
    (pytester.path / "parity_collector.py").write_text(COLLECTOR, encoding="utf-8")
    out = tmp_path / "plugin.json"
    os.environ["PARITY_OUT"] = str(out)
    try:
        run = pytester.runpytest_subprocess(
            "--verl-corpus",
            f"--verl-corpus-manifest={manifest}",
            f"--verl-corpus-upstream={upstream_checkout}",
            "-p",
            "parity_collector",
            "-p",
            "no:randomly",
            "-o",
            f"cache_dir={tmp_path / 'pytest-cache'}",
            "-k",
            "test_verdict",
            "-q",
        )
    finally:
        del os.environ["PARITY_OUT"]
    recorded: dict[str, dict[str, Any]] = json.loads(out.read_text(encoding="utf-8"))
    # A case the stage skipped (not composed) recorded no verdict.
    plugin = {case_id: facts for case_id, facts in recorded.items() if "valid" in facts}
    assert plugin, run.stdout.str()[-3000:]

    sources = ("--manifest", str(manifest), "--upstream", str(upstream_checkout))
    # The same user cache as the plugin's run (the suite's, where ``example_answers`` put
    # upstream's answers for every example): both doors read the same answers of upstream, asked
    # once per run; what they must agree on is what each makes of them.
    check = subprocess.run(
        [*CLI, *sources, "check", *ids, "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode in (0, 1), check.stderr[-3000:]
    files = {entry["case"]: entry for entry in json.loads(check.stdout)["files"]}

    compared = 0
    for case_id, facts in sorted(plugin.items()):
        entry = files[case_id]
        lines = [
            Finding(f["level"], f["path"], f["message"], f["fix"]).line() for f in entry["findings"]
        ]
        assert (facts["valid"], facts["runnable"]) == (entry["valid"], entry["runnable"]), case_id
        assert facts["check_findings"] == lines, case_id
        compared += 1
    # Every case check composed reached the plugin's verdict stage (it skips the others).
    composed = {
        case_id
        for case_id, entry in files.items()
        if entry["status"] == "checked"
        # Not composed: rejected by composition, or a launch of a module the release lacks.
        and not any(f["path"] in ("<composition>", "<launch>") for f in entry["findings"])
    }
    assert set(plugin) == composed
    assert compared > 100, compared
