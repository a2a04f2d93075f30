"""A warm template of the oracle process: verl imported once per machine, each oracle forked.

A cold oracle process spends ~5-14 s importing verl before its first answer, and the same
machine starts many of them: every ``verl-compat check`` whose question no recorded or cached
answer holds, every ``pytest --verl-corpus`` run that asks, each xdist worker. The template is one
sandboxed process (``warm_process``: empty folder, isolated interpreter, the oracle's allow-listed
environment, its own session) that has done the oracle's first steps (``oracle_process.prepare``)
and forks a child per request; the child runs the oracle module on the requester's pipes, in the
requester's fresh empty folder, so it is the cold process but for the import already done.

The first requester starts the template (under a lock, so concurrent requesters start one) and
waits for it as it would have waited for its own import; later ones fork in milliseconds. The
socket lives in the login's runtime folder (``$XDG_RUNTIME_DIR``, else a private folder under the
system's temporary one), mode 0700 and checked to be ours, named by a digest of everything the
template has loaded (this package's source, the installed platform, the interpreter and the
environment), so a changed checkout or install never meets an old template. The template exits
after ``VERL_COMPAT_WARM_SECONDS`` (default 300) without a request, or when its socket is removed;
``VERL_COMPAT_WARM_SECONDS=0`` turns it off. When anything about it fails, the requester starts the
cold process as before: the template only ever saves time.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import select
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from pytest_verl_compat.upstream.oracle import runner

TEMPLATE_MODULE = "pytest_verl_compat.upstream.oracle.warm_process"
IDLE_VARIABLE = "VERL_COMPAT_WARM_SECONDS"
DEFAULT_IDLE_SECONDS = 300.0
# What the template imports: this package (and the reference trainer a served module may use).
_CODE = tuple(
    Path(__file__).resolve().parents[3] / name
    for name in ("pytest_verl_compat", "reference_trainer")
)
_SOCKET_PATH_LIMIT = 100  # sun_path holds 108 bytes on Linux
_START_TIMEOUT = 600.0


def idle_seconds() -> float:
    """How long a template waits for its next request; 0: no template."""
    value = os.environ.get(IDLE_VARIABLE, "")
    try:
        return max(0.0, float(value)) if value else DEFAULT_IDLE_SECONDS
    except ValueError:
        return DEFAULT_IDLE_SECONDS


def runtime_folder() -> Path | None:
    """The private folder of this user's templates, made if missing; None when it is not ours
    alone (then no template: another user could bind a socket there)."""
    base = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(base) and os.path.isdir(base):
        folder = Path(base) / "pytest-verl-compat"
    else:
        folder = Path(tempfile.gettempdir()) / f"pytest-verl-compat-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    try:
        found = os.lstat(folder)
    except OSError:
        return None
    mine = found.st_uid == os.getuid() and not found.st_mode & 0o077
    return folder if stat.S_ISDIR(found.st_mode) and mine else None


def template_key(
    environment: Mapping[str, str], interpreter: runner.Interpreter | None = None
) -> str:
    """A digest of everything a template has loaded or inherited: the interpreter (a release's
    environment is named by its folder, which names its lock's digest), this package's and the
    reference trainer's files (each one's path inside its folder and its bytes: two copies of one
    checkout meet the same template, an edit never meets an old one), every installed
    distribution and the environment."""
    digest = hashlib.sha256()
    python = (interpreter.python if interpreter else None) or sys.executable
    for part in (python, sys.version, json.dumps(sorted(environment.items()))):
        digest.update(part.encode() + b"\0")
    for folder in _CODE:
        for path in sorted(folder.rglob("*.py")):
            digest.update(f"{path.relative_to(folder.parent)}\0".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    for site in sorted({p for p in sys.path if p.endswith("-packages") and os.path.isdir(p)}):
        installed = sorted(name for name in os.listdir(site) if name.endswith(".dist-info"))
        digest.update("\0".join([site, *installed]).encode() + b"\0")
    return digest.hexdigest()[:24]


class ForkedProcess:
    """A child of the template, as much of ``subprocess.Popen`` as the oracle's owner uses: its
    pipes, its pid (the leader of its own process group) and its exit status, which the template
    sends on the connection when it reaps the child."""

    def __init__(self, connection: socket.socket, pid: int, pipes: tuple[int, int, int]) -> None:
        self._connection = connection
        self._pending = b""
        self.pid = pid
        self.returncode: int | None = None
        self.stdin: IO[str] | None = open(pipes[0], "w", encoding="utf-8")
        self.stdout: IO[str] | None = open(pipes[1], encoding="utf-8")
        self.stderr: IO[str] | None = open(pipes[2], encoding="utf-8")

    def _read_exit(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            if b"\n" in self._pending:
                line, _, self._pending = self._pending.partition(b"\n")
                if line.startswith(b"exit "):
                    self.returncode = int(line[5:])
                continue
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._connection], [], [], left)
            if not ready:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            chunk = self._connection.recv(4096)
            if not chunk:  # the template itself ended: the child's status is lost with it
                self.returncode = -9
            self._pending += chunk

    def poll(self) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._read_exit(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._read_exit(timeout)
        assert self.returncode is not None
        if self._connection.fileno() >= 0:
            self._connection.close()
        return self.returncode


def fork(
    module: str,
    args: Sequence[str],
    cwd: str,
    environment: Mapping[str, str],
    interpreter: runner.Interpreter | None = None,
) -> Any:
    """``module`` with ``args`` forked from the warm template, in ``cwd``; None when there is no
    template to fork from (turned off, or anything failed). The template serves only the
    oracle process's module (``warm_process.SERVED``); the child refuses any other."""
    idle = idle_seconds()
    folder = runtime_folder() if idle > 0 else None
    if folder is None:
        return None
    path = folder / f"{template_key(environment, interpreter)}.sock"
    if len(os.fsencode(path)) > _SOCKET_PATH_LIMIT:
        return None
    connection = _connect(path)
    if connection is None:
        with open(folder / f"{path.stem}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one starter; the others wait and then connect
            connection = _connect(path)
            if connection is None and _start_template(path, environment, idle, interpreter):
                connection = _connect(path)
    if connection is None:
        return None
    try:
        return _request(connection, module, args, cwd)
    except (OSError, ValueError):
        connection.close()
        return None


def _connect(path: Path) -> socket.socket | None:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(os.fspath(path))
    except OSError:
        connection.close()
        return None
    return connection


def _start_template(
    path: Path,
    environment: Mapping[str, str],
    idle: float,
    interpreter: runner.Interpreter | None = None,
) -> bool:
    """Start a template for ``path`` and wait until it listens; whether it does."""
    log = path.with_suffix(".log")
    with open(log, "w", encoding="utf-8") as errors:
        process = runner.start_detached(
            TEMPLATE_MODULE,
            ["--socket", os.fspath(path), "--idle", str(idle)],
            environment,
            errors,
            interpreter,
        )
    assert process.stdout is not None
    process.wait()  # the first process forks the template and exits at once
    ready, _, _ = select.select([process.stdout], [], [], _START_TIMEOUT)
    said = process.stdout.readline() if ready else b""
    process.stdout.close()
    return said.strip() == b"ready"


def _request(connection: socket.socket, module: str, args: Sequence[str], cwd: str) -> Any:
    pipes = [os.pipe() for _ in range(3)]  # (read, write) each
    theirs = [pipes[0][0], pipes[1][1], pipes[2][1]]
    ours = (pipes[0][1], pipes[1][0], pipes[2][0])
    try:
        request = {"module": module, "args": list(args), "cwd": cwd}
        socket.send_fds(connection, [json.dumps(request).encode()], theirs)
    except OSError:
        for fd in (*theirs, *ours):
            os.close(fd)
        raise
    for fd in theirs:
        os.close(fd)
    connection.settimeout(30)
    said = b""
    while not said.endswith(b"\n"):
        chunk = connection.recv(1)
        if not chunk:
            break
        said += chunk
    connection.settimeout(None)
    if not said.startswith(b"pid "):
        for fd in ours:
            os.close(fd)
        raise ValueError(f"the warm template refused: {said.decode(errors='replace').strip()}")
    return ForkedProcess(connection, int(said[4:]), ours)
