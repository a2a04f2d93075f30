"""The audit's node ids and the stage module they stand for (found without importing it).

Shared by the entry module, the collector and the reporter: a pasted ``verl-corpus::`` node id
becomes the stage module's path, and ``--verl-corpus`` alone collects only that module.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# The stage tests' node id path, and the module it stands for (found without importing it).
NODE_PREFIX = "verl-corpus"
STAGES_PATH = Path(__file__).resolve().with_name("stages.py")
# Every stage test, by the name in its node id (test_<stage>); --help lists them, a test keeps
# this in step with plugin/stages.py.
STAGES = (
    "read",
    "compose",
    "trusted",
    "compile",
    "verdict",
    "snapshot",
    "upstream_tree",
    "golden_orphans",
    "conformance",
    "conformance_tolerances",
)


def corpus_args(args: list[str], *, audit_only: bool) -> list[str]:
    """The paths pytest collects once the stage tests are added to ``args``.

    A stage node id the user named (``verl-corpus::test_snapshot[grpo]``) becomes the stage
    module's path; otherwise the module joins the user's paths, or stands alone when
    ``audit_only`` (``--verl-corpus`` on the command line and no path given).
    """
    named = [arg for arg in args if arg == NODE_PREFIX or arg.startswith(NODE_PREFIX + "::")]
    if named:
        return [str(STAGES_PATH) + arg[len(NODE_PREFIX) :] if arg in named else arg for arg in args]
    if any(_is_stages_path(arg) for arg in args):
        return list(args)  # the module's own path, given as it is
    return [str(STAGES_PATH)] if audit_only else [*args, str(STAGES_PATH)]


def _is_stages_path(arg: str) -> bool:
    path = Path(arg.split("::", 1)[0])
    try:
        return path.resolve() == STAGES_PATH
    except OSError:
        return False


def audit_from_command_line(config: pytest.Config) -> bool:
    """``--verl-corpus`` given on the command line (not through addopts or PYTEST_ADDOPTS)."""
    return "--verl-corpus" in config.invocation_params.args
