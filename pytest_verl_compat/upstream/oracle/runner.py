"""The one place that starts upstream's code: a sandboxed ``python -I -m MODULE`` subprocess.

Every run gets a fresh empty working folder (so no ``verl/`` or ``omegaconf.py`` beside the audited
files is imported), an isolated interpreter (``-I``: no ``PYTHONPATH``, no user site, no script
folder on ``sys.path``) and an environment built from an allow-list. Manifest bindings reach it only
as the values of ``${oc.env:NAME}`` interpolations that the fields themselves name, and never under
a name that changes how the interpreter or the loader start.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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


# How a release's interpreter (``releases.environment``) runs a module of this checker, which is
# not installed there: the folder of links to the checker's packages first on its path, then the
# module as ``-m`` would run it. Nothing else of the checker's environment is visible.
_BOOTSTRAP = (
    "import runpy, sys; sys.path.insert(0, sys.argv[1]); del sys.argv[:2]; "
    "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
)


@dataclass(frozen=True)
class Interpreter:
    """The Python that runs upstream's code: a release's environment (``python`` and the folder
    that holds the checker's packages for it), or this interpreter when ``python`` is None."""

    python: str | None = None
    checker: str | None = None

    def command(self, module: str, args: Sequence[str]) -> list[str]:
        if self.python is None:
            return [sys.executable, "-I", "-m", module, *args]
        assert self.checker is not None
        return [self.python, "-I", "-c", _BOOTSTRAP, self.checker, module, *args]


THIS_INTERPRETER = Interpreter()


def say_progress(message: str) -> None:
    """A step the user waits for (a release's environment built on first use), on stderr."""
    print(f"verl-compat: {message}", file=sys.stderr, flush=True)


def release_interpreter(version: str, progress: Callable[[str], None] | None = None) -> Interpreter:
    """The interpreter of a supported release's own environment, built on first use (raises
    ``ReleaseError``, one line, when it cannot be)."""
    from pytest_verl_compat.releases.environment import checker_folder, release_environment
    from pytest_verl_compat.releases.index import load_release_index

    release = load_release_index().supported_release(version)
    environment = release_environment(release, progress or say_progress)
    return Interpreter(str(environment.python), str(checker_folder()))


def release_runner(version: str) -> Callable[..., UpstreamRun]:
    """``run_module`` in ``version``'s own environment (built now, on first use)."""
    interpreter = release_interpreter(version)
    return functools.partial(run_module, interpreter=interpreter)


def _command(module: str, args: Sequence[str], interpreter: Interpreter | None = None) -> list[str]:
    return (interpreter or THIS_INTERPRETER).command(module, args)


def run_module(
    module: str,
    args: Sequence[str] = (),
    *,
    stdin: str | None = None,
    variables: Mapping[str, str] | None = None,
    timeout: float = 600,
    ranks: int = 1,
    interpreter: Interpreter | None = None,
) -> UpstreamRun:
    """Run ``python -I -m module *args`` in a fresh empty folder with an allow-listed environment.

    With ``ranks`` > 1, one such process per rank, each told its rank (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``) and where to meet the others (``MASTER_ADDR``,
    ``MASTER_PORT``), as ``torch.distributed.run`` tells its workers; see `_run_ranks`.
    """
    if ranks > 1:
        return _run_ranks(
            module,
            args,
            stdin=stdin,
            variables=variables,
            timeout=timeout,
            ranks=ranks,
            interpreter=interpreter,
        )
    with tempfile.TemporaryDirectory(prefix="verl-upstream-") as cwd:
        env = sandbox_environment(variables)
        env["HOME"] = cwd  # nothing of the auditing user's home is read or written
        proc = subprocess.run(
            _command(module, args, interpreter),
            cwd=cwd,
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    return UpstreamRun(proc.returncode, proc.stdout, proc.stderr)


def start_detached(
    module: str,
    args: Sequence[str],
    env: Mapping[str, str],
    stderr: Any,
    interpreter: Interpreter | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``python -I -m module *args`` to outlive this process (the warm template of
    ``warm.py``): in a fresh empty folder that it removes itself, with ``env`` (an allow-listed
    environment of ``sandbox_environment``) and ``HOME`` there, in a session of its own so that no
    signal of ours reaches it; what it prints comes back on the returned process's stdout."""
    cwd = tempfile.mkdtemp(prefix="verl-upstream-")
    return subprocess.Popen(
        _command(module, args, interpreter),
        cwd=cwd,
        env={**env, "HOME": cwd},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr,
        start_new_session=True,
    )


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run_ranks(
    module: str,
    args: Sequence[str],
    *,
    stdin: str | None,
    variables: Mapping[str, str] | None,
    timeout: float,
    ranks: int,
    interpreter: Interpreter | None = None,
) -> UpstreamRun:
    """One sandboxed process per rank, each in a fresh empty folder, all on the same input.

    Their output goes to files (a rank blocked on a full pipe would stall the others in a
    collective); when one fails or the time is up, the others are ended too, since they would
    wait for it forever. The result is rank 0's output, every rank's stderr and the first
    failing exit code.
    """
    import time

    port = str(_free_port())
    with tempfile.TemporaryDirectory(prefix="verl-upstream-") as root:
        base = os.path.join(root, "input")
        with open(base, "w", encoding="utf-8") as handle:
            handle.write(stdin or "")
        processes = []
        for rank in range(ranks):
            cwd = os.path.join(root, f"rank{rank}")
            os.mkdir(cwd)
            env = sandbox_environment(variables)
            env.update(
                HOME=cwd,
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(ranks),
                LOCAL_WORLD_SIZE=str(ranks),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
            )
            with (
                open(base, encoding="utf-8") as source,
                open(os.path.join(root, f"out{rank}"), "w", encoding="utf-8") as out,
                open(os.path.join(root, f"err{rank}"), "w", encoding="utf-8") as err,
            ):
                processes.append(
                    subprocess.Popen(
                        _command(module, args, interpreter),
                        cwd=cwd,
                        env=env,
                        stdin=source,
                        stdout=out,
                        stderr=err,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + timeout
        codes: list[int | None] = [None] * ranks
        while any(code is None for code in codes):
            codes = [p.poll() for p in processes]
            failed = any(code not in (None, 0) for code in codes)
            if failed or time.monotonic() > deadline:
                for p in processes:
                    with contextlib.suppress(OSError):
                        os.killpg(p.pid, signal.SIGKILL)
                codes = [p.wait() for p in processes]
                if not failed:
                    codes = [code or -signal.SIGKILL for code in codes]
                break
            time.sleep(0.2)

        def read(name: str) -> str:
            with open(os.path.join(root, name), encoding="utf-8", errors="replace") as handle:
                return handle.read()

        # The failing ranks last, so the tail a caller shows is theirs.
        shown = sorted(range(ranks), key=lambda r: (codes[r] not in (None, 0), r))
        stderr = "\n".join(
            f"[rank {r}] {line}" for r in shown for line in read(f"err{r}").splitlines()
        )
        returncode = next((code for code in codes if code), 0)
        return UpstreamRun(returncode or 0, read("out0"), stderr)


class UpstreamProcess:
    """A long-lived ``python -I -m module`` in a fresh empty folder, spoken to through its pipes.

    For upstream code that is expensive to import (verl takes ~5 s): one process serves many
    requests. The caller owns the protocol; this class owns the sandbox and the cleanup.
    """

    def __init__(
        self,
        module: str,
        args: Sequence[str] = (),
        *,
        fork: Callable[..., Any] | None = None,
        interpreter: Interpreter | None = None,
    ) -> None:
        self._cwd = tempfile.TemporaryDirectory(prefix="verl-upstream-")
        env = sandbox_environment()
        if fork is not None:
            # Forked from a warm template (``warm.fork``) when there is one: the same process in
            # the same kind of folder and environment, without its seconds of importing verl.
            forked = fork(module, args, self._cwd.name, env, interpreter)
            if forked is not None:
                self.process: Any = forked
                return
        env["HOME"] = self._cwd.name
        self.process = subprocess.Popen(
            _command(module, args, interpreter),
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
