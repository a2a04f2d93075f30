"""``verl-compat drift``, ``retarget`` and ``init``: subcommands for moving to a new verl release.

``add_drift_parsers(subparsers)`` registers them on the ``verl-compat`` parser; they read the
parent parser's ``--manifest`` and ``--upstream`` when it has them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pytest_verl_compat.cli.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    open_session,
    say,
)
from pytest_verl_compat.cli.output import note


def _folder(value: str) -> str:
    if not Path(value).expanduser().is_dir():
        raise argparse.ArgumentTypeError(f"{value!r} is not a folder")
    return value


def _folder_or_release(value: str) -> str:
    """A folder, or the version of a pinned release (its tree is fetched when the command runs)."""
    from pytest_verl_compat.upstream.drift import load_release_index

    if Path(value).expanduser().is_dir() or value in load_release_index().versions:
        return value
    known = ", ".join(load_release_index().versions)
    raise argparse.ArgumentTypeError(f"{value!r} is not a folder nor a pinned release ({known})")


def _against_root(value: str) -> Path:
    """The folder ``--against`` names: the path itself, or the pinned release's fetched tree."""
    from pytest_verl_compat.upstream.drift import ReleaseError, release_tree

    if Path(value).expanduser().is_dir():
        return Path(value)
    try:
        return release_tree(value).root
    except ReleaseError as exc:
        raise UsageError(str(exc)) from exc


def cmd_drift(args: argparse.Namespace) -> int:
    """Exit 1 when the other tree drifts from the pinned one, 0 when not, 2 when it cannot run."""
    from pytest_verl_compat.pipeline.snapshot import dumps, write_atomic
    from pytest_verl_compat.upstream.drift.report import (
        DriftError,
        drift_report,
        has_drift,
        render_markdown,
    )

    try:
        report = drift_report(open_session(args), _against_root(args.against))
    except DriftError as exc:
        say("drift", str(exc))
        return EXIT_USAGE
    markdown = render_markdown(report)
    if args.json:
        write_atomic(Path(args.json), dumps(report))
        note("drift", f"wrote the drift report (JSON) to {args.json}")
    if args.markdown:
        write_atomic(Path(args.markdown), markdown)
        note("drift", f"wrote the drift summary (Markdown) to {args.markdown}")
    if not args.json and not args.markdown:
        sys.stdout.write(markdown)
    return EXIT_FINDINGS if has_drift(report) else EXIT_OK


def cmd_retarget(args: argparse.Namespace) -> int:
    from pytest_verl_compat.upstream.drift.retarget import (
        RetargetError,
        retarget_cases,
        retarget_profile,
    )

    session = open_session(args)
    pin = session.pin
    # Cases are composed on the other tree too, so leaves their overrides bring in get rules.
    cases = retarget_cases(session) if session.upstream is not None else []
    try:
        path = retarget_profile(
            session.profile_name,
            _against_root(args.against),
            args.profile,
            # Never beside the pinned profile by default: that is inside the installed package.
            out_dir=Path(args.out) if args.out else Path.cwd(),
            version=args.version,
            config_dir=pin.config_dir,
            config_name=pin.config_name,
            cases=cases,
        )
    except RetargetError as exc:
        say("retarget", str(exc))
        return EXIT_USAGE
    note("retarget", f"wrote {path}")
    say(
        "retarget",
        "set `profile:` in the manifest to this file and update the upstream pin, then run "
        "pytest --verl-corpus --snapshot-update and review the golden diff",
    )
    return EXIT_OK


def cmd_init(args: argparse.Namespace) -> int:
    from pytest_verl_compat.pipeline.init_manifest import PLACEHOLDER, init_manifest, unbound

    out = Path(args.out) if args.out else None
    if out is not None and out.exists() and not args.force:
        say("init", f"{out} exists (use --force to overwrite)")
        return EXIT_USAGE
    text = init_manifest(Path(args.folder), out)
    if out is None:
        sys.stdout.write(text)
    else:
        note("init", f"wrote {out}")
    left = unbound(text)
    if left:
        say(
            "init", f'bind every "{PLACEHOLDER}" in the manifest before auditing: {", ".join(left)}'
        )
    return EXIT_OK


def add_drift_parsers(subparsers: Any, common: argparse.ArgumentParser | None = None) -> None:
    """Register ``drift``, ``retarget`` and ``init`` on an ``add_subparsers()`` object."""
    parents = [common] if common is not None else []
    drift = subparsers.add_parser(
        "drift",
        parents=parents,
        help="compare the corpus on another verl tree with the pinned one "
        "(exit 1 when it drifts, 0 when not)",
    )
    drift.add_argument(
        "--against",
        required=True,
        type=_folder_or_release,
        metavar="PATH|VERSION",
        help="folder laid out like a verl checkout (the config tree is enough), or a release "
        "pinned in data/releases.yaml (its wheel's tree, fetched with pip once)",
    )
    drift.add_argument("--json", metavar="FILE", help="write the drift report as JSON to FILE")
    drift.add_argument(
        "--markdown", metavar="FILE", help="write a summary for a pull request to FILE"
    )
    drift.set_defaults(func=cmd_drift)

    retarget = subparsers.add_parser(
        "retarget",
        parents=parents,
        help="write a new profile for another verl tree: the pinned rules plus a "
        "not-yet-reviewed rule for every leaf they cannot classify",
    )
    retarget.add_argument(
        "--against", required=True, type=_folder_or_release, metavar="PATH|VERSION"
    )
    retarget.add_argument(
        "--profile", required=True, metavar="NEW_NAME", help="e.g. verl-0.9.1-single-device"
    )
    retarget.add_argument(
        "--out",
        metavar="DIR",
        help="folder for the profile (default: the current folder)",
    )
    retarget.add_argument(
        "--version",
        metavar="VERSION",
        help="verl version of the other tree, when it has no version file and the name has none",
    )
    retarget.set_defaults(func=cmd_retarget)

    init = subparsers.add_parser(
        "init", help="write a starter manifest for a folder of your own launch scripts"
    )
    init.add_argument("folder", type=_folder, metavar="FOLDER")
    init.add_argument("--out", metavar="FILE", help="write the manifest to FILE (default: stdout)")
    init.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    init.set_defaults(func=cmd_init)
