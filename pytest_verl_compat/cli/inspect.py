"""Commands that show one case: read, compose, compile (``check`` has its own module)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
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
from pytest_verl_compat.pipeline.pins import UpstreamError


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


def cmd_compile(args: argparse.Namespace) -> int:
    """Compile a run's resolved configuration file directly: no launch reading, no composition."""
    from pytest_verl_compat.pipeline.compile import compile_resolved
    from pytest_verl_compat.pipeline.compose import Composer
    from pytest_verl_compat.pipeline.pins import checkout_tree
    from pytest_verl_compat.pipeline.profile import load_profile
    from pytest_verl_compat.pipeline.resolved import (
        ResolvedFileError,
        check_resolved,
        load_resolved,
    )
    from pytest_verl_compat.pipeline.snapshot import dumps

    session = open_session(args)
    try:
        mapping = load_resolved(existing_file(args.resolved, "resolved configuration"))
    except ResolvedFileError as exc:
        say("compile", str(exc))
        return EXIT_USAGE
    pin = session.pin
    others = []
    for tree_path in args.tree or []:
        try:
            tree = checkout_tree(Path(tree_path), pin, "option")
        except UpstreamError as exc:
            raise UsageError(str(exc)) from exc
        others.append((f"the tree at {tree_path}", Composer(tree.config_dir, pin.config_name)))
    check = check_resolved(mapping, session.composer(), f"verl {pin.version}", others)
    for line in check.lines():
        print(line, file=sys.stderr)
    if not check.from_pinned_tree or check.unresolved:
        say("compile", f"{args.resolved} is not a complete verl {pin.version} mapping")
        return EXIT_FINDINGS
    report = compile_resolved(
        mapping, case_id=Path(args.resolved).stem, profile=load_profile(session.profile_name)
    )
    summary = {key: value for key, value in report.to_json().items() if key != "leaves"}
    sys.stdout.write(dumps(report.to_json() if args.full else summary))
    return EXIT_OK if report.accepted else EXIT_FINDINGS


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

    comp = sub.add_parser(
        "compile",
        parents=[common],
        help="compile a resolved configuration file (e.g. .hydra/config.yaml)",
    )
    comp.add_argument("resolved", metavar="RESOLVED.yaml")
    comp.add_argument(
        "--tree", action="append", metavar="PATH", help="another upstream tree to compare with"
    )
    comp.add_argument("--full", action="store_true", help="include every leaf's class")
    comp.set_defaults(func=cmd_compile)
