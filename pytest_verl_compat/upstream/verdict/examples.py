"""Upstream's own composition of every example script, recorded once into a data file.

``python -m pytest_verl_compat.upstream.verdict.examples --upstream PATH --write`` reads each
script of ``corpus/examples.yaml`` and runs ``python -m verl.trainer.main_ppo --cfg job --resolve``
with the same argv through ``runner.run_module`` (a sandboxed subprocess, ~12 s each). The file
keeps, per script, the argv's sha256, whether upstream composed it, and the sha256 of the resolved
mapping it printed; the test suite compares our in-process composition with it without starting
109 subprocesses. Upstream's answers to ``check``'s questions on the composed scripts are also
written under the keys ``check`` asks them by (``golden/answers/checks-examples.json``, beside
the corpus's ``checks.json``), so that ``check``, the plugin and the suite find every verl
example's answer without importing verl; ``tests/test_examples.py`` fails when a key is stale.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_verl_compat.model import Case, StageFailed, StageUnavailable
from pytest_verl_compat.pipeline.answers import (
    CHECKS,
    EXAMPLES_PART,
    dumps_recorded,
    mapping_digest,
    recorded_path,
)
from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
from pytest_verl_compat.pipeline.entry_points import UnknownEntryPoint
from pytest_verl_compat.pipeline.manifest import default_examples_path, load_examples
from pytest_verl_compat.pipeline.report import EXAMPLES_AUDIT, example_totals
from pytest_verl_compat.pipeline.snapshot import dumps, write_atomic, write_atomic_bytes
from pytest_verl_compat.upstream.oracle.client import UpstreamOracle
from pytest_verl_compat.upstream.oracle.runner import referenced_variables, release_runner
from pytest_verl_compat.upstream.oracle.trusted import printed_config
from pytest_verl_compat.upstream.verdict.early import early_answer, upstream_gate

ENTRY_MODULE = "verl.trainer.main_ppo"
# Per composed script, upstream's answer to the probes (``EarlyAnswer.to_json``).
UPSTREAM_ANSWER = "upstream_answer"


# sha256 of a mapping as canonical JSON (key order kept: Hydra's order is part of the result).
digest = mapping_digest


def argv_digest(fields: tuple[str, ...] | list[str]) -> str:
    return digest(list(fields))


def example_cases(session: AuditSession, path: Path | None = None) -> tuple[Case, ...]:
    assert session.manifest is not None
    return load_examples(path or default_examples_path(), session.manifest.bindings)


def record(session: AuditSession, cases: tuple[Case, ...]) -> dict[str, dict[str, Any]]:
    """Read every case, then run upstream's entry point on all argvs in one sandboxed process."""
    recorded: dict[str, dict[str, Any]] = {}
    argvs: dict[str, tuple[str, ...]] = {}
    launches: list[dict[str, Any]] = []
    for case in cases:
        try:
            fields = session.outcome(case).fields
        except (StageFailed, StageUnavailable) as exc:
            if isinstance(exc.__cause__, UnknownEntryPoint):
                # Read; the module it launches is not in the release, so Python stops at once.
                recorded[case.id] = {"read": True, "composed": False, "error": str(exc.__cause__)}
            else:
                recorded[case.id] = {"read": False, "reason": str(exc).split(": ", 1)[-1]}
            continue
        argvs[case.id] = fields.fields
        launched = session.entry_point(fields)
        launches.append(
            {
                "module": launched.module if launched is not None else ENTRY_MODULE,
                "argv": list(fields.fields),
                # The folders its config's search path adds, as the launch from a verl
                # checkout's root finds them (a file://verl/... path of a config the script
                # selects with --config-name is relative to that root, not to the sandbox).
                "search_path": list(launched.search_path) if launched is not None else [],
                # Its @hydra.main arguments, for a module that does not import where the
                # oracle runs (entry_batch composes with Hydra's own hydra.main and says so).
                "decorator": (
                    [launched.config_dir, launched.config_name] if launched is not None else None
                ),
            }
        )
    variables: dict[str, str] = {}
    for case in cases:
        if case.id in argvs:
            variables.update(referenced_variables(argvs[case.id], case.bindings.variables))
    run = release_runner(session.version)(
        "pytest_verl_compat.upstream.oracle.entry_batch",
        stdin=json.dumps(launches),
        variables=variables,
        timeout=3600,
    )
    if run.returncode != 0:
        raise RuntimeError(f"upstream's entry point batch failed:\n{run.stderr_tail(20)}")
    for (case_id, argv), result in zip(argvs.items(), json.loads(run.stdout), strict=True):
        entry: dict[str, Any] = {"read": True, "argv_sha256": argv_digest(argv)}
        if result["code"] != 0:
            entry.update(composed=False, error=result["error"])
        else:
            entry.update(composed=True, resolved_sha256=digest(printed_config(result["stdout"])))
        if result.get("via"):
            entry["via"] = f"{result['via']}: composed by hydra.main with its decorator's config"
        recorded[case_id] = entry
    by_id = {case.id: case for case in cases}
    composed = [cid for cid, entry in recorded.items() if entry.get("composed")]
    for case_id, answer in _early_answers(session, [by_id[cid] for cid in composed]).items():
        recorded[case_id][UPSTREAM_ANSWER] = answer
    return recorded


def answer_keys(session: AuditSession, cases: tuple[Case, ...]) -> dict[str, str]:
    """Each composed script's question key, as ``check`` asks it (case id → key)."""
    from pytest_verl_compat.upstream.verdict.case import upstream_question

    gate = upstream_gate(session)
    if gate.tree is None:
        raise RuntimeError(f"upstream's checks cannot run: {gate.reason}")
    keys = {}
    for case in cases:
        try:
            composition = session.outcome(case).composition
        except (StageFailed, StageUnavailable):
            continue
        if composition.composed and composition.resolved is not None:
            question = upstream_question(session, case)
            if not isinstance(question, str):
                keys[case.id] = question.key(session.pin.version, gate.tree)
    return keys


def recorded_answers(
    session: AuditSession, cases: tuple[Case, ...], recorded: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """The recorded answers file of the examples (``golden/answers/checks-examples.json``):
    each composed script's answer under the key ``check`` looks it up by, so that ``check``, the
    plugin and the matrix find every verl example's answer without asking verl."""
    keys = answer_keys(session, cases)
    return {
        key: recorded[case_id][UPSTREAM_ANSWER]
        for case_id, key in sorted(keys.items())
        if UPSTREAM_ANSWER in recorded.get(case_id, {})
    }


def _early_answers(session: AuditSession, cases: list[Case]) -> dict[str, dict[str, Any]]:
    """Upstream's own code (the probes) on each composed script, through the oracle (as ``check``
    asks it, all questions sent first so both workers stay busy): the answer as ``check``'s cache
    keeps it, so that ``example_entry`` judges the script by the same code."""
    from pytest_verl_compat.upstream.verdict.case import upstream_question

    gate = upstream_gate(session)
    if gate.tree is None:
        raise RuntimeError(f"upstream's checks cannot run: {gate.reason}")
    version = session.pin.version
    questions = {}
    for case in cases:
        composition = session.outcome(case).composition
        if composition.composed and composition.resolved is not None:
            question = upstream_question(session, case)
            if not isinstance(question, str):
                questions[case.id] = question
    oracle = UpstreamOracle(workers=2, release=version)
    try:
        for question in questions.values():
            oracle.submit(question.key(version, gate.tree), question.request())
        answers = {
            case_id: early_answer(session, question, gate.tree, None, oracle).to_json()
            for case_id, question in questions.items()
        }
    finally:
        oracle.close()
    return answers


def example_entry(
    session: AuditSession, case: Case, answer: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """One example script: read, composed, valid for the pinned verl, runnable by the trainer,
    judged by ``check_case`` (``verl-compat check``'s own code) with upstream's answer as
    recorded (``golden/examples/upstream.json``), so the file needs no oracle to be checked."""
    from pytest_verl_compat.upstream.verdict.case import check_case, recorded_asker

    entry: dict[str, Any] = {"id": case.id}
    try:
        outcome = session.outcome(case)
    except StageFailed as exc:
        if isinstance(exc.__cause__, UnknownEntryPoint):
            # Read: the launch runs a module the release lacks, which Python refuses at once.
            return {**entry, "read": True, "composed": False, "reason": str(exc.__cause__)}
        return {**entry, "read": False, "reason": str(exc).split(": ", 1)[-1]}
    composition = outcome.composition
    entry.update(read=True, composed=composition.composed)
    if not composition.composed:
        return {**entry, "reason": composition.reason.splitlines()[0]}
    result = check_case(session, case, recorded_asker(answer))
    return {
        **entry,
        "valid": result.valid,
        "runnable": result.runnable,
        "errors": [f.line() for f in result.findings if f.level == "error"],
        "warnings": sum(1 for f in result.findings if f.level == "warning"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_verl_compat.upstream.verdict.examples")
    parser.add_argument("--upstream", required=True, help="a verl checkout with examples/")
    parser.add_argument(
        "--release", help="the release to check them against (default: the checkout's)"
    )
    parser.add_argument(
        "--out",
        help="the JSON file to write (default: the release's golden examples/upstream.json)",
    )
    parser.add_argument("--only", action="append", help="record only these case ids")
    parser.add_argument(
        "--audit",
        metavar="PATH",
        nargs="?",
        const="",
        help="also write the per-script verdicts and totals (default: the release's golden "
        "examples/audit.json) from it",
    )
    args = parser.parse_args(argv)
    session = AuditSession.start(AuditOptions(upstream=args.upstream, release=args.release))
    if session.release is None:
        raise SystemExit(session.release_error)
    out = Path(args.out) if args.out else session.golden_dir / "examples" / "upstream.json"
    recorded: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {}
    cases = tuple(c for c in example_cases(session) if not args.only or c.id in args.only)
    recorded.update(record(session, cases))
    write_atomic(out, dumps(dict(sorted(recorded.items()))))
    composed = sum(1 for entry in recorded.values() if entry.get("composed"))
    print(f"wrote {out}: {len(recorded)} scripts, {composed} composed by upstream")
    answers_file = recorded_path(session.golden_dir, CHECKS, EXAMPLES_PART)
    answers = recorded_answers(session, example_cases(session), recorded)
    write_atomic_bytes(answers_file, dumps_recorded(CHECKS, answers))
    print(f"wrote {answers_file}: {len(answers)} answers")
    if args.audit is not None:
        args.audit = args.audit or str(session.golden_dir / EXAMPLES_AUDIT)
        entries = [
            example_entry(session, case, recorded.get(case.id, {}).get(UPSTREAM_ANSWER))
            for case in example_cases(session)
        ]
        audit = {"scripts": entries, "totals": example_totals(entries)}
        write_atomic(Path(args.audit), dumps(audit))
        print(f"wrote {args.audit}: {audit['totals']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
