"""The one place that starts upstream's code: a sandboxed ``python -I -m MODULE`` subprocess.

Every run gets a fresh empty working folder (so no ``verl/`` or ``omegaconf.py`` beside the audited
files is imported), an isolated interpreter (``-I``: no ``PYTHONPATH``, no user site, no script
folder on ``sys.path``) and an environment built from an allow-list. Manifest bindings reach it only
as the values of ``${oc.env:NAME}`` interpolations that the fields themselves name, and never under
a name that changes how the interpreter or the loader start.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
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


def safe_variables(variables: Mapping[str, str] | None) -> dict[str, str]:
    """The variables whose names cannot change how a process starts or what it loads."""
    return {
        name: value for name, value in (variables or {}).items() if not _UNSAFE_NAME.match(name)
    }


def sandbox_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", _DEFAULT_PATH),
        **_BASE_ENVIRONMENT,
        **safe_variables(extra),
    }


def _command(module: str, args: Sequence[str]) -> list[str]:
    return [sys.executable, "-I", "-m", module, *args]


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
            _command(module, args),
            cwd=cwd,
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    return UpstreamRun(proc.returncode, proc.stdout, proc.stderr)


class UpstreamProcess:
    """A long-lived ``python -I -m module`` in a fresh empty folder, spoken to through its pipes.

    For upstream code that is expensive to import (verl takes ~5 s): one process serves many
    requests. The caller owns the protocol; this class owns the sandbox and the cleanup.
    """

    def __init__(self, module: str, args: Sequence[str] = ()) -> None:
        self._cwd = tempfile.TemporaryDirectory(prefix="verl-upstream-")
        env = sandbox_environment()
        env["HOME"] = self._cwd.name
        self.process = subprocess.Popen(
            _command(module, args),
            cwd=self._cwd.name,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            # Its own process group, so that stop() also ends what it forked (the oracle's
            # workers would otherwise outlive it, each holding the others' pipes open).
            start_new_session=True,
        )

    def finish(self, timeout: float = 10) -> None:
        """Close stdin (the process's signal to exit) and wait for it, killing it if it hangs."""
        process = self.process
        try:
            if process.stdin is not None and not process.stdin.closed:
                process.stdin.close()
            process.wait(timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            self.stop()

    def stop(self) -> None:
        """End the process now: for a caller that has every answer it asked for (an interpreter
        that imported verl, ray and torch takes a second or two to tear down, for nothing)."""
        with contextlib.suppress(OSError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def close(self) -> None:
        """Finish, close the remaining pipes (once their readers are done), remove the folder."""
        self.finish()
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        self._cwd.cleanup()
