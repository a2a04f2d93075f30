"""The audit's test functions: one per stage, parametrized by corpus case.

They are ordinary test functions (not custom items) because syrupy's ``snapshot`` fixture
only serves ``pytest.Function`` items.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_verl_compat.model import (
    KEY_AUDIT_ENTRY,
    KEY_CASE,
    KEY_COMPILE_SECONDS,
    KEY_CONFORMANCE,
    KEY_FACTS,
    KEY_STAGE,
    Case,
    StageFailed,
    StageUnavailable,
)
from pytest_verl_compat.pipeline.audit import AuditSession
from pytest_verl_compat.pipeline.compose import count_leaves
from pytest_verl_compat.pipeline.pins import PinMismatch
from pytest_verl_compat.pipeline.snapshot import first_difference
from pytest_verl_compat.plugin.commands import accept_command, pin_command, shown_path
from pytest_verl_compat.plugin.golden import golden_extension, golden_orphans
from pytest_verl_compat.plugin.keys import KEY_GOLDEN_ORPHANS, audit_state_key, payload_key
from pytest_verl_compat.plugin.memory_stage import memory_findings
from pytest_verl_compat.plugin.nodes import NODE_PREFIX
from pytest_verl_compat.plugin.sft_stage import TestSFTStepConformance  # noqa: F401  # collected here
from pytest_verl_compat.plugin.shared import once_per_session, result_name
from pytest_verl_compat.plugin.state import AuditState
from pytest_verl_compat.upstream.oracle.trusted import TrustedCompositions


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize every stage test by the manifest's cases, ids from the manifest."""
    state = metafunc.config.stash[audit_state_key]
    session = state.session
    if "verl_case" in metafunc.fixturenames:
        params = [pytest.param(case, id=case.id) for case in session.cases]
        assert params or session.manifest_error, "the corpus manifest lists no cases"
        metafunc.parametrize("verl_case", params)
    if "conformance_case" in metafunc.fixturenames:
        # A manifest without a conformance file (a user's own corpus) has no conformance cases.
        cases = state.conformance_cases()
        metafunc.parametrize(
            "conformance_case",
            _case_params(
                [(case, case.id) for case in cases],
                "the manifest names no conformance file (the stage checks this "
                "plugin's math against verl's, not your scripts)",
            ),
        )
    if "step_case" in metafunc.fixturenames:
        from pytest_verl_compat.conformance.step.cases import step_case_ids

        # The step oracle trains the official cases, the derived cases the compiler must accept
        # and the step-only cases of corpus/step.yaml whose base the manifest has; a user's
        # corpus (no conformance file) has none.
        has_conformance = session.manifest is not None and session.manifest.conformance
        ids = step_case_ids(session) if has_conformance else []
        metafunc.parametrize(
            "step_case",
            _case_params(
                [(cid, cid) for cid in ids],
                "no official or accepted derived case to train (the manifest "
                "names no conformance file)",
            ),
        )


def _case_params(cases: list[tuple[Any, str]], empty_reason: str) -> list[Any]:
    """One param per (value, id); none, one skipped param that says why (pytest's own
    placeholder for an empty list reads "got empty parameter set")."""
    if cases:
        return [pytest.param(value, id=case_id) for value, case_id in cases]
    return [pytest.param(None, id="none", marks=pytest.mark.skip(reason=empty_reason))]


@pytest.fixture
def verl_state(request: pytest.FixtureRequest) -> AuditState:
    state: AuditState = request.config.stash[audit_state_key]
    return state


@pytest.fixture
def verl_audit(verl_state: AuditState) -> AuditSession:
    session = verl_state.session
    if session.manifest_error:
        pytest.fail(session.manifest_error, pytrace=False)
    return session


# Golden folders, one per stage that snapshots; orphans are looked for in each.
GOLDEN_STAGES = ("compose", "compile")
# JUnit property values are for people reading a CI page, not a transport.
MAX_PROPERTY_CHARS = 300


def _payload(request: pytest.FixtureRequest, key: str, value: Any) -> None:
    """A builtin value for the audit; it travels on the test report (see plugin/keys.py)."""
    request.node.stash.setdefault(payload_key, {})[key] = value


def _property(request: pytest.FixtureRequest, name: str, value: str | int | float | bool) -> None:
    """A short per-case JUnit property, where the JUnit family has a place for it.

    pytest's default family, xunit2, has no ``properties`` in a testcase (its schema rejects
    them); the per-case outcome is then a suite property (plugin/report.py).
    """
    if request.config.getini("junit_family") not in ("xunit1", "legacy"):
        return
    text = str(value)
    if len(text) > MAX_PROPERTY_CHARS:
        value = text[: MAX_PROPERTY_CHARS - 1] + "…"
    request.node.user_properties.append((name, value))


def _record(request: pytest.FixtureRequest, case: Case | str, stage: str, **facts: Any) -> None:
    """Per-case facts travel with the test report (also from xdist workers) to JUnit and JSON."""
    case_id = case if isinstance(case, str) else case.id
    payload = request.node.stash.setdefault(payload_key, {})
    if payload.get(KEY_CASE) is None:
        _property(request, KEY_CASE, case_id)
        _property(request, KEY_STAGE, stage)
    payload[KEY_CASE] = case_id
    payload[KEY_STAGE] = stage
    payload.setdefault(KEY_FACTS, {}).update(json.loads(json.dumps(facts)))
    for key, value in facts.items():
        if isinstance(value, str | int | float | bool):
            _property(request, key, value)


def _run(
    stage_call: Any, request: pytest.FixtureRequest | None = None, case: Case | None = None
) -> Any:
    """Turn stage exceptions into skips and failures with their message, no traceback.

    Inputs that no longer match their pins fail one stage of the case, with the command that
    re-pins them: the read stage when it runs, else the first stage that meets them; the case's
    other stages are skipped and point at it.
    """
    try:
        return stage_call()
    except StageUnavailable as exc:
        skipped, failure = str(exc), ""
    except StageFailed as exc:
        skipped, failure = "", str(exc)
        if isinstance(exc.__cause__, PinMismatch) and request is not None and case is not None:
            skipped, failure = _pin_mismatch(request, case, failure)
    # Outside the except blocks: pytest would print the stage exception as the failure's cause.
    if skipped:
        pytest.skip(skipped)
    pytest.fail(failure, pytrace=False)


def _pin_mismatch(request: pytest.FixtureRequest, case: Case, message: str) -> tuple[str, str]:
    """(skip reason, "") for a stage the read stage speaks for, else ("", the failure)."""
    read_node = f"{NODE_PREFIX}::test_read[{case.id}]"
    if request.node.name.startswith("test_read[") or not any(
        item.nodeid == read_node for item in request.session.items
    ):
        state: AuditState = request.config.stash[audit_state_key]
        command = pin_command(request.config, state.session)
        return "", f"{message}; review the change, then re-pin the manifest: {command}"
    return f"[{case.id}] its inputs changed since they were pinned ({read_node} says how)", ""


def test_read(verl_case: Case, verl_audit: AuditSession, request: pytest.FixtureRequest) -> None:
    """The launch script's literal arguments, without executing anything."""
    _record(request, verl_case, "read", inputs=[pin.path for pin in verl_case.inputs])
    fields = _run(lambda: verl_audit.read(verl_case), request, verl_case)
    _record(request, verl_case, "read", explicit_field_count=len(fields.fields))


def test_compose(
    verl_case: Case,
    verl_audit: AuditSession,
    verl_state: AuditState,
    request: pytest.FixtureRequest,
) -> None:
    """Hydra composition of the pinned tree with the explicit fields, resolved."""
    _record(request, verl_case, "compose")  # a failure below still counts as this stage's
    outcome = _run(lambda: verl_audit.outcome(verl_case), request, verl_case)
    composition = outcome.composition
    facts: dict[str, Any] = {
        "outcome": composition.outcome,
        "reason": composition.reason,
        "fields_source": outcome.fields_source,
        "explicit_fields": list(outcome.fields.fields),
        "input_sha256": ";".join(f"{p.path}={p.sha256}" for p in verl_case.inputs),
        "missing": list(composition.missing),
    }
    if composition.composed:
        facts["resolved_leaf_count"] = count_leaves(composition.resolved)
    _record(request, verl_case, "compose", **facts)
    if composition.composed:
        verl_state.prefetch_upstream(verl_case)
    expected = (verl_case.expected or {}).get("outcome")
    if expected == "composition_rejection" or not composition.composed:
        # Rejections are failures unless the manifest expects exactly this one.
        assert composition.outcome == (expected or "composed"), (
            f"outcome={composition.outcome} ({composition.reason}), but should be "
            f"{expected or 'composed'} [{verl_case.id}]"
        )


def test_compile(
    verl_case: Case, verl_audit: AuditSession, snapshot: Any, request: pytest.FixtureRequest
) -> None:
    """Every resolved leaf classified by the profile; the case accepted or rejected with a reason."""
    _record(request, verl_case, "compile")
    started = time.perf_counter()
    entry = _run(lambda: verl_audit.audit_entry(verl_case), request, verl_case)
    elapsed = time.perf_counter() - started
    _record(
        request,
        verl_case,
        "compile",
        outcome=entry["outcome"],
        **{f"leaves_{klass}": count for klass, count in entry["leaf_classes"].items()},
    )
    _payload(request, KEY_AUDIT_ENTRY, entry)
    _payload(request, KEY_COMPILE_SECONDS, round(elapsed, 3))
    expected = (verl_case.expected or {}).get("outcome", "accepted")
    assert entry["outcome"] == expected, (
        f"outcome={entry['outcome']} ({entry['reason']}), but should be {expected} [{verl_case.id}]"
    )
    found = {f"{f['level']}:{f['path']}" for f in entry["findings"]}
    missing = [want for want in (verl_case.expected or {}).get("findings", []) if want not in found]
    assert not missing, f"findings={sorted(found)}, but should include {missing} [{verl_case.id}]"
    report = verl_audit.compile(verl_case)
    if report is None:
        return  # nothing was composed, so there is no compile report to snapshot
    assert report.to_json() == snapshot.use_extension(
        golden_extension(
            verl_audit.golden_dir, "compile", accept_command(request.config), _baseline(verl_audit)
        )
    )


def test_verdict(
    verl_case: Case,
    verl_audit: AuditSession,
    verl_state: AuditState,
    request: pytest.FixtureRequest,
) -> None:
    """The verdict ``verl-compat check`` gives: static findings and upstream's own early checks.

    A case the manifest expects accepted must be valid for verl; ``expected.valid`` states the
    verdict outright, and every ``expected.findings`` entry must be among check's findings.
    """
    gate = verl_state.upstream_gate()
    if gate.tree is None:
        pytest.skip(gate.reason)
    _record(request, verl_case, "verdict")
    outcome = _run(lambda: verl_audit.outcome(verl_case), request, verl_case)
    if not outcome.composition.composed:
        pytest.skip("not composed: upstream's checks never see this case")
    result = _run(
        lambda: verl_state.check(verl_case),
        request,
        verl_case,
    )
    gpu = request.config.getoption("verl_corpus_gpu", None)
    memory, not_forecast = (
        memory_findings(
            outcome,
            gpu,
            verl_audit.version,
            verl_audit.entry_point(outcome.fields),
            verl_audit.composer(outcome.fields).key_followers(outcome.fields.fields),
        )
        if gpu
        else ([], "")
    )
    _record(
        request,
        verl_case,
        "verdict",
        valid=result.valid,
        runnable=result.runnable,
        check_findings=[finding.line() for finding in (*result.findings, *memory)],
        **({"memory": not_forecast or f"forecast on {gpu}"} if gpu else {}),
    )
    assert not result.upstream_skipped, f"upstream's checks did not run: {result.upstream_skipped}"
    expected = verl_case.expected or {}
    want = expected.get("valid")
    if want is None and expected.get("outcome", "accepted") == "accepted":
        want = True
    errors = [f.line() for f in result.findings if f.level == "error"]
    if want is not None:
        assert result.valid == want, (
            f"valid={result.valid} ({'; '.join(errors) or 'no error'}), but should be {want} "
            f"[{verl_case.id}]"
        )
    # A static finding upstream's own failure repeats counts: the same cause, said by verl.
    found = {f"{f.level}:{f.path}" for f in (*result.findings, *result.said_by_upstream)}
    missing = [w for w in expected.get("findings", []) if w not in found]
    assert not missing, f"findings={sorted(found)}, but should include {missing} [{verl_case.id}]"
    over = [f.line() for f in memory if f.level == "error"]
    assert want is False or not over, f"does not fit the {gpu}: {'; '.join(over)} [{verl_case.id}]"


def test_trusted(
    verl_case: Case,
    verl_audit: AuditSession,
    verl_state: AuditState,
    request: pytest.FixtureRequest,
) -> None:
    """In-process composition equals upstream's own entry point (values, types, key order)."""
    _record(request, verl_case, "trusted")  # a skip below still counts as this stage's
    trusted = verl_state.trusted()
    if not isinstance(trusted, TrustedCompositions):
        if verl_audit.options.trusted == "require" and "switched off" not in trusted:
            pytest.fail(trusted, pytrace=False)
        pytest.skip(trusted)
    outcome = _run(lambda: verl_audit.outcome(verl_case), request, verl_case)
    composition = outcome.composition
    if not composition.composed:
        # Never sent: a rejected case may carry what upstream's entry point must not see.
        pytest.skip(f"composition rejected ({composition.reason}): not sent to upstream")
    fields, variables = outcome.fields.fields, outcome.fields.environment(verl_case.bindings)
    module = outcome.fields.module
    result = trusted.result(fields, variables, module=module)
    _record(request, verl_case, "trusted", trusted_cached=result.cached, trusted_ok=result.ok)
    if result.refused:
        pytest.skip(result.error)
    assert result.ok, f"upstream entry point failed: {result.error} [{verl_case.id}]"
    if result.differs_from(composition.resolved):
        # Only a digest is kept: ask for the whole mapping to say where the two differ.
        whole = trusted.result(fields, variables, whole=True, module=module)
        difference = first_difference(composition.resolved, whole.resolved)
        pytest.fail(
            f"resolved mapping differs from upstream's entry point at {difference} "
            f"[{verl_case.id}]",
            pytrace=False,
        )


def test_snapshot(
    verl_case: Case, verl_audit: AuditSession, snapshot: Any, request: pytest.FixtureRequest
) -> None:
    """Explicit fields and the complete resolved mapping match the golden file."""
    _record(request, verl_case, "snapshot")
    payload = _run(lambda: verl_audit.golden_payload(verl_case), request, verl_case)
    _record(request, verl_case, "snapshot", golden=str(verl_audit.golden_path(verl_case).name))
    assert payload == snapshot.use_extension(
        golden_extension(
            verl_audit.golden_dir, "compose", accept_command(request.config), _baseline(verl_audit)
        )
    )


def test_upstream_tree(verl_audit: AuditSession, request: pytest.FixtureRequest) -> None:
    """The config tree is the pinned one, and composes to upstream's own generated reference."""
    if verl_audit.upstream is None:
        pytest.skip(f"no upstream config tree: {verl_audit.upstream_reason}")
    pin = verl_audit.pin
    _property(request, "verl_tree", verl_audit.upstream.describe())
    assert verl_audit.upstream.tree_sha256 == pin.tree_sha256, (
        f"tree_sha256={verl_audit.upstream.tree_sha256}, but should be {pin.tree_sha256} "
        f"(the pinned verl {pin.version} tree) [{verl_audit.upstream.config_dir}]; the profile is "
        f"not retargeted. `verl-compat drift --against {verl_audit.upstream.root}` reports the drift "
        "leaf by leaf; `verl-compat retarget` writes a new profile version to accept it"
    )
    generated_path = Path(verl_audit.upstream.config_dir) / "_generated_ppo_trainer.yaml"
    difference = verl_audit.generated_difference(generated_path)
    assert difference is None, (
        f"override-free composition differs from {generated_path.name} at {difference}"
    )


def test_golden_orphans(verl_audit: AuditSession, request: pytest.FixtureRequest) -> None:
    """Every golden file of every stage belongs to a case; --snapshot-update removes the others.

    Syrupy's own cleanup is off for these folders (it would delete the files of deselected
    cases); a file is an orphan here only when no manifest case has its id. The rest is syrupy's
    contract for unused snapshots: they fail the run unless ``--snapshot-warn-unused``;
    ``--snapshot-update`` deletes them unless ``--snapshot-no-cleanup``; the summary counts them
    and lists them on an update or with ``--snapshot-details``.
    """
    known = {case.id for case in verl_audit.cases}
    orphans = [
        path
        for stage in GOLDEN_STAGES
        for path in golden_orphans(verl_audit.golden_dir, stage, known)
    ]
    option = request.config.getoption
    update = bool(option("update_snapshots", False))
    delete = update and not option("no_cleanup", False)
    if delete:
        for path in orphans:
            path.unlink()
    shown = [shown_path(path) for path in orphans]
    if orphans:
        _payload(request, KEY_GOLDEN_ORPHANS, {"deleted": delete, "paths": shown})
    if orphans and not update and not option("warn_unused_snapshots", False):
        pytest.fail(
            f"golden files without a case: {', '.join(shown)} "
            f"(run {accept_command(request.config)} to delete them)",
            pytrace=False,
        )


def _baseline(session: AuditSession) -> tuple[Path, str, str] | None:
    """The manifest's own release's golden folder, when the release checked is another."""
    if session.golden_dir == session.corpus_golden_dir or session.manifest is None:
        return None
    base = session.manifest.upstream.version
    return session.corpus_golden_dir, f"verl {base}", f"verl {session.version}"


def test_conformance(
    conformance_case: Any, verl_state: AuditState, request: pytest.FixtureRequest
) -> None:
    """Our reference math equals upstream verl's, values and gradients, within the case's tolerance."""
    from pytest_verl_compat.conformance.plan import comparison_missing_reason

    missing = comparison_missing_reason(verl_state.session.version)
    if missing:
        pytest.skip(missing)
    result = verl_state.conformance_results.get(conformance_case)
    if result is None:
        from pytest_verl_compat.conformance.run import run_case

        # Upstream's side from the oracle process, which has verl imported already.
        references = verl_state.conformance_references()
        result = _run(
            lambda: run_case(
                conformance_case,
                reference=references,
                candidate=references.candidate if references is not None else None,
            )
        )
        verl_state.conformance_results.put(conformance_case, result)
    _payload(
        request,
        KEY_CONFORMANCE,
        {
            "component": result.component,
            "variant": result.variant,
            "case": result.case_id,
            "samples": result.samples,
            "max_abs_err": float(result.max_abs_err),
            "max_grad_abs_err": float(result.max_grad_abs_err),
            "passed": bool(result.passed),
            "rtol": conformance_case.rtol,
            "atol": conformance_case.atol,
        },
    )
    _property(request, "max_abs_err", float(result.max_abs_err))
    if not result.passed:
        pytest.fail(result.message, pytrace=False)


def test_conformance_tolerances(verl_audit: AuditSession, verl_state: AuditState) -> None:
    """The conformance tolerance file is readable and every known divergence matches a case."""
    verl_state.conformance_cases()
    assert not verl_state.conformance_error, verl_state.conformance_error


class TestStepConformance:
    """The step oracle (`conformance/step/`): the official cases, the derived cases the compiler
    accepts and the step-only cases of `corpus/step.yaml` (several steps, two data-parallel
    ranks, every setting the others leave at verl's default), each in its optimizer variants,
    with one upstream subprocess per session for the one-rank cases (under xdist too:
    `plugin/shared.py`) and one process per rank for the two-rank case.

    Derived cases whose step settings equal another case's (`plan.upstream_key`: group
    filtering, which V1 applies while sampling, before a batch exists; legacy no-op fields)
    share that case's upstream run and still run our side from their own lowered config.
    Measured on 2 shared cores: see benchmarks/README.md (bench_step.py). "conformance" in the
    class name keeps it out of `-k "not conformance"` runs, like the function-level stage. (No
    `slow` mark: a plugin user's project has no such marker.)
    """

    def test_step(
        self,
        step_case: str,
        verl_audit: AuditSession,
        request: pytest.FixtureRequest,
        tmp_path_factory: pytest.TempPathFactory,
    ) -> None:
        """The reference trainer's training steps equal verl's V1 engine steps."""
        from pytest_verl_compat.conformance.plan import comparison_missing_reason
        from pytest_verl_compat.conformance.step.run import case_failures

        if not request.config.getoption("verl_corpus_step"):
            pytest.skip("the step stage runs with --verl-corpus-step (about 4 minutes)")
        missing = comparison_missing_reason(verl_audit.version)
        if missing:
            pytest.skip(missing)
        # Every selected step case in one upstream subprocess (verl is imported once).
        selected = sorted(
            {
                item.callspec.params["step_case"]
                for item in request.session.items
                if getattr(item, "originalname", "") == "test_step" and hasattr(item, "callspec")
            }
            | {step_case}
        )
        outcome = once_per_session(
            request.config,
            tmp_path_factory,
            result_name("step", selected),
            lambda: _step_outcome(verl_audit, selected),
        )
        if outcome.get("error"):
            pytest.fail(outcome["error"], pytrace=False)
        entry = outcome["report"][step_case]
        if isinstance(entry, str):  # the case's config, not the oracle, failed
            pytest.fail(entry, pytrace=False)
        _record(request, step_case, "step", step=json.dumps(entry, sort_keys=True))
        failures = case_failures(entry)
        assert not failures, f"step differs from upstream: {'; '.join(failures)} [{step_case}]"


def _step_outcome(verl_audit: AuditSession, selected: list[str]) -> dict[str, Any]:
    """The step report of `selected` as plain JSON: case → its entry, or why it has none.

    A case whose lowered config fails (the compiler did not accept it) fails alone; an oracle
    that did not run fails every case with its message.
    """
    from pytest_verl_compat.conformance.step.cases import step_case
    from pytest_verl_compat.conformance.step.run import StepOracleError, run_steps
    from pytest_verl_compat.releases.index import ReleaseError
    from pytest_verl_compat.upstream.oracle.runner import release_runner

    cases = []
    report: dict[str, Any] = {}
    for cid in selected:
        try:
            cases.append(step_case(verl_audit, cid))
        except (StageFailed, StageUnavailable, ValueError) as exc:
            report[cid] = str(exc)
    try:
        report.update(run_steps(cases, release_runner(verl_audit.version)) if cases else {})
    except (StepOracleError, ReleaseError) as exc:
        return {"error": str(exc)}
    # As a worker under xdist reads it from JSON, so without xdist too.
    outcome: dict[str, Any] = json.loads(json.dumps({"report": report}))
    return outcome
