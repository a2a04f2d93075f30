"""What every command shares: exit codes, case-source options, the session, script cases.

Exit codes (the README's table): 0 clean, 1 findings / drift / a stale golden file, 2 usage
(bad arguments, unknown case, missing file, unreadable input), 3 an internal error (a bug).
Requested output goes to stdout, every message to stderr.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from pathlib import Path
from typing import Any

from pytest_verl_compat.bash import LaunchReadError
from pytest_verl_compat.cli.settings import SettingsError, release_setting
from pytest_verl_compat.files.safe_input import InputError
from pytest_verl_compat.model import Bindings, Case, StageFailed, StageUnavailable
from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
from pytest_verl_compat.pipeline.compose import override_refusal
from pytest_verl_compat.pipeline.manifest import ManifestError
from pytest_verl_compat.pipeline.pins import UpstreamError
from pytest_verl_compat.pipeline.read import PinMismatch
from pytest_verl_compat.pipeline.resolved import ResolvedFileError
from pytest_verl_compat.pipeline.snapshot import OutputRefused
from pytest_verl_compat.releases.index import ReleaseError

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3


class UsageError(Exception):
    """A one-line message for the user; the command exits with ``EXIT_USAGE``."""


# What the pipeline raises for input it refuses (an unreadable or hostile file, a manifest, a
# launch script, a tree, a value): each message names the file, line or value. Any command
# meeting one exits 2 with that line; everything else is a bug (exit 3).
INPUT_ERRORS: tuple[type[Exception], ...] = (
    UsageError,
    InputError,
    ManifestError,
    ResolvedFileError,
    LaunchReadError,
    UpstreamError,
    PinMismatch,
    OutputRefused,
    StageFailed,
    StageUnavailable,
    SettingsError,
    ReleaseError,
)
# A shell reports a command that a closed pipe stopped (`| head`) as killed by SIGPIPE.
EXIT_BROKEN_PIPE = 128 + 13


def say(command: str, message: str) -> None:
    """A message for the user: on stderr, prefixed with the command."""
    print(
        f"verl-compat {command}: {message}" if command else f"verl-compat: {message}",
        file=sys.stderr,
    )


def one_line(message: str) -> str:
    """A message as one line (Hydra's and PyYAML's span several)."""
    return " ".join(message.split())


def did_you_mean(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """``; did you mean 'x'?`` for the closest choices, or nothing."""
    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    if not close:
        return ""
    return "; did you mean " + " or ".join(repr(c) for c in close) + "?"


def case_source_options() -> argparse.ArgumentParser:
    """A parent parser with ``--manifest`` and ``--upstream``, for every subcommand that reads cases."""
    parent = argparse.ArgumentParser(add_help=False)
    add_case_source(parent)
    return parent


def add_case_source(parser: argparse.ArgumentParser) -> None:
    """``--manifest`` and ``--upstream`` on a subcommand.

    They are accepted before or after the subcommand; SUPPRESS keeps a subcommand's parser from
    overwriting a value given before it.
    """
    group = parser.add_argument_group("case source")
    group.add_argument(
        "--manifest",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="corpus manifest (default: the embedded one)",
    )
    group.add_argument(
        "--upstream",
        default=argparse.SUPPRESS,
        metavar="PATH",
        help="verl checkout or folder with verl/trainer/config "
        "(default: $VERL_UPSTREAM, then the checked release's own files)",
    )
    group.add_argument(
        "--release",
        default=argparse.SUPPRESS,
        metavar="VERSION",
        help="the verl release to check against (default: the tree given, [tool.verl-compat] "
        "release, the installed verl, then the manifest's release)",
    )


def name_value(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def override_value(text: str) -> str:
    """A ``--set`` value Hydra can read as an override (checked before anything composes)."""
    refused = override_refusal(text, parse=True)
    if refused:
        raise argparse.ArgumentTypeError(refused)
    return text


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


def existing_file(path: str, what: str = "file") -> Path:
    """The path, or a UsageError saying it is not found."""
    found = Path(path).expanduser()
    # Something that exists but is not a regular file (a FIFO, a link to a device, a folder) is
    # passed on: the bounded readers refuse it with what it is, without opening it for a read.
    if not os.path.lexists(found):
        raise UsageError(f"{path}: {what} not found")
    return found


MODEL_NOT_FOUND = (
    "cannot read the model config: not found (a config.json, its folder, or a model the shipped "
    "table or the Hugging Face cache knows by name)"
)


def given_model_facts(given: str) -> Any:
    """``--model-config``'s model facts: a config.json or its folder, else a model the Hugging
    Face cache or the shipped table knows by name (a fine-tune's base model); one line if none."""
    from pytest_verl_compat.pipeline.model_facts import read_model_facts

    if not Path(given).expanduser().exists():
        from pytest_verl_compat.checks.model_facts import facts_from_config
        from pytest_verl_compat.memory.models import config_by_name

        named = config_by_name(given)
        if named is None:
            raise UsageError(f"{given}: {MODEL_NOT_FOUND}")
        # the name is the facts' source: check --gpu's forecast takes the model it names
        return facts_from_config(named[1], given)
    try:
        return read_model_facts(given)
    except InputError as exc:
        raise UsageError(str(exc)) from exc


def open_session(args: argparse.Namespace) -> AuditSession:
    manifest = getattr(args, "manifest", None)
    if manifest is not None:
        existing_file(manifest, "manifest")
    upstream = getattr(args, "upstream", None)
    if upstream is not None and not Path(upstream).expanduser().is_dir():
        raise UsageError(f"{upstream}: upstream folder not found")
    release, release_source = getattr(args, "release", None), ""
    if release is None and not getattr(args, "isolated", False):
        release, release_source = release_setting(Path.cwd())
    session = AuditSession.start(
        AuditOptions(
            manifest=manifest,
            upstream=upstream,
            rootdir=str(Path.cwd()),
            release=release,
            release_source=release_source,
        )
    )
    if session.manifest_error:
        raise UsageError(session.manifest_error)
    if session.release is None:
        raise UsageError(session.release_error)
    if session.upstream is not None:
        # Every file of the tree is checked before a command composes on it: a hostile tree
        # is the command's unreadable input (InputError, exit 2), not each case's rejection.
        session.composer().check_tree()
    return session


def release_root(session: AuditSession) -> Path:
    """The folder of the checked release's own files (its ``verl`` package, read as data)."""
    try:
        return session.release_files().root
    except StageUnavailable as exc:
        raise UsageError(str(exc)) from exc


def _looks_like_path(target: str) -> bool:
    return target.endswith((".sh", ".bash")) or target.startswith((".", "/", "~"))


def case_for_target(session: AuditSession, target: str, args: argparse.Namespace) -> Case:
    """A manifest case by id, or a one-off case for a script path (raises UsageError otherwise)."""
    path = Path(target).expanduser()
    if path.is_file():
        return session.case_for_script(path, flag_bindings(args))
    if os.path.lexists(path) and _looks_like_path(target):
        from pytest_verl_compat.bash import LaunchReadError, read_launch

        try:  # the reader refuses it (a FIFO, a device, a folder) with a one-line reason
            read_launch(path, flag_bindings(args))
        except LaunchReadError as exc:
            raise UsageError(str(exc)) from exc
    assert session.manifest is not None
    ids = [case.id for case in session.cases]
    if target in ids:
        return session.manifest.case(target)
    if _looks_like_path(target):
        raise UsageError(f"{target}: launch script not found")
    raise UsageError(
        f"no case {target!r} in {session.manifest.path}{did_you_mean(target, ids)} "
        f"({len(ids)} cases; a launch script path also works)"
    )


def run_command(command: str, func: Any, args: argparse.Namespace) -> int:
    """Run a subcommand; refused input (``INPUT_ERRORS``) becomes its one-line message and
    exit 2; a reader that closed stdout early ends the command quietly, as it ends ``cat``."""
    try:
        return int(func(args))
    except INPUT_ERRORS as exc:
        say(command, one_line(str(exc)))
        return EXIT_USAGE
    except BrokenPipeError:
        # Python ignores SIGPIPE, so the write raises; what the reader left unread is no error.
        # stdout goes to /dev/null, or the interpreter's final flush raises again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
