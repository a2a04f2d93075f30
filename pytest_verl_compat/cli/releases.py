"""``verl-compat matrix`` and ``migrate``: scripts across the pinned verl releases."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from pytest_verl_compat.cli.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    add_bindings_flags,
    case_for_target,
    existing_file,
    flag_bindings,
    open_session,
    say,
)
from pytest_verl_compat.model import SCRIPT, Case

FORMATS = ("text", "json", "markdown")


def _session(args: argparse.Namespace) -> Any:
    """The session; without a located tree (no checkout, verl not installed), the pinned
    release's tree from its wheel, so the pinned column is still a composition and `check`'s
    static verdict."""
    from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
    from pytest_verl_compat.upstream.drift import ReleaseError, release_tree

    session = open_session(args)
    if session.upstream is not None or getattr(args, "upstream", None):
        return session
    try:
        root = release_tree(session.pin.version).root
    except ReleaseError as exc:
        raise UsageError(f"no config tree of the pinned release: {exc}") from exc
    return AuditSession.start(
        AuditOptions(
            manifest=getattr(args, "manifest", None), upstream=str(root), rootdir=str(Path.cwd())
        )
    )


def _versions(text: str) -> list[str]:
    versions = [part.strip() for part in text.split(",") if part.strip()]
    if not versions:
        raise argparse.ArgumentTypeError("expected a comma-separated list of versions")
    return versions


def _matrix_cases(session: Any, args: argparse.Namespace) -> list[Case]:
    cases: list[Case] = []
    if args.official:
        cases += [case for case in session.cases if case.kind == "official"]
    if args.examples:
        from pytest_verl_compat.upstream.verdict.examples import example_cases

        if session.upstream is None or not session.upstream.has_scripts:
            raise UsageError(
                "--examples reads upstream's example scripts: pass --upstream PATH to a verl "
                f"v{session.pin.version} checkout"
            )
        cases += list(example_cases(session))
    for target in args.targets:
        case = case_for_target(session, target, args)
        # Scripts are named as given: two scripts of one name in different folders stay apart.
        cases.append(dataclasses.replace(case, id=target) if case.kind == SCRIPT else case)
    if not cases:
        raise UsageError("name at least one CASE or SCRIPT (or --official, --examples)")
    seen: set[str] = set()
    unique = []
    for case in cases:
        if case.id not in seen:
            seen.add(case.id)
            unique.append(case)
    return unique


def cmd_matrix(args: argparse.Namespace) -> int:
    """Exit 1 when a script is not read or not valid for the pinned release, else 0."""
    from pytest_verl_compat.pipeline.snapshot import dumps, write_atomic
    from pytest_verl_compat.upstream.drift import (
        CellCache,
        MatrixError,
        ReleaseError,
        matrix_failed,
        matrix_report,
        render_markdown,
        render_text,
    )

    session = _session(args)
    cases = _matrix_cases(session, args)
    try:
        report = matrix_report(
            session,
            cases,
            args.releases,
            upstream_checks=not args.no_upstream_checks,
            cache=None if args.no_cache else CellCache(),
        )
    except (MatrixError, ReleaseError) as exc:
        say("matrix", str(exc))
        return EXIT_USAGE
    renderers = {"json": dumps, "markdown": render_markdown, "text": render_text}
    text = renderers[args.format](report)
    if args.out:
        write_atomic(Path(args.out), text)
    else:
        sys.stdout.write(text)
    return EXIT_FINDINGS if matrix_failed(report) else EXIT_OK


def cmd_migrate(args: argparse.Namespace) -> int:
    """Exit 0 when every moved key was migrated and verified, 1 when a key still blocks it."""
    import hashlib

    from pytest_verl_compat.files.safe_input import read_bytes
    from pytest_verl_compat.pipeline.snapshot import dumps, write_atomic
    from pytest_verl_compat.upstream.drift import (
        MigrateError,
        ReleaseError,
        migrate_script,
        render_lines,
    )

    script = existing_file(args.script, "launch script")
    session = _session(args)
    target = args.to or session.pin.version
    case = session.case_for_script(script, flag_bindings(args))
    try:
        migration = migrate_script(session, case, args.source, target)
    except (MigrateError, ReleaseError) as exc:
        say("migrate", str(exc))
        return EXIT_USAGE
    for line in render_lines(migration.report):
        say("migrate", line)
    if args.json:
        write_atomic(Path(args.json), dumps(migration.report))
    if migration.migrated is not None:
        if args.write:
            # The script must still be the one that was read and verified.
            current = hashlib.sha256(read_bytes(script, what="launch script")).hexdigest()
            if current != hashlib.sha256(migration.original.encode()).hexdigest():
                say("migrate", f"{script} changed while it was migrated; nothing written")
                return EXIT_USAGE
            write_atomic(script, migration.migrated)
            say("migrate", f"wrote {script}")
        else:
            sys.stdout.write(migration.diff(args.script))
    return EXIT_FINDINGS if migration.blocked else EXIT_OK


def add_release_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register ``matrix`` and ``migrate`` on an ``add_subparsers()`` object."""
    matrix = sub.add_parser(
        "matrix",
        parents=[common],
        help="compose scripts on every pinned verl release: which accepts them, and which keys "
        "they set resolve differently (exit 1 when one is not valid for the pinned release)",
    )
    matrix.add_argument("targets", nargs="*", metavar="CASE|SCRIPT")
    matrix.add_argument(
        "--releases",
        type=_versions,
        metavar="V1,V2,...",
        help="the releases, in order (default: every release pinned in data/releases.yaml)",
    )
    matrix.add_argument("--format", choices=FORMATS, default="text")
    matrix.add_argument("--out", metavar="FILE", help="write the matrix to FILE instead of stdout")
    matrix.add_argument("--official", action="store_true", help="every official case")
    matrix.add_argument(
        "--examples",
        action="store_true",
        help="every upstream example script of corpus/examples.yaml (needs --upstream CHECKOUT)",
    )
    matrix.add_argument(
        "--no-upstream-checks",
        action="store_true",
        help="the pinned release's verdict without upstream's own checks (as check's flag)",
    )
    matrix.add_argument(
        "--no-cache",
        action="store_true",
        help="compose every cell now (the other releases' cells are otherwise kept in the user "
        "cache, keyed by tree, fields, variables and this package's code)",
    )
    add_bindings_flags(matrix)
    matrix.set_defaults(func=cmd_matrix)

    migrate = sub.add_parser(
        "migrate",
        parents=[common],
        help="rewrite the overrides of a launch script whose key moved between two releases, "
        "where upstream gives evidence; prints a unified diff (exit 1 when a key still blocks it)",
    )
    migrate.add_argument("script", metavar="SCRIPT")
    migrate.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="VERSION",
        help="the release it was written for",
    )
    migrate.add_argument(
        "--to", metavar="VERSION", help="the release to migrate to (default: the pinned release)"
    )
    migrate.add_argument(
        "--write", action="store_true", help="rewrite the script (temporary file, then rename)"
    )
    migrate.add_argument("--json", metavar="FILE", help="write the migration report as JSON")
    add_bindings_flags(migrate)
    migrate.set_defaults(func=cmd_migrate)
