"""The warm template itself (see ``warm.py``): verl imported once, one forked child per request.

Run only through ``warm.template_process`` (``python -I -m`` in an empty folder with the oracle's
allow-listed environment, its own session). It prepares what the oracle process would import
first (``oracle_process.prepare``), binds its socket, says ``ready`` on stdout, and then, for each
connection, receives three file descriptors (the new process's stdin, stdout and stderr) and the
module's arguments, and forks a child that runs ``python -m MODULE ARGS`` as a fresh interpreter
would, in the fresh empty folder the client made: only what it imports first is already there.

One thread, one loop: accept, reap the children (their exit status goes back on their
connection), end a child whose client hung up, and exit when nothing ran for ``--idle`` seconds
or when the socket was removed (its folder is a login's runtime folder, gone at logout).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import time
import traceback
from typing import Any

from pytest_verl_compat.upstream.oracle import process as oracle_process
from pytest_verl_compat.upstream.oracle.client import PROCESS_MODULE

_HEADER_LIMIT = 64 * 1024
# The module the template prepared (``oracle_process.prepare``); any other would start cold.
SERVED = (PROCESS_MODULE,)


def _child(connection: socket.socket, fds: list[int], request: dict[str, Any]) -> None:
    """In the forked child: become ``python -I -m MODULE ARGS`` on the client's pipes; never
    returns."""
    code = 1
    try:
        connection.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        cwd = str(request["cwd"])
        os.chdir(cwd)
        os.environ["HOME"] = cwd  # as the cold start: nothing of a real home is read or written
        module = str(request["module"])
        if module not in SERVED:
            raise SystemExit(f"{module!r}: not served by the warm template")
        sys.argv = [module, *(str(arg) for arg in request["args"])]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:  # the child's own failure, told on its stderr as Python would
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)  # the template's exit handlers are not the child's


def serve(path: str, idle: float) -> None:
    start_folder = os.getcwd()
    oracle_process.prepare()
    oracle_process.prepare_children()
    gc.freeze()  # as the oracle does after its import: the children share these pages
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(16)
    inode = os.stat(path).st_ino
    print("ready", flush=True)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the starter stops reading after "ready"

    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    # A child's end wakes the loop at once (its owner waits for the status), not at the next tick.
    wakeup, woken = socket.socketpair()
    for end in (wakeup, woken):
        end.setblocking(False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(woken.fileno())
    selector.register(wakeup, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}  # pid -> its client's connection
    last_seen = time.monotonic()
    while True:
        for key, _ in selector.select(timeout=1.0):
            if key.fileobj is wakeup:
                with contextlib.suppress(OSError):
                    wakeup.recv(4096)
            elif key.fileobj is listener:
                connection, _ = listener.accept()
                inherited = [listener, wakeup, woken, *children.values()]
                pid = _start_child(connection, inherited)
                if pid is not None:
                    children[pid] = connection
                    selector.register(connection, selectors.EVENT_READ, pid)
            else:
                # The client hung up (or sent more than it should): its child is no longer wanted.
                selector.unregister(key.fileobj)
                with contextlib.suppress(OSError):
                    os.killpg(key.data, signal.SIGKILL)
        for pid in list(children):
            with contextlib.suppress(ChildProcessError):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done == 0:
                    continue
                connection = children.pop(pid)
                with contextlib.suppress(KeyError):
                    selector.unregister(connection)
                with contextlib.suppress(OSError):
                    connection.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                connection.close()
        if children:
            last_seen = time.monotonic()
            continue
        try:
            moved = os.stat(path).st_ino != inode
        except OSError:
            moved = True
        if moved or time.monotonic() - last_seen > idle:
            break
    listener.close()
    with contextlib.suppress(OSError):
        if os.stat(path).st_ino == inode:
            os.unlink(path)
    with contextlib.suppress(OSError):  # the empty folder runner.start_detached made for it
        os.rmdir(start_folder)


def _start_child(connection: socket.socket, inherited_sockets: list[socket.socket]) -> int | None:
    """Fork a child for one request; its pid, told to the client, or None for a bad request."""
    fds: list[int] = []
    try:
        connection.settimeout(10)
        message, fds, _, _ = socket.recv_fds(connection, _HEADER_LIMIT, 3)
        connection.settimeout(None)
        request = json.loads(message)
        if len(fds) != 3 or not isinstance(request, dict):
            raise ValueError("a request is one JSON object and three file descriptors")
    except (OSError, ValueError) as exc:
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            connection.sendall(f"refused {exc}\n".encode())
        connection.close()
        return None
    # The pid is told only once the child leads its own group: the client may end it at once.
    leading, led = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        os.close(leading)
        os.close(led)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for inherited in inherited_sockets:  # the template's, none of the child's business
            inherited.close()
        _child(connection, fds, request)
    for fd in (*fds, led):
        os.close(fd)
    os.read(leading, 1)  # the end of the pipe: the child closed its copy after setsid()
    os.close(leading)
    connection.sendall(f"pid {pid}\n".encode())
    return pid


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="pytest_verl_compat.upstream.oracle.warm_process")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--idle", type=float, required=True)
    args = parser.parse_args(argv)
    # Detach: the starter waits for this first process only, and the template lives on as its
    # child, adopted by init, never a zombie of a requester that outlives it.
    if os.fork() != 0:
        os._exit(0)
    serve(args.socket, args.idle)


if __name__ == "__main__":
    main(sys.argv[1:])
