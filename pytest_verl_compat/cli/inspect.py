"""Commands that show one case: read, compose, check, compile."""

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
    override_value,
    say,
)
from pytest_verl_compat.cli.output import waiting
from pytest_verl_compat.model import Case, Finding, StageFailed, StageUnavailable
from pytest_verl_compat.pipeline.manifest import ManifestError, default_manifest_path, load_manifest
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
        read = read_launch(script, bindings)
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


def cmd_check(args: argparse.Namespace) -> int:
    """Compose a case or script with extra fields and print its findings, one per line."""
    session = open_session(args)
    if args.model_config:
        from pytest_verl_compat.pipeline.model_facts import read_model_facts
        from pytest_verl_compat.pipeline.safe_input import InputError

        try:
            session.model_facts_override = read_model_facts(args.model_config)
        except InputError as exc:
            raise UsageError(str(exc)) from exc
    case = case_for_target(session, args.target, args)
    try:
        # The base case's fields come from its script or its golden file; --set adds to them.
        with waiting("check", f"composing {args.target} on the verl {session.pin.version} tree"):
            case = session.with_overrides(case, tuple(args.set or ()))
            report = session.compile(case)
    except (StageFailed, StageUnavailable) as exc:
        say("check", str(exc))
        return EXIT_USAGE
    if report is None:
        print(f"ERROR <composition>: {session.outcome(case).composition.reason}")
        return EXIT_FINDINGS
    from pytest_verl_compat.pipeline.compile import verdicts

    verdict = verdicts(report)
    findings = list(report.findings)
    if not args.no_upstream_checks:
        findings = _with_upstream_findings(session, case, findings)
    for finding in findings:
        print(finding.line())
    if args.profile:
        for problem in verdict.problems:
            print(f"ERROR {problem}")
    if not session.model_facts(case):
        print(
            "model facts: none (no local config.json at the model paths; --model-config PATH "
            "adds the heads, experts and context checks)",
            file=sys.stderr,
        )
    version = session.pin.version
    valid = verdict.valid and not any(f.level == "error" for f in findings)
    print(f"valid for verl {version}: {'yes' if valid else 'no'}", file=sys.stderr)
    runnable = "yes" if verdict.runnable else f"no ({report.reason})"
    print(f"runnable by the reference trainer: {runnable}", file=sys.stderr)
    # Exit 1 only when verl itself would fail or misbehave; the reference trainer's verdict
    # fails the command only when asked (--profile).
    return EXIT_OK if valid and (verdict.runnable or not args.profile) else EXIT_FINDINGS


def _with_upstream_findings(session: Any, case: Case, findings: list[Finding]) -> list[Finding]:
    """The findings with upstream's own early checks after them, in the order verl 0.9.0 meets
    them (and the static ones they repeat left out), or as they were with one line saying why
    upstream's checks were skipped."""
    from pytest_verl_compat.upstream.early import (
        AnswerCache,
        covered_static_checks,
        early_answer,
        upstream_gate,
    )

    gate = upstream_gate(session)
    if gate.tree is None:
        say("check", f"upstream's own checks skipped: {gate.reason}")
        return findings
    mapping = session.outcome(case).composition.mapping
    try:
        with waiting(
            "check",
            f"starting verl {session.pin.version} for its own checks "
            "(import ~5 s in a sandboxed process, once: answers are cached)",
        ):
            answer = early_answer(session, mapping, gate.tree, AnswerCache())
    except RuntimeError as exc:
        say("check", f"upstream's own checks skipped: {str(exc).splitlines()[0]}")
        return findings
    if answer.verdict == "refused":
        say("check", f"upstream's own checks skipped: {answer.message}")
        return findings
    covered = covered_static_checks(answer)
    kept = [f for f in findings if f.check not in covered]
    return kept + [failure.finding(session.pin.version) for failure in answer.failures]


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

    check = sub.add_parser(
        "check", parents=[common], help="print a case's findings; exit 1 on an error"
    )
    check.add_argument("target", metavar="CASE|SCRIPT")
    check.add_argument(
        "--set", action="append", type=override_value, metavar="KEY=VALUE", help="an extra override"
    )
    check.add_argument(
        "--profile",
        action="store_true",
        help="also fail (exit 1) when the reference trainer cannot run the case, listing why",
    )
    check.add_argument(
        "--model-config",
        metavar="PATH",
        help="the actor model's config.json (or its folder): checks heads, experts, context length "
        "and tokenizer against the layout; read as JSON only, never run",
    )
    check.add_argument(
        "--no-upstream-checks",
        action="store_true",
        help="skip upstream's own config-only checks (run in a sandboxed verl process, cached)",
    )
    add_bindings_flags(check)
    check.set_defaults(func=cmd_check)
