"""Traps: code the shell runs when it exits (EXIT) or a command fails (ERR), run as bash runs it.

A trap's code is text the script gives to ``trap``; it is parsed (shfmt, never run) when the
trap is set and interpreted where bash would run it: EXIT when the shell (the script, or the
subshell that set it) ends, except through ``exec``; ERR after a command whose failure ``set
-e`` would act on, in functions and subshells only under ``set -E``. A trap that only handles
signals never runs in a run the audit follows. Code for DEBUG or RETURN runs around every
command and stays refused, and so does code only known at run time.
"""

from __future__ import annotations

from pytest_verl_compat.bash.errors import (
    LaunchForked,
    LaunchReadError,
    LoopControl,
    ShellExit,
    ShellReturn,
)
from pytest_verl_compat.bash.functions import Functions
from pytest_verl_compat.bash.parse import load_script, parse_script
from pytest_verl_compat.bash.state import Trap

# Conditions that run code in every run, by the name bash shows; signals are the rest.
_ALIASES = {"0": "EXIT", "EXIT": "EXIT", "ERR": "ERR", "DEBUG": "DEBUG", "RETURN": "RETURN"}
_MODELLED = frozenset({"EXIT", "ERR"})


class Traps(Functions):
    """The ``trap`` builtin and running its code."""

    def trap_builtin(self, words: list[str], line: int) -> int:
        """``trap [ACTION] CONDITION...``; ``trap``, ``-p`` and ``-l`` only print."""
        args = words[1:]
        if args[:1] == ["--"]:
            args = args[1:]
        if not args or (args[0].startswith("-") and args[0] not in ("-", "--")):
            self.write_unknown("`trap`")  # it lists traps or signals
            return 0
        if len(args) == 1:
            action, conditions = "-", args  # `trap SIGNAL` resets it
        else:
            action, conditions = args[0], args[1:]
        for condition in conditions:
            self.need(condition, line, "names what `trap` acts on")
        kinds = {_ALIASES.get(c.upper().removeprefix("SIG"), "signal") for c in conditions}
        if action in ("-", ""):
            for kind in kinds & _MODELLED:
                if action == "-":
                    self.sh.traps.pop(kind, None)
                else:
                    self.sh.traps[kind] = Trap("", None, line, self.path)
            return 0
        for kind in sorted(kinds - _MODELLED - {"signal"}):
            self.fail(line, f"trap {kind}", "runs its code around every command")
        if kinds & _MODELLED:
            self.need(action, line, "is the code of a trap, which bash parses")
            try:
                tree = parse_script(*load_script(self.path, action))
            except LaunchReadError as exc:
                self.fail(line, "trap", f"its code does not parse: {exc.detail}")
            for kind in kinds & _MODELLED:
                self.sh.traps[kind] = Trap(action, tree, line, self.path)
        return 0

    def run_trap(self, kind: str) -> None:
        """Run the ``kind`` trap's code, if it has any (an EXIT trap runs once)."""
        trap = self.sh.traps.get(kind)
        if trap is None or trap.tree is None:
            return
        # An EXIT trap runs once; an ERR trap does not fire while its own code runs.
        del self.sh.traps[kind]
        saved = self.enter_file(trap.path, trap.text.encode(), self.source_name)
        status = self.sh.status
        self.substituting.append("the code of a trap")
        try:
            self.stmts(trap.tree.get("Stmts") or [], exempt=False)
        except ShellReturn as done:
            status = done.status
        except LoopControl:
            pass
        except LaunchReadError as exc:
            if exc.construct in ("limit", "nesting") or isinstance(exc, LaunchForked):
                raise
            where = f"line {exc.line} of its code: " if exc.line else ""
            raise LaunchReadError(
                trap.path, trap.line, f"trap {kind}", f"{where}{exc.construct}: {exc.detail}"
            ) from None
        finally:
            self.substituting.pop()
            self.enter_file(*saved)
            if kind == "ERR":
                self.sh.traps.setdefault(kind, trap)
        if kind == "ERR":
            self.sh.status = status

    def exit_trap(self, status: int) -> int:
        """The shell ends with ``status``: run its EXIT trap; an ``exit`` there decides."""
        if "EXIT" not in self.sh.traps:
            return status
        self.sh.status = status
        try:
            self.run_trap("EXIT")
        except ShellExit as done:
            return done.status
        return status

    def err_trap(self) -> None:
        """A command failed where ``set -e`` would act: run the ERR trap if it applies here."""
        if "ERR" in self.sh.traps and ("errtrace" in self.sh.options or not self.in_function()):
            self.run_trap("ERR")

    def subshell_traps(self) -> None:
        """A subshell starts without the EXIT trap, and without ERR unless ``set -E``."""
        self.sh.traps.pop("EXIT", None)
        if "errtrace" not in self.sh.options:
            self.sh.traps.pop("ERR", None)
