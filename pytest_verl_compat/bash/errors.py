"""What the launch reader raises: its public errors, its budgets and internal control flow.

Nothing here imports the rest of the package.
"""

from __future__ import annotations

# Budgets that keep hostile or generated scripts from exhausting time or memory; real launch
# scripts are several orders of magnitude below each of them.
MAX_STEPS = 200_000
MAX_VALUE = 1_000_000
MAX_FIELDS = 100_000
MAX_PATTERN_SUBJECT = 10_000
# Steps of glob matching (one per live pattern position per character): globs are matched by
# a set-of-positions automaton, linear in the text, but `${X//*a*b/r}` restarts at every offset.
MAX_PATTERN_STEPS = 2_000_000
# Characters produced by all expansions together: each step is bounded, but 200k steps that
# each copy a 1 MB value would take minutes.
MAX_WORK = 100_000_000
# Run-time values created (each expansion of $PWD or an unbound `$(...)` makes one); a real
# script makes a few dozen, a loop of brace expansions could make millions.
MAX_RUNTIME_VALUES = 100_000
SHFMT_TIMEOUT = 60
# Input bounds, checked before shfmt sees a byte. shfmt's tree takes about a kilobyte of memory
# per byte of script (far more for many tiny statements), and its parser recurses once per
# nesting level: 100k nested `(` cost it a gigabyte, and arithmetic parentheses overflow its
# stack. The largest upstream example is under 12 KiB and nests fewer than 10 levels.
MAX_SCRIPT_BYTES = 1 << 20
MAX_NESTING = 200
# shfmt's data segment (Go heap and goroutine stacks); a real script needs about 20 MiB.
SHFMT_MEMORY = 512 << 20
# shfmt's JSON indents every level, so its size grows with the square of the nesting depth
# (1000 nested `if` print 188 MB); a real script's tree is about 50 bytes per byte of script.
MAX_TREE_BYTES = 64 << 20


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
        # One line whatever the script holds: a file name or a quoted word may hold newlines.
        text = f"{where}: {self.construct}: {self.detail}"
        return text.replace("\r", "\\r").replace("\n", "\\n")


class LaunchExited(LaunchReadError):
    """The script reaches `exit` before the launcher."""

    def __init__(self, path: str, line: int | None, status: int) -> None:
        super().__init__(
            path, line, "exit", f"the script exits with status {status} before the launcher"
        )
        # Keep args matching this signature so the exception survives pickling (xdist).
        self.args = (path, line, status)
        self.status = status


class LaunchForked(LaunchReadError):
    """A condition only the running system decides, whose two ways lead to different reads:
    the read follows one way when ``Bindings.conditions`` names it (``key``), else it stops
    here with the condition's own refusal (``construct``, ``detail``)."""

    def __init__(
        self, path: str, line: int | None, construct: str, detail: str, key: str, text: str
    ) -> None:
        super().__init__(path, line, construct, detail)
        # Keep args matching this signature so the exception survives pickling (xdist).
        self.args = (path, line, construct, detail, key, text)
        self.key = key  # the condition's place: FILE:LINE:COLUMN, and #N when met again
        self.text = text  # the condition as written (`[ -d "$HOME/models/Qwen" ]`)


class BudgetExceeded(Exception):
    """A resource budget was exceeded (converted to LaunchReadError with a line)."""


class ShellExit(Exception):
    """The shell exits (``exit``, or ``set -e`` after a failure); ``replaced``: by ``exec``,
    which runs no EXIT trap."""

    def __init__(self, status: int, line: int, replaced: bool = False) -> None:
        super().__init__(status, line, replaced)
        self.status = status
        self.line = line
        self.replaced = replaced


class LoopControl(Exception):
    """``break`` or ``continue`` unwinding to the enclosing ``for``."""

    def __init__(self, kind: str, levels: int) -> None:
        super().__init__(kind, levels)
        self.kind = kind
        self.levels = levels


class ShellReturn(Exception):
    """``return`` unwinding to the function call."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class MalformedTest(Exception):
    """A ``[`` / ``test`` expression that bash rejects with status 2."""
