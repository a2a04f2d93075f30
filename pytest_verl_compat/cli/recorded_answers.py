"""The answers recorded for a corpus (``golden/answers/``): what upstream answers its audit.

The default audit asks upstream three kinds of question (``pipeline.answers``): its checks on
every composed case (the verdict stage), its entry point's composition of every case (the trusted
stage) and its side of every conformance case. ``questions`` lists them by key, exactly as the
stages key them; ``record`` answers them (the user cache, else one oracle process for all) and
``verl-compat audit --write`` writes them beside the golden files; ``audit --check`` fails when
the recorded keys are not the keys asked now (a probe, the tree, a case or a package changed).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_verl_compat.conformance.plan import (
    conformance_cases,
    load_tolerances,
    upstream_missing_reason,
)
from pytest_verl_compat.conformance.reference_answers import (
    answer_key_of,
    oracle_answers,
    reference_answers,
)
from pytest_verl_compat.conformance.reference_answers import request as conformance_request
from pytest_verl_compat.pipeline.answers import (
    CHECKS,
    COMPOSE,
    CONFORMANCE,
    KINDS,
    dumps_recorded,
    load_recorded,
    recorded_path,
    stale_keys,
)
from pytest_verl_compat.pipeline.audit import AuditSession
from pytest_verl_compat.pipeline.snapshot import write_atomic_bytes
from pytest_verl_compat.upstream.early import cache_key, check_answers, early_answer, upstream_gate
from pytest_verl_compat.upstream.oracle import (
    EntryArgvRefused,
    UpstreamOracle,
    checks_request,
    compose_request,
)
from pytest_verl_compat.upstream.runner import referenced_variables
from pytest_verl_compat.upstream.trusted import TrustedCompositions, trusted_answers
from pytest_verl_compat.upstream.trusted import cache_key as compose_key
from pytest_verl_compat.upstream.verdict import explicit_keys

# The oracle process imports these to answer the conformance questions.
_SERVED = ("pytest_verl_compat.conformance.reference_answers",)


class NotRecordable(RuntimeError):
    """Upstream's code cannot see this session's compositions (the reason says why)."""


def questions(session: AuditSession) -> dict[str, dict[str, dict[str, Any]]]:
    """Every question the session's audit asks upstream, by kind, then by key (a ``compose``
    question as the fields and variables the trusted stage sends)."""
    gate = upstream_gate(session)
    if gate.tree is None:
        raise NotRecordable(gate.reason)
    asked: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in KINDS}
    for case in session.cases:
        try:
            outcome = session.outcome(case)
        except Exception:
            continue
        if not outcome.composition.composed:
            continue
        mapping = outcome.composition.mapping
        explicit = explicit_keys(session, case)
        asked[CHECKS][cache_key(session.pin.version, gate.tree, mapping, explicit)] = (
            checks_request(mapping, explicit=explicit)
        )
        fields = outcome.fields.fields
        variables = referenced_variables(fields, outcome.fields.environment(case.bindings))
        try:
            compose_request(fields, variables)
        except EntryArgvRefused:
            continue  # never sent: the trusted stage skips it
        asked[COMPOSE][compose_key(gate.tree, fields, variables)] = {
            "fields": list(fields),
            "variables": variables,
        }
    manifest = session.manifest
    if manifest is not None and manifest.conformance is not None and not upstream_missing_reason():
        for conformance in conformance_cases(load_tolerances(manifest.conformance)):
            if oracle_answers(conformance):
                asked[CONFORMANCE][answer_key_of(conformance)] = conformance_request(conformance)
    return asked


def record(session: AuditSession) -> dict[str, dict[str, Any]]:
    """The answer to every question of ``questions``, from the user cache or one oracle."""
    asked = questions(session)
    gate = upstream_gate(session)
    assert gate.tree is not None
    stores = {
        CHECKS: check_answers(None),
        COMPOSE: trusted_answers(None),
        CONFORMANCE: reference_answers(None),
    }
    oracle = UpstreamOracle(workers=2, served=_SERVED)
    try:
        trusted = TrustedCompositions(oracle, gate.tree, stores[COMPOSE])
        for kind, by_key in asked.items():
            for key, question in by_key.items():
                if kind == COMPOSE:
                    trusted.prefetch(question["fields"], question["variables"])
                elif stores[kind].get(key) is None:
                    oracle.submit(key, question)
        recorded: dict[str, dict[str, Any]] = {kind: {} for kind in KINDS}
        for key, question in asked[CHECKS].items():
            answer = early_answer(
                session,
                question["mapping"],
                gate.tree,
                stores[CHECKS],
                oracle,
                question.get("explicit", ()),
            )
            recorded[CHECKS][key] = answer.to_json()
        for key, question in asked[COMPOSE].items():
            result = trusted.result(question["fields"], question["variables"])
            recorded[COMPOSE][key] = {
                "ok": result.ok,
                "resolved_sha256": result.resolved_sha256,
                "error": result.error,
            }
        for key, question in asked[CONFORMANCE].items():
            entry = stores[CONFORMANCE].get(key)
            if entry is None:
                entry = oracle.answer(key, question)
                if not entry.get("ok"):
                    raise RuntimeError(f"upstream side of {key}: {entry.get('error')}")
                stores[CONFORMANCE].put(key, entry)
            recorded[CONFORMANCE][key] = entry
    finally:
        oracle.close()
    return recorded


def write(session: AuditSession, recorded: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Write each kind's recorded file beside the golden files; the paths written."""
    written = []
    for kind in KINDS:
        path = recorded_path(session.golden_dir, kind)
        write_atomic_bytes(path, dumps_recorded(kind, recorded.get(kind, {})))
        written.append(str(path))
    return written


def stale(session: AuditSession) -> list[str]:
    """What is stale in the recorded files: a question asked now without an answer, or an
    answer no question asks any more (one line per kind)."""
    asked = questions(session)
    lines = []
    for kind in KINDS:
        path = recorded_path(session.golden_dir, kind)
        missing, unused = stale_keys(load_recorded(path), asked[kind])
        if missing or unused:
            lines.append(
                f"{path}: {len(missing)} of {len(asked[kind])} questions without an answer, "
                f"{len(unused)} answers no question asks"
            )
    return lines
