"""The commands the plugin's messages ask the user to run, with the options this run used.

A hint that drops ``--verl-corpus-manifest my-runs/manifest.yaml`` sends a user of their own
corpus to update the embedded one; each command here repeats the corpus options as they were
given on the command line (ini values and ``$VERL_UPSTREAM`` apply again by themselves).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from pytest_verl_compat.pipeline.audit import AuditSession

# The corpus options a rerun must repeat, by their argparse dest.
CORPUS_OPTIONS = (
    ("--verl-corpus-manifest", "verl_corpus_manifest"),
    ("--verl-corpus-upstream", "verl_corpus_upstream"),
    ("--verl-corpus-golden", "verl_corpus_golden"),
)


def accept_command(config: pytest.Config) -> str:
    """``pytest --verl-corpus [the run's corpus options] --snapshot-update``."""
    words = ["pytest", "--verl-corpus"]
    for flag, dest in CORPUS_OPTIONS:
        value = config.getoption(dest, None)
        if value:
            words += [flag, str(value)]
    return shlex.join([*words, "--snapshot-update"])


def shown_path(path: Path) -> str:
    """A path as a user would type it here: relative to the current folder when under it."""
    absolute = path.resolve()
    try:
        return os.path.relpath(absolute) if absolute.is_relative_to(Path.cwd()) else str(path)
    except ValueError:
        return str(path)


def pin_command(config: pytest.Config, session: AuditSession) -> str:
    """``verl-compat pin MANIFEST [--upstream ROOT]`` for this run's manifest and input root."""
    assert session.manifest is not None
    given = config.getoption("verl_corpus_manifest", None)
    manifest = Path(given) if given else session.manifest.path
    words = ["verl-compat", "pin", given or shown_path(manifest)]
    root = session.upstream.root if session.upstream is not None else None
    if root is not None and root.resolve() != manifest.resolve().parent:
        words += ["--upstream", config.getoption("verl_corpus_upstream", None) or shown_path(root)]
    return shlex.join(words)
