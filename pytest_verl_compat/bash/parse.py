"""Parsing: a script's bytes, its typed syntax tree from ``shfmt --to-json`` (memoised by hash).

Also the tree helpers every layer uses (:func:`line_of`, :func:`substitution_text`) and the public
:func:`command_substitutions`, which needs only the tree.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import resource
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from pytest_verl_compat.bash.errors import (
    MAX_NESTING,
    MAX_SCRIPT_BYTES,
    MAX_TREE_BYTES,
    SHFMT_MEMORY,
    SHFMT_TIMEOUT,
    LaunchReadError,
)

Node = dict[str, Any]


def command_substitutions(
    source: str | os.PathLike[str], *, text: str | None = None
) -> list[tuple[int, str]]:
    """(line, exact text) of every outermost ``$(...)``/backtick; ``text`` overrides the file."""
    # Nested substitutions are not listed: the reader looks up only the outer text and never
    # evaluates what is inside it, so only outer texts can ever need a binding.
    label, data = load_script(source, text)
    tree = parse_script(label, data)
    found: list[tuple[int, int, str]] = []
    stack: list[Any] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            if node.get("Type") == "CmdSubst":
                found.append((node["Pos"]["Offset"], line_of(node), substitution_text(data, node)))
            else:
                stack.extend(value for value in node.values() if isinstance(value, (dict, list)))
    return [(line, subst) for _, line, subst in sorted(found)]


def load_script(source: str | os.PathLike[str], text: str | None) -> tuple[str, bytes]:
    """The label and UTF-8 bytes of a script given by path or as text, checked by :func:`vet_script`."""
    label = os.fspath(source)
    if text is not None:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise LaunchReadError(
                label, None, "encoding", f"text is not encodable: {exc}"
            ) from None
    else:
        data = _read_regular(label)
    vet_script(label, data)
    return label, data


def _read_regular(label: str) -> bytes:
    """The bytes of a regular file of at most ``MAX_SCRIPT_BYTES``, read without blocking."""
    # stat before open: opening a device can have effects of its own (a tape rewinds, a FIFO
    # waits for a writer). O_NONBLOCK keeps a FIFO swapped in after the stat from hanging the
    # open, and the fstat of the opened file is the check that counts.
    try:
        if not stat.S_ISREG(os.stat(label).st_mode):
            raise LaunchReadError(label, None, "read", _not_regular(os.stat(label).st_mode))
        fd = os.open(label, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise LaunchReadError(label, None, "read", _not_regular(mode))
            chunks: list[bytes] = []
            size = 0
            while size <= MAX_SCRIPT_BYTES:
                chunk = os.read(fd, MAX_SCRIPT_BYTES + 1 - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
    except OSError as exc:
        raise LaunchReadError(label, None, "read", exc.strerror or str(exc)) from None
    data = b"".join(chunks)
    if len(data) > MAX_SCRIPT_BYTES:
        raise LaunchReadError(label, None, "size", _too_large())
    return data


def _not_regular(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    kind = next((name for test, name in kinds if test(mode)), "not a regular file")
    return f"a launch script must be a regular file, this is {kind}"


def _too_large() -> str:
    return f"too large: a launch script may have at most {MAX_SCRIPT_BYTES} bytes"


_BRACKETS = re.compile(rb"[(){}\[\]]")


def vet_script(label: str, data: bytes) -> None:
    """Refuse bytes that bash reads differently from shfmt, or that would exhaust shfmt."""
    if len(data) > MAX_SCRIPT_BYTES:
        raise LaunchReadError(label, None, "size", _too_large())
    # shfmt drops NUL bytes and reads CRLF as a newline; bash keeps the \r in the words (so
    # `main_ppo\r` is another module) and drops or refuses NULs. Neither appears in a script
    # written for bash on Linux, so both are refused rather than modelled.
    nul = data.find(b"\0")
    if nul >= 0:
        raise LaunchReadError(
            label, _line_at(data, nul), "NUL byte", "bash drops or refuses NUL bytes in a script"
        )
    cr = data.find(b"\r")
    if cr >= 0:
        raise LaunchReadError(
            label,
            _line_at(data, cr),
            "carriage return",
            "bash keeps a \\r (CRLF line ending) in the word it ends; convert the script to LF",
        )
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LaunchReadError(
            label, _line_at(data, exc.start), "encoding", f"invalid UTF-8 at byte {exc.start}"
        ) from None
    # An upper bound on the nesting depth, counted on brackets alone (quotes and keywords are
    # ignored, so it can only over-count); comment lines are skipped.
    depth = 0
    for number, text in enumerate(data.split(b"\n"), start=1):
        if text.lstrip().startswith(b"#"):
            continue
        for bracket in _BRACKETS.findall(text):
            depth = depth + 1 if bracket in b"({[" else max(depth - 1, 0)
            if depth > MAX_NESTING:
                raise LaunchReadError(
                    label,
                    number,
                    "nesting",
                    f"too deeply nested: more than {MAX_NESTING} open brackets",
                )


def _line_at(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def _shfmt() -> str | None:
    """The shfmt binary: the one installed beside this interpreter first, then PATH."""
    bindir = Path(sys.executable).parent
    for name in ("shfmt", "shfmt.exe"):
        candidate = bindir / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("shfmt")


# shfmt's tree, pickled, by sha256 of the script: a corpus reads the same few scripts many times
# (every derived case re-reads its base), and each shfmt start costs more than the evaluation.
_TREES: dict[str, bytes] = {}
_TREES_LIMIT = 512


def parse_script(label: str, data: bytes) -> Node:
    """The typed syntax tree of ``data``, as printed by ``shfmt --to-json`` (memoised by hash)."""
    digest = hashlib.sha256(data).hexdigest()
    cached = _TREES.get(digest)
    if cached is not None:
        fresh: Node = pickle.loads(cached)  # a fresh tree each time: callers may annotate it
        return fresh
    tree = _parse_uncached(label, data)
    if len(_TREES) < _TREES_LIMIT:
        # Our own tree, kept in this process only: pickle writes and reads it in about half
        # json's time, in a fifth of shfmt's indented text (5 ms and 70 kB for a 200-line script).
        _TREES[digest] = pickle.dumps(tree, protocol=pickle.HIGHEST_PROTOCOL)
    return tree


def _parse_uncached(label: str, data: bytes) -> Node:
    exe = _shfmt()
    if exe is None:
        raise LaunchReadError(
            label, None, "shfmt", "the shfmt binary (package shfmt-py) is not installed"
        )
    try:
        proc = _run_bounded([exe, "--language-dialect=bash", "--to-json"], data)
    except subprocess.TimeoutExpired:
        raise LaunchReadError(
            label, None, "limit", f"too large: shfmt did not finish in {SHFMT_TIMEOUT} s"
        ) from None
    except (OSError, subprocess.SubprocessError) as exc:
        raise LaunchReadError(label, None, "shfmt", f"could not run {exe}: {exc}") from None
    if proc.returncode != 0:
        message = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        first = message[0] if message else f"shfmt exited with status {proc.returncode}"
        if first.startswith(("fatal error:", "runtime:")) or proc.returncode < 0:
            # The Go runtime ran out of its memory budget (or of stack): not a syntax error.
            raise LaunchReadError(
                label,
                None,
                "limit",
                f"too large or too deeply nested: shfmt exceeded its {SHFMT_MEMORY >> 20} MiB "
                f"memory budget ({first.strip()})",
            )
        line: int | None = None
        # shfmt reports "LINE:COL: message" for input read from stdin.
        head, _, rest = first.partition(":")
        if head.isdigit() and rest:
            line = int(head)
            _, _, first = rest.partition(":")
        if first.strip() == "exceeded max depth":
            raise LaunchReadError(label, line, "nesting", "too deeply nested for shfmt")
        raise LaunchReadError(label, line, "syntax error", first.strip())
    if len(proc.stdout) > MAX_TREE_BYTES:
        raise LaunchReadError(
            label,
            None,
            "limit",
            f"too large or too deeply nested: its syntax tree exceeds {MAX_TREE_BYTES >> 20} MiB",
        )
    try:
        tree = json.loads(proc.stdout)
    except RecursionError:
        raise LaunchReadError(label, None, "nesting", "too deeply nested to read") from None
    except ValueError as exc:
        raise LaunchReadError(label, None, "shfmt", f"unreadable syntax tree: {exc}") from None
    if not isinstance(tree, dict):
        raise LaunchReadError(label, None, "shfmt", "unexpected syntax tree")
    return tree


def _run_bounded(argv: list[str], data: bytes) -> subprocess.CompletedProcess[bytes]:
    """Run shfmt on ``data`` with its data segment capped and a timeout.

    The cap makes a hostile script fail fast instead of taking gigabytes. It is set with
    prlimit after the start rather than in a preexec_fn (unsafe in a threaded process): shfmt
    parses nothing before its input arrives. RLIMIT_AS would stop every run, as Go reserves
    address space up front.
    """
    with subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as proc:
        try:
            resource.prlimit(proc.pid, resource.RLIMIT_DATA, (SHFMT_MEMORY, SHFMT_MEMORY))
            resource.prlimit(proc.pid, resource.RLIMIT_CORE, (0, 0))
            stdout, stderr = proc.communicate(data, timeout=SHFMT_TIMEOUT)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def line_of(node: Node) -> int:
    """The 1-based line a node starts on."""
    return int(node.get("Pos", {}).get("Line", 0))


def substitution_text(data: bytes, node: Node) -> str:
    """The exact source text between the delimiters of a command substitution."""
    left = node["Left"]["Offset"]
    right = node["Right"]["Offset"]
    # Offsets are byte offsets into the UTF-8 source.
    start = left + (1 if node.get("Backquotes") else 2)
    return data[start:right].decode("utf-8", "replace")
