"""Commands that show one case: read, compose (``check`` and ``compile`` have their own modules)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pytest_verl_compat.bash import LaunchReadError, read_launch
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
from pytest_verl_compat.model import StageFailed, StageUnavailable
from pytest_verl_compat.pipeline.manifest import ManifestError, default_manifest_path, load_manifest
from pytest_verl_compat.pipeline.naming import may_carry


def cmd_read(args: argparse.Namespace) -> int:
    script = existing_file(args.script, "launch script")
    manifest_path = getattr(args, "manifest", None)
    try:
        manifest = load_manifest(
            existing_file(manifest_path, "manifest") if manifest_path else default_manifest_path()
        )
    except ManifestError as exc:
        raise UsageError(str(exc)) from exc
    bindings = manifest.bindings.overlay(flag_bindings(args))
    try:
        read = read_launch(script, bindings, carry=may_carry)
    except LaunchReadError as exc:
        say("read", str(exc))
        return EXIT_USAGE
    for field in read.argv:
        print(field)
    return EXIT_OK


def cmd_compose(args: argparse.Namespace) -> int:
    import yaml

    session = open_session(args)
    case = case_for_target(session, args.target, args)
    try:
        composition = session.outcome(case).composition
    except (StageFailed, StageUnavailable) as exc:
        say("compose", str(exc))
        return EXIT_USAGE
    if not composition.composed:
        say("compose", f"composition rejected: {composition.reason}")
        return EXIT_FINDINGS
    sys.stdout.write(yaml.safe_dump(composition.resolved, sort_keys=False))
    return EXIT_OK


def add_inspect_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    read = sub.add_parser(
        "read", parents=[common], help="print a launch script's explicit fields, one per line"
    )
    read.add_argument("script")
    add_bindings_flags(read)
    read.set_defaults(func=cmd_read)

    compose = sub.add_parser(
        "compose", parents=[common], help="print the resolved mapping of a case or script as YAML"
    )
    compose.add_argument("target", metavar="CASE|SCRIPT")
    add_bindings_flags(compose)
    compose.set_defaults(func=cmd_compose)
