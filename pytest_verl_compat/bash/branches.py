"""Conditions only the running system can decide: followed both ways, or one way as bound.

``if [ ! -d "$CKPT" ]; then mkdir -p "$CKPT"; fi`` and ``[ -f data.parquet ] || python3
prepare.py`` test the file system, which this reader never sees; ``command -v nvidia-smi`` and
``which ray`` look a program up on it. When such a condition is pure (tests only: no
assignment, no command that acts), both ways are run on copies of the shell; if they leave the
same shell (variables, options, folder, functions, launcher, captured output, status), the
decision cannot change the read and the script goes on.

Otherwise the ways part (``if [ -d "$HOME/models/Qwen" ]; then MODEL=...; else MODEL=...;
fi``): the read takes the way ``Bindings.conditions`` names for this condition (its place,
``FILE:LINE:COLUMN``, with ``#N`` when it is met again) and records it (``LaunchRead.conditions``);
unbound, it stops with :class:`LaunchForked`, which carries the condition's own refusal, so a
caller that does not follow ways sees the refusal it always saw (``ways`` follows each).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from pytest_verl_compat.bash.errors import BudgetExceeded, LaunchForked, LaunchReadError
from pytest_verl_compat.bash.expansion import assigns_nothing
from pytest_verl_compat.bash.launcher import Launcher
from pytest_verl_compat.bash.parse import Node, line_of
from pytest_verl_compat.bash.results import TakenCondition
from pytest_verl_compat.bash.state import Shell

# The commands a pure condition is made of: tests that only read.
_TESTS = frozenset({"[", "test"})
# Refusals that only mean "the running system decides this".
_RESOURCE = frozenset({"limit", "nesting"})


class Undecided:
    """A pure condition this reader cannot decide, with the refusal it raised."""

    def __init__(self, error: LaunchReadError) -> None:
        self.error = error


class Branches(Launcher):
    """Runs both ways of an undecidable pure condition and keeps the result if they agree."""

    def condition(self, stmts: list[Node]) -> int | Undecided:
        """A condition's status, or Undecided when the running system decides a pure one."""
        if not _pure(stmts):
            return self.stmts(stmts, exempt=True)
        looked_up = _looks_up(stmts)
        printed = self.capture is not None and self.stdout_captured and not _silent(stmts[0])
        if looked_up is not None and not printed:
            # `command -v nvidia-smi`: whether the program is installed where the script runs.
            # (Printing into a `$(...)`, it stays a command assumed to succeed, its output
            # only known at run time.)
            line = line_of(stmts[0])
            return Undecided(
                LaunchReadError(
                    self.path,
                    line,
                    looked_up,
                    f"`{' '.join(self.source_text(stmts[0]).split())}`: whether the program "
                    "it looks up is installed is only known where the script runs",
                )
            )
        try:
            return self.stmts(stmts, exempt=True)
        except LaunchReadError as exc:
            if exc.construct in _RESOURCE or not _undecidable(exc):
                raise
            return Undecided(exc)

    def either(
        self,
        when_true: Callable[[], int],
        when_false: Callable[[], int],
        undecided: Undecided,
        status_reader: Node | None,
        tested: list[Node],
    ) -> int:
        """Run both ways; the shared result when they agree. Where they part, the way bound
        for this condition (``tested``), else :class:`LaunchForked`.

        ``status_reader``: the statement after this command. When it reads no status (neither
        expands ``$?`` nor is a bare ``exit``/``return``), only the statuses may differ.
        """
        key, text = self.condition_place(tested)
        chosen = self.choices.get(key)
        if chosen is not None:
            line = line_of(tested[0])
            self.taken.append(TakenCondition(key, text, self.path, line, chosen))
            return (when_true if chosen else when_false)()
        outcomes = []
        for way in (when_true, when_false):
            saved = self.save()
            try:
                status = way()
            except BudgetExceeded:
                raise
            except LaunchReadError as exc:
                if exc.construct in _RESOURCE:
                    raise
                # A refusal, or another condition that parts, on one way: they part here.
                self.load(saved)
                raise self.forked_at(key, text, undecided) from None
            except Exception:
                # exit, return, break: the two ways part.
                self.load(saved)
                raise self.forked_at(key, text, undecided) from None
            outcomes.append((status, self.save()))
            self.load(saved)
        (first_status, first), (second_status, second) = outcomes
        status_differs = first_status != second_status
        if (status_differs and observes_status(status_reader)) or not _same(first, second):
            raise self.forked_at(key, text, undecided)
        self.load(first)
        return first_status

    def condition_place(self, tested: list[Node]) -> tuple[str, str]:
        """The key of a condition met now (its place, and how often it was met before), and
        its text; counting it as met."""
        start, end = tested[0].get("Pos") or {}, tested[-1].get("End") or {}
        where = "trap:" if "the code of a trap" in self.substituting else ""
        place = f"{self.path}:{where}{start.get('Line', 0)}:{start.get('Col', 0)}"
        seen = self.met.get(place, 0)
        self.met[place] = seen + 1
        text = self.data[start.get("Offset", 0) : end.get("Offset", 0)].decode("utf-8", "replace")
        text = " ".join(text.split()).removesuffix(";").rstrip()
        return (f"{place}#{seen + 1}" if seen else place), text

    def forked_at(self, key: str, text: str, undecided: Undecided) -> LaunchForked:
        error = undecided.error
        return LaunchForked(error.path, error.line, error.construct, error.detail, key, text)

    def save(self) -> dict[str, Any]:
        """Everything a command can change that a later one can see, copied."""
        capture = self.capture
        return {
            "sh": self.sh.fork(),
            "launch": self.launch,
            "other_entry": self.other_entry,
            "frames": copy.deepcopy(self.frames),
            "capture": None
            if capture is None
            else (list(capture.pieces), capture.unknown, capture.open_newlines),
            "stdin": (self.stdin.text, self.stdin.position, self.stdin.origin),
            "met": dict(self.met),
            "taken": list(self.taken),
        }

    def load(self, saved: dict[str, Any]) -> None:
        """Make ``saved`` (from :meth:`save`) the state; it is copied again."""
        # The same shell object, refilled: a function call holds on to it.
        self.sh.__dict__.update(saved["sh"].fork().__dict__)
        self.launch = saved["launch"]
        self.other_entry = saved["other_entry"]
        self.frames[:] = copy.deepcopy(saved["frames"])
        if self.capture is not None and saved["capture"] is not None:
            self.capture.pieces[:] = saved["capture"][0]
            self.capture.unknown = saved["capture"][1]
            self.capture.open_newlines = saved["capture"][2]
        # The same input object, rewound: the commands around share it.
        self.stdin.text, self.stdin.position, self.stdin.origin = saved["stdin"]
        self.met = dict(saved["met"])
        self.taken[:] = saved["taken"]


def _same(first: dict[str, Any], second: dict[str, Any]) -> bool:
    one, two = first["sh"], second["sh"]
    return all(getattr(one, name) == getattr(two, name) for name in Shell.COMPARED) and all(
        first[key] == second[key] for key in ("launch", "other_entry", "frames", "capture", "stdin")
    )


def observes_status(stmt: Node | None) -> bool:
    """Whether a statement reads the status the one before it left: ``$?``, bare exit/return."""
    if stmt is None:
        return True
    stack: list[Any] = [stmt]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            if node.get("Type") == "ParamExp" and (node.get("Param") or {}).get("Value") == "?":
                return True
            if node.get("Type") == "CallExpr":
                args = node.get("Args") or []
                first = (args[0].get("Parts") or [{}]) if args else [{}]
                if len(args) == 1 and first[0].get("Value") in ("exit", "return"):
                    return True
            stack.extend(v for v in node.values() if isinstance(v, (dict, list)))
    return False


def _undecidable(error: LaunchReadError) -> bool:
    """A refusal that only says the running system decides: a file test, a run-time value."""
    return error.construct.startswith("test -") or error.construct == "run-time value"


# Commands that look a name up on the running system's PATH: their status is whether it is
# installed there (`command -v NAME`, `type NAME`, `which NAME`, `hash NAME`).
_LOOKUPS = frozenset({"type", "which", "hash"})


def _words(stmt: Node) -> list[str] | None:
    """A simple command's words, each as written (None: not a simple command)."""
    cmd = stmt.get("Cmd") or {}
    if cmd.get("Type") != "CallExpr" or cmd.get("Assigns"):
        return None
    words = []
    for arg in cmd.get("Args") or []:
        parts = arg.get("Parts") or []
        plain = len(parts) == 1 and parts[0].get("Type") == "Lit"
        # Only the command and its options must be plain to tell a lookup; "?" stands for a
        # word written otherwise (`"$1"`), never an option.
        words.append(str(parts[0].get("Value", "")) if plain else "?")
    return words


def _looks_up(stmts: list[Node]) -> str | None:
    """The refusal's construct when a condition is one lookup of a program (``command -v
    NAME``, ``which NAME``, ``type -P NAME``, ``hash NAME``), its output sent nowhere but
    /dev/null or the other stream; else None."""
    if len(stmts) != 1 or not _discarded(stmts[0]):
        return None
    words = _words(stmts[0]) or [""]
    names = [word for word in words[1:] if not word.startswith("-")]
    if len(names) != 1:
        return None
    if words[0] == "command" and words[1:2] in (["-v"], ["-V"]):
        return f"command {words[1]}"
    if words[0] in _LOOKUPS and not any(word in ("-p", "-r", "-d") for word in words[1:]):
        return words[0]
    return None


def _discarded(stmt: Node) -> bool:
    """Whether every redirection of a statement (if any) sends output to /dev/null or the
    other stream."""
    for redir in stmt.get("Redirs") or []:
        parts = (redir.get("Word") or {}).get("Parts") or []
        target = parts[0].get("Value") if len(parts) == 1 else None
        if redir.get("Op") not in (">", ">>", "&>", ">&") or target not in ("/dev/null", "1", "2"):
            return False
    return True


def _pure(stmts: list[Node]) -> bool:
    """Whether a condition only tests: ``[ ]``, ``test``, ``[[ ]]``, with ``!``, ``&&``, ``||``."""
    return bool(stmts) and all(_pure_statement(stmt) for stmt in stmts) and assigns_nothing(stmts)


def _pure_statement(stmt: Node) -> bool:
    if stmt.get("Background") or stmt.get("Coprocess"):
        return False
    cmd = stmt.get("Cmd") or {}
    kind = cmd.get("Type")
    if kind == "TestClause":
        return True
    if kind == "BinaryCmd" and cmd.get("Op") in ("&&", "||"):
        return _pure_statement(cmd["X"]) and _pure_statement(cmd["Y"])
    if kind == "CallExpr" and not cmd.get("Assigns"):
        parts = ((cmd.get("Args") or [{}])[0].get("Parts")) or []
        if len(parts) == 1 and parts[0].get("Type") == "Lit" and parts[0].get("Value") in _TESTS:
            return True
        return _looks_up([stmt]) is not None
    return False


def _silent(stmt: Node) -> bool:
    """Whether a statement's standard output goes to /dev/null."""
    for redir in stmt.get("Redirs") or []:
        parts = (redir.get("Word") or {}).get("Parts") or []
        target = parts[0].get("Value") if len(parts) == 1 else None
        number = (redir.get("N") or {}).get("Value", "")
        if target == "/dev/null" and (redir.get("Op") == "&>" or number in ("", "1")):
            return True
    return False
