"""Launch reader: the argv of a script's final ``python3 -m verl.trainer.main_ppo``, never run.

The script is parsed by mvdan/sh's ``shfmt --to-json`` and the typed syntax tree is interpreted
here, with bash semantics, for the subset of bash that launch scripts use.  Nothing the script
names is ever executed: command substitutions are answered only from
``LaunchBindings.substitutions`` and every construct whose effect cannot be known statically
raises :class:`LaunchReadError` naming the file, the line and the construct.

Deliberate differences from bash, each documented where it is implemented:

* Pathname expansion is never performed.  An unquoted word that still holds ``*``, ``?`` or
  ``[`` after expansion stays literal, which is what bash produces when nothing matches.
* Commands other than the shell builtins modelled here are skipped as if they succeeded
  (status 0); their output matters only through ``substitutions``.
* Variables bash sets by itself (``PWD``, ``PATH``, ``RANDOM``, ...) are unknown unless bound in
  ``LaunchBindings.env``; referencing one is an error instead of a guess.
* Text whose meaning depends on the locale (non-ASCII in ``${#X}``, slices, patterns, case
  changes or ``$'\\u...'``) is rejected: the audit's oracle runs bash in the C locale.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

__all__ = [
    "LaunchBindings",
    "LaunchExited",
    "LaunchRead",
    "LaunchReadError",
    "command_substitutions",
    "read_launch",
    "read_launch_text",
]

Node = dict[str, Any]

_LAUNCHER_PYTHONS = frozenset({"python3", "python"})
_LAUNCHER_MODULE = "verl.trainer.main_ppo"

# Budgets that keep hostile or generated scripts from exhausting time or memory; real launch
# scripts are several orders of magnitude below each of them.
_MAX_STEPS = 200_000
_MAX_VALUE = 1_000_000
_MAX_FIELDS = 100_000
_MAX_PATTERN_SUBJECT = 10_000
_SHFMT_TIMEOUT = 60

_IFS_WHITESPACE = " \t\n"

# Variables bash itself provides to every script: without a binding their value is unknown, so
# reading one is an error rather than the silent "unset" that the remaining names get.
_BASH_PROVIDED = frozenset(
    {
        "BASH",
        "BASHOPTS",
        "BASHPID",
        "BASH_ALIASES",
        "BASH_ARGC",
        "BASH_ARGV",
        "BASH_ARGV0",
        "BASH_CMDS",
        "BASH_COMMAND",
        "BASH_LINENO",
        "BASH_SOURCE",
        "BASH_SUBSHELL",
        "BASH_VERSINFO",
        "BASH_VERSION",
        "DIRSTACK",
        "EPOCHREALTIME",
        "EPOCHSECONDS",
        "EUID",
        "FUNCNAME",
        "GROUPS",
        "HISTCMD",
        "HOSTNAME",
        "HOSTTYPE",
        "IFS",
        "LINENO",
        "MACHTYPE",
        "OPTERR",
        "OPTIND",
        "OSTYPE",
        "PATH",
        "PIPESTATUS",
        "PPID",
        "PS4",
        "PWD",
        "RANDOM",
        "SECONDS",
        "SHELLOPTS",
        "SHLVL",
        "SRANDOM",
        "UID",
    }
)

_NOT_A_DECLARATION = (
    "after an assignment, quoted or expanded, bash reads its arguments as ordinary words"
)
# Builtins whose effect on the shell cannot be reproduced without running something.
_REJECTED_BUILTINS: dict[str, tuple[str, str]] = {
    "eval": ("eval", "evaluates text as code at run time"),
    "source": ("source", "reads and runs another file; read that file on its own"),
    ".": ("source", "reads and runs another file; read that file on its own"),
    "trap": ("trap", "installs code that runs on signals or exit"),
    "alias": ("alias", "aliases can rename any command, including the launcher"),
    "unalias": ("alias", "aliases can rename any command, including the launcher"),
    "enable": ("enable", "can swap builtins for loadable ones"),
    "read": ("read", "sets variables from input at run time"),
    "mapfile": ("mapfile", "sets variables from input at run time"),
    "readarray": ("readarray", "sets variables from input at run time"),
    "getopts": ("getopts", "sets variables from arguments at run time"),
    "shopt": ("shopt", "changes shell options this reader does not model"),
    "return": ("return", "`return` outside a function"),
    "coproc": ("coproc", "runs a command concurrently with the script"),
    "fc": ("fc", "re-runs commands from history"),
    "local": ("local", "`local` outside a function"),
    "declare": ("declare", _NOT_A_DECLARATION),
    "typeset": ("typeset", _NOT_A_DECLARATION),
    "export": ("export", _NOT_A_DECLARATION),
    "readonly": ("readonly", _NOT_A_DECLARATION),
    "let": ("let", "`let` after an assignment, quoted or expanded: its words are not arithmetic"),
}

_SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh", "mksh"})

# bash expands an external command's redirections after forking, so their side effects (such
# as ``${X:=v}``) stay in the child; a builtin's are expanded in the shell itself.
_BASH_BUILTINS = frozenset(
    (
        ": . [ alias bg bind break builtin caller cd command compgen complete compopt continue "
        "declare dirs disown echo enable eval exec exit export false fc fg getopts hash help "
        "history jobs kill let local logout mapfile popd printf pushd pwd read readarray "
        "readonly return set shift shopt source suspend test times trap true type typeset "
        "ulimit umask unalias unset wait"
    ).split()
)

_TEST_FILE_OPS = frozenset("-a -b -c -d -e -f -g -h -k -p -r -s -t -u -w -x -G -L -N -O -S".split())
_TEST_BINARY = frozenset("= == != < > -eq -ne -lt -le -gt -ge -nt -ot -ef".split())
_INT_OPS = frozenset("-eq -ne -lt -le -gt -ge".split())

_CHAR_CLASSES = {
    "alpha": "a-zA-Z",
    "digit": "0-9",
    "alnum": "a-zA-Z0-9",
    "upper": "A-Z",
    "lower": "a-z",
    "space": " \\t\\n\\r\\f\\v",
    "blank": " \\t",
    "punct": re.escape("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
    "xdigit": "0-9A-Fa-f",
    "cntrl": "\\x00-\\x1f\\x7f",
    "print": "\\x20-\\x7e",
    "graph": "\\x21-\\x7e",
    "word": "a-zA-Z0-9_",
}

_ANSI_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "e": "\x1b",
    "E": "\x1b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "?": "?",
}

_SET_FLAGS = {"e": "errexit", "u": "nounset", "a": "allexport", "B": "braceexpand"}
# Options that change nothing this reader computes (tracing, job control, history, ...).
_SET_HARMLESS_FLAGS = frozenset("xvfhHmbCPTEp")
_SET_HARMLESS_NAMES = frozenset(
    {
        "xtrace",
        "verbose",
        "noglob",
        "hashall",
        "histexpand",
        "monitor",
        "notify",
        "noclobber",
        "physical",
        "errtrace",
        "functrace",
        "privileged",
        "ignoreeof",
        "nolog",
        "emacs",
        "vi",
        "history",
        "interactive-comments",
    }
)
_SET_NAMED = {
    "errexit": "errexit",
    "nounset": "nounset",
    "pipefail": "pipefail",
    "allexport": "allexport",
    "braceexpand": "braceexpand",
}

_INT64 = 1 << 64


class LaunchReadError(Exception):
    """A launch script could not be read statically."""

    def __init__(self, path: str, line: int | None, construct: str, detail: str) -> None:
        super().__init__(path, line, construct, detail)
        self.path = path
        self.line = line
        self.construct = construct
        self.detail = detail

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.construct}: {self.detail}"


class LaunchExited(LaunchReadError):
    """The script reaches `exit` before the launcher."""

    def __init__(self, path: str, line: int | None, status: int) -> None:
        super().__init__(
            path, line, "exit", f"the script exits with status {status} before the launcher"
        )
        # Keep args matching this signature so the exception survives pickling (xdist).
        self.args = (path, line, status)
        self.status = status


@dataclass(frozen=True)
class LaunchBindings:
    """What the script sees: its environment, substitution outputs and positional parameters."""

    env: Mapping[str, str] = field(default_factory=dict)
    substitutions: Mapping[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class LaunchRead:
    """The launcher command as bash would run it."""

    argv: tuple[str, ...]
    line: int
    exported: Mapping[str, str]


def read_launch(
    path: str | os.PathLike[str], bindings: LaunchBindings, *, text: str | None = None
) -> LaunchRead:
    """Read the script at ``path`` (or ``text``, labelled with ``path``) without executing it."""
    label, data = _load(path, text)
    return _read(label, data, bindings)


def read_launch_text(text: str, bindings: LaunchBindings, *, path: str = "<string>") -> LaunchRead:
    """Read a script given as text; ``path`` only labels error messages and ``$0``."""
    label, data = _load(path, text)
    return _read(label, data, bindings)


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


# --------------------------------------------------------------------------- parsing


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
        return json.loads(cached)  # a fresh tree each time: callers may annotate it
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


def _sq(text: str) -> str:
    """``text`` single-quoted for a shell command line."""
    return "'" + text.replace("'", "'\\''") + "'"


def _read(label: str, data: bytes, bindings: LaunchBindings) -> LaunchRead:
    """Parse and interpret; every failure surfaces as a LaunchReadError."""
    tree = _parse(label, data)
    try:
        return _Interpreter(label, data, bindings).run(tree)
    except LaunchReadError:
        raise
    except RecursionError:
        raise LaunchReadError(label, None, "nesting", "the script nests too deeply") from None
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        # The contract is "a LaunchRead or a LaunchReadError": a tree shape this reader does
        # not know is reported as unsupported rather than leaking an internal error.
        raise LaunchReadError(
            label, None, "unsupported syntax", f"syntax tree not understood ({exc!r})"
        ) from None


# --------------------------------------------------------------------------- values


def _is_name(text: str) -> bool:
    """Whether ``text`` is a bash variable name."""
    if not text or not (text[0] == "_" or ("a" <= text[0] <= "z") or ("A" <= text[0] <= "Z")):
        return False
    return all(c == "_" or (c.isascii() and c.isalnum()) for c in text)


def _could_be_user(text: str) -> bool:
    """Whether ``text`` is a plausible login name (``[a-z_][a-z0-9_.-]*``, any case)."""
    if not text or not (text[0] == "_" or (text[0].isascii() and text[0].isalpha())):
        return False
    return all(c in "_.-" or (c.isascii() and c.isalnum()) for c in text)


def _ascii_digits(text: str) -> bool:
    """Whether ``text`` is a non-empty run of ASCII decimal digits."""
    return bool(text) and all("0" <= c <= "9" for c in text)


def _wrap(value: int) -> int:
    """``value`` as bash's signed 64-bit arithmetic holds it."""
    value &= _INT64 - 1
    return value - _INT64 if value >= 1 << 63 else value


def _parse_number(text: str) -> int | None:
    """A bash integer constant (decimal, 0octal, 0xhex, base#digits); None if not a number."""
    # Malformed constants raise ValueError: bash rejects them instead of reading a name.
    if not text:
        return None
    if "#" in text:
        base_text, _, digits = text.partition("#")
        if not _ascii_digits(base_text):
            return None
        base = int(base_text)
        if not 2 <= base <= 64 or not digits:
            raise ValueError(f"invalid arithmetic base in {text!r}")
        value = 0
        for c in digits:
            if "0" <= c <= "9":
                d = ord(c) - 48
            elif "a" <= c <= "z":
                d = ord(c) - 87
            elif "A" <= c <= "Z":
                d = ord(c) - 29 if base > 36 else ord(c) - 55
            elif c == "@":
                d = 62
            elif c == "_":
                d = 63
            else:
                raise ValueError(f"invalid digit in {text!r}")
            if d >= base:
                raise ValueError(f"value too great for base in {text!r}")
            value = value * base + d
        return _wrap(value)
    if text[0] not in "0123456789":
        return None
    if text[:2] in ("0x", "0X"):
        digits = text[2:]
        if not digits or any(c not in "0123456789abcdefABCDEF" for c in digits):
            raise ValueError(f"invalid hexadecimal constant {text!r}")
        return _wrap(int(digits, 16))
    if not _ascii_digits(text):
        raise ValueError(f"invalid number {text!r}")
    if text[0] == "0" and len(text) > 1:
        if any(c in "89" for c in text):
            raise ValueError(f"value too great for base in {text!r}")
        return _wrap(int(text, 8))
    return _wrap(int(text))


def _legal_integer(text: str) -> int | None:
    """An operand of ``[ ... -eq ... ]``: optional blanks and sign around decimal digits."""
    body = text.strip(" \t\n")
    sign = 1
    if body[:1] in ("+", "-"):
        sign = -1 if body[0] == "-" else 1
        body = body[1:]
    if not _ascii_digits(body):
        return None
    return _wrap(sign * int(body))


def _ascii_case(text: str, op: str) -> str:
    """Bash's ``^^ ^ ,, ,`` case changes; only ASCII letters change in the C locale."""
    upper = op.startswith("^")
    if len(op) == 2:
        return "".join(_ascii_case_char(c, upper) for c in text)
    return _ascii_case_char(text[:1], upper) + text[1:] if text else text


def _ascii_case_char(c: str, upper: bool) -> str:
    """One character with its ASCII case changed."""
    if upper and "a" <= c <= "z":
        return chr(ord(c) - 32)
    if not upper and "A" <= c <= "Z":
        return chr(ord(c) + 32)
    return c


def _unescape_dq(text: str) -> str:
    """Backslash removal inside double quotes: only before ``$ ` " \\`` and newline."""
    if "\\" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text) and text[i + 1] in '$`"\\\n':
            if text[i + 1] != "\n":
                out.append(text[i + 1])
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _lit_chunks(text: str) -> Iterator[tuple[str, bool]]:
    """An unquoted literal as (text, escaped) runs; escaped runs are single characters."""
    start = 0
    i = 0
    while i < len(text):
        if text[i] == "\\":
            if i > start:
                yield text[start:i], False
            # A trailing lone backslash stands for itself.
            yield (text[i + 1] if i + 1 < len(text) else "\\"), True
            i += 2
            start = i
        else:
            i += 1
    if start < len(text):
        yield text[start:], False


# --------------------------------------------------------------------------- field building


class _Quoted:
    """A run of text inside a word that is protected from brace expansion and splitting."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


# A word before expansion: unquoted characters (str of length 1), protected text, or parts.
_Item = str | _Quoted | Node


class _Fields:
    """Accumulates expansion results into fields, splitting only unquoted expansion results."""

    def __init__(self, split: bool) -> None:
        self.split = split
        self.fields: list[str] = []
        self.buf: list[str] = []
        # Whether the field in progress exists even if empty (it holds quoted or literal text).
        self.content = False

    def text(self, value: str) -> None:
        """Append text that is never split (literal or quoted)."""
        self.buf.append(value)
        self.content = True

    def expanded(self, value: str) -> None:
        """Append the result of an unquoted expansion, splitting on IFS whitespace."""
        if not self.split:
            self.buf.append(value)
            return
        start = 0
        for i, c in enumerate(value):
            if c in _IFS_WHITESPACE:
                if i > start:
                    self.buf.append(value[start:i])
                    self.content = True
                self.delimit()
                start = i + 1
        if start < len(value):
            self.buf.append(value[start:])
            self.content = True

    def delimit(self) -> None:
        """End the field in progress if it exists."""
        if self.content:
            self.fields.append("".join(self.buf))
            if len(self.fields) > _MAX_FIELDS:
                raise _Budget("too many words")
        self.buf = []
        self.content = False

    def hard(self) -> None:
        """End the field in progress unconditionally (between the elements of ``"$@"``)."""
        self.content = True
        self.delimit()

    def finish(self) -> list[str]:
        """All fields (split mode)."""
        self.delimit()
        return self.fields

    def joined(self) -> str:
        """The single string (non-split mode)."""
        return "".join(self.buf)


class _Budget(Exception):
    """A resource budget was exceeded (converted to LaunchReadError with a line)."""


# --------------------------------------------------------------------------- interpreter state


Value = str | dict[int, str]


class _Shell:
    """The mutable shell state; copied for subshells so their changes are discarded."""

    def __init__(
        self,
        variables: dict[str, Value],
        exported: set[str],
        readonly: set[str],
        positional: list[str],
        options: set[str],
        status: int = 0,
    ) -> None:
        self.vars = variables
        self.exported = exported
        self.readonly = readonly
        self.positional = positional
        self.options = options
        self.status = status

    def fork(self) -> _Shell:
        """An independent copy, as a subshell gets."""
        return _Shell(
            {k: (v if isinstance(v, str) else dict(v)) for k, v in self.vars.items()},
            set(self.exported),
            set(self.readonly),
            list(self.positional),
            set(self.options),
            self.status,
        )


class _Exit(Exception):
    """The shell exits (``exit``, or ``set -e`` after a failure)."""

    def __init__(self, status: int, line: int) -> None:
        super().__init__(status, line)
        self.status = status
        self.line = line


class _LoopControl(Exception):
    """``break`` or ``continue`` unwinding to the enclosing ``for``."""

    def __init__(self, kind: str, levels: int) -> None:
        super().__init__(kind, levels)
        self.kind = kind
        self.levels = levels


class _TestSyntax(Exception):
    """A ``[`` / ``test`` expression that bash rejects with status 2."""


class _Interpreter:
    """Interprets a shfmt syntax tree with bash semantics, recording launcher commands."""

    def __init__(self, path: str, data: bytes, bindings: LaunchBindings) -> None:
        self.path = path
        self.data = data
        self.substitutions = dict(bindings.substitutions)
        env = {str(k): str(v) for k, v in bindings.env.items()}
        self.sh = _Shell(
            dict(env),
            set(env),
            set(),
            [str(a) for a in bindings.args],
            {"braceexpand"},
        )
        self.launch: LaunchRead | None = None
        self.steps = 0
        self.loop_depth = 0
        self.line = 0

    # ---------------------------------------------------------------- errors

    def fail(self, line: int | None, construct: str, detail: str) -> NoReturn:
        """Raise the reader's error for this script."""
        raise LaunchReadError(self.path, line or None, construct, detail)

    # ---------------------------------------------------------------- top level

    def run(self, tree: Node) -> LaunchRead:
        """Run the whole script and return its last launcher command."""
        try:
            self.stmts(tree.get("Stmts") or [], exempt=False)
        except _Exit as done:
            if self.launch is None:
                raise LaunchExited(self.path, done.line, done.status) from None
        except _LoopControl:
            self.fail(self.line, "loop control", "`break`/`continue` outside a loop")
        except _Budget as exc:
            self.fail(self.line, "limit", str(exc))
        if self.launch is None:
            self.fail(
                None,
                "no launcher",
                f"no `python3 -m {_LAUNCHER_MODULE}` command is reached with these bindings",
            )
        return self.launch

    def stmts(self, stmts: list[Node], exempt: bool) -> int:
        """Run a statement list; its status is the last statement's."""
        status = 0
        for stmt in stmts:
            status = self.stmt(stmt, exempt)
        return status

    def stmt(self, stmt: Node, exempt: bool) -> int:
        """Run one statement. ``exempt``: set -e is ignored here (conditions, && lists, !)."""
        self.steps += 1
        if self.steps > _MAX_STEPS:
            self.fail(_line(stmt), "limit", "the script runs too many commands")
        self.line = _line(stmt)
        cmd = stmt.get("Cmd")
        redirs = stmt.get("Redirs") or []
        if stmt.get("Coprocess"):
            self.fail(self.line, "coprocess", "`|&` runs a command concurrently with the script")
        if stmt.get("Background"):
            # A background job runs in a subshell: it may launch, but changes nothing here.
            self.subshell(lambda: self.command(cmd, redirs, stmt, exempt))
            status = 0
        elif stmt.get("Negated"):
            status = 0 if self.command(cmd, redirs, stmt, exempt=True) else 1
        else:
            status = self.command(cmd, redirs, stmt, exempt)
        self.sh.status = status
        return status

    def errexit(self, status: int, exempt: bool, line: int) -> int:
        """Apply ``set -e`` to a command's status."""
        if status and not exempt and "errexit" in self.sh.options:
            raise _Exit(status, line)
        return status

    @contextmanager
    def forked(self) -> Iterator[None]:
        """Run the body on a copy of the shell state, as bash runs a subshell."""
        saved, depth = self.sh, self.loop_depth
        self.sh = saved.fork()
        self.loop_depth = 0
        try:
            yield
        finally:
            self.sh, self.loop_depth = saved, depth

    def subshell(self, body: Callable[[], int]) -> int:
        """Run ``body`` in a subshell and return its exit status."""
        with self.forked():
            try:
                return body()
            except _Exit as done:
                return done.status
            except _LoopControl:
                return 0

    # ---------------------------------------------------------------- commands

    def command(self, cmd: Node | None, redirs: list[Node], stmt: Node, exempt: bool) -> int:
        """Run the command of a statement with its redirections."""
        line = _line(stmt)
        if cmd is None:
            self.redirections(redirs, launcher=False)
            return 0
        kind = cmd.get("Type")
        if kind == "CallExpr":
            return self.call(cmd, redirs, exempt)
        for redir in redirs:
            if redir.get("Op") in ("<<", "<<-", "<<<"):
                # The input could reach a launcher inside the compound command.
                self.fail(_line(redir), "here-document", "input redirected into a compound command")
        self.redirections(redirs, launcher=False)
        if kind == "IfClause":
            return self.if_clause(cmd, exempt)
        if kind == "CaseClause":
            return self.case_clause(cmd, exempt)
        if kind == "Block":
            return self.stmts(cmd.get("Stmts") or [], exempt)
        if kind == "Subshell":
            status = self.subshell(lambda: self.stmts(cmd.get("Stmts") or [], exempt))
            return self.errexit(status, exempt, line)
        if kind == "BinaryCmd":
            return self.binary(cmd, exempt, line)
        if kind == "ForClause":
            return self.for_clause(cmd, exempt)
        if kind == "WhileClause":
            loop = "until" if cmd.get("Until") else "while"
            self.fail(line, f"{loop} loop", "its iteration count cannot be known statically")
        if kind == "FuncDecl":
            name = (cmd.get("Name") or {}).get("Value", "?")
            self.fail(
                line,
                "function definition",
                f"`{name}` could shadow any command, including `python3`",
            )
        if kind == "ArithmCmd":
            value = self.arith(cmd["X"])
            return self.errexit(0 if value else 1, exempt, line)
        if kind == "LetClause":
            value = 0
            for expr in cmd.get("Exprs") or []:
                value = self.arith(expr)
            return self.errexit(0 if value else 1, exempt, line)
        if kind == "TestClause":
            return self.errexit(0 if self.cond(cmd["X"]) else 1, exempt, line)
        if kind == "DeclClause":
            return self.declaration(cmd, line)
        if kind == "TimeClause":
            inner = cmd.get("Stmt")
            return self.stmt(inner, exempt) if inner else 0
        if kind == "CoprocClause":
            self.fail(line, "coproc", "runs a command concurrently with the script")
        self.fail(line, str(kind), "this shell construct is not supported by the launch reader")

    def binary(self, cmd: Node, exempt: bool, line: int) -> int:
        """``&&``, ``||`` and pipelines."""
        op = cmd.get("Op")
        if op in ("&&", "||"):
            status = self.stmt(cmd["X"], exempt=True)
            if (status == 0) == (op == "&&"):
                return self.stmt(cmd["Y"], exempt)
            return status
        if op not in ("|", "|&"):
            self.fail(line, f"operator {op}", "not supported")
        parts: list[Node] = []

        def flatten(stmt: Node) -> None:
            inner = stmt.get("Cmd") or {}
            plain = not (stmt.get("Negated") or stmt.get("Background") or stmt.get("Redirs"))
            if plain and inner.get("Type") == "BinaryCmd" and inner.get("Op") in ("|", "|&"):
                flatten(inner["X"])
                flatten(inner["Y"])
            else:
                parts.append(stmt)

        flatten(cmd["X"])
        flatten(cmd["Y"])
        # Every element of a pipeline runs in its own subshell (lastpipe is off in scripts).
        statuses = [self.subshell(lambda s=part: self.stmt(s, exempt)) for part in parts]
        if "pipefail" in self.sh.options:
            status = next((s for s in reversed(statuses) if s), 0)
        else:
            status = statuses[-1]
        return self.errexit(status, exempt, line)

    def if_clause(self, cmd: Node, exempt: bool) -> int:
        """``if``/``elif``/``else``; conditions run with set -e ignored."""
        clause: Node | None = cmd
        while clause is not None:
            cond = clause.get("Cond")
            if not cond:
                return self.stmts(clause.get("Then") or [], exempt)
            if self.stmts(cond, exempt=True) == 0:
                return self.stmts(clause.get("Then") or [], exempt)
            clause = clause.get("Else")
        return 0

    def case_clause(self, cmd: Node, exempt: bool) -> int:
        """``case``: first matching pattern, with ``;&`` and ``;;&`` continuations."""
        subject = self.string(cmd["Word"], tilde="start")
        items = cmd.get("Items") or []
        status = 0
        index = 0
        while index < len(items):
            item = items[index]
            if not any(self.match(pattern, subject) for pattern in item.get("Patterns") or []):
                index += 1
                continue
            status = self.stmts(item.get("Stmts") or [], exempt)
            op = item.get("Op", ";;")
            while op == ";&" and index + 1 < len(items):
                index += 1
                status = self.stmts(items[index].get("Stmts") or [], exempt)
                op = items[index].get("Op", ";;")
            if op == ";;&":
                index += 1
                continue
            return status
        return status

    def for_clause(self, cmd: Node, exempt: bool) -> int:
        """``for NAME in WORDS``: the word list bounds the iterations."""
        line = _line(cmd)
        loop = cmd.get("Loop") or {}
        if cmd.get("Select"):
            self.fail(line, "select loop", "reads its choice from input at run time")
        if loop.get("Type") != "WordIter":
            self.fail(line, "for ((...)) loop", "its iteration count cannot be known statically")
        name = loop["Name"]["Value"]
        if "InPos" in loop:
            items = self.fields(loop.get("Items") or [])
        else:
            items = list(self.sh.positional)
        status = 0
        self.loop_depth += 1
        try:
            for item in items:
                self.set_scalar(name, item, line)
                try:
                    status = self.stmts(cmd.get("Do") or [], exempt)
                except _LoopControl as ctl:
                    if ctl.levels > 1:
                        ctl.levels -= 1
                        raise
                    if ctl.kind == "break":
                        break
        finally:
            self.loop_depth -= 1
        return status

    # ---------------------------------------------------------------- simple commands

    def call(self, cmd: Node, redirs: list[Node], exempt: bool) -> int:
        """A simple command: assignments, the launcher, modelled builtins, or a skipped command."""
        line = _line(cmd)
        assigns = cmd.get("Assigns") or []
        argv = self.fields(cmd.get("Args") or [])
        if not argv:
            # Assignment-only (or empty after expansion): the assignments persist.
            for assign in assigns:
                self.assign(assign)
            self.redirections(redirs, launcher=False)
            return 0
        # Prefix assignments only reach the command's environment.
        temporary: dict[str, str] = {}
        for assign in assigns:
            name = assign["Name"]["Value"]
            if assign.get("Array") is not None or assign.get("Index") is not None:
                self.fail(line, "assignment", f"array assignment to {name} before a command")
            value = self.string(assign.get("Value"), tilde="assign")
            if assign.get("Append"):
                current = temporary.get(name, self.lookup(name, None, line))
                value = (current or "") + value
            temporary[name] = value
        if self.is_launcher(argv):
            with self.forked():
                self.redirections(redirs, launcher=True)
            env = self.environment()
            env.update(temporary)
            self.launch = LaunchRead(tuple(argv[3:]), line, dict(sorted(env.items())))
            return 0
        if argv[0] in _BASH_BUILTINS:
            self.redirections(redirs, launcher=False)
        else:
            with self.forked():
                self.redirections(redirs, launcher=False)
        status = self.builtin(argv, line)
        return self.errexit(status, exempt, line)

    @staticmethod
    def is_launcher(argv: list[str]) -> bool:
        """Whether the expanded words start ``python3 -m verl.trainer.main_ppo``."""
        return (
            len(argv) >= 3
            and argv[0] in _LAUNCHER_PYTHONS
            and argv[1] == "-m"
            and argv[2] == _LAUNCHER_MODULE
        )

    def environment(self) -> dict[str, str]:
        """The exported scalar variables (bash does not export arrays)."""
        env: dict[str, str] = {}
        for name in self.sh.exported:
            value = self.sh.vars.get(name)
            if isinstance(value, str):
                env[name] = value
        return env

    def builtin(self, argv: list[str], line: int) -> int:
        """Builtins that change the shell; anything else is skipped as a success."""
        name = argv[0]
        if name in (":", "true"):
            return 0
        if name == "false":
            return 1
        if name in ("[", "test"):
            return self.test_builtin(argv, line)
        if name == "exit":
            return self.exit_builtin(argv, line)
        if name == "set":
            return self.set_builtin(argv, line)
        if name == "shift":
            return self.shift_builtin(argv, line)
        if name == "unset":
            return self.unset_builtin(argv, line)
        if name in ("break", "continue"):
            if not self.loop_depth:
                self.fail(line, name, f"`{name}` outside a loop")
            levels = 1
            if len(argv) > 1:
                parsed = _legal_integer(argv[1])
                if parsed is None or parsed < 1:
                    self.fail(line, name, f"invalid loop count {argv[1]!r}")
                levels = parsed
            raise _LoopControl(name, min(levels, self.loop_depth))
        if name == "exec":
            if len(argv) > 1:
                self.fail(line, "exec", "replaces the shell with another program")
            return 0
        if name in _REJECTED_BUILTINS:
            construct, detail = _REJECTED_BUILTINS[name]
            self.fail(line, construct, detail)
        if name == "printf" and len(argv) > 1 and argv[1].startswith("-v"):
            self.fail(line, "printf -v", "sets a variable from formatted output")
        if _LAUNCHER_MODULE in argv[1:]:
            self.fail(
                line, "indirect launcher", f"`{name}` runs {_LAUNCHER_MODULE}; call it directly"
            )
        if name.rsplit("/", 1)[-1] in _SHELLS and any("main_ppo" in a for a in argv[1:]):
            self.fail(line, "indirect launcher", f"`{name}` runs shell code that mentions main_ppo")
        return 0

    def exit_builtin(self, argv: list[str], line: int) -> int:
        """``exit [N]``."""
        if len(argv) > 2:
            return 1  # bash: "too many arguments", and the shell keeps running
        if len(argv) == 1:
            raise _Exit(self.sh.status, line)
        value = _legal_integer(argv[1])
        raise _Exit(2 if value is None else value & 255, line)

    def set_builtin(self, argv: list[str], line: int) -> int:
        """``set`` options and ``set -- ARGS``."""
        options = self.sh.options
        i = 1
        while i < len(argv):
            arg = argv[i]
            if arg == "--":
                self.sh.positional = argv[i + 1 :]
                return 0
            if arg == "-":
                if i + 1 < len(argv):
                    self.sh.positional = argv[i + 1 :]
                return 0
            if len(arg) < 2 or arg[0] not in "-+":
                self.sh.positional = argv[i:]
                return 0
            on = arg[0] == "-"
            for flag in arg[1:]:
                if flag == "o":
                    i += 1
                    if i >= len(argv):
                        return 0  # `set -o` alone lists the options
                    option = argv[i]
                    if option in _SET_NAMED:
                        (options.add if on else options.discard)(_SET_NAMED[option])
                    elif option not in _SET_HARMLESS_NAMES:
                        self.fail(line, f"set -o {option}", "shell option not supported")
                elif flag in _SET_FLAGS:
                    (options.add if on else options.discard)(_SET_FLAGS[flag])
                elif flag not in _SET_HARMLESS_FLAGS:
                    self.fail(line, f"set {arg[0]}{flag}", "shell option not supported")
            i += 1
        return 0

    def shift_builtin(self, argv: list[str], line: int) -> int:
        """``shift [N]``."""
        count = 1
        if len(argv) > 1:
            parsed = _legal_integer(argv[1])
            if parsed is None or parsed < 0:
                self.fail(line, "shift", f"invalid shift count {argv[1]!r}")
            count = parsed
        if count > len(self.sh.positional):
            return 1
        self.sh.positional = self.sh.positional[count:]
        return 0

    def unset_builtin(self, argv: list[str], line: int) -> int:
        """``unset [-v|-f] NAME...``; there are no functions, so ``-f`` does nothing."""
        functions = False
        for arg in argv[1:]:
            if arg in ("-v", "-f", "-fv", "-vf"):
                functions = arg == "-f"
                continue
            if arg.startswith("-"):
                self.fail(line, f"unset {arg}", "option not supported")
            if functions:
                continue
            name, bracket, rest = arg.partition("[")
            if not _is_name(name):
                self.fail(line, "unset", f"not a variable name: {arg!r}")
            if name in self.sh.readonly:
                self.fail(line, "unset", f"{name} is readonly")
            if bracket:
                if not rest.endswith("]"):
                    self.fail(line, "unset", f"bad array subscript {arg!r}")
                index = self.arith_text(rest[:-1], line)
                value = self.sh.vars.get(name)
                if isinstance(value, dict):
                    value.pop(index, None)
                elif isinstance(value, str) and index == 0:
                    del self.sh.vars[name]
                continue
            self.sh.vars.pop(name, None)
            self.sh.exported.discard(name)
        return 0

    def redirections(self, redirs: list[Node], launcher: bool) -> None:
        """Expand redirection targets (for their side effects and errors); open nothing."""
        for redir in redirs:
            line = _line(redir)
            op = redir.get("Op")
            number = (redir.get("N") or {}).get("Value", "")
            if number.startswith("{"):
                self.fail(line, "redirection", f"{number} assigns a file descriptor to a variable")
            if op in ("<<", "<<-"):
                if launcher:
                    self.fail(line, "here-document", "feeds the launcher's standard input")
                if self.heredoc_expands(redir.get("Word")):
                    body = redir.get("Hdoc") or {}
                    fb = _Fields(split=False)
                    for part in body.get("Parts") or []:
                        if part.get("Type") != "Lit":
                            self.part(part, fb, quoted=True, pword=False)
                continue
            if op == "<<<":
                if launcher:
                    self.fail(line, "here-string", "feeds the launcher's standard input")
                self.string(redir.get("Word"), tilde="start")
                continue
            targets = self.fields([redir["Word"]]) if redir.get("Word") else []
            if len(targets) != 1:
                self.fail(line, "redirection", "ambiguous redirect")

    @staticmethod
    def heredoc_expands(word: Node | None) -> bool:
        """Whether a here-document body is expanded (its delimiter is unquoted)."""
        for part in (word or {}).get("Parts") or []:
            if part.get("Type") != "Lit" or "\\" in part.get("Value", ""):
                return False
        return True

    # ---------------------------------------------------------------- declarations

    def declaration(self, cmd: Node, line: int) -> int:
        """``export``, ``declare``/``typeset`` and ``readonly`` with the options modelled here."""
        variant = (cmd.get("Variant") or {}).get("Value", "")
        if variant == "local":
            self.fail(line, "local", "`local` outside a function")
        allowed = {
            "export": ("np", ""),
            "declare": ("axgrp", "x"),
            "typeset": ("axgrp", "x"),
            "readonly": ("pa", ""),
        }
        if variant not in allowed:
            self.fail(line, variant or "declaration", "not supported")
        on: set[str] = set()
        off: set[str] = set()
        assigns: list[Node] = []
        for arg in cmd.get("Args") or []:
            if arg.get("Naked") and arg.get("Name") is None:
                parts = (arg.get("Value") or {}).get("Parts") or []
                text = parts[0].get("Value", "") if len(parts) == 1 else ""
                if len(parts) == 1 and parts[0].get("Type") == "Lit" and text[:1] in ("-", "+"):
                    if text in ("-", "--"):
                        continue
                    (on if text[0] == "-" else off).update(text[1:])
                    continue
                self.fail(line, variant, "a name or option that is not a literal word")
            assigns.append(arg)
        allowed_on, allowed_off = allowed[variant]
        for flag in sorted(on - set(allowed_on)):
            self.fail(line, f"{variant} -{flag}", "option not supported")
        for flag in sorted(off - set(allowed_off)):
            self.fail(line, f"{variant} +{flag}", "option not supported")
        if "p" in on:
            if assigns:
                self.fail(line, f"{variant} -p", "printing with names is not supported")
            return 0
        export = (variant == "export" and "n" not in on) or "x" in on
        unexport = (variant == "export" and "n" in on) or "x" in off
        readonly = variant == "readonly" or "r" in on
        for assign in assigns:
            name = assign["Name"]["Value"]
            if not assign.get("Naked"):
                self.assign(assign)
            if "a" in on:
                current = self.sh.vars.get(name)
                if isinstance(current, str):
                    self.sh.vars[name] = {0: current}
            if export:
                self.sh.exported.add(name)
            if unexport:
                self.sh.exported.discard(name)
            if readonly:
                self.sh.readonly.add(name)
        return 0

    # ---------------------------------------------------------------- assignments

    def check_assignable(self, name: str, line: int) -> None:
        """Reject assignments bash would refuse or that change how words split."""
        if name in self.sh.readonly:
            self.fail(line, "assignment", f"{name} is readonly")
        if name == "IFS":
            self.fail(line, "assignment", "changing IFS changes word splitting; not supported")

    def store(self, name: str, value: Value, line: int) -> None:
        """Set a variable, enforcing the size budget and ``set -a``."""
        size = len(value) if isinstance(value, str) else sum(len(v) for v in value.values())
        if size > _MAX_VALUE or (isinstance(value, dict) and len(value) > _MAX_FIELDS):
            self.fail(line, "limit", f"the value of {name} grows too large")
        self.sh.vars[name] = value
        if "allexport" in self.sh.options:
            self.sh.exported.add(name)

    def set_scalar(self, name: str, value: str, line: int) -> None:
        """``name=value`` as bash does it (element 0 when ``name`` is an array)."""
        self.check_assignable(name, line)
        current = self.sh.vars.get(name)
        if isinstance(current, dict):
            updated = dict(current)
            updated[0] = value
            self.store(name, updated, line)
        else:
            self.store(name, value, line)

    def assign(self, assign: Node) -> None:
        """One assignment word: scalar, ``+=``, ``A=( ... )``, ``A+=( ... )`` or ``A[i]=v``."""
        line = _line(assign)
        name = assign["Name"]["Value"]
        self.check_assignable(name, line)
        append = bool(assign.get("Append"))
        current = self.sh.vars.get(name)
        if assign.get("Array") is not None:
            if assign.get("Index") is not None:
                self.fail(line, "assignment", f"{name}[...] cannot be assigned a list")
            elements = self.array_elements(assign["Array"])
            if append:
                base = dict(current) if isinstance(current, dict) else {}
                if isinstance(current, str):
                    base[0] = current
            else:
                base = {}
            following = max(base) + 1 if base else 0
            for index, value in elements:
                if index is None:
                    index = following
                elif index < 0:
                    index += max(base) + 1 if base else 0
                    if index < 0:
                        self.fail(line, "assignment", f"{name}: bad array subscript")
                base[index] = value
                following = index + 1
            self.store(name, base, line)
            return
        value = self.string(assign.get("Value"), tilde="assign")
        if assign.get("Index") is not None:
            index = self.arith(assign["Index"])
            array = dict(current) if isinstance(current, dict) else {}
            if isinstance(current, str):
                array[0] = current
            if index < 0:
                index += max(array) + 1 if array else 0
                if index < 0:
                    self.fail(line, "assignment", f"{name}: bad array subscript")
            array[index] = array.get(index, "") + value if append else value
            self.store(name, array, line)
            return
        if isinstance(current, dict):
            array = dict(current)
            array[0] = array.get(0, "") + value if append else value
            self.store(name, array, line)
            return
        self.store(name, (current or "") + value if append else value, line)

    def array_elements(self, array: Node) -> list[tuple[int | None, str]]:
        """The elements of ``( ... )``: plain words split like arguments, ``[i]=v`` not split."""
        elements: list[tuple[int | None, str]] = []
        for elem in array.get("Elems") or []:
            if elem.get("Index") is not None:
                index = self.arith(elem["Index"])
                elements.append((index, self.string(elem.get("Value"), tilde="assign")))
            elif elem.get("Value") is not None:
                fields = self.fields([elem["Value"]], assignment_words=False)
                elements.extend((None, f) for f in fields)
        return elements

    # ---------------------------------------------------------------- variables

    def lookup(self, name: str, index: int | None, line: int) -> str | None:
        """A variable's value (or one element), or None when unset."""
        if name not in self.sh.vars and name in _BASH_PROVIDED:
            self.fail(
                line,
                "bash variable",
                f"${name} is set by bash at run time; bind it in the environment to read it",
            )
        value = self.sh.vars.get(name)
        if value is None:
            return None
        if isinstance(value, str):
            return value if index in (None, 0) else None
        if index is None:
            index = 0
        if index < 0:
            index += max(value) + 1 if value else 0
        return value.get(index)

    def elements(self, name: str, line: int) -> list[str] | None:
        """All elements of an array (a scalar is one element), or None when unset."""
        if name not in self.sh.vars and name in _BASH_PROVIDED:
            self.fail(line, "bash variable", f"${name} is set by bash at run time; bind it")
        value = self.sh.vars.get(name)
        if value is None:
            return None
        if isinstance(value, str):
            return [value]
        return [value[k] for k in sorted(value)]

    def unbound(self, line: int, name: str) -> NoReturn:
        """bash's ``set -u`` abort."""
        self.fail(
            line, "unbound variable", f"{name}: unbound variable (set -u aborts the script here)"
        )

    # ---------------------------------------------------------------- word expansion

    def word_items(self, parts: list[Node]) -> list[_Item]:
        """The parts of an unquoted word with its literal text split into characters."""
        items: list[_Item] = []
        for part in parts:
            if part.get("Type") == "Lit":
                for chunk, escaped in _lit_chunks(part.get("Value", "")):
                    if escaped:
                        items.append(_Quoted(chunk))
                    else:
                        items.extend(chunk)
            else:
                items.append(part)
        return items

    def fields(self, words: list[Node], *, assignment_words: bool = True) -> list[str]:
        """Expand words as command arguments: braces, tilde, parameters, splitting."""
        # bash gives NAME=... arguments assignment-style tilde expansion, but not the elements
        # of A=( ... ) (``assignment_words=False``).
        fb = _Fields(split=True)
        try:
            for word in words:
                line = _line(word)
                items = self.word_items(word.get("Parts") or [])
                mode = "word" if assignment_words else "start"
                alternatives = [items]
                if "braceexpand" in self.sh.options and "{" in items:
                    alternatives = _brace_expand(items, line, self)
                    if alternatives != [items]:
                        # bash re-reads the expanded text, so `$E{1,2}` names $E1 and $E2, and
                        # the new words lose the "looks like an assignment" flag.
                        alternatives = [_merge_names(alt) for alt in alternatives]
                        mode = "start"
                for alternative in alternatives:
                    self.emit_items(self.tilde(alternative, mode, line), fb, pword=False)
                    fb.delimit()
        except _Budget as exc:
            self.fail(self.line, "limit", str(exc))
        return fb.finish()

    def string(self, word: Node | None, tilde: str | None) -> str:
        """Expand a word to one string: no brace expansion, no splitting."""
        if word is None:
            return ""
        fb = _Fields(split=False)
        items = self.word_items(word.get("Parts") or [])
        self.emit_items(self.tilde(items, tilde, _line(word)), fb, pword=False)
        return fb.joined()

    def tilde(self, items: list[_Item], mode: str | None, line: int) -> list[_Item]:
        """Tilde expansion with bash's rules for each kind of word (``mode``)."""
        # start: only a leading ~.  word: an argument; if it reads NAME=... it is also expanded
        # after the first = and after each :.  assign: an assignment value, at its start and
        # after each :.
        if mode is None or "~" not in items:
            return items
        out: list[_Item] = []
        i = 0
        n = len(items)
        if _is_char(items[0], "~"):
            if mode == "assign":
                replaced = self.tilde_assign_prefix(items, 0, line)
            else:
                replaced = self.tilde_start_prefix(items, line)
            if replaced is not None:
                text, i = replaced
                out.append(_Quoted(text))
        after_colon = mode == "assign"
        equals = -1
        if mode == "word":
            # bash flags NAME=... arguments as assignments (an unquoted, valid name before `=`).
            for index, item in enumerate(items):
                if type(item) is not str:
                    break
                if item == "=":
                    if index and _is_name("".join(items[:index])):  # type: ignore[arg-type]
                        equals = index
                    break
        while i < n:
            item = items[i]
            out.append(item)
            i += 1
            trigger = i - 1 == equals or (after_colon and _is_char(item, ":"))
            if i - 1 == equals:
                after_colon = True
            if trigger and i < n and _is_char(items[i], "~"):
                replaced = self.tilde_assign_prefix(items, i, line)
                if replaced is not None:
                    text, i = replaced
                    out.append(_Quoted(text))
        return out

    def tilde_start_prefix(self, items: list[_Item], line: int) -> tuple[str, int] | None:
        """A leading ``~...`` of an ordinary word: bash reads it up to the first ``/``."""
        end = 1
        while end < len(items) and not _is_char(items[end], "/"):
            end += 1
        raw = ["~"]
        opaque_at: int | None = None
        for index in range(1, end):
            item = items[index]
            if type(item) is str:
                raw.append(item)
                continue
            if isinstance(item, _Quoted):
                return None  # bash never expands a tilde-prefix that contains quoting
            source = self.source_text(item)
            if any(c in source for c in ("\\", "'", '"')):
                return None
            if opaque_at is None:
                opaque_at = len("".join(raw))
            raw.append(source)
        text = "".join(raw)
        # readline ends the user name at `:` or `=~` and copies the rest of the prefix verbatim.
        stop = len(text)
        for index in range(1, len(text)):
            if text[index] == ":" or text.startswith("=~", index):
                stop = index
                break
        if opaque_at is not None and opaque_at < stop:
            return None  # the user name holds an expansion: no such user, the word stays
        if opaque_at is not None:
            self.fail(line, "tilde expansion", f"{text} copies an expansion verbatim in bash")
        expansion = self.tilde_user(text[1:stop], line)
        if expansion is None:
            return None
        return expansion + text[stop:], end

    def tilde_assign_prefix(
        self, items: list[_Item], start: int, line: int
    ) -> tuple[str, int] | None:
        """A ``~...`` in assignment position: the prefix ends at ``/`` or ``:``."""
        end = start + 1
        while end < len(items):
            item = items[end]
            if type(item) is not str:
                return None  # quoted, or a user name containing an expansion
            if item in "/:":
                break
            end += 1
        expansion = self.tilde_user("".join(items[start + 1 : end]), line)  # type: ignore[arg-type]
        return None if expansion is None else (expansion, end)

    def tilde_user(self, user: str, line: int) -> str | None:
        """The directory for ``~user`` (None: bash leaves the text unexpanded)."""
        if user == "":
            home = self.sh.vars.get("HOME")
            if not isinstance(home, str):
                self.fail(line, "tilde expansion", "~ with HOME unset needs the password database")
            return home
        if user in ("+", "-"):
            return self.lookup("PWD" if user == "+" else "OLDPWD", None, line)
        if not _could_be_user(user):
            return None  # no such user can exist, so bash leaves the word alone
        self.fail(line, "tilde expansion", f"~{user} needs the password database")

    def source_text(self, node: Node) -> str:
        """The exact source text of a node."""
        start = node.get("Pos", {}).get("Offset", 0)
        end = node.get("End", {}).get("Offset", start)
        return self.data[start:end].decode("utf-8", "replace")

    def emit_items(self, items: list[_Item], fb: _Fields, pword: bool) -> None:
        """Expand a word's items into ``fb``; in a parameter word literal text also splits."""
        run: list[str] = []
        for item in items:
            if type(item) is str:
                run.append(item)
                continue
            if run:
                (fb.expanded if pword else fb.text)("".join(run))
                run = []
            if isinstance(item, _Quoted):
                fb.text(item.text)
            else:
                self.part(item, fb, quoted=False, pword=pword)
        if run:
            (fb.expanded if pword else fb.text)("".join(run))

    def part(self, part: Node, fb: _Fields, quoted: bool, pword: bool) -> None:
        """Expand one word part. ``quoted``: inside double quotes."""
        kind = part.get("Type")
        line = _line(part)
        if kind == "Lit":
            value = part.get("Value", "")
            if quoted:
                fb.text(_unescape_dq(value))
            else:
                for chunk, escaped in _lit_chunks(value):
                    (fb.expanded if pword and not escaped else fb.text)(chunk)
        elif kind == "SglQuoted":
            value = part.get("Value", "")
            if quoted:
                if part.get("Dollar"):
                    self.fail(line, "quoting", "$'...' inside a double-quoted expansion")
                # In "${X:-'w'}" the single quotes are ordinary characters.
                fb.text(f"'{value}'")
            else:
                fb.text(self.ansi_c(value, line) if part.get("Dollar") else value)
        elif kind == "DblQuoted":
            inner = part.get("Parts") or []
            if not inner or not all(self.is_at_list(p) for p in inner):
                fb.text("")
            for sub in inner:
                self.part(sub, fb, quoted=True, pword=False)
        elif kind == "ParamExp":
            self.param(part, fb, quoted, pword)
        elif kind == "CmdSubst":
            output = self.substitution(part)
            (fb.text if quoted else fb.expanded)(output)
        elif kind == "ArithmExp":
            value = str(self.arith(part["X"]))
            (fb.text if quoted else fb.expanded)(value)
        elif kind == "ProcSubst":
            self.fail(line, "process substitution", f"{part.get('Op', '<(')}...) runs a command")
        elif kind == "ExtGlob":
            self.fail(line, "extended glob", "extglob patterns are not supported")
        else:
            self.fail(line, str(kind), "this word part is not supported")

    def substitution(self, part: Node) -> str:
        """A command substitution's bound output; never executed."""
        text = _subst_text(self.data, part)
        shown = f"`{text}`" if part.get("Backquotes") else f"$({text})"
        if text not in self.substitutions:
            self.fail(
                _line(part),
                "command substitution",
                f"{shown} has no binding; pass --subst {_sq(text)} OUTPUT",
            )
        # bash drops NUL bytes and strips every trailing newline from the output.
        return str(self.substitutions[text]).replace("\0", "").rstrip("\n")

    def ansi_c(self, text: str, line: int) -> str:
        """Decode ``$'...'`` escapes as bash does in the C locale."""
        out: list[str] = []
        i = 0
        n = len(text)
        while i < n:
            c = text[i]
            if c != "\\" or i + 1 >= n:
                out.append(c)
                i += 1
                continue
            e = text[i + 1]
            i += 2
            if e in _ANSI_ESCAPES:
                out.append(_ANSI_ESCAPES[e])
                continue
            code: int | None = None
            if "0" <= e <= "7":
                j = i
                while j < n and j < i + 2 and "0" <= text[j] <= "7":
                    j += 1
                code = int(e + text[i:j], 8) & 0xFF
                i = j
            elif e in "xuU":
                width = {"x": 2, "u": 4, "U": 8}[e]
                j = i
                while j < n and j < i + width and text[j] in "0123456789abcdefABCDEF":
                    j += 1
                if j == i:
                    out.append("\\" + e)
                    continue
                code = int(text[i:j], 16)
                i = j
            elif e == "c" and i < n:
                ctl = text[i]
                i += 1
                code = 0x7F if ctl == "?" else ord(_ascii_case_char(ctl, True)) & 0x1F
            else:
                out.append("\\" + e)
                continue
            if code == 0:
                break  # bash strings end at a NUL byte
            if code > 0x7F:
                self.fail(line, "quoting", "$'...' with a non-ASCII escape depends on the locale")
            out.append(chr(code))
        return "".join(out)

    @staticmethod
    def is_at_list(part: Node) -> bool:
        """Whether a part is ``$@`` or ``${A[@]}`` (which may expand to no field at all)."""
        if part.get("Type") != "ParamExp" or part.get("Length") or part.get("Excl"):
            return False
        if (part.get("Param") or {}).get("Value") == "@":
            return True
        return _index_word(part.get("Index")) == "@"

    # ---------------------------------------------------------------- parameters

    def param(self, pe: Node, fb: _Fields, quoted: bool, pword: bool) -> None:
        """Parameter expansion: ``$X ${X} ${X:-w} ${#X} ${A[@]} ${X#p} ${X/p/r} ${X:o:l}`` ..."""
        line = _line(pe)
        name = pe["Param"].get("Value", "")
        if pe.get("Excl") or pe.get("Names") or pe.get("Width"):
            self.fail(line, "parameter expansion", f"indirect expansion ${{!{name}...}}")
        nounset = "nounset" in self.sh.options
        index_node = pe.get("Index")
        index_word = _index_word(index_node)
        is_list = name in ("@", "*") or index_word in ("@", "*")
        emit: Callable[[str], None] = fb.text if quoted else fb.expanded
        if pe.get("Length"):
            if pe.get("Exp") or pe.get("Slice") or pe.get("Repl"):
                self.fail(line, "parameter expansion", "operators combined with ${#...}")
            if name in ("@", "*") and index_node is None:
                emit(str(len(self.sh.positional)))
                return
            if is_list:
                values = self.elements(name, line)
                # bash 5.2 under set -u also rejects ${#X[@]} when X is not an array.
                if nounset and (values is None or isinstance(self.sh.vars.get(name), str)):
                    self.unbound(line, name)
                emit(str(len(values or [])))
                return
            value = self.scalar(name, index_node, line)
            if value is None:
                if nounset:
                    self.unbound(line, _display_name(name, index_node))
                value = ""
            if not value.isascii():
                self.fail(
                    line,
                    "parameter expansion",
                    f"${{#{name}}} of non-ASCII text depends on the locale",
                )
            emit(str(len(value)))
            return
        if is_list:
            if pe.get("Slice") or pe.get("Repl"):
                self.fail(line, "parameter expansion", f"slicing or replacing the list {name}")
            if name in ("@", "*"):
                values = list(self.sh.positional)
            else:
                # bash 5.2 lets "${A[@]}" expand to nothing under set -u, like "$@".
                values = self.elements(name, line) or []
            star = name == "*" or index_word == "*"
            exp = pe.get("Exp")
            if exp is not None:
                op = exp.get("Op", "")
                if op not in (":-", "-", ":+", "+", ":?", "?"):
                    self.fail(line, "parameter expansion", f"operator {op!r} on the list {name}")
                # A list is unset with no elements and null when its joined value is empty.
                missing = " ".join(values) == "" if op.startswith(":") else not values
                if op.endswith("?") and missing:
                    self.fail(line, "parameter check", f"{name}: parameter null or not set")
                if (op.endswith("-") and missing) or (op.endswith("+") and not missing):
                    self.param_word(exp.get("Word"), fb, quoted)
                    return
                # Otherwise bash expands the list itself (for an unused `+`, [] or [""]).
            self.emit_list(values, fb, quoted, star)
            return
        value = self.scalar(name, index_node, line)
        exp = pe.get("Exp")
        if exp is not None:
            op = exp.get("Op", "")
            word = exp.get("Word")
            if op in (":-", "-", ":=", "=", ":+", "+", ":?", "?"):
                null = value is None or (op.startswith(":") and value == "")
                if op.endswith("-"):
                    if null:
                        self.param_word(word, fb, quoted)
                    else:
                        emit(value or "")
                elif op.endswith("="):
                    if null:
                        if not _is_name(name):
                            self.fail(
                                line, "parameter expansion", f"${name}: cannot assign in this way"
                            )
                        new = self.string(word, tilde="start")
                        self.assign_indexed(name, index_node, new, line)
                        value = new
                    emit(value or "")
                elif op.endswith("+"):
                    if not null:
                        self.param_word(word, fb, quoted)
                else:
                    if null:
                        message = self.string(word, tilde=None) if word is not None else ""
                        if not message:
                            message = (
                                "parameter null or not set" if op == ":?" else "parameter not set"
                            )
                        self.fail(
                            line, "parameter check", f"{_display_name(name, index_node)}: {message}"
                        )
                    emit(value or "")
                return
            if value is None:
                if nounset:
                    self.unbound(line, _display_name(name, index_node))
                value = ""
            if op in ("#", "##", "%", "%%"):
                emit(self.remove_affix(value, op, word, line))
            elif op in ("^^", "^", ",,", ","):
                if word is not None:
                    self.fail(line, "parameter expansion", f"${{X{op}pattern}} is not supported")
                if not value.isascii():
                    self.fail(
                        line,
                        "parameter expansion",
                        "case change of non-ASCII text depends on the locale",
                    )
                emit(_ascii_case(value, op))
            else:
                self.fail(line, "parameter expansion", f"operator {op!r} is not supported")
            return
        if value is None:
            if nounset:
                self.unbound(line, _display_name(name, index_node))
            value = ""
        if pe.get("Slice") is not None:
            value = self.slice(value, pe["Slice"], line)
        elif pe.get("Repl") is not None:
            value = self.replace(value, pe["Repl"], line)
        emit(value)

    def emit_list(self, values: list[str], fb: _Fields, quoted: bool, star: bool) -> None:
        """Emit ``$@``/``$*``/``${A[@]}``/``${A[*]}`` with bash's field rules."""
        if not fb.split or (quoted and star):
            # "$*" and every list in a non-splitting context join with the first IFS char.
            (fb.text if quoted else fb.expanded)(" ".join(values))
            return
        for i, value in enumerate(values):
            if quoted:
                if i:
                    fb.hard()
                fb.text(value)
            else:
                if i:
                    fb.delimit()
                fb.expanded(value)

    def param_word(self, word: Node | None, fb: _Fields, quoted: bool) -> None:
        """The word of ``${X:-word}``: unquoted text in it is split like the expansion."""
        if word is None:
            return
        parts = word.get("Parts") or []
        if quoted:
            for part in parts:
                self.part(part, fb, quoted=True, pword=False)
            return
        items = self.tilde(self.word_items(parts), "start", _line(word))
        self.emit_items(items, fb, pword=True)

    def scalar(self, name: str, index_node: Node | None, line: int) -> str | None:
        """The value of a scalar parameter (special, positional, variable or element)."""
        if name == "#":
            return str(len(self.sh.positional))
        if name == "?":
            return str(self.sh.status)
        if name == "0":
            return self.path
        if _ascii_digits(name):
            position = int(name)
            return self.sh.positional[position - 1] if position <= len(self.sh.positional) else None
        if name in ("$", "!", "-", "_"):
            self.fail(line, "special parameter", f"${name} is only known at run time")
        if not _is_name(name):
            self.fail(line, "parameter expansion", f"unsupported parameter {name!r}")
        index = None if index_node is None else self.arith(index_node)
        return self.lookup(name, index, line)

    def assign_indexed(self, name: str, index_node: Node | None, value: str, line: int) -> None:
        """Assignment made by ``${X:=word}`` (possibly to an element)."""
        if index_node is None:
            self.set_scalar(name, value, line)
            return
        self.check_assignable(name, line)
        index = self.arith(index_node)
        current = self.sh.vars.get(name)
        array = dict(current) if isinstance(current, dict) else {}
        if isinstance(current, str):
            array[0] = current
        array[index] = value
        self.store(name, array, line)

    # ---------------------------------------------------------------- patterns

    def pattern_chars(self, word: Node | None) -> list[tuple[str, bool]]:
        """A pattern word as (character, is-special) pairs; quoted characters are literal."""
        chars: list[tuple[str, bool]] = []
        for part in (word or {}).get("Parts") or []:
            kind = part.get("Type")
            if kind == "Lit":
                for chunk, escaped in _lit_chunks(part.get("Value", "")):
                    chars.extend((c, not escaped) for c in chunk)
            elif kind == "SglQuoted":
                value = part.get("Value", "")
                if part.get("Dollar"):
                    value = self.ansi_c(value, _line(part))
                chars.extend((c, False) for c in value)
            elif kind == "DblQuoted":
                fb = _Fields(split=False)
                self.part(part, fb, quoted=False, pword=False)
                chars.extend((c, False) for c in fb.joined())
            else:
                # Unquoted expansions keep their pattern characters active.
                fb = _Fields(split=False)
                self.part(part, fb, quoted=False, pword=False)
                chars.extend((c, True) for c in fb.joined())
        return chars

    def compile_pattern(self, word: Node | None, line: int) -> re.Pattern[str]:
        """A bash glob pattern word as a regular expression matching whole strings."""
        try:
            return re.compile(_glob_regex(self.pattern_chars(word)), re.DOTALL)
        except (re.error, _GlobClassError) as exc:
            self.fail(line, "pattern", f"unsupported pattern: {exc}")

    def match(self, word: Node, subject: str) -> bool:
        """Whether ``subject`` matches a case pattern."""
        return self.compile_pattern(word, _line(word)).fullmatch(subject) is not None

    def remove_affix(self, value: str, op: str, word: Node | None, line: int) -> str:
        """``${X#p} ${X##p} ${X%p} ${X%%p}``."""
        self.check_pattern_subject(value, line)
        rx = self.compile_pattern(word, line)
        n = len(value)
        if op == "#":
            cuts: Iterator[int] = iter(range(0, n + 1))
        elif op == "##":
            cuts = iter(range(n, -1, -1))
        elif op == "%":
            cuts = iter(range(n, -1, -1))
        else:
            cuts = iter(range(0, n + 1))
        for cut in cuts:
            if op.startswith("#"):
                if rx.fullmatch(value, 0, cut):
                    return value[cut:]
            elif rx.fullmatch(value, cut, n):
                return value[:cut]
        return value

    def replace(self, value: str, repl: Node, line: int) -> str:
        """``${X/p/r} ${X//p/r} ${X/#p/r} ${X/%p/r}`` (bash 5.2: unquoted ``&`` is the match)."""
        self.check_pattern_subject(value, line)
        orig = repl.get("Orig") or {}
        parts = list(orig.get("Parts") or [])
        anchor = ""
        if parts and parts[0].get("Type") == "Lit" and parts[0].get("Value", "")[:1] in ("#", "%"):
            anchor = parts[0]["Value"][0]
            parts[0] = {**parts[0], "Value": parts[0]["Value"][1:]}
        pattern_word = {**orig, "Parts": parts}
        chars = self.pattern_chars(pattern_word)
        with_pieces = self.replacement_pieces(repl.get("With"), line)

        def render(matched: str) -> str:
            return "".join(matched if piece is None else piece for piece in with_pieces)

        if not chars:
            if anchor == "#":
                return render("") + value
            if anchor == "%":
                return value + render("")
            return value
        try:
            rx = re.compile(_glob_regex(chars), re.DOTALL)
        except (re.error, _GlobClassError) as exc:
            self.fail(line, "pattern", f"unsupported pattern: {exc}")
        n = len(value)
        if anchor == "#":
            for end in range(n, -1, -1):
                if rx.fullmatch(value, 0, end):
                    return render(value[:end]) + value[end:]
            return value
        if anchor == "%":
            for start in range(0, n + 1):
                if rx.fullmatch(value, start, n):
                    return value[:start] + render(value[start:])
            return value
        out: list[str] = []
        i = 0
        replaced = False
        while i < n:
            if replaced and not repl.get("All"):
                break
            found = next((e for e in range(n, i, -1) if rx.fullmatch(value, i, e)), None)
            if found is None:
                out.append(value[i])
                i += 1
                continue
            out.append(render(value[i:found]))
            i = found
            replaced = True
        out.append(value[i:])
        if n == 0 and rx.fullmatch(""):
            return render("")
        return "".join(out)

    def replacement_pieces(self, word: Node | None, line: int) -> list[str | None]:
        """The replacement of ``${X/p/r}`` as text pieces, None standing for the match."""
        pieces: list[str | None] = []
        for part in (word or {}).get("Parts") or []:
            kind = part.get("Type")
            if kind == "Lit":
                for chunk, escaped in _lit_chunks(part.get("Value", "")):
                    if escaped:
                        pieces.append(chunk)
                        continue
                    for segment_index, segment in enumerate(chunk.split("&")):
                        if segment_index:
                            pieces.append(None)
                        pieces.append(segment)
            elif kind in ("SglQuoted", "DblQuoted"):
                fb = _Fields(split=False)
                self.part(part, fb, quoted=False, pword=False)
                pieces.append(fb.joined())
            else:
                fb = _Fields(split=False)
                self.part(part, fb, quoted=False, pword=False)
                text = fb.joined()
                if "&" in text:
                    self.fail(
                        line, "parameter expansion", "an unquoted expansion with & in ${X/p/r}"
                    )
                pieces.append(text)
        return pieces

    def check_pattern_subject(self, value: str, line: int) -> None:
        """Pattern operations are quadratic and locale-dependent beyond ASCII."""
        if len(value) > _MAX_PATTERN_SUBJECT:
            self.fail(line, "limit", "pattern operation on a very long value")
        if not value.isascii():
            self.fail(
                line,
                "parameter expansion",
                "pattern operation on non-ASCII text depends on the locale",
            )

    def slice(self, value: str, spec: Node, line: int) -> str:
        """``${X:offset}`` and ``${X:offset:length}``."""
        if not value.isascii():
            self.fail(
                line, "parameter expansion", "substring of non-ASCII text depends on the locale"
            )
        n = len(value)
        offset = self.arith(spec["Offset"]) if spec.get("Offset") is not None else 0
        if offset < 0:
            offset += n
            if offset < 0:
                return ""
        if offset > n:
            return ""
        if spec.get("Length") is None:
            return value[offset:]
        length = self.arith(spec["Length"])
        if length < 0:
            end = n + length
            if end < offset:
                self.fail(line, "parameter expansion", f"substring expression < 0 ({length})")
            return value[offset:end]
        return value[offset : offset + length]

    # ---------------------------------------------------------------- arithmetic

    def arith(self, node: Node) -> int:
        """Evaluate a shfmt arithmetic expression with bash's 64-bit semantics."""
        kind = node.get("Type")
        line = _line(node)
        if kind == "Word":
            return self.arith_word(node)
        if kind == "ParenArithm":
            return self.arith(node["X"])
        if kind == "UnaryArithm":
            op = node.get("Op")
            if op in ("++", "--"):
                name, index = self.arith_ref(node["X"])
                old = self.arith_var(name, index, line)
                new = _wrap(old + (1 if op == "++" else -1))
                self.arith_store(name, index, new, line)
                return old if node.get("Post") else new
            value = self.arith(node["X"])
            if op == "-":
                return _wrap(-value)
            if op == "+":
                return value
            if op == "!":
                return int(value == 0)
            if op == "~":
                return _wrap(~value)
            self.fail(line, "arithmetic", f"operator {op!r} is not supported")
        if kind == "BinaryArithm":
            op = node.get("Op", "")
            if op in ("=", "+=", "-=", "*=", "/=", "%=", "<<=", ">>=", "&=", "|=", "^="):
                name, index = self.arith_ref(node["X"])
                rhs = self.arith(node["Y"])
                if op != "=":
                    rhs = self.arith_binary(op[:-1], self.arith_var(name, index, line), rhs, line)
                self.arith_store(name, index, rhs, line)
                return rhs
            if op == "&&":
                return int(self.arith(node["X"]) != 0 and self.arith(node["Y"]) != 0)
            if op == "||":
                return int(self.arith(node["X"]) != 0 or self.arith(node["Y"]) != 0)
            if op == "?":
                branches = node["Y"]
                if branches.get("Type") != "BinaryArithm" or branches.get("Op") != ":":
                    self.fail(line, "arithmetic", "malformed ?: expression")
                chosen = branches["X"] if self.arith(node["X"]) else branches["Y"]
                return self.arith(chosen)
            if op == ",":
                self.arith(node["X"])
                return self.arith(node["Y"])
            return self.arith_binary(op, self.arith(node["X"]), self.arith(node["Y"]), line)
        self.fail(line, "arithmetic", f"unsupported expression {kind!r}")

    def arith_binary(self, op: str, a: int, b: int, line: int) -> int:
        """A binary arithmetic operator on two evaluated operands."""
        if op == "+":
            return _wrap(a + b)
        if op == "-":
            return _wrap(a - b)
        if op == "*":
            return _wrap(a * b)
        if op in ("/", "%"):
            if b == 0:
                self.fail(line, "arithmetic", "division by 0")
            # C semantics: the quotient truncates toward zero.
            quotient = abs(a) // abs(b)
            if (a < 0) != (b < 0):
                quotient = -quotient
            return _wrap(quotient) if op == "/" else _wrap(a - b * quotient)
        if op == "**":
            if b < 0:
                self.fail(line, "arithmetic", "exponent less than 0")
            return _wrap(pow(a, b, _INT64))
        if op == "<<":
            return _wrap(a << (b & 63))
        if op == ">>":
            return a >> (b & 63)
        if op == "&":
            return _wrap(a & b)
        if op == "|":
            return _wrap(a | b)
        if op == "^":
            return _wrap(a ^ b)
        comparisons = {
            "==": a == b,
            "!=": a != b,
            "<": a < b,
            "<=": a <= b,
            ">": a > b,
            ">=": a >= b,
        }
        if op in comparisons:
            return int(comparisons[op])
        self.fail(line, "arithmetic", f"operator {op!r} is not supported")

    def arith_word(self, word: Node) -> int:
        """An arithmetic operand: a constant, a variable name, or an expansion of one."""
        line = _line(word)
        parts = word.get("Parts") or []
        if len(parts) == 1 and parts[0].get("Type") == "Lit":
            return self.arith_text(parts[0].get("Value", ""), line, bare=True)
        if len(parts) == 1 and parts[0].get("Type") == "ParamExp" and "Dollar" not in parts[0]:
            # A bare NAME[i] reference.
            name, index = self.arith_ref(word)
            return self.arith_var(name, index, line)
        fb = _Fields(split=False)
        for part in parts:
            self.part(part, fb, quoted=True, pword=False)
        text = fb.joined()
        if not text.strip(" \t\n"):
            self.fail(line, "arithmetic", "an expansion in $((...)) is empty")
        return self.arith_text(text, line, bare=False)

    def arith_text(self, text: str, line: int, bare: bool = True, depth: int = 0) -> int:
        """Evaluate text that must be a constant or a variable name (no nested expressions)."""
        body = text.strip(" \t\n")
        if not body:
            return 0
        sign = 1
        if body[0] in "+-" and len(body) > 1 and body[1] not in "+-":
            sign = -1 if body[0] == "-" else 1
            body = body[1:].lstrip(" \t\n")
        try:
            number = _parse_number(body)
        except ValueError as exc:
            self.fail(line, "arithmetic", str(exc))
        if number is not None:
            return _wrap(sign * number)
        if _is_name(body):
            if depth > 32:
                self.fail(line, "arithmetic", "expression recursion level exceeded")
            return _wrap(sign * self.arith_var(body, None, line, depth + 1))
        self.fail(line, "arithmetic", f"{text!r} is an expression inside a value; not supported")

    def arith_ref(self, node: Node) -> tuple[str, int | None]:
        """The variable an arithmetic assignment or ``++``/``--`` targets."""
        line = _line(node)
        parts = (node.get("Parts") or []) if node.get("Type") == "Word" else []
        if (
            len(parts) == 1
            and parts[0].get("Type") == "Lit"
            and _is_name(parts[0].get("Value", ""))
        ):
            return parts[0]["Value"], None
        if len(parts) == 1 and parts[0].get("Type") == "ParamExp" and "Dollar" not in parts[0]:
            pe = parts[0]
            name = pe["Param"].get("Value", "")
            if _is_name(name) and not pe.get("Exp") and pe.get("Index") is not None:
                return name, self.arith(pe["Index"])
        self.fail(line, "arithmetic", "assignment to something that is not a variable")

    def arith_var(self, name: str, index: int | None, line: int, depth: int = 0) -> int:
        """A variable's value as an arithmetic operand (unset is 0, or an error under set -u)."""
        value = self.lookup(name, index, line)
        if value is None:
            if "nounset" in self.sh.options:
                self.unbound(line, name if index is None else f"{name}[{index}]")
            return 0
        return self.arith_text(value, line, depth=depth)

    def arith_store(self, name: str, index: int | None, value: int, line: int) -> None:
        """Store an arithmetic result into a variable or element."""
        if index is None:
            self.set_scalar(name, str(value), line)
            return
        self.check_assignable(name, line)
        current = self.sh.vars.get(name)
        array = dict(current) if isinstance(current, dict) else {}
        if isinstance(current, str):
            array[0] = current
        array[index] = str(value)
        self.store(name, array, line)

    # ---------------------------------------------------------------- conditionals

    def cond(self, node: Node) -> bool:
        """Evaluate a ``[[ ... ]]`` expression."""
        kind = node.get("Type")
        line = _line(node)
        if kind == "Word":
            return self.string(node, tilde="start") != ""
        if kind == "ParenTest":
            return self.cond(node["X"])
        if kind == "UnaryTest":
            op = node.get("Op")
            if op == "!":
                return not self.cond(node["X"])
            operand = self.string(node["X"], tilde="start")
            return self.unary_test(op or "", operand, line)
        if kind == "BinaryTest":
            op = node.get("Op", "")
            if op == "&&":
                return self.cond(node["X"]) and self.cond(node["Y"])
            if op == "||":
                return self.cond(node["X"]) or self.cond(node["Y"])
            left = self.string(node["X"], tilde="start")
            if op in ("==", "=", "!="):
                matched = self.compile_pattern(node["Y"], line).fullmatch(left) is not None
                return matched if op != "!=" else not matched
            if op == "=~":
                self.fail(line, "[[ =~ ]]", "regular-expression matching is not supported")
            right = self.string(node["Y"], tilde="start")
            if op == "<":
                return left < right
            if op == ">":
                return left > right
            if op in _INT_OPS:
                # Inside [[ ]] the operands of -eq and friends are arithmetic expressions.
                return _compare(op, self.arith_text(left, line), self.arith_text(right, line))
            self.fail(line, f"[[ {op} ]]", "file tests need the file system")
        self.fail(line, "[[ ]]", f"unsupported expression {kind!r}")

    def unary_test(self, op: str, operand: str, line: int) -> bool:
        """Unary operators shared by ``[[ ]]`` and ``[``."""
        if op == "-z":
            return operand == ""
        if op == "-n":
            return operand != ""
        if op == "-v":
            name, bracket, rest = operand.partition("[")
            if not _is_name(name):
                return False
            if bracket:
                if not rest.endswith("]"):
                    return False
                return self.lookup(name, self.arith_text(rest[:-1], line), line) is not None
            return self.lookup(name, None, line) is not None
        if op == "-o":
            if operand in _SET_NAMED:
                return _SET_NAMED[operand] in self.sh.options
            self.fail(line, f"test -o {operand}", "shell option not modelled")
        self.fail(line, f"test {op}", "file and terminal tests need the running system")

    def test_builtin(self, argv: list[str], line: int) -> int:
        """``[ ... ]`` and ``test``: real statuses, 2 for syntax errors."""
        args = argv[1:]
        if argv[0] == "[":
            if not args or args[-1] != "]":
                return 2
            args = args[:-1]
        try:
            return 0 if self.test_expr(args, line) else 1
        except _TestSyntax:
            return 2

    def test_expr(self, args: list[str], line: int) -> bool:
        """POSIX argument-count rules, then bash's precedence parser."""
        n = len(args)
        if n == 0:
            return False
        if n == 1:
            return args[0] != ""
        if n == 2:
            if args[0] == "!":
                return args[1] == ""
            return self.test_unary(args[0], args[1], line)
        if n == 3:
            if args[1] in _TEST_BINARY or args[1] in ("-a", "-o"):
                return self.test_binary(args[0], args[1], args[2], line)
            if args[0] == "!":
                return not self.test_expr(args[1:], line)
            if args[0] == "(" and args[2] == ")":
                return args[1] != ""
        elif n == 4:
            if args[0] == "!":
                return not self.test_expr(args[1:], line)
            if args[0] == "(" and args[3] == ")":
                return self.test_expr(args[1:3], line)
        return _TestParser(self, args, line).parse()

    def test_unary(self, op: str, operand: str, line: int) -> bool:
        """A unary ``[`` operator; anything else is a syntax error."""
        if op in ("-z", "-n", "-v", "-o"):
            return self.unary_test(op, operand, line)
        if op in _TEST_FILE_OPS or op == "-R":
            self.fail(line, f"test {op}", "file and terminal tests need the running system")
        raise _TestSyntax(op)

    def test_binary(self, left: str, op: str, right: str, line: int) -> bool:
        """A binary ``[`` operator."""
        if op in ("=", "=="):
            return left == right
        if op == "!=":
            return left != right
        if op == "<":
            return left < right
        if op == ">":
            return left > right
        if op == "-a":
            return left != "" and right != ""
        if op == "-o":
            return left != "" or right != ""
        if op in _INT_OPS:
            a, b = _legal_integer(left), _legal_integer(right)
            if a is None or b is None:
                raise _TestSyntax("integer expression expected")
            return _compare(op, a, b)
        self.fail(line, f"test {op}", "file tests need the file system")


class _TestParser:
    """bash's ``test`` grammar for more than four arguments (``-o`` < ``-a`` < ``!``)."""

    def __init__(self, shell: _Interpreter, args: list[str], line: int) -> None:
        self.shell = shell
        self.args = args
        self.pos = 0
        self.line = line

    def parse(self) -> bool:
        """The whole expression; leftover arguments are a syntax error."""
        value = self.disjunction()
        if self.pos != len(self.args):
            raise _TestSyntax("too many arguments")
        return value

    def disjunction(self) -> bool:
        """``expr -o expr``."""
        value = self.conjunction()
        while self.pos < len(self.args) and self.args[self.pos] == "-o":
            self.pos += 1
            right = self.conjunction()
            value = value or right
        return value

    def conjunction(self) -> bool:
        """``expr -a expr``."""
        value = self.term()
        while self.pos < len(self.args) and self.args[self.pos] == "-a":
            self.pos += 1
            right = self.term()
            value = value and right
        return value

    def term(self) -> bool:
        """``! term``, ``( expr )``, binary, unary, or a single string."""
        args = self.args
        if self.pos >= len(args):
            raise _TestSyntax("argument expected")
        arg = args[self.pos]
        if arg == "!":
            self.pos += 1
            return not self.term()
        if arg == "(":
            self.pos += 1
            value = self.disjunction()
            if self.pos >= len(args) or args[self.pos] != ")":
                raise _TestSyntax("`)' expected")
            self.pos += 1
            return value
        if self.pos + 3 <= len(args) and args[self.pos + 1] in _TEST_BINARY:
            value = self.shell.test_binary(arg, args[self.pos + 1], args[self.pos + 2], self.line)
            self.pos += 3
            return value
        if (
            self.pos + 2 <= len(args)
            and len(arg) == 2
            and arg[0] == "-"
            and arg not in ("-a", "-o")
        ):
            value = self.shell.test_unary(arg, args[self.pos + 1], self.line)
            self.pos += 2
            return value
        self.pos += 1
        return arg != ""


def _compare(op: str, a: int, b: int) -> bool:
    """Integer comparison operators of ``test`` and ``[[ ]]``."""
    return {
        "-eq": a == b,
        "-ne": a != b,
        "-lt": a < b,
        "-le": a <= b,
        "-gt": a > b,
        "-ge": a >= b,
    }[op]


def _index_word(index: Node | None) -> str | None:
    """The literal text of an index such as ``@`` or ``*``, if it is one literal."""
    if not index or index.get("Type") != "Word":
        return None
    parts = index.get("Parts") or []
    if len(parts) == 1 and parts[0].get("Type") == "Lit":
        return parts[0].get("Value")
    return None


def _display_name(name: str, index: Node | None) -> str:
    """How bash names a parameter in its error messages."""
    if _ascii_digits(name):
        return f"${name}"
    if index is not None:
        return f"{name}[{_index_word(index) or '...'}]"
    return name


# --------------------------------------------------------------------------- globs


class _GlobClassError(Exception):
    """An unknown ``[:class:]`` in a bracket expression."""


def _glob_regex(chars: list[tuple[str, bool]]) -> str:
    """Translate bash glob characters (special or literal) into a regular expression."""
    out: list[str] = []
    i = 0
    n = len(chars)
    while i < n:
        c, special = chars[i]
        if not special:
            out.append(re.escape(c))
            i += 1
            continue
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "\\":
            # In an expanded pattern a backslash quotes the next character.
            if i + 1 < n:
                out.append(re.escape(chars[i + 1][0]))
                i += 1
            else:
                out.append(re.escape(c))
        elif c == "[":
            bracket = _glob_bracket(chars, i)
            if bracket is None:
                out.append(re.escape(c))
            else:
                regex, i = bracket
                out.append(regex)
                continue
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _glob_bracket(chars: list[tuple[str, bool]], start: int) -> tuple[str, int] | None:
    """A ``[...]`` bracket expression at ``start`` as a regex class and the index after it."""
    n = len(chars)
    i = start + 1
    negate = False
    if i < n and chars[i][1] and chars[i][0] in "!^":
        negate = True
        i += 1
    members: list[str] = []
    first = True
    while i < n:
        c, special = chars[i]
        if c == "]" and special and not first:
            body = "".join(members)
            if not body:
                return None
            return f"[{'^' if negate else ''}{body}]", i + 1
        first = False
        if c == "[" and special and i + 1 < n and chars[i + 1] == (":", True):
            end = i + 2
            while end + 1 < n and not (chars[end] == (":", True) and chars[end + 1] == ("]", True)):
                end += 1
            if end + 1 < n:
                name = "".join(ch for ch, _ in chars[i + 2 : end])
                if name not in _CHAR_CLASSES:
                    raise _GlobClassError(f"unknown character class [:{name}:]")
                members.append(_CHAR_CLASSES[name])
                i = end + 2
                continue
        if (
            i + 2 < n
            and chars[i + 1] == ("-", True)
            and not (chars[i + 2][0] == "]" and chars[i + 2][1])
        ):
            low, high = c, chars[i + 2][0]
            if low <= high:
                members.append(f"{_class_escape(low)}-{_class_escape(high)}")
            i += 3
            continue
        members.append(_class_escape(c))
        i += 1
    return None


def _class_escape(c: str) -> str:
    """Escape one character for use inside a regex character class."""
    return "\\" + c if c in "\\]^-[" else c


# --------------------------------------------------------------------------- braces


def _is_char(item: _Item, c: str) -> bool:
    """Whether an item is the unquoted character ``c``."""
    return type(item) is str and item == c


def _merge_names(items: list[_Item]) -> list[_Item]:
    """Re-read ``$NAME`` followed by name characters, as bash does after brace expansion."""
    out: list[_Item] = []
    i = 0
    n = len(items)
    while i < n:
        item = items[i]
        i += 1
        if (
            isinstance(item, dict)
            and item.get("Type") == "ParamExp"
            and item.get("Short")
            and item.get("Index") is None
            and _is_name((item.get("Param") or {}).get("Value", ""))
            and i < n
            and type(items[i]) is str
            and _is_name("a" + items[i])  # type: ignore[operator]
        ):
            name = item["Param"]["Value"]
            while i < n and type(items[i]) is str and _is_name("a" + items[i]):  # type: ignore[operator]
                name += items[i]  # type: ignore[operator]
                i += 1
            item = {**item, "Param": {**item["Param"], "Value": name}}
        out.append(item)
    return out


def _brace_gobble(text: list[_Item], i: int, satisfy: str) -> int:
    """bash's brace_gobbler: index of the next depth-0 ``satisfy`` character, or len(text)."""
    level = 0
    n = len(text)
    while i < n:
        item = text[i]
        if type(item) is not str:
            i += 1
            continue
        if item == satisfy and level == 0:
            # bash ignores an opening brace that ends the word or is followed by `}` at word start.
            if item == "{" and i == 0 and (i + 1 == n or _is_char(text[i + 1], "}")):
                i += 1
                continue
            return i
        if item == "{":
            level += 1
        elif item == "}" and level:
            level -= 1
        i += 1
    return n


def _brace_expand(text: list[_Item], line: int, shell: _Interpreter) -> list[list[_Item]]:
    """bash brace expansion (``a{b,c}d``, ``{1..5}``, ``{a..e..2}``) over word items."""
    n = len(text)
    i = 0
    while True:
        i = _brace_gobble(text, i, "{")
        if i >= n:
            return [text]
        close = _brace_gobble(text, i + 1, "}")
        if close < n:
            break
        i += 1
    preamble = text[:i]
    amble = text[i + 1 : close]
    if any(_is_char(item, ",") for item in amble):
        tack = _brace_amble(amble, line, shell)
    else:
        sequence = _brace_sequence(amble, line, shell)
        if sequence is not None:
            tack = [list(s) for s in sequence]
        elif close + 1 < n:
            tack = [text[i : close + 1]]
        else:
            return [text]
    result = [preamble + t for t in tack]
    post = text[close + 1 :]
    if post:
        posts = _brace_expand(post, line, shell)
        if len(result) * len(posts) > _MAX_FIELDS:
            raise _Budget("brace expansion produces too many words")
        result = [r + p for r in result for p in posts]
    return result


def _brace_amble(amble: list[_Item], line: int, shell: _Interpreter) -> list[list[_Item]]:
    """The comma-separated alternatives inside braces, each brace-expanded in turn."""
    result: list[list[_Item]] = []
    start = 0
    while True:
        i = _brace_gobble(amble, start, ",")
        result.extend(_brace_expand(amble[start:i], line, shell))
        if len(result) > _MAX_FIELDS:
            raise _Budget("brace expansion produces too many words")
        if i >= len(amble):
            return result
        start = i + 1


def _brace_sequence(amble: list[_Item], line: int, shell: _Interpreter) -> list[str] | None:
    """A ``{x..y[..incr]}`` sequence, or None when the text is not a valid one."""
    if not amble or any(type(item) is not str for item in amble):
        return None
    text = "".join(amble)  # type: ignore[arg-type]
    pieces = text.split("..")
    if len(pieces) not in (2, 3):
        return None
    lhs, rhs = pieces[0], pieces[1]
    step = 1
    if len(pieces) == 3:
        parsed = _legal_integer(pieces[2]) if pieces[2].strip() == pieces[2] else None
        if parsed is None:
            return None
        step = parsed
    lhs_int = _legal_integer(lhs) if lhs.strip() == lhs else None
    rhs_int = _legal_integer(rhs) if rhs.strip() == rhs else None
    if lhs_int is not None and rhs_int is not None:
        start, end = lhs_int, rhs_int
        width = 0
        # bash zero-pads when either end is written with a leading zero; its width counts
        # everything after the first "..", increment included.
        rhs_len = len(text) - len(lhs) - 2
        if (len(lhs) > 1 and lhs[0] == "0") or (len(lhs) > 2 and lhs[:2] == "-0"):
            width = len(lhs)
        if (
            (rhs_len > 1 and rhs[0] == "0") or (rhs_len > 2 and rhs[:2] == "-0")
        ) and width < rhs_len:
            width = rhs_len
        chars = False
    elif (
        len(lhs) == 1
        and len(rhs) == 1
        and lhs.isascii()
        and rhs.isascii()
        and lhs.isalpha()
        and rhs.isalpha()
    ):
        start, end, width, chars = ord(lhs), ord(rhs), 0, True
    else:
        return None
    if step == 0:
        step = 1
    step = abs(step) if start <= end else -abs(step)
    count = abs(end - start) // abs(step) + 1
    if count > _MAX_FIELDS:
        shell.fail(line, "brace expansion", f"{{{text}}} produces {count} words")
    out: list[str] = []
    value = start
    for _ in range(count):
        if chars:
            out.append(chr(value))
        elif width:
            out.append(f"{value:0{width}d}")
        else:
            out.append(str(value))
        value += step
    return out
