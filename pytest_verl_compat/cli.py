"""``verl-compat``: the audit's stages as commands, for use outside pytest."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pytest_verl_compat.manifest import Bindings, Case


def _name_value(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def _session(args: argparse.Namespace):
    from pytest_verl_compat.session import AuditOptions, AuditSession

    session = AuditSession.start(
        AuditOptions(manifest=args.manifest, upstream=args.upstream, rootdir=str(Path.cwd()))
    )
    if session.manifest_error:
        raise SystemExit(f"verl-compat: {session.manifest_error}")
    return session


def _script_case(session, script: str, args: argparse.Namespace) -> Case:
    """A one-off case for a script path, read with the manifest's bindings plus the flags."""
    from pytest_verl_compat.manifest import InputPin
    from pytest_verl_compat.upstream import sha256_file

    path = Path(script).resolve()
    extra = Bindings(
        variables=dict(getattr(args, "env", None) or []),
        substitutions=dict(tuple(s) for s in (getattr(args, "subst", None) or [])),
        args=tuple(getattr(args, "arg", None) or ()),
    )
    return Case(
        id=path.stem,
        kind="user",
        line=0,
        launch=str(path),
        inputs=(InputPin(str(path), sha256_file(path)),),
        bindings=session.manifest.bindings.overlay(extra),
    )


def cmd_read(args: argparse.Namespace) -> int:
    from pytest_verl_compat.launch import LaunchBindings, LaunchReadError, read_launch
    from pytest_verl_compat.manifest import load_manifest
    from pytest_verl_compat.session import embedded_root

    manifest = load_manifest(args.manifest or embedded_root() / "corpus" / "manifest.yaml")
    bindings = manifest.bindings.overlay(
        Bindings(
            variables=dict(args.env or []),
            substitutions=dict(tuple(s) for s in (args.subst or [])),
            args=tuple(args.arg or ()),
        )
    )
    try:
        read = read_launch(
            args.script,
            LaunchBindings(
                env=dict(bindings.variables),
                substitutions=dict(bindings.substitutions),
                args=bindings.args,
            ),
        )
    except LaunchReadError as exc:
        print(f"verl-compat read: {exc}", file=sys.stderr)
        return 2
    for field in read.argv:
        print(field)
    return 0


def cmd_compose(args: argparse.Namespace) -> int:
    import yaml

    from pytest_verl_compat.session import StageFailed, StageUnavailable

    session = _session(args)
    target = args.target
    case = _script_case(session, target, args) if Path(target).is_file() else None
    if case is None:
        try:
            case = session.manifest.case(target)
        except KeyError as exc:
            print(f"verl-compat compose: {exc.args[0]}", file=sys.stderr)
            return 2
    try:
        if case.kind == "user":
            from pytest_verl_compat.read import read_case_fields

            fields = read_case_fields(case, Path("/")).fields
            composition = session.composer().compose(fields, case.bindings.variables)
        else:
            composition = session.outcome(case).composition
    except (StageFailed, StageUnavailable, Exception) as exc:
        print(f"verl-compat compose: {exc}", file=sys.stderr)
        return 2
    if not composition.composed:
        print(f"verl-compat compose: composition rejected: {composition.reason}", file=sys.stderr)
        return 1
    sys.stdout.write(yaml.safe_dump(composition.resolved, sort_keys=False))
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    """Regenerate the audit JSON; with --check, compare it byte for byte with the golden one."""
    from pytest_verl_compat.report import build_audit, summary_lines
    from pytest_verl_compat.session import StageFailed, StageUnavailable
    from pytest_verl_compat.snapshot import dumps, write_atomic

    session = _session(args)
    entries = []
    for case in session.cases:
        try:
            entries.append(session.audit_entry(case))
        except (StageFailed, StageUnavailable) as exc:
            print(f"verl-compat audit: {exc}", file=sys.stderr)
            return 2
    text = dumps(build_audit(session, entries))
    golden = session.golden_dir / "audit.json"
    for line in summary_lines(build_audit(session, entries)["totals"]):
        print(line)
    if args.check:
        if not golden.is_file() or golden.read_text(encoding="utf-8") != text:
            import json

            from pytest_verl_compat.snapshot import leaf_diff

            old = json.loads(golden.read_text(encoding="utf-8")) if golden.is_file() else {}
            print(f"verl-compat audit: {golden} is out of date:", file=sys.stderr)
            for line in leaf_diff(old, json.loads(text)):
                print(f"  {line}", file=sys.stderr)
            print("run `verl-compat audit --write` to accept", file=sys.stderr)
            return 1
        print(f"{golden} is up to date")
        return 0
    target = Path(args.json) if args.json else (golden if args.write else None)
    if target is None:
        sys.stdout.write(text)
    else:
        write_atomic(target, text)
        print(f"wrote {target}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """Compose a case or script with extra fields and print its findings, one per line."""
    import dataclasses

    from pytest_verl_compat.session import StageFailed, StageUnavailable

    session = _session(args)
    target = args.target
    if Path(target).is_file():
        case = _script_case(session, target, args)
        from pytest_verl_compat.read import read_case_fields

        fields = read_case_fields(case, Path("/")).fields
        case = dataclasses.replace(case, kind="user", launch=None, inputs=(), overrides=fields)
    else:
        try:
            case = session.manifest.case(target)
        except KeyError as exc:
            print(f"verl-compat check: {exc.args[0]}", file=sys.stderr)
            return 2
    if args.set:
        case = dataclasses.replace(
            case, id=f"{case.id}+set", overrides=case.overrides + tuple(args.set)
        )
    try:
        report = session.compile(case)
    except (StageFailed, StageUnavailable) as exc:
        print(f"verl-compat check: {exc}", file=sys.stderr)
        return 2
    if report is None:
        print(f"ERROR <composition>: {session.outcome(case).composition.reason}")
        return 1
    for finding in report.findings:
        print(finding.line())
    for problem in (leaf.problem for leaf in report.leaves if leaf.problem):
        print(f"ERROR {problem}")
    print(f"{report.outcome}: {report.reason}", file=sys.stderr)
    return 0 if report.accepted else 1


def cmd_compile(args: argparse.Namespace) -> int:
    """Compile a run's resolved configuration file directly: no launch reading, no composition."""
    from pytest_verl_compat.compile import compile_resolved, load_profile
    from pytest_verl_compat.compose import Composer
    from pytest_verl_compat.resolved import ResolvedFileError, check_resolved, load_resolved
    from pytest_verl_compat.snapshot import dumps
    from pytest_verl_compat.upstream import checkout_tree

    session = _session(args)
    try:
        mapping = load_resolved(Path(args.resolved))
    except ResolvedFileError as exc:
        print(f"verl-compat compile: {exc}", file=sys.stderr)
        return 2
    pin = session.manifest.upstream
    others = []
    for tree_path in args.tree or []:
        tree = checkout_tree(Path(tree_path), pin, "option")
        others.append((f"the tree at {tree_path}", Composer(tree.config_dir, pin.config_name)))
    check = check_resolved(mapping, session.composer(), f"verl {pin.version}", others)
    for line in check.lines():
        print(line, file=sys.stderr)
    if not check.from_pinned_tree or check.unresolved:
        print(
            f"verl-compat compile: {args.resolved} is not a complete verl {pin.version} mapping",
            file=sys.stderr,
        )
        return 1
    report = compile_resolved(
        mapping, case_id=Path(args.resolved).stem, profile=load_profile(session.profile_name)
    )
    summary = {key: value for key, value in report.to_json().items() if key != "leaves"}
    sys.stdout.write(dumps(report.to_json() if args.full else summary))
    return 0 if report.accepted else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verl-compat", description=__doc__)
    parser.add_argument("--manifest", help="corpus manifest (default: the embedded one)")
    parser.add_argument(
        "--upstream", help="verl checkout folder (default: $VERL_UPSTREAM, then the installed verl)"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def bindings_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--env", action="append", type=_name_value, metavar="NAME=VALUE", help="set a variable"
        )
        p.add_argument(
            "--subst",
            action="append",
            nargs=2,
            metavar=("COMMAND", "OUTPUT"),
            help="bind the output of a command substitution by its exact text",
        )
        p.add_argument("--arg", action="append", metavar="WORD", help='append a word to "$@"')

    read = sub.add_parser("read", help="print a launch script's explicit fields, one per line")
    read.add_argument("script")
    bindings_flags(read)
    read.set_defaults(func=cmd_read)

    compose = sub.add_parser(
        "compose", help="print the resolved mapping of a case or script as YAML"
    )
    compose.add_argument("target", metavar="CASE|SCRIPT")
    bindings_flags(compose)
    compose.set_defaults(func=cmd_compose)

    comp = sub.add_parser(
        "compile", help="compile a resolved configuration file (e.g. .hydra/config.yaml)"
    )
    comp.add_argument("resolved", metavar="RESOLVED.yaml")
    comp.add_argument(
        "--tree", action="append", metavar="PATH", help="another upstream tree to compare with"
    )
    comp.add_argument("--full", action="store_true", help="include every leaf's class")
    comp.set_defaults(func=cmd_compile)

    check = sub.add_parser("check", help="print a case's findings; exit 1 on an error")
    check.add_argument("target", metavar="CASE|SCRIPT")
    check.add_argument("--set", action="append", metavar="KEY=VALUE", help="an extra override")
    bindings_flags(check)
    check.set_defaults(func=cmd_check)

    audit = sub.add_parser("audit", help="regenerate the audit JSON of every case (no pytest)")
    mode = audit.add_mutually_exclusive_group()
    mode.add_argument(
        "--check", action="store_true", help="compare with golden/audit.json byte for byte"
    )
    mode.add_argument("--write", action="store_true", help="write golden/audit.json")
    mode.add_argument("--json", metavar="FILE", help="write the audit JSON to FILE")
    audit.set_defaults(func=cmd_audit)

    from pytest_verl_compat.assets_cli import add_asset_parsers
    from pytest_verl_compat.drift_cli import add_drift_parsers
    from pytest_verl_compat.train_cli import add_train_parser

    add_train_parser(sub)
    add_drift_parsers(sub)
    add_asset_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
