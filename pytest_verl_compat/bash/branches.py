"""Conditions only the running system can decide, where the decision changes nothing.

``if [ ! -d "$CKPT" ]; then mkdir -p "$CKPT"; fi`` and ``[ -f data.parquet ] || python3
prepare.py`` test the file system, which this reader never sees. When such a condition is pure
(tests only: no assignment, no command that acts), both ways are run on copies of the shell;
if they leave the same shell (variables, options, folder, functions, launcher, captured
output, status), the decision cannot change the read and the script goes on. Otherwise the
condition's own refusal stands.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from pytest_verl_compat.bash.errors import BudgetExceeded, LaunchReadError
from pytest_verl_compat.bash.expansion import assigns_nothing
from pytest_verl_compat.bash.launcher import Launcher
from pytest_verl_compat.bash.parse import Node
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
        status_reader: Node | None = None,
    ) -> int:
        """Run both ways; the shared result when they agree, else the condition's refusal.

        ``status_reader``: the statement after this command. When it reads no status (neither
        expands ``$?`` nor is a bare ``exit``/``return``), only the statuses may differ.
        """
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
                raise undecided.error from None
            except Exception:
                # exit, return, break: the two ways part; so does the read.
                self.load(saved)
                raise undecided.error from None
            outcomes.append((status, self.save()))
            self.load(saved)
        (first_status, first), (second_status, second) = outcomes
        status_differs = first_status != second_status
        if (status_differs and observes_status(status_reader)) or not _same(first, second):
            raise undecided.error
        self.load(first)
        return first_status

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
        return len(parts) == 1 and parts[0].get("Type") == "Lit" and parts[0].get("Value") in _TESTS
    return False
