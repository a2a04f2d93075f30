"""The CLI run in the test's own process, as a user's command line would run it."""

from __future__ import annotations

import pytest

from pytest_verl_compat import cli


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``verl-compat ARGS``: its exit status (argparse's usage errors included), stdout, stderr."""
    try:
        status = cli.main(list(args))
    except SystemExit as exc:  # argparse's own usage errors
        status = int(exc.code or 0)
    out, err = capsys.readouterr()
    return status, out, err
