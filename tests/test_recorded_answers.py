"""The answers recorded for the embedded default (golden/answers/) are the answers of now.

The default audit reads upstream's answers from there before asking verl (pipeline/answers.py),
so a stale file would only make the audit slower, never wrong: its keys digest the question, the
installed packages and our code that asks. These tests keep it current all the same: every
question the audit asks has its recorded answer and no recorded answer is orphaned (fast), and
each recorded answer is what the oracle answers today (slow: it asks verl).
"""

from __future__ import annotations

import json
import shutil

import pytest
from corpus_facts import needs_release, skip_unless_built

from pytest_verl_compat.cli import recorded_answers
from pytest_verl_compat.conformance.plan import ConformanceCase
from pytest_verl_compat.pipeline.answers import (
    CHECKS,
    COMPOSE,
    CONFORMANCE,
    CONFORMANCE_RESULTS,
    KINDS,
    RECORDED,
    dumps_recorded,
    load_recorded,
    recorded_path,
)
from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession

pytestmark = needs_release()


@pytest.fixture(scope="module")
def session() -> AuditSession:
    return AuditSession.start(AuditOptions())


def test_every_question_of_the_default_audit_has_its_recorded_answer(
    session: AuditSession,
) -> None:
    asked = recorded_answers.questions(session)
    assert {kind: len(asked[kind]) > 0 for kind in RECORDED} == dict.fromkeys(RECORDED, True)
    assert recorded_answers.stale(session) == [], "run `verl-compat audit --write`"


@pytest.mark.filterwarnings("ignore:provider=hydra.searchpath:UserWarning")
def test_the_other_releases_recorded_answers_are_asked_now() -> None:
    """golden/releases/0.9.1/answers/ too: its corpus answers and its examples' answers under the
    keys check asks now (d066d08 moved the oracle-code digest and left four of them stale: every
    check --release 0.9.1 asked verl again, and nothing said so)."""
    from pytest_verl_compat.pipeline.answers import CHECKS as CHECK_KIND
    from pytest_verl_compat.pipeline.answers import EXAMPLES_PART
    from pytest_verl_compat.upstream.verdict.examples import example_cases
    from pytest_verl_compat.upstream.verdict.examples import recorded_answers as examples_answers

    skip_unless_built("0.9.1")
    other = AuditSession.start(AuditOptions(release="0.9.1"))
    assert recorded_answers.stale(other) == [], "run `verl-compat audit --write --release 0.9.1`"
    upstream = json.loads((other.golden_dir / "examples" / "upstream.json").read_text())
    now = examples_answers(other, example_cases(other), upstream)
    recorded = load_recorded(recorded_path(other.golden_dir, CHECK_KIND, EXAMPLES_PART))
    assert now and set(now) == set(recorded), "re-record the examples' answers for 0.9.1"


def test_a_changed_question_is_stale(session: AuditSession, tmp_path) -> None:  # type: ignore[no-untyped-def]
    golden = tmp_path / "golden"
    shutil.copytree(session.golden_dir, golden)
    for kind in RECORDED:
        entries = load_recorded(recorded_path(session.golden_dir, kind))
        if kind == CHECKS:
            entries.pop(sorted(entries)[0])  # a probe now asks one question more
        if kind == COMPOSE:
            entries["0" * 64] = {"ok": True, "resolved_sha256": None, "error": ""}
        path = recorded_path(golden, kind)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(dumps_recorded(kind, entries))
    other = AuditSession.start(AuditOptions(golden=str(golden)))
    lines = recorded_answers.stale(other)
    assert len(lines) == 2, lines
    assert "checks.json: 1 of" in lines[0] and "0 answers no question asks" in lines[0]
    assert "compose.json: 0 of" in lines[1] and "1 answers no question asks" in lines[1]


def test_the_recorded_files_are_byte_deterministic(session: AuditSession) -> None:
    for kind in RECORDED:
        path = recorded_path(session.golden_dir, kind)
        assert dumps_recorded(kind, load_recorded(path)) == path.read_bytes(), path
    # A compressed file carries no timestamp: the same answers give the same bytes on any day.
    answers = {"k": {"ok": True}}
    assert dumps_recorded(CONFORMANCE, answers) == dumps_recorded(CONFORMANCE, answers)
    assert b'"k"' in dumps_recorded(CONFORMANCE, answers)


@pytest.mark.slow
def test_each_recorded_answer_is_what_upstream_answers_now(session: AuditSession) -> None:
    """Asked afresh (the user cache of this run, else the oracle), every answer equals the
    recorded one, to the byte once serialised; a conformance result's measured errors, to the
    case's own tolerance (see ``same_result``)."""
    now = recorded_answers.record(session, fresh=True)
    cases = recorded_answers.questions(session)[CONFORMANCE_RESULTS]
    for kind in RECORDED:
        recorded = load_recorded(recorded_path(session.golden_dir, kind))
        assert sorted(now[kind]) == sorted(recorded), kind
        if kind == CONFORMANCE_RESULTS:
            different = [
                key
                for key in recorded
                if not same_result(recorded[key], now[kind][key], cases[key])
            ]
        else:
            different = [
                key
                for key in recorded
                if json.dumps(now[kind][key], sort_keys=True)
                != json.dumps(recorded[key], sort_keys=True)
            ]
        assert not different, f"{kind}: {len(different)} answers differ, e.g. {different[:3]}"


def test_write_keeps_an_answer_recorded_under_a_key_asked_now_and_asks_only_the_rest(
    session: AuditSession,
    tmp_path,  # type: ignore[no-untyped-def]
) -> None:
    """``audit --write`` after a change to one case asks only that case's questions: here one
    compose answer is missing (asked again: upstream's own answer comes back) and another is
    marked (kept as it is: its key says it is the answer of now, so it is not asked)."""
    golden = tmp_path / "golden"
    shutil.copytree(session.golden_dir, golden)
    path = recorded_path(golden, COMPOSE)
    entries = load_recorded(path)
    missing, marked = sorted(entries)[:2]
    answer = entries.pop(missing)
    entries[marked] = {**entries[marked], "error": "kept, not asked"}
    path.write_bytes(dumps_recorded(COMPOSE, entries))
    other = AuditSession.start(AuditOptions(golden=str(golden)))
    now = recorded_answers.record(other)
    assert now[COMPOSE][missing] == answer
    assert now[COMPOSE][marked]["error"] == "kept, not asked"
    for kind in RECORDED:
        assert sorted(now[kind]) == sorted(load_recorded(recorded_path(session.golden_dir, kind)))


# A conformance result's largest errors are |ours - upstream's| measured in float arithmetic:
# torch picks its CPU kernels by instruction set (AVX2, AVX-512, ...), and the last bits of a
# sum differ between them, so two machines measure 2.4e-07 and 4.8e-07 for the same case. The
# recorded file is read, never recomputed, by the audit (its reports are the same bytes on every
# machine); what must hold here is the verdict to the byte and the measurement to the case's
# tolerance.
MEASURED = ("max_abs_err", "max_grad_abs_err")


def same_result(recorded: dict, now: dict, case: ConformanceCase) -> bool:  # type: ignore[type-arg]
    verdict = [
        name
        for name in recorded
        if name not in MEASURED and (recorded["passed"] or name != "message")
    ]
    if any(recorded[name] != now[name] for name in verdict):
        return False
    return all(
        abs(recorded[name] - now[name]) <= case.atol + case.rtol * max(recorded[name], now[name])
        for name in MEASURED
    )


def test_a_conformance_result_is_the_same_to_its_tolerance_and_its_verdict_to_the_byte() -> None:
    case = ConformanceCase("c", "policy_loss", "vanilla", "f", "float32", rtol=1e-5, atol=1e-6)
    result = {
        "case_id": "c", "component": "policy_loss", "variant": "vanilla", "samples": 3,
        "max_abs_err": 2.384185791015625e-07, "max_grad_abs_err": 0.0, "passed": True,
        "message": "12 comparisons over 3 samples within rtol=1e-05, atol=1e-06 [c]",
    }  # fmt: skip
    assert same_result(result, {**result, "max_abs_err": 4.76837158203125e-07}, case)
    assert not same_result(result, {**result, "max_abs_err": 3e-06}, case)
    assert not same_result(result, {**result, "passed": False}, case)
    assert not same_result(result, {**result, "samples": 4}, case)


def _closure(starts: tuple[str, ...]) -> set[str]:
    """Every module of the package the ``starts`` import, directly or not (``test_architecture``'s
    reading of imports: at module level, in functions and for type checking alike)."""
    from test_architecture import PACKAGE, TRAINER, _dependencies, _modules

    modules = {**_modules(PACKAGE), **_modules(TRAINER)}
    seen: set[str] = set()
    todo = list(starts)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo.extend(_dependencies(modules[module], module, modules))
    return seen


# What the oracle process runs to answer each kind: its own module (cold, or forked from the warm
# template), the handlers of the kind.
_PROCESS = (
    "pytest_verl_compat.upstream.oracle.process",
    "pytest_verl_compat.upstream.oracle.warm_process",
)
ORACLE_ENTRIES = {
    CHECKS: (*_PROCESS, "pytest_verl_compat.upstream.probes.validate"),
    COMPOSE: _PROCESS,
    CONFORMANCE: (*_PROCESS, "pytest_verl_compat.conformance.reference_answers"),
}


@pytest.mark.parametrize("kind", KINDS)
def test_an_answer_key_digests_every_module_the_oracle_runs_for_it(kind: str) -> None:
    """A module the oracle imports but the key leaves out would let an answer outlive a change
    to the code that computed it."""
    from pytest_verl_compat.pipeline.answers import NOT_ASKING, ORACLE_CODE

    def covered(module: str) -> bool:
        path = module.replace(".", "/")
        return any(
            path == entry.removesuffix(".py") or path.startswith(entry.rstrip("/") + "/")
            for entry in ORACLE_CODE[kind]
        )

    closure = _closure(ORACLE_ENTRIES[kind])
    # The package's face and the shared vocabulary hold names, not computations.
    ignored = {"pytest_verl_compat", "pytest_verl_compat.model"}
    left_out = sorted(
        m
        for m in closure - ignored
        if not covered(m) and not any(m.replace(".", "/").startswith(n) for n in NOT_ASKING)
    )
    assert not left_out, f"{kind}: the key leaves out {left_out} (add them to ORACLE_CODE)"


def test_an_entry_points_answer_key_digests_every_module_its_probes_run() -> None:
    """The checks of another entry point than main_ppo run its probes module (``validate``
    names it): the entry's key digests that module's closure too, main_ppo's never needs to."""
    from pytest_verl_compat.pipeline.answers import ENTRY_CODE, ORACLE_CODE
    from pytest_verl_compat.upstream.probes.validate import ENTRY_PROBES

    assert set(ENTRY_PROBES) == set(ENTRY_CODE)
    for entry, probes in ENTRY_PROBES.items():
        closure = _closure((*ORACLE_ENTRIES[CHECKS], probes))
        code = ENTRY_CODE[entry]
        left_out = sorted(
            m
            for m in closure - {"pytest_verl_compat", "pytest_verl_compat.model"}
            if not any(
                m.replace(".", "/") == path.removesuffix(".py")
                or m.replace(".", "/").startswith(path.rstrip("/") + "/")
                for path in code
            )
        )
        assert not left_out, f"{entry}: the key leaves out {left_out} (add them to ENTRY_CODE)"
        assert probes.replace(".", "/") + ".py" not in ORACLE_CODE[CHECKS]


def test_a_conformance_result_key_digests_every_module_the_comparison_runs() -> None:
    """Our side of a conformance case is computed by what ``run_case`` imports: a module left
    out of ``OURS_CODE`` would let a recorded result outlive a change to our math."""
    from pytest_verl_compat.conformance.results import OURS_CODE

    closure = _closure(
        ("pytest_verl_compat.conformance.run", "pytest_verl_compat.conformance.results")
    )
    left_out = sorted(
        m
        for m in closure - {"pytest_verl_compat", "pytest_verl_compat.model"}
        if not any(
            m.replace(".", "/") == entry.removesuffix(".py")
            or m.replace(".", "/").startswith(entry + "/")
            for entry in OURS_CODE
        )
    )
    assert not left_out, f"the result key leaves out {left_out} (add them to OURS_CODE)"
