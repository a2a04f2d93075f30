"""``verl-compat``: the audit's stages as commands, for use outside pytest.

One module per command group; each adds its subcommands to the parser built here.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from pytest_verl_compat.cli.assets import add_asset_parsers
from pytest_verl_compat.cli.audit import add_audit_parser
from pytest_verl_compat.cli.drift import add_drift_parsers
from pytest_verl_compat.cli.inspect import add_inspect_parsers
from pytest_verl_compat.cli.train import add_train_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verl-compat", description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", help="corpus manifest (default: the embedded one)")
    parser.add_argument(
        "--upstream", help="verl checkout folder (default: $VERL_UPSTREAM, then the installed verl)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_inspect_parsers(sub)
    add_audit_parser(sub)
    add_train_parser(sub)
    add_drift_parsers(sub)
    add_asset_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
