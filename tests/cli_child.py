"""``verl-compat`` in a child process without a new interpreter each time: for tests that run the
CLI once per case, over and over.

A new ``python -m pytest_verl_compat.cli`` spends ~0.4 s of CPU importing the package before it
reads anything; the hostile-launch suite alone ran 101 of them, 48.9 s of CPU in one suite run
(measured from /proc: benchmarks/README.md, "Stop 41"). Here a
multiprocessing fork server imports ``pytest_verl_compat.cli`` once per xdist worker, and each call
is a process forked from it that runs the CLI's own ``main`` with the argv, folder, environment
and limits of that call, its stdout and stderr in files: what a subprocess of the CLI gives
(exit status, both streams, a timeout and a memory cap that end only the child), minus the
interpreter's start. The fork server is a fresh interpreter of its own (not a fork of the pytest
worker), so nothing of the test session reaches the child.

What this does not cover, the CLI as an installed command and ``python -m``, stays with the tests
that run it as a user does (``test_manifest_and_cli``, ``test_hostile_cli``, the documented
commands).
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import resource
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path

CLI_MODULE = "pytest_verl_compat.cli"


@functools.cache
def _fork_server() -> multiprocessing.context.ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([CLI_MODULE])
    return context


def _exit_status(code: object) -> int:
    """What the interpreter makes of ``SystemExit(code)``, as ``python -m`` would exit."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _run_main(
    argv: list[str],
    cwd: str,
    environment: dict[str, str],
    memory: int | None,
    out: str,
    err: str,
) -> None:
    """The child: this call's limits, folder, environment and streams, then the CLI's ``main``."""
    status = 1
    try:
        if memory is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environment)
        for fd, path in ((1, out), (2, err)):
            opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(opened, fd)
            os.close(opened)
        sys.argv = ["verl-compat", *argv]
        from pytest_verl_compat.cli import main

        try:
            status = _exit_status(main(argv))
        except SystemExit as exc:
            status = _exit_status(exc.code)
        except BaseException:
            traceback.print_exc()
            status = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(status)


def run_cli(
    argv: Sequence[str],
    cwd: Path,
    *,
    timeout: float,
    memory: int | None = None,
    environment: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``verl-compat ARGV`` in ``cwd`` as a child process: its exit status, stdout and stderr
    (decoded with errors replaced); ``subprocess.TimeoutExpired`` once ``timeout`` passes (the
    child is killed); ``memory`` caps its address space as ``RLIMIT_AS`` does."""
    environ = dict(os.environ if environment is None else environment)
    with tempfile.TemporaryDirectory(prefix="cli-child-") as folder:
        out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        child = _fork_server().Process(
            target=_run_main, args=(list(argv), str(cwd), environ, memory, out, err)
        )
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired([CLI_MODULE, *argv], timeout)

        def read(path: str) -> str:
            try:
                return Path(path).read_bytes().decode("utf-8", errors="replace")
            except FileNotFoundError:
                return ""

        status = child.exitcode
        # A child killed by a signal: a negative status, as subprocess reports it.
        return subprocess.CompletedProcess(
            [CLI_MODULE, *argv], status, stdout=read(out), stderr=read(err)
        )
