"""The one place that starts upstream's code: a sandboxed ``python -I -m MODULE`` subprocess.

Every run gets a fresh empty working folder (so no ``verl/`` or ``omegaconf.py`` beside the audited
files is imported), an isolated interpreter (``-I``: no ``PYTHONPATH``, no user site, no script
folder on ``sys.path``) and an environment built from an allow-list. Manifest bindings reach it only
as the values of ``${oc.env:NAME}`` interpolations that the fields themselves name, and never under
a name that changes how the interpreter or the loader start.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# What the interpreter itself needs; everything else is left out.
_BASE_ENVIRONMENT = {"PYTHONHASHSEED": "0", "LC_ALL": "C.UTF-8"}
_DEFAULT_PATH = "/usr/bin:/bin"
# Names that change how a process starts or what it loads: never taken from a binding.
_UNSAFE_NAME = re.compile(
    r"^(PYTHON|LD_|DYLD_|MALLOC_|GCONV_|HOSTALIASES$|PATH$|BASH_ENV$|ENV$|IFS$)"
)
_OC_ENV = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class UpstreamRun:
    """What an upstream subprocess returned."""

    returncode: int
    stdout: str
    stderr: str

    def stderr_tail(self, lines: int) -> str:
        return "\n".join(self.stderr.strip().splitlines()[-lines:])


def referenced_variables(fields: Sequence[str], variables: Mapping[str, str]) -> dict[str, str]:
    """The bound variables that the fields read through ``${oc.env:NAME}``."""
    named = {name for field in fields for name in _OC_ENV.findall(field)}
    return {name: value for name, value in sorted(variables.items()) if name in named}


def sandbox_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", _DEFAULT_PATH), **_BASE_ENVIRONMENT}
    for name, value in (extra or {}).items():
        if not _UNSAFE_NAME.match(name):
            env[name] = value
    return env


def run_module(
    module: str,
    args: Sequence[str] = (),
    *,
    stdin: str | None = None,
    variables: Mapping[str, str] | None = None,
    timeout: float = 600,
) -> UpstreamRun:
    """Run ``python -I -m module *args`` in a fresh empty folder with an allow-listed environment."""
    with tempfile.TemporaryDirectory(prefix="verl-upstream-") as cwd:
        env = sandbox_environment(variables)
        env["HOME"] = cwd  # nothing of the auditing user's home is read or written
        proc = subprocess.run(
            [sys.executable, "-I", "-m", module, *args],
            cwd=cwd,
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    return UpstreamRun(proc.returncode, proc.stdout, proc.stderr)
