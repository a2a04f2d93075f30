"""The GitHub Action (action.yml) as GitHub reads it: a composite action whose check step uses only
options ``verl-compat check`` accepts, uploads SARIF to code scanning and fails on findings."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from pytest_verl_compat.cli import build_parser

REPO = Path(__file__).resolve().parents[1]


def test_the_action_is_composite_and_uploads_sarif() -> None:
    action = yaml.safe_load((REPO / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    steps = action["runs"]["steps"]
    uses = [step.get("uses", "") for step in steps]
    assert any(u.startswith("github/codeql-action/upload-sarif@") for u in uses)
    assert any(u.startswith("actions/setup-python@") for u in uses)
    for step in steps:
        if "run" in step:
            assert step["shell"] == "bash", step.get("name")
    assert {"paths", "fail-on", "args", "sarif-file", "upstream-checks"} <= set(action["inputs"])
    # Inputs reach the scripts through env, never spliced into the script text.
    for step in steps:
        assert "${{ inputs." not in step.get("run", ""), step.get("name")


def test_the_action_calls_check_with_options_it_accepts() -> None:
    action = (REPO / "action.yml").read_text()
    calls = re.findall(r'^ *verl-compat check ("\$\{scripts\[@\]\}"(?:.*\\\n)*.*)', action, re.M)
    assert len(calls) == 2
    parser = build_parser()
    for call in calls:
        words = call.replace("\\\n", " ").split()
        concrete = [
            {'"${scripts[@]}"': "a.sh", '"$SARIF"': "x.sarif", '"$FAIL_ON"': "error"}.get(w, w)
            for w in words
            if w not in ('"${extra[@]}"', "$ARGS")
        ]
        args = parser.parse_args(["check", *concrete, "--no-upstream-checks"])
        assert args.format in ("sarif", "github") and args.fail_on == "error"


def test_the_readme_shows_the_workflow_and_the_hook() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Use it in CI", 1)[1].split("\n## ", 1)[0]
    for needed in (
        "--format sarif",
        "--format github",
        "id: verl-compat",
        "security-events: write",
        "[tool.verl-compat]",
        "# verl-compat: ignore[",
    ):
        assert needed in section, needed
