"""What every command shares: the session from the global options, bindings flags, script cases."""

from __future__ import annotations

import argparse
from pathlib import Path

from pytest_verl_compat.model import Bindings, Case
from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession


def name_value(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def add_bindings_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--env", action="append", type=name_value, metavar="NAME=VALUE", help="set a variable"
    )
    p.add_argument(
        "--subst",
        action="append",
        nargs=2,
        metavar=("COMMAND", "OUTPUT"),
        help="bind the output of a command substitution by its exact text",
    )
    p.add_argument("--arg", action="append", metavar="WORD", help='append a word to "$@"')


def flag_bindings(args: argparse.Namespace) -> Bindings:
    """The bindings given by --env, --subst and --arg."""
    return Bindings(
        variables=dict(getattr(args, "env", None) or []),
        substitutions=dict(tuple(s) for s in (getattr(args, "subst", None) or [])),
        args=tuple(getattr(args, "arg", None) or ()),
    )


def open_session(args: argparse.Namespace) -> AuditSession:
    session = AuditSession.start(
        AuditOptions(manifest=args.manifest, upstream=args.upstream, rootdir=str(Path.cwd()))
    )
    if session.manifest_error:
        raise SystemExit(f"verl-compat: {session.manifest_error}")
    return session


def case_for_target(session: AuditSession, target: str, args: argparse.Namespace) -> Case:
    """A manifest case by id, or a one-off case for a script path (raises KeyError otherwise)."""
    if Path(target).is_file():
        return session.case_for_script(target, flag_bindings(args))
    assert session.manifest is not None
    return session.manifest.case(target)
