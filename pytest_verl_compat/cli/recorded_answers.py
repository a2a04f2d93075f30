"""What is recorded for a corpus (``golden/answers/``): upstream's answers to its audit, and the
conformance stage's results.

The default audit asks upstream two kinds of question for its cases (``pipeline.answers``): its
checks on every composed case (the verdict stage) and its entry point's composition of every case
(the trusted stage); its conformance stage compares our math with upstream's on every case of the
tolerance file. ``questions`` lists them by key, exactly as the stages key them (a conformance
case by its result's key, ``conformance.results``); ``record`` answers them (the user cache,
else one oracle process for all; our side of the conformance cases in this process) and
``verl-compat audit --write`` writes them beside the golden files; ``audit --check`` fails when
the recorded keys are not the keys asked now (a probe, the tree, a case, our code or a package
changed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pytest_verl_compat.conformance.plan import (
    ConformanceCase,
    conformance_cases,
    load_tolerances,
    upstream_missing_reason,
)
from pytest_verl_compat.conformance.results import result_key
from pytest_verl_compat.model import StageFailed, StageUnavailable
from pytest_verl_compat.pipeline.answers import (
    CHECKS,
    COMPOSE,
    CONFORMANCE_RESULTS,
    RECORDED,
    dumps_recorded,
    load_recorded,
    recorded_path,
    stale_keys,
)
from pytest_verl_compat.pipeline.audit import AuditSession
from pytest_verl_compat.pipeline.snapshot import write_atomic_bytes
from pytest_verl_compat.upstream.oracle.client import EntryArgvRefused, UpstreamOracle
from pytest_verl_compat.upstream.oracle.client import compose_request as entry_request
from pytest_verl_compat.upstream.oracle.runner import referenced_variables
from pytest_verl_compat.upstream.oracle.trusted import TrustedCompositions, trusted_answers
from pytest_verl_compat.upstream.oracle.trusted import cache_key as compose_key
from pytest_verl_compat.upstream.verdict.case import upstream_question
from pytest_verl_compat.upstream.verdict.early import (
    ChecksQuestion,
    check_answers,
    early_answer,
    upstream_gate,
)

# The oracle process imports these to answer the conformance questions.
_SERVED = ("pytest_verl_compat.conformance.reference_answers",)


class NotRecordable(RuntimeError):
    """Upstream's code cannot see this session's compositions (the reason says why)."""


def questions(session: AuditSession) -> dict[str, dict[str, Any]]:
    """Everything the session's audit would record, by kind, then by key: a ``checks`` question
    as the oracle's request, a ``compose`` one as the fields and variables the trusted stage
    sends, a conformance case as itself."""
    gate = upstream_gate(session)
    if gate.tree is None:
        raise NotRecordable(gate.reason)
    asked: dict[str, dict[str, Any]] = {kind: {} for kind in RECORDED}
    for case in session.cases:
        try:
            outcome = session.outcome(case)
        except (StageFailed, StageUnavailable):  # a case that is not read asks nothing
            continue
        if not outcome.composition.composed:
            continue
        question = upstream_question(session, case)
        if not isinstance(question, str):
            asked[CHECKS][question.key(session.pin.version, gate.tree)] = question.request()
        fields = outcome.fields.fields
        variables = referenced_variables(fields, outcome.fields.environment(case.bindings))
        module = outcome.fields.module
        try:
            entry_request(fields, variables, module)
        except EntryArgvRefused:
            continue  # never sent: the trusted stage skips it
        asked[COMPOSE][compose_key(session.version, gate.tree, fields, variables, module)] = {
            "fields": list(fields),
            "variables": variables,
            "module": module,
        }
    manifest = session.manifest
    if (
        manifest is not None
        and manifest.conformance is not None
        and not upstream_missing_reason(session.version)
    ):
        for conformance in conformance_cases(load_tolerances(manifest.conformance)):
            asked[CONFORMANCE_RESULTS][result_key(conformance, session.version)] = conformance
    return asked


def record(session: AuditSession, *, fresh: bool = False) -> dict[str, dict[str, Any]]:
    """The answer to every question of ``questions``: an answer already recorded under its key
    (unless ``fresh``), else upstream's from the user cache or one oracle process, and the
    conformance results by comparing both sides here.

    A key digests the question, the installed packages and every module that answers it
    (``pipeline.answers``), so a recorded answer under a key asked now is the answer of now:
    after a change to one case only that case's questions are asked. ``fresh`` asks them all
    (``tests/test_recorded_answers.py`` holds the recorded files to that)."""
    from pytest_verl_compat.conformance.reference_answers import (
        OracleReferences,
        reference_answers,
    )
    from pytest_verl_compat.conformance.run import run_case

    asked = questions(session)
    recorded: dict[str, dict[str, Any]] = {kind: {} for kind in RECORDED}
    if not fresh:
        for kind in RECORDED:
            kept = load_recorded(recorded_path(session.golden_dir, kind))
            recorded[kind] = {key: kept[key] for key in asked[kind] if key in kept}
            asked[kind] = {k: q for k, q in asked[kind].items() if k not in recorded[kind]}
    if not any(asked.values()):
        return recorded
    gate = upstream_gate(session)
    assert gate.tree is not None
    checks = check_answers(None)
    oracle = UpstreamOracle(workers=2, served=_SERVED, release=session.version)
    references = OracleReferences(oracle, reference_answers(None))
    try:
        trusted = TrustedCompositions(oracle, gate.tree, trusted_answers(None))
        for key, question in asked[CHECKS].items():
            if checks.get(key) is None:
                oracle.submit(key, question)
        for question in asked[COMPOSE].values():
            trusted.prefetch(question["fields"], question["variables"], question["module"])
        cases: list[ConformanceCase] = list(asked[CONFORMANCE_RESULTS].values())
        for case in cases:
            references.prefetch(case)
        for key, question in asked[CHECKS].items():
            answer = early_answer(
                session, ChecksQuestion.from_request(question), gate.tree, checks, oracle
            )
            recorded[CHECKS][key] = answer.to_json()
        for key, question in asked[COMPOSE].items():
            result = trusted.result(
                question["fields"], question["variables"], module=question["module"]
            )
            recorded[COMPOSE][key] = {
                "ok": result.ok,
                "resolved_sha256": result.resolved_sha256,
                "error": result.error,
            }
        for key, case in asked[CONFORMANCE_RESULTS].items():
            outcome = run_case(case, reference=references, candidate=references.candidate)
            recorded[CONFORMANCE_RESULTS][key] = dataclasses.asdict(outcome)
    finally:
        oracle.close()
    return recorded


def write(session: AuditSession, recorded: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Write each kind's recorded file beside the golden files; the paths written."""
    written = []
    for kind in RECORDED:
        path = recorded_path(session.golden_dir, kind)
        write_atomic_bytes(path, dumps_recorded(kind, recorded.get(kind, {})))
        written.append(str(path))
    return written


def stale(session: AuditSession) -> list[str]:
    """What is stale in the recorded files: a question asked now without an answer, or an
    answer no question asks any more (one line per kind)."""
    asked = questions(session)
    lines = []
    for kind in RECORDED:
        path = recorded_path(session.golden_dir, kind)
        missing, unused = stale_keys(load_recorded(path), asked[kind])
        if missing or unused:
            lines.append(
                f"{path}: {len(missing)} of {len(asked[kind])} questions without an answer, "
                f"{len(unused)} answers no question asks"
            )
    return lines
