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
import yaml

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
from pytest_verl_compat.pipeline.pins import installed_verl_root, tree_sha256
from pytest_verl_compat.plugin.golden import golden_extension
from pytest_verl_compat.plugin.keys import audit_state_key
from pytest_verl_compat.plugin.state import AuditState
from pytest_verl_compat.upstream.trusted import first_difference, trusted_composition


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
        metafunc.parametrize("conformance_case", [pytest.param(c, id=c.id) for c in cases])
    if "step_case" in metafunc.fixturenames:
        # The step oracle trains the official cases; a user's corpus (no conformance file) has none.
        has_conformance = session.manifest is not None and session.manifest.conformance
        official = [c for c in session.cases if c.kind == "official"] if has_conformance else []
        metafunc.parametrize("step_case", [pytest.param(c, id=c.id) for c in official])


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


def _record(request: pytest.FixtureRequest, case: Case, stage: str, **facts: Any) -> None:
    """Per-case facts travel with the test report (also from xdist workers) to JUnit and JSON."""
    props = request.node.user_properties
    props.append((KEY_CASE, case.id))
    props.append((KEY_STAGE, stage))
    for key, value in facts.items():
        if isinstance(value, str | int | float | bool):
            props.append((key, value))
    props.append((KEY_FACTS, json.dumps(facts, sort_keys=True)))


def _run(stage_call: Any) -> Any:
    """Turn stage exceptions into skips and failures with their message, no traceback."""
    try:
        return stage_call()
    except StageUnavailable as exc:
        pytest.skip(str(exc))
    except StageFailed as exc:
        pytest.fail(str(exc), pytrace=False)


def test_read(verl_case: Case, verl_audit: AuditSession, request: pytest.FixtureRequest) -> None:
    """The launch script's literal arguments, without executing anything."""
    _record(request, verl_case, "read", inputs=[pin.path for pin in verl_case.inputs])
    fields = _run(lambda: verl_audit.read(verl_case))
    _record(request, verl_case, "read", explicit_field_count=len(fields.fields))


def test_compose(verl_case: Case, verl_audit: AuditSession, request: pytest.FixtureRequest) -> None:
    """Hydra composition of the pinned tree with the explicit fields, resolved."""
    outcome = _run(lambda: verl_audit.outcome(verl_case))
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
    started = time.perf_counter()
    entry = _run(lambda: verl_audit.audit_entry(verl_case))
    elapsed = time.perf_counter() - started
    props = request.node.user_properties
    props.append((KEY_CASE, verl_case.id))
    props.append((KEY_STAGE, "compile"))
    props.append(("outcome", entry["outcome"]))
    for klass, count in entry["leaf_classes"].items():
        props.append((f"leaves_{klass}", count))
    props.append((KEY_AUDIT_ENTRY, json.dumps(entry, sort_keys=True)))
    props.append((KEY_COMPILE_SECONDS, round(elapsed, 3)))
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
        golden_extension(verl_audit.golden_dir, "compile")
    )


def test_upstream_validate(
    verl_case: Case,
    verl_audit: AuditSession,
    verl_state: AuditState,
    request: pytest.FixtureRequest,
) -> None:
    """Upstream's own validate_config verdict next to ours; a difference must be explained in the manifest."""
    if installed_verl_root() is None:
        pytest.skip(f"upstream verl {verl_audit.pin.version} not installed")
    entry = _run(lambda: verl_audit.audit_entry(verl_case))
    if entry["outcome"] == "composition_rejection":
        pytest.skip("not composed: upstream's validate_config never sees this case")
    verdict = _run(
        lambda: verl_state.verdicts.verdict(verl_case, getattr(request.config, "cache", None))
    )
    ours = "passes" if entry["outcome"] == "accepted" else "fails"
    _record(
        request, verl_case, "upstream_validate", upstream_validate=verdict["verdict"], ours=ours
    )
    if verdict["verdict"] == ours:
        return
    upstream = verl_case.upstream or {}
    # A field case's recorded behaviour (fails late, silent, notice only) says validate_config passes.
    explained = upstream.get("validate_config") or (
        "passes" if upstream.get("behaviour") in {"fails late", "silent", "notice only"} else None
    )
    reason = upstream.get("why") or upstream.get("detail")
    assert explained == verdict["verdict"] and reason, (
        f"upstream validate_config {verdict['verdict']} ({verdict['message']}), but the compiler "
        f"{'accepted' if ours == 'passes' else 'rejected'} the case and the manifest explains no "
        f"difference [{verl_case.id}]"
    )


def test_trusted(verl_case: Case, verl_audit: AuditSession, request: pytest.FixtureRequest) -> None:
    """In-process composition equals upstream's own entry point (values, types, key order)."""
    mode = verl_audit.options.trusted
    if mode == "off":
        pytest.skip("trusted composition switched off (--verl-corpus-trusted=off)")
    installed = installed_verl_root()
    if installed is None or installed[1] != verl_audit.pin.version:
        reason = f"upstream verl {verl_audit.pin.version} not installed"
        if mode == "require":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    outcome = _run(lambda: verl_audit.outcome(verl_case))
    assert verl_audit.upstream is not None  # the outcome above needed the tree
    installed_tree = tree_sha256(installed[0] / verl_audit.pin.config_dir)
    composed_tree = verl_audit.upstream.tree_sha256
    if installed_tree != composed_tree:
        pytest.skip(
            f"installed verl's tree {installed_tree} is not the composed tree {composed_tree}"
        )
    result = trusted_composition(
        installed_tree,
        outcome.fields.fields,
        verl_case.bindings.variables,
        getattr(request.config, "cache", None),
    )
    _record(request, verl_case, "trusted", trusted_cached=result.cached, trusted_ok=result.ok)
    composition = outcome.composition
    if not composition.composed:
        assert not result.ok, (
            f"upstream entry point composed what Hydra's compose API rejected ({composition.reason}) "
            f"[{verl_case.id}]"
        )
        return
    assert result.ok, f"upstream entry point failed: {result.error} [{verl_case.id}]"
    difference = first_difference(composition.resolved, result.resolved)
    assert difference is None, (
        f"resolved mapping differs from upstream's entry point at {difference} [{verl_case.id}]"
    )


def test_snapshot(
    verl_case: Case, verl_audit: AuditSession, snapshot: Any, request: pytest.FixtureRequest
) -> None:
    """Explicit fields and the complete resolved mapping match the golden file."""
    payload = _run(lambda: verl_audit.golden_payload(verl_case))
    _record(request, verl_case, "snapshot", golden=str(verl_audit.golden_path(verl_case).name))
    assert payload == snapshot.use_extension(golden_extension(verl_audit.golden_dir, "compose"))


def test_upstream_tree(verl_audit: AuditSession, request: pytest.FixtureRequest) -> None:
    """The config tree is the pinned one, and composes to upstream's own generated reference."""
    if verl_audit.upstream is None:
        pytest.skip(f"no upstream config tree: {verl_audit.upstream_reason}")
    pin = verl_audit.pin
    request.node.user_properties.append(("verl_tree", verl_audit.upstream.describe()))
    assert verl_audit.upstream.tree_sha256 == pin.tree_sha256, (
        f"tree_sha256={verl_audit.upstream.tree_sha256}, but should be {pin.tree_sha256} "
        f"(the pinned verl {pin.version} tree) [{verl_audit.upstream.config_dir}]; the profile is "
        f"not retargeted. `verl-compat drift --against {verl_audit.upstream.root}` reports the drift "
        "leaf by leaf; `verl-compat retarget` writes a new profile version to accept it"
    )
    generated_path = Path(verl_audit.upstream.config_dir) / "_generated_ppo_trainer.yaml"
    generated = yaml.safe_load(generated_path.read_text(encoding="utf-8"))
    from omegaconf import OmegaConf

    composed = OmegaConf.to_container(verl_audit.composer().compose_config([]), resolve=False)
    assert isinstance(composed, dict)
    # The generated reference is printed from a tree where the engine is already chosen.
    composed.pop("model_engine", None)
    difference = first_difference(composed, generated)
    assert difference is None, (
        f"override-free composition differs from {generated_path.name} at {difference}"
    )


def test_golden_orphans(verl_audit: AuditSession) -> None:
    """Every golden file belongs to a case (syrupy's own cleanup is off for these folders)."""
    known = {verl_audit.golden_path(case) for case in verl_audit.cases}
    folder = verl_audit.golden_dir / "compose"
    orphans = (
        sorted(str(p) for p in folder.rglob("*.json") if p not in known) if folder.is_dir() else []
    )
    assert not orphans, f"golden files without a case (delete them): {orphans}"


def test_conformance(conformance_case: Any, request: pytest.FixtureRequest) -> None:
    """Our reference math equals upstream verl's, values and gradients, within the case's tolerance."""
    from pytest_verl_compat.conformance.plan import upstream_missing_reason
    from pytest_verl_compat.conformance.run import run_case

    missing = upstream_missing_reason()
    if missing:
        pytest.skip(missing)
    result = run_case(conformance_case)
    request.node.user_properties.append(
        (
            KEY_CONFORMANCE,
            json.dumps(
                {
                    "component": result.component,
                    "variant": result.variant,
                    "case": result.case_id,
                    "samples": result.samples,
                    "max_abs_err": result.max_abs_err,
                    "max_grad_abs_err": result.max_grad_abs_err,
                    "passed": result.passed,
                    "rtol": conformance_case.rtol,
                    "atol": conformance_case.atol,
                },
                sort_keys=True,
            ),
        )
    )
    if not result.passed:
        pytest.fail(result.message, pytrace=False)


def test_conformance_tolerances(verl_audit: AuditSession, verl_state: AuditState) -> None:
    """The conformance tolerance file is readable and every known divergence matches a case."""
    verl_state.conformance_cases()
    assert not verl_state.conformance_error, verl_state.conformance_error


_STEP_REPORTS: dict[tuple[str, ...], dict[str, Any]] = {}


class TestStepConformance:
    """The step oracle (`conformance/step_*.py`), about a minute and a half for the seven cases;
    "conformance" in the class name keeps it out of `-k "not conformance"` runs, like the
    function-level stage. (No `slow` mark: a plugin user's project has no such marker.)"""

    def test_step(
        self, step_case: Case, verl_audit: AuditSession, request: pytest.FixtureRequest
    ) -> None:
        """One training step of the reference trainer equals one of verl's V1 engine step."""
        from pytest_verl_compat.conformance.plan import upstream_missing_reason
        from pytest_verl_compat.conformance.step_run import (
            StepOracleError,
            case_failures,
            run_steps,
        )
        from pytest_verl_compat.upstream.runner import run_module

        missing = upstream_missing_reason()
        if missing:
            pytest.skip(missing)
        # Every selected step case in one upstream subprocess (verl is imported once).
        selected = tuple(
            sorted(
                item.callspec.params["step_case"].id
                for item in request.session.items
                if getattr(item, "originalname", "") == "test_step" and hasattr(item, "callspec")
            )
        ) or (step_case.id,)
        if selected not in _STEP_REPORTS:
            by_id = {c.id: c for c in verl_audit.cases}
            configs = {
                cid: _run(lambda c=by_id[cid]: verl_audit.reference_config(c)) for cid in selected
            }
            try:
                _STEP_REPORTS[selected] = run_steps(configs, run_module)
            except StepOracleError as exc:
                pytest.fail(str(exc), pytrace=False)
        entry = _STEP_REPORTS[selected][step_case.id]
        _record(request, step_case, "step", step=json.dumps(entry, sort_keys=True))
        failures = case_failures(entry)
        assert not failures, f"step differs from upstream: {'; '.join(failures)} [{step_case.id}]"
