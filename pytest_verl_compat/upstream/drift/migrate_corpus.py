"""``migrate`` over a folder of launch scripts, measured: what reads, composes, passes ``check``
on the target release before and after ``migrate --write`` (on copies in a temporary folder).

``python -m pytest_verl_compat.upstream.drift.migrate_corpus --from 0.8.0 EXAMPLES_DIR`` prints the
figures docs/releases.md quotes; ``--json FILE`` writes them per script. ``--bindings-from
corpus/examples.yaml`` reads each script with the environment that file gives the script of the
same path (the v0.9.0 examples' bindings, for scripts of another release's examples folder).
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_verl_compat.model import Bindings, Case, StageFailed, StageUnavailable
from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
from pytest_verl_compat.pipeline.manifest import load_examples
from pytest_verl_compat.pipeline.snapshot import dumps, write_atomic
from pytest_verl_compat.upstream.drift.migrate import MigrateError, migrate_script
from pytest_verl_compat.upstream.verdict.case import PinnedVerdict, pinned_verdicts


def _errors(verdict: PinnedVerdict | None) -> list[str]:
    return [f.line() for f in verdict.findings if f.level == "error"] if verdict else []


def _naming(errors: Sequence[str], keys: Sequence[str]) -> list[str]:
    """The error lines whose path is one of these keys or under one."""
    return [
        line
        for line in errors
        if any(
            path == key or path.startswith(key + ".")
            for path in line.split(" ", 1)[1].split(":", 1)[0].split(", ")
            for key in keys
        )
    ]


def measure(
    session: AuditSession,
    root: Path,
    source: str,
    target: str,
    work: Path,
    bindings: Mapping[str, Bindings] | None = None,
    *,
    upstream_checks: bool = True,
) -> dict[str, Any]:
    """Every ``*.sh`` under ``root/examples``, copied to ``work`` and migrated there."""
    scripts = sorted((root / "examples").rglob("*.sh"))
    cases: dict[str, Case] = {}
    for script in scripts:
        relative = script.relative_to(root).as_posix()
        copy = work / relative
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(script, copy)
        case = session.case_for_script(copy, (bindings or {}).get(relative))
        cases[relative] = dataclasses.replace(case, id=relative)
    read: dict[str, Case] = {}
    entries: dict[str, dict[str, Any]] = {}
    for relative, case in cases.items():
        try:
            session.outcome(case)
        except (StageFailed, StageUnavailable) as exc:
            entries[relative] = {"read": False, "reason": str(exc).replace(str(work) + "/", "")}
            continue
        read[relative] = case
    before = pinned_verdicts(session, read.values(), upstream_checks=upstream_checks)
    migrated: dict[str, Case] = {}
    for relative, case in read.items():
        composition = session.outcome(case).composition
        entry: dict[str, Any] = {
            "read": True,
            "composed": composition.composed,
            "errors_before": _errors(before.get(relative))
            if composition.composed
            else [f"ERROR <composition>: {composition.reason.splitlines()[0]}"],
        }
        entries[relative] = entry
        launched = session.entry_point(session.outcome(case).fields)
        if launched is not None:
            # migrate rewrites main_ppo launches (their tree's keys); another entry point's
            # script is measured (read, composed, judged) but not rewritten.
            entry["migrate_skipped"] = f"{launched.module}'s launch: migrate rewrites main_ppo's"
            continue
        try:
            migration = migrate_script(session, case, source, target)
        except MigrateError as exc:
            entry["migrate_error"] = str(exc)
            continue
        report = migration.report
        entry.update(
            edits=[
                {k: edit[k] for k in ("line", "key", "new_key", "kind", "evidence", "verified")}
                for edit in report["edits"]
            ],
            blocked=report["blocked"],
            changed_by_release=report["changed_by_release"],
            composed_after=report["target"]["composed"],
        )
        if migration.migrated is not None:
            write_atomic(Path(case.launch or ""), migration.migrated)
            after_case = session.case_for_script(Path(case.launch or ""), case.bindings)
            migrated[relative] = dataclasses.replace(after_case, id=f"{relative}@{target}")
    after = pinned_verdicts(session, migrated.values(), upstream_checks=upstream_checks)
    for relative, entry in entries.items():
        if not entry.get("read") or "edits" not in entry:
            continue
        moved = [edit["key"] for edit in entry["edits"]]
        if relative in migrated:
            case = migrated[relative]
            composition = session.outcome(case).composition
            errors_after = (
                _errors(after.get(case.id))
                if composition.composed
                else [f"ERROR <composition>: {composition.reason.splitlines()[0]}"]
            )
        else:
            errors_after = entry["errors_before"]
        entry["errors_after"] = errors_after
        entry["moved_key_errors"] = [
            len(_naming(entry["errors_before"], moved)),
            len(_naming(errors_after, moved)),
        ]
    return {"from": source, "to": target, "scripts": dict(sorted(entries.items()))}


def summary(measured: Mapping[str, Any]) -> list[str]:
    scripts = measured["scripts"]
    read = {k: v for k, v in scripts.items() if v["read"]}
    composed = [k for k, v in read.items() if v["composed"]]
    rejected = [k for k, v in read.items() if v["errors_before"]]
    edited = [k for k, v in read.items() if v.get("edits")]
    edits = sum(len(v.get("edits", [])) for v in read.values())
    unverified = sum(1 for v in read.values() for e in v.get("edits", []) if not e["verified"])
    fixed = [k for k in rejected if not scripts[k].get("errors_after")]
    lines = [
        f"{len(scripts)} scripts; {len(read)} read; {len(composed)} compose on verl "
        f"{measured['to']} as they are, {len(read) - len(composed)} do not; `check` rejects "
        f"{len(rejected)}",
        f"migrate --from {measured['from']} --write: {edits} edits in {len(edited)} scripts, "
        f"{unverified} not verified; {len(fixed)} of the {len(rejected)} rejected pass `check` "
        "after it",
    ]
    for key in rejected:
        entry = scripts[key]
        moved = entry.get("moved_key_errors", [0, 0])
        status = "composes" if entry.get("composed_after", entry["composed"]) else "rejected"
        lines.append(
            f"  {key}: {len(entry.get('edits', []))} edits; {status} on {measured['to']}; errors "
            f"{len(entry['errors_before'])} -> {len(entry.get('errors_after', entry['errors_before']))}"
            f" (on moved keys {moved[0]} -> {moved[1]})"
        )
        for item in entry.get("blocked", []):
            lines.append(f"    blocks: {item['key']}: {item['why']}: {item['evidence']}")
        remaining = [e for e in entry.get("errors_after", entry["errors_before"])]
        for error in remaining[:3]:
            lines.append(f"    still: {error[:160]}")
    for key, entry in read.items():
        for item in entry.get("changed_by_release", []):
            lines.append(
                f"  {key}: changed by the release: {item['key']}: {item['from']} -> {item['to']}"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_verl_compat.upstream.drift.migrate_corpus"
    )
    parser.add_argument("root", help="a folder holding examples/**/*.sh")
    parser.add_argument("--from", dest="source", required=True)
    parser.add_argument("--to", default=None)
    parser.add_argument("--upstream", default=None, help="the pinned verl checkout (optional)")
    parser.add_argument("--bindings-from", default=None, metavar="EXAMPLES_YAML")
    parser.add_argument("--json", default=None, metavar="FILE")
    parser.add_argument("--no-upstream-checks", action="store_true")
    args = parser.parse_args(argv)
    session = AuditSession.start(AuditOptions(upstream=args.upstream))
    assert session.manifest is not None, session.manifest_error
    bindings = None
    if args.bindings_from:
        bindings = {
            case.launch or "": case.bindings
            for case in load_examples(args.bindings_from, session.manifest.bindings)
        }
    with tempfile.TemporaryDirectory(prefix="verl-migrate-") as work:
        measured = measure(
            session,
            Path(args.root),
            args.source,
            args.to or session.pin.version,
            Path(work),
            bindings,
            upstream_checks=not args.no_upstream_checks,
        )
    if args.json:
        write_atomic(Path(args.json), dumps(measured))
    print("\n".join(summary(measured)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
