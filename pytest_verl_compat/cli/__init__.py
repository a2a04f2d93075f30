"""``verl-compat``: the audit's stages as commands, for use outside pytest.

One module per command group; each adds its subcommands to the parser built here.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from importlib import metadata
from typing import NoReturn

from pytest_verl_compat.cli.assets import add_asset_parsers
from pytest_verl_compat.cli.audit import add_audit_parser
from pytest_verl_compat.cli.census import add_census_parser
from pytest_verl_compat.cli.check import add_check_parser
from pytest_verl_compat.cli.common import (
    EXIT_INTERNAL,
    EXIT_USAGE,
    add_case_source,
    case_source_options,
    did_you_mean,
    run_command,
    say,
)
from pytest_verl_compat.cli.drift import add_drift_parsers
from pytest_verl_compat.cli.explain import add_explain_parser
from pytest_verl_compat.cli.fit import add_fit_parser
from pytest_verl_compat.cli.inspect import add_inspect_parsers
from pytest_verl_compat.cli.output import configure_output
from pytest_verl_compat.cli.pin import add_pin_parser
from pytest_verl_compat.cli.release import add_release_command
from pytest_verl_compat.cli.releases import add_release_parsers
from pytest_verl_compat.cli.resolved import add_compile_parser
from pytest_verl_compat.cli.rules import add_rule_parser
from pytest_verl_compat.cli.train import add_train_parser

# The optional dependencies by top-level module, and the extra that installs them.
EXTRAS = {
    "torch": "trainer",
    "transformers": "trainer",
    "peft": "trainer",
    "safetensors": "trainer",
    "tqdm": "trainer",
    "matplotlib": "trainer",
    "gguf": "smollm2",
    "reasoning_gym": "smollm2",
}


class _Parser(argparse.ArgumentParser):
    """argparse with a "did you mean" for a mistyped subcommand or choice."""

    def error(self, message: str) -> NoReturn:
        if "invalid choice: " in message:
            word = message.split("invalid choice: ", 1)[1].split("'")[1]
            choices = [
                name
                for action in self._actions
                for name in (action.choices or ())
                if isinstance(name, str)
            ]
            message += did_you_mean(word, choices)
        # One line, as every other refusal (the usage is one --help away).
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _version() -> str:
    try:
        return metadata.version("pytest-verl-compat")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="verl-compat",
        description=__doc__.splitlines()[0],
        epilog="exit status: 0 clean, 1 findings or drift, 2 usage or unreadable input, "
        "3 internal error",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument(
        "--manifest", metavar="PATH", help="corpus manifest (default: the embedded one)"
    )
    parser.add_argument(
        "--upstream",
        metavar="PATH",
        help="verl checkout folder (default: $VERL_UPSTREAM, then the checked release's files)",
    )
    parser.add_argument(
        "--release",
        metavar="VERSION",
        help="the verl release to check against (default: [tool.verl-compat] release, the tree "
        "given, the installed verl, then the manifest's release)",
    )
    _add_output_flags(parser, default=0)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    common = case_source_options()
    add_inspect_parsers(sub, common)
    add_check_parser(sub, common)
    add_fit_parser(sub, common)
    add_compile_parser(sub, common)
    add_audit_parser(sub, common)
    add_census_parser(sub, common)
    add_explain_parser(sub, common)
    add_case_source(add_train_parser(sub))
    add_drift_parsers(sub, common)
    add_pin_parser(sub)
    add_release_parsers(sub, common)
    add_release_command(sub, common, run_command=main)
    add_asset_parsers(sub)
    add_rule_parser(sub)
    for command in sub.choices.values():
        # Accepted after the command too; SUPPRESS keeps a value given before it.
        _add_output_flags(command, default=argparse.SUPPRESS)
    return parser


def _add_output_flags(parser: argparse.ArgumentParser, default: object) -> None:
    group = parser.add_argument_group("output").add_mutually_exclusive_group()
    group.add_argument(
        "-q",
        "--quiet",
        dest="verbosity",
        action="store_const",
        const=-1,
        default=default,
        help="errors and the requested output only: no notes, no progress",
    )
    group.add_argument(
        "-v",
        "--verbose",
        dest="verbosity",
        action="store_const",
        const=1,
        default=default,
        help="say every slow step as it starts and how long it took",
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # The words after the command's name: where a --set argument was written (check's locations).
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    configure_output(args.verbosity)
    try:
        return run_command(args.command, args.func, args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        top = (getattr(exc, "name", None) or "").split(".")[0]
        if isinstance(exc, ModuleNotFoundError) and top in EXTRAS:
            say(
                args.command,
                f"needs the [{EXTRAS[top]}] extra ({top} is not installed): "
                f"pip install 'pytest-verl-compat[{EXTRAS[top]}]'",
            )
            return EXIT_USAGE
        traceback.print_exc()
        say(args.command, f"internal error (a bug, please report it): {type(exc).__name__}: {exc}")
        return EXIT_INTERNAL


if __name__ == "__main__":
    raise SystemExit(main())
