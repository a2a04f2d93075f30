"""verl 0.9.0's own launch scripts (corpus/examples.yaml): read, composed as upstream does, checked.

Upstream's outcome for each argv was recorded once from its entry point
(``python -m pytest_verl_compat.upstream.verdict.examples``, golden/examples/upstream.json); our
per-script verdicts and the totals that golden/audit.json carries are in golden/examples/audit.json.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from bash_oracle import BASH, ENV, run_bash
from corpus_facts import release_ready, release_root

from pytest_verl_compat.model import Case, StageFailed
from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
from pytest_verl_compat.pipeline.entry_points import UnknownEntryPoint
from pytest_verl_compat.pipeline.entry_registry import ReleaseModules
from pytest_verl_compat.pipeline.manifest import (
    default_examples_path,
    default_manifest_path,
    load_examples,
    load_manifest,
)
from pytest_verl_compat.pipeline.report import EXAMPLES_AUDIT, example_totals
from pytest_verl_compat.upstream.verdict.examples import (
    UPSTREAM_ANSWER,
    argv_digest,
    digest,
    example_entry,
)

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "golden"
CASES = load_examples(default_examples_path(), load_manifest(default_manifest_path()).bindings)
UPSTREAM = json.loads((GOLDEN / "examples/upstream.json").read_text(encoding="utf-8"))
RECORDED = json.loads((GOLDEN / EXAMPLES_AUDIT).read_text(encoding="utf-8"))
RECORDED_BY_ID = {entry["id"]: entry for entry in RECORDED["scripts"]}


@pytest.fixture(scope="module")
def session(upstream_checkout: Path) -> AuditSession:
    return AuditSession.start(AuditOptions(upstream=str(upstream_checkout)))


def test_the_list_is_every_script_of_the_checkout_pinned(upstream_checkout: Path) -> None:
    on_disk = sorted(
        str(p.relative_to(upstream_checkout)) for p in upstream_checkout.glob("examples/**/*.sh")
    )
    assert [case.launch for case in CASES] == on_disk
    for case in CASES:
        (pin,) = case.inputs
        sha = hashlib.sha256((upstream_checkout / pin.path).read_bytes()).hexdigest()
        assert sha == pin.sha256, f"sha256={sha}, but should be {pin.sha256} [{case.id}]"


@pytest.mark.filterwarnings("ignore:provider=hydra.searchpath:UserWarning")
@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_example(case: Case, session: AuditSession) -> None:
    """Read as recorded, composed as upstream's entry point composed the same argv, checked."""
    upstream: dict[str, Any] = UPSTREAM[case.id]
    entry = example_entry(session, case, upstream.get(UPSTREAM_ANSWER))
    expected_error = (case.expected or {}).get("read_error")
    if expected_error:
        assert not entry["read"] and expected_error in entry["reason"], entry
        assert not upstream["read"]
        return
    assert entry["read"], entry.get("reason")
    try:
        outcome = session.outcome(case)
    except StageFailed as exc:
        # Read, but the launch runs a module the release lacks: Python fails at once, as the
        # recorded upstream run did.
        assert isinstance(exc.__cause__, UnknownEntryPoint), exc
        assert not upstream["composed"] and str(exc.__cause__) == upstream["error"], upstream
        assert entry == RECORDED_BY_ID[case.id]
        return
    fields = outcome.fields.fields
    assert argv_digest(fields) == upstream["argv_sha256"], (
        f"the argv changed since upstream's outcome was recorded [{case.id}]; re-record with "
        "python -m pytest_verl_compat.upstream.verdict.examples"
    )
    composition = session.outcome(case).composition
    assert composition.composed == upstream["composed"], (
        f"composed={composition.composed}, but upstream's entry point "
        f"{'composed it' if upstream['composed'] else 'failed: ' + upstream['error']} [{case.id}]"
    )
    if composition.composed:
        assert digest(composition.resolved) == upstream["resolved_sha256"], (
            f"resolved mapping differs from upstream's entry point [{case.id}]"
        )
    assert entry == RECORDED_BY_ID[case.id]


@pytest.mark.filterwarnings("ignore:provider=hydra.searchpath:UserWarning")
def test_the_examples_answers_are_recorded_under_the_keys_check_asks_now(
    session: AuditSession,
) -> None:
    """golden/answers/checks-examples.json holds each composed script's recorded answer under
    the key ``check`` asks it by now: a changed probe, tree, script or our oracle code re-keys
    the question, and the file must be re-recorded (the suite would otherwise ask verl ~100
    times, and a user's ``check`` on a verl example would too)."""
    from pytest_verl_compat.pipeline.answers import (
        CHECKS,
        EXAMPLES_PART,
        load_recorded,
        recorded_path,
    )
    from pytest_verl_compat.upstream.verdict.examples import recorded_answers

    if not release_ready():
        pytest.skip("the questions' tree is the installed verl's")
    recorded = load_recorded(recorded_path(GOLDEN, CHECKS, EXAMPLES_PART))
    now = recorded_answers(session, CASES, UPSTREAM)
    assert len(now) == sum(1 for entry in UPSTREAM.values() if UPSTREAM_ANSWER in entry)
    stale = sorted(set(now) ^ set(recorded))
    assert not stale, (
        f"{len(stale)} recorded answers are stale; re-record with "
        "python -m pytest_verl_compat.upstream.verdict.examples"
    )
    assert recorded == now


def test_totals_are_the_recorded_ones() -> None:
    assert example_totals(RECORDED["scripts"]) == RECORDED["totals"]
    audit = json.loads((GOLDEN / "audit.json").read_text(encoding="utf-8"))
    assert audit["example_totals"] == RECORDED["totals"]


READ_CASES = [case for case in CASES if not (case.expected or {}).get("read_error")]


@pytest.mark.skipif(BASH is None or ENV is None, reason="bash and env are needed for the oracle")
@pytest.mark.parametrize("case", READ_CASES, ids=[case.id for case in READ_CASES])
def test_example_read_equals_bash(case: Case, upstream_checkout: Path, tmp_path: Path) -> None:
    """`verl-compat read` hands the launcher exactly the argv real bash hands it."""
    from pytest_verl_compat.bash import read_launch

    data = (upstream_checkout / str(case.launch)).read_bytes()
    bindings = case.bindings
    oracle = run_bash(data, tmp_path, bindings.variables, bindings.substitutions, bindings.args)
    if oracle.argv is None and any(
        sign in oracle.stderr for sign in ("cannot modify limit", "command not found")
    ):
        # The script runs a tool (hf download) or raises a limit this machine refuses; under
        # `set -e` bash stops there, while on a user's machine it would reach the launcher.
        pytest.skip(f"bash cannot run this script here: {oracle.stderr.strip().splitlines()[-1]}")
    assert oracle.argv is not None, f"bash exited {oracle.returncode}: {oracle.stderr}"
    argv = oracle.argv
    if "PWD" in bindings.variables:
        # bash resets PWD to the folder it runs in; the binding stands for that folder.
        argv = tuple(f.replace(str(tmp_path), bindings.variables["PWD"]) for f in argv)
    read = read_launch(
        upstream_checkout / str(case.launch),
        bindings,
        entry_modules=ReleaseModules.from_site(release_root()).accepts,
    )
    assert read.argv == argv
