"""Differential oracle for the launch reader: what real bash hands to the launcher.

A script is copied into a scratch directory with two edits, both located through the positions
in shfmt's syntax tree (never by pattern-matching the text):

* every outermost ``$(...)`` / backtick substitution becomes ``$(printf %s 'OUTPUT')`` with its
  bound output, so nothing the script names is executed (an unbound one becomes a marker);
* the words ``python3 -m verl.trainer.main_ppo`` of every launcher become a bash one-liner that
  writes its arguments and its environment, NUL-separated, into the scratch directory.

bash then runs the copy as ``env -i HOME=... bash copy.sh ARGS...``.  This module is test code:
it runs bash on purpose, the reader under test never does.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BASH = shutil.which("bash")
ENV = shutil.which("env")
UNBOUND_MARKER = "<<unbound substitution>>"

LAUNCHER_WORDS = (("python3", "python"), ("-m",), ("verl.trainer.main_ppo",))
# Variables bash (and the printer's own bash) add to every child environment.
BASH_OWN_EXPORTS = frozenset({"PWD", "OLDPWD", "SHLVL", "_"})


def shfmt_binary() -> str:
    """shfmt beside this interpreter, else on PATH."""
    local = Path(sys.executable).parent / "shfmt"
    if local.is_file():
        return str(local)
    found = shutil.which("shfmt")
    if found is None:
        raise RuntimeError("shfmt is not installed")
    return found


def syntax_tree(data: bytes) -> dict[str, Any]:
    """shfmt's typed JSON syntax tree of a bash script."""
    proc = subprocess.run(
        [shfmt_binary(), "--language-dialect=bash", "--to-json"],
        input=data,
        capture_output=True,
        check=True,
        timeout=30,
    )
    return json.loads(proc.stdout)


def _walk(node: Any, visit: Callable[[dict[str, Any]], bool]) -> None:
    """Depth-first walk; ``visit`` returns False to skip a node's children."""
    if isinstance(node, list):
        for item in node:
            _walk(item, visit)
    elif isinstance(node, dict):
        if visit(node) is False:
            return
        for value in node.values():
            if isinstance(value, (dict, list)):
                _walk(value, visit)


def _literal(word: dict[str, Any]) -> str | None:
    """The text of a word made of one unquoted literal, else None."""
    parts = word.get("Parts") or []
    if len(parts) == 1 and parts[0].get("Type") == "Lit":
        return parts[0].get("Value")
    return None


@dataclass(frozen=True)
class Instrumented:
    """The instrumented copy and what was found while making it."""

    text: bytes
    launcher_lines: tuple[int, ...]


PRINTER = ': > argv.bin; [ "$#" -eq 0 ] || printf "%s\\0" "$@" > argv.bin; exec {env} -0 > env.bin'


def instrument(data: bytes, substitutions: Mapping[str, str]) -> Instrumented:
    """Replace substitutions by their bound outputs and launchers by an argv printer."""
    tree = syntax_tree(data)
    edits: list[tuple[int, int, bytes]] = []
    lines: list[int] = []
    printer = f"{BASH} -c {shlex.quote(PRINTER.format(env=ENV))} launcher"

    def visit(node: dict[str, Any]) -> bool:
        kind = node.get("Type")
        if kind == "CmdSubst":
            start = node["Left"]["Offset"] + (1 if node.get("Backquotes") else 2)
            key = data[start : node["Right"]["Offset"]].decode()
            output = substitutions.get(key, UNBOUND_MARKER)
            stub = f"$(printf %s {shlex.quote(output)})".encode()
            edits.append((node["Pos"]["Offset"], node["End"]["Offset"], stub))
            return False
        if kind == "CallExpr":
            args = node.get("Args") or []
            words = [_literal(w) for w in args[:3]]
            pairs = zip(words, LAUNCHER_WORDS, strict=False)
            if len(words) == 3 and all(word in allowed for word, allowed in pairs):
                edits.append((args[0]["Pos"]["Offset"], args[2]["End"]["Offset"], printer.encode()))
                lines.append(node["Pos"]["Line"])
        return True

    _walk(tree, visit)
    out = data
    for start, end, replacement in sorted(edits, reverse=True):
        out = out[:start] + replacement + out[end:]
    return Instrumented(out, tuple(lines))


@dataclass(frozen=True)
class BashRun:
    """What bash did with the instrumented copy."""

    returncode: int
    argv: tuple[str, ...] | None
    exported: dict[str, str] | None
    stderr: str
    launcher_lines: tuple[int, ...]


def run_bash(
    data: bytes,
    workdir: Path,
    env: Mapping[str, str],
    substitutions: Mapping[str, str],
    args: Sequence[str] = (),
) -> BashRun:
    """Run the instrumented copy of ``data`` under ``env -i`` in ``workdir``."""
    if BASH is None or ENV is None:
        raise RuntimeError("bash and env are needed for the oracle")
    made = instrument(data, substitutions)
    (workdir / "copy.sh").write_bytes(made.text)
    for stale in ("argv.bin", "env.bin"):
        (workdir / stale).unlink(missing_ok=True)
    proc = subprocess.run(
        [ENV, "-i", *(f"{k}={v}" for k, v in env.items()), BASH, "copy.sh", *args],
        cwd=workdir,
        capture_output=True,
        timeout=30,
        check=False,
    )
    argv = exported = None
    if (workdir / "argv.bin").exists():
        raw = (workdir / "argv.bin").read_bytes().decode()
        argv = tuple(raw.split("\0")[:-1])
        exported = {}
        for entry in (workdir / "env.bin").read_bytes().decode().split("\0")[:-1]:
            name, _, value = entry.partition("=")
            if name not in BASH_OWN_EXPORTS:
                exported[name] = value
    return BashRun(
        proc.returncode, argv, exported, proc.stderr.decode(errors="replace"), made.launcher_lines
    )
