"""``verl-compat audit``: the audit JSON of every case, without pytest."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pytest_verl_compat.cli.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_USAGE,
    INPUT_ERRORS,
    one_line,
    open_session,
    say,
)
from pytest_verl_compat.cli.output import note
from pytest_verl_compat.files.safe_input import load_json_file, read_text
from pytest_verl_compat.pipeline.audit import AuditSession
from pytest_verl_compat.pipeline.report import build_audit, summary_lines
from pytest_verl_compat.pipeline.snapshot import dumps, leaf_diff, write_atomic


def cmd_audit(args: argparse.Namespace) -> int:
    """Regenerate the audit JSON; with --check, compare it byte for byte with the golden one."""
    session = open_session(args)
    entries = []
    # A case whose input cannot be read is reported (one line each) and left out; the others
    # are still audited and written, and the command exits 2.
    unreadable = 0
    for case in session.cases:
        try:
            entries.append(session.audit_entry(case))
        except INPUT_ERRORS as exc:
            say("audit", one_line(str(exc)))
            unreadable += 1
    if unreadable and args.check:
        say("audit", f"{unreadable} cases unreadable; nothing compared")
        return EXIT_USAGE
    audit = build_audit(session, entries)
    text = dumps(audit)
    golden = session.golden_dir / "audit.json"
    # The summary is a message: stdout holds only the JSON (`verl-compat audit | python -m json.tool`).
    for line in summary_lines(audit["totals"], audit.get("example_totals")):
        print(line, file=sys.stderr)
    if args.check:
        committed = read_text(golden, what="golden audit") if golden.is_file() else None
        status = EXIT_OK
        if committed != text:
            old = load_json_file(golden, what="golden audit") if committed is not None else {}
            say("audit", f"{golden} is out of date:")
            for line in leaf_diff(old, json.loads(text)):
                print(f"  {line}", file=sys.stderr)
            status = EXIT_FINDINGS
        else:
            note("audit", f"{golden} is up to date")
        if _recorded_answers_stale(session):
            status = EXIT_FINDINGS
        if status != EXIT_OK:
            print("run `verl-compat audit --write` to accept", file=sys.stderr)
        return status
    target = Path(args.json) if args.json else (golden if args.write else None)
    if target is None:
        sys.stdout.write(text)
    else:
        write_atomic(target, text)
        note("audit", f"wrote {target}")
    if args.write:
        _write_recorded_answers(session)
    if unreadable:
        say(
            "audit", f"{unreadable} of {len(session.cases)} cases unreadable, left out of the audit"
        )
        return EXIT_USAGE
    return EXIT_OK


def add_audit_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    audit = sub.add_parser(
        "audit", parents=[common], help="print the audit JSON of every case (no pytest)"
    )
    mode = audit.add_mutually_exclusive_group()
    mode.add_argument(
        "--check",
        action="store_true",
        help="compare with golden/audit.json byte for byte, and the recorded answers' keys with "
        "the questions the audit asks upstream now",
    )
    mode.add_argument(
        "--write",
        action="store_true",
        help="write golden/audit.json and upstream's answers to the audit (golden/answers/)",
    )
    mode.add_argument("--json", metavar="FILE", help="write the audit JSON to FILE")
    audit.set_defaults(func=cmd_audit)


def _recorded_answers_stale(session: AuditSession) -> bool:
    """Whether the recorded answers miss a question the audit asks now, or keep one it no
    longer asks (said on stderr); without the installed verl they are not compared."""
    from pytest_verl_compat.cli import recorded_answers

    try:
        lines = recorded_answers.stale(session)
    except recorded_answers.NotRecordable as exc:
        note("audit", f"recorded answers not compared: {exc}")
        return False
    for line in lines:
        say("audit", f"{line} (stale)")
    if not lines:
        note("audit", "recorded answers are up to date")
    return bool(lines)


def _write_recorded_answers(session: AuditSession) -> None:
    """Record upstream's answers to the audit's questions (``golden/answers/``)."""
    from pytest_verl_compat.cli import recorded_answers

    try:
        recorded = recorded_answers.record(session)
    except recorded_answers.NotRecordable as exc:
        say("audit", f"upstream's answers not recorded: {exc}")
        return
    for path in recorded_answers.write(session, recorded):
        note("audit", f"wrote {path}")
