"""``verl-compat pin MANIFEST``: re-pin the sha256 of every case input after editing scripts."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pytest_verl_compat.cli.common import EXIT_OK, existing_file
from pytest_verl_compat.cli.output import note


def cmd_pin(args: argparse.Namespace) -> int:
    """Print each pin that moved (stdout) and rewrite the manifest in place; 0 when done."""
    from pytest_verl_compat.pipeline.pin_manifest import pin_manifest

    manifest = existing_file(args.manifest_path, "manifest")
    upstream = getattr(args, "upstream", None)
    root = Path(upstream).expanduser() if upstream else manifest.parent
    changes = pin_manifest(manifest, root, write=not args.dry_run)
    for change in changes:
        print(change.line())
    if not changes:
        note("pin", f"every pin in {manifest} matches the files under {root}")
    elif args.dry_run:
        note("pin", f"{len(changes)} pins would change in {manifest} (nothing written)")
    else:
        note("pin", f"wrote {manifest} ({len(changes)} pins changed)")
    return EXIT_OK


def add_pin_parser(sub: Any) -> None:
    pin = sub.add_parser(
        "pin",
        help="re-pin the sha256 of every case input in a manifest (after editing your scripts)",
        description="Rewrite each case's sha256 pins to the files as they are now, keeping the "
        "manifest's comments and formatting; prints every pin that changed.",
    )
    pin.add_argument("manifest_path", metavar="MANIFEST")
    pin.add_argument(
        "--upstream",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="the folder the inputs' paths are relative to (the --verl-corpus-upstream of the "
        "audit; default: the manifest's folder, as `verl-compat init` lays it out)",
    )
    pin.add_argument(
        "--dry-run", action="store_true", help="print what would change; write nothing"
    )
    pin.set_defaults(func=cmd_pin)
