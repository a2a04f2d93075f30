"""Parsing: a script's bytes, its typed syntax tree from ``shfmt --to-json`` (memoised by hash).

Also the tree helpers every layer uses (:func:`_line`, :func:`_subst_text`) and the public
:func:`command_substitutions`, which needs only the tree.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from pytest_verl_compat.bash.errors import _SHFMT_TIMEOUT, LaunchReadError

Node = dict[str, Any]


def command_substitutions(
    source: str | os.PathLike[str], *, text: str | None = None
) -> list[tuple[int, str]]:
    """(line, exact text) of every outermost ``$(...)``/backtick; ``text`` overrides the file."""
    # Nested substitutions are not listed: the reader looks up only the outer text and never
    # evaluates what is inside it, so only outer texts can ever need a binding.
    label, data = _load(source, text)
    tree = _parse(label, data)
    found: list[tuple[int, int, str]] = []
    stack: list[Any] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            if node.get("Type") == "CmdSubst":
                found.append((node["Pos"]["Offset"], _line(node), _subst_text(data, node)))
            else:
                stack.extend(value for value in node.values() if isinstance(value, (dict, list)))
    return [(line, subst) for _, line, subst in sorted(found)]


def _load(source: str | os.PathLike[str], text: str | None) -> tuple[str, bytes]:
    """The label and UTF-8 bytes of a script given by path or as text."""
    label = os.fspath(source)
    if text is not None:
        try:
            return label, text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise LaunchReadError(
                label, None, "encoding", f"text is not encodable: {exc}"
            ) from None
    try:
        return label, Path(label).read_bytes()
    except OSError as exc:
        raise LaunchReadError(label, None, "read", exc.strerror or str(exc)) from None


def _shfmt() -> str | None:
    """The shfmt binary: the one installed beside this interpreter first, then PATH."""
    bindir = Path(sys.executable).parent
    for name in ("shfmt", "shfmt.exe"):
        candidate = bindir / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("shfmt")


# shfmt's printed tree by sha256 of the script: a corpus reads the same few scripts many times
# (every derived case re-reads its base), and each shfmt start costs more than the evaluation.
_TREE_TEXT: dict[str, bytes] = {}
_TREE_TEXT_LIMIT = 512


def _parse(label: str, data: bytes) -> Node:
    """The typed syntax tree of ``data``, as printed by ``shfmt --to-json`` (memoised by hash)."""
    digest = hashlib.sha256(data).hexdigest()
    cached = _TREE_TEXT.get(digest)
    if cached is not None:
        fresh: Node = json.loads(cached)  # a fresh tree each time: callers may annotate it
        return fresh
    tree = _parse_uncached(label, data)
    if len(_TREE_TEXT) < _TREE_TEXT_LIMIT:
        _TREE_TEXT[digest] = json.dumps(tree).encode()
    return tree


def _parse_uncached(label: str, data: bytes) -> Node:
    exe = _shfmt()
    if exe is None:
        raise LaunchReadError(
            label, None, "shfmt", "the shfmt binary (package shfmt-py) is not installed"
        )
    try:
        proc = subprocess.run(
            [exe, "--language-dialect=bash", "--to-json"],
            input=data,
            capture_output=True,
            timeout=_SHFMT_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise LaunchReadError(label, None, "shfmt", f"could not run {exe}: {exc}") from None
    if proc.returncode != 0:
        message = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        first = message[0] if message else f"shfmt exited with status {proc.returncode}"
        line: int | None = None
        # shfmt reports "LINE:COL: message" for input read from stdin.
        head, _, rest = first.partition(":")
        if head.isdigit() and rest:
            line = int(head)
            _, _, first = rest.partition(":")
        raise LaunchReadError(label, line, "syntax error", first.strip())
    try:
        tree = json.loads(proc.stdout)
    except (ValueError, RecursionError) as exc:
        raise LaunchReadError(label, None, "shfmt", f"unreadable syntax tree: {exc}") from None
    if not isinstance(tree, dict):
        raise LaunchReadError(label, None, "shfmt", "unexpected syntax tree")
    return tree


def _line(node: Node) -> int:
    """The 1-based line a node starts on."""
    return int(node.get("Pos", {}).get("Line", 0))


def _subst_text(data: bytes, node: Node) -> str:
    """The exact source text between the delimiters of a command substitution."""
    left = node["Left"]["Offset"]
    right = node["Right"]["Offset"]
    # Offsets are byte offsets into the UTF-8 source.
    start = left + (1 if node.get("Backquotes") else 2)
    return data[start:right].decode("utf-8", "replace")
