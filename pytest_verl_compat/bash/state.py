"""Interpreter state: the launcher it looks for, shell options, variables and their values.

:class:`State` is the base of the interpreter's mixin layers: it holds the bindings, the
mutable :class:`Shell` and the variable table operations every layer needs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from pytest_verl_compat.bash.arrays import MAX_KEYS, Assoc
from pytest_verl_compat.bash.errors import (
    MAX_FIELDS,
    MAX_RUNTIME_VALUES,
    MAX_VALUE,
    MAX_WORK,
    BudgetExceeded,
    LaunchReadError,
)
from pytest_verl_compat.bash.results import LaunchRead, TakenCondition
from pytest_verl_compat.bash.shapes import DIGITS, INTEGER_VARIABLES, one_word
from pytest_verl_compat.model import Bindings

if TYPE_CHECKING:
    from pytest_verl_compat.bash.parse import Node
    from pytest_verl_compat.bash.scope import SourceScope
    from pytest_verl_compat.bash.words import Fields


LAUNCHER_MODULE = "verl.trainer.main_ppo"
# Variables bash gives the same value at every start, ignoring the environment.
_BASH_STARTS_WITH = {"IFS": " \t\n", "OPTIND": "1", "OPTERR": "1"}
# The program names that run Python: `python`, `python3`, `python3.11`, by PATH or by a path.
_PYTHON = re.compile(r"python(3(\.[0-9]+)?)?")


def is_python(word: str) -> bool:
    """Whether ``word`` names a Python interpreter (``python3``, ``/usr/bin/python3.11``...)."""
    return _PYTHON.fullmatch(word.rsplit("/", 1)[-1]) is not None


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


# Variables of _BASH_PROVIDED that bash never leaves empty in a script (the rest may be empty or
# unset, such as FUNCNAME outside a function), and those that stay errors: IFS changes how this
# reader splits words, the arrays have an unknown number of elements.
_NEVER_EMPTY = frozenset(
    "BASH BASHOPTS BASHPID BASH_SUBSHELL BASH_VERSION EPOCHREALTIME EPOCHSECONDS EUID HOSTNAME "
    "HOSTTYPE LINENO MACHTYPE OPTERR OPTIND OSTYPE PATH PPID PS4 PWD RANDOM SECONDS SHELLOPTS "
    "SHLVL SRANDOM UID".split()
)
_NOT_LAZY = frozenset(
    "IFS BASH_ALIASES BASH_ARGC BASH_ARGV BASH_CMDS BASH_LINENO BASH_VERSINFO DIRSTACK "
    "GROUPS PIPESTATUS".split()
)

# Arrays bash computes: the call stack and the statuses of the last pipeline.
_COMPUTED = frozenset({"BASH_SOURCE", "FUNCNAME", "PIPESTATUS"})

# A run-time value inside a string: NUL, its number in State.lazies, NUL. bash values never hold
# a NUL byte (scripts holding one are refused, substitution outputs drop them, bindings are
# checked), so the marker cannot be forged; it is copied, concatenated and exported like text.
_LAZY = re.compile("\0([0-9]+)\0")


@dataclass(frozen=True)
class _Lazy:
    """Where a run-time value comes from: what the script expanded, on which line, how to bind it."""

    line: int
    what: str
    binding: str
    nonempty: bool
    cause: int | None = None
    # The characters it can hold, when only those are possible (``shapes``); None: any.
    chars: frozenset[str] | None = None


SET_FLAGS = {
    "e": "errexit",
    "u": "nounset",
    "a": "allexport",
    "B": "braceexpand",
    "E": "errtrace",
}
# Options that change nothing this reader computes (tracing, job control, history, ...).
SET_HARMLESS_FLAGS = frozenset("xvfhHmbCPTp")
SET_HARMLESS_NAMES = frozenset(
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
SET_NAMED = {
    "errexit": "errexit",
    "nounset": "nounset",
    "pipefail": "pipefail",
    "allexport": "allexport",
    "braceexpand": "braceexpand",
    "errtrace": "errtrace",
}


Value = str | dict[int, str] | Assoc


def _copy_value(value: Value) -> Value:
    return value if isinstance(value, str) else value.copy()


@dataclass(frozen=True, eq=False)
class ShellFunction:
    """A function the script defined: its body and the file that defined it."""

    body: Node
    path: str  # the file's label in errors
    data: bytes  # its text: node offsets point into it
    source: str  # BASH_SOURCE of its frames: the file's name as the script gave it

    def __eq__(self, other: object) -> bool:
        # The same definition (one syntax tree node) from the same file.
        return (
            isinstance(other, ShellFunction)
            and self.body is other.body
            and (self.path, self.source) == (other.path, other.source)
        )

    def __hash__(self) -> int:
        return id(self.body)


@dataclass(frozen=True)
class Trap:
    """Code a trap runs: parsed when the trap is set, run where bash runs it."""

    text: str
    tree: Node | None  # None: the empty action (the condition is ignored)
    line: int
    path: str


class Capture:
    """The output of a command substitution being evaluated: known text, or why it is not."""

    def __init__(self, strips_trailing_newlines: bool = False) -> None:
        self.pieces: list[str] = []
        # What wrote output this reader cannot know (a skipped program), if anything did.
        self.unknown: str | None = None
        # A `$(...)` drops every trailing newline of its output, so a command whose output is
        # bound without its trailing newlines may end it; a pipe or a `<(...)` keeps them.
        self.strips_trailing_newlines = strips_trailing_newlines
        # The bound command that wrote last, while nothing has followed it: the newlines it
        # really ended with are unknown, so any further output makes the whole unknown.
        self.open_newlines: str | None = None


class StandardInput:
    """A command's standard input: known text read from a position, or unknown (None)."""

    def __init__(self, text: str | None, origin: str, heredoc: bool = False) -> None:
        self.text = text
        self.position = 0
        # What the input is, for refusals: "the script's standard input", "a here-document".
        self.origin = origin
        # Text written in the script (a here-document or here-string), not a pipe or a file.
        self.heredoc = heredoc


class Shell:
    """The mutable shell state; copied for subshells so their changes are discarded."""

    def __init__(
        self,
        variables: dict[str, Value],
        exported: set[str],
        readonly: set[str],
        positional: list[str],
        options: set[str],
        cwd: str | None = None,
    ) -> None:
        self.vars = variables
        self.exported = exported
        self.readonly = readonly
        self.positional = positional
        self.options = options
        self.status = 0
        # The line of the first change to PATH: after it, `python3` may name another program.
        self.path_changed: int | None = None
        # Variables bash provides that the script unset: from then on they are ordinary.
        self.dropped: set[str] = set()
        # The functions the script defined.
        self.functions: dict[str, ShellFunction] = {}
        # The working directory as `cd` left it; None: the one the script starts in.
        self.cwd = cwd
        # Traps with code: "EXIT", "ERR".
        self.traps: dict[str, Trap] = {}
        # Whether a background job ran (then `$!` is its process id, a run-time value).
        self.background = False
        # PIPESTATUS: the statuses of the last pipeline.
        self.pipestatus: list[int] = [0]
        # getopts' place inside a word of bundled options: (OPTIND it belongs to, index).
        self.getopts_char = (1, 0)
        # `set` changed the positional parameters (a `source` with arguments keeps them then).
        self.args_set = False

    def fork(self) -> Shell:
        """An independent copy, as a subshell gets."""
        copy = Shell(
            {k: _copy_value(v) for k, v in self.vars.items()},
            set(self.exported),
            set(self.readonly),
            list(self.positional),
            set(self.options),
            self.cwd,
        )
        copy.status = self.status
        copy.path_changed = self.path_changed
        copy.dropped = set(self.dropped)
        copy.functions = dict(self.functions)
        copy.traps = dict(self.traps)
        copy.background = self.background
        copy.pipestatus = list(self.pipestatus)
        copy.getopts_char = self.getopts_char
        copy.args_set = self.args_set
        return copy

    # What `_same` (branches) compares to decide that two ways left the same shell.
    COMPARED = (
        "vars exported readonly positional options path_changed dropped functions cwd traps "
        "background getopts_char args_set".split()
    )


class State:
    """The interpreter's state and variables; each layer above adds one group of methods.

    The layers are mixins stacked in import order (arithmetic, patterns, expansion, conditions,
    builtins, interpreter); the few calls that go up the stack are declared here for the type
    checker only.
    """

    def __init__(
        self,
        path: str,
        data: bytes,
        bindings: Bindings,
        script: str | None = None,
        scope: SourceScope | None = None,
        accepts: Callable[[str], bool] | None = None,
        entry_stems: frozenset[str] = frozenset(),
    ) -> None:
        # The file being run (the script, or a file it sources): errors name it, and syntax
        # tree offsets point into its text.
        self.path = path
        # `$0` and `${BASH_SOURCE[0]}`: the path bash was given to run.
        self.script = path if script is None else script
        self.data = data
        self.lazies: list[_Lazy] = []
        self.substitutions = dict(bindings.substitutions)
        # The way to take at each condition only the running system decides (see branches),
        # how often each condition was met so far, and the conditions this read followed.
        self.choices = dict(bindings.conditions)
        self.met: dict[str, int] = {}
        self.taken: list[TakenCondition] = []
        env = {str(k): str(v) for k, v in bindings.variables.items()}
        for name, value in [*env.items(), *(("$@", str(a)) for a in bindings.args)]:
            if "\0" in name or "\0" in value or "\0" in path:
                # bash cannot hold one; it would also forge the run-time marker.
                self.fail(None, "binding", f"{name.replace(chr(0), '')} holds a NUL byte")
        # bash sets these at start whatever its environment holds.
        variables: dict[str, Value] = {**env, **_BASH_STARTS_WITH}
        self.sh = Shell(
            variables,
            set(env) - _BASH_STARTS_WITH.keys(),
            set(),
            [str(a) for a in bindings.args],
            {"braceexpand"},
            cwd=env.get("PWD"),
        )
        # Which files `source` may read (None: none), and those read: path -> sha256.
        self.scope = scope
        self.sourced: dict[str, str] = {}
        self.sourced_bytes = 0
        # The standard input of the command being run, and whether it is its own (not one it
        # shares with the commands around it).
        self.stdin = StandardInput(None, "the script's standard input")
        self.stdin_owned = False
        # What the output of `<(...)` paths holds (None: unknown), by their run-time marker.
        self.process_outputs: dict[str, str | None] = {}
        # The substitutions being evaluated, innermost last: a launcher there is refused.
        self.substituting: list[str] = []
        self.launch: LaunchRead | None = None
        # Which entry modules this read accepts as its launch, and their file names without
        # `.py` (a file of that name in a folder only known at run time is refused).
        self.accepts = accepts or LAUNCHER_MODULE.__eq__
        self.entry_stems = entry_stems
        # The last `python -m OTHER_MODULE` run, named when no launcher is reached.
        self.other_entry: tuple[int, str] | None = None
        # What the innermost command substitution being evaluated has captured (None outside
        # one), and whether standard output and error lead to it at this point.
        self.capture: Capture | None = None
        self.stdout_captured = False
        self.stderr_captured = False
        # The functions and sourced files being run, innermost last: (FUNCNAME, BASH_SOURCE)
        # of each frame, "source" for a sourced file. A function's frame also has the
        # variables it made local (`frames`): name -> (value, exported, readonly) before it.
        self.calls: list[tuple[str, str]] = []
        # BASH_SOURCE of the file being run: the script's path, or a sourced file's as given.
        self.source_name = self.script
        # The source text of the statement being run: a skipped program run by a statement
        # whose text is bound in `substitutions` prints that output (`now() { date; }`).
        self.command_text: tuple[str, ...] = ()
        # The status of the last command substitution of the command being run.
        self.substitution_status = 0
        # The statement after the one about to run, and after the one running: whether it reads
        # their status (`$?`, a bare exit/return) decides an undecidable test whose two ways
        # differ only in status (see branches). None: no such statement, the status is read.
        self.status_reader: Node | None = None
        self.reader_here: Node | None = None
        self.frames: list[dict[str, tuple[Value | None, bool, bool]]] = []
        self.steps = 0
        self.pattern_steps = 0
        self.work = 0
        self.loop_depth = 0
        self.line = 0

    def enter_file(self, path: str, data: bytes, source: str) -> tuple[str, bytes, str]:
        """Run the code of another file (a sourced one, a function's); returns the current."""
        saved = (self.path, self.data, self.source_name)
        self.path, self.data, self.source_name = path, data, source
        return saved

    # ---------------------------------------------------------------- errors

    def fail(self, line: int | None, construct: str, detail: str) -> NoReturn:
        """Raise the reader's error for this script."""
        raise LaunchReadError(self.path, line or None, construct, self.shown(detail))

    # ---------------------------------------------------------------- run-time values

    def lazy(
        self,
        line: int,
        what: str,
        binding: str,
        nonempty: bool,
        cause: int | None = None,
        chars: frozenset[str] | None = None,
    ) -> str:
        """A new run-time value: text that may be copied around but never decided on."""
        if len(self.lazies) >= MAX_RUNTIME_VALUES:
            raise BudgetExceeded(
                f"the script expands more than {MAX_RUNTIME_VALUES} run-time values"
            )
        self.lazies.append(_Lazy(line, what, binding, nonempty, cause, chars))
        return f"\0{len(self.lazies) - 1}\0"

    def replace_runtime(self, text: str, replace: Callable[[int], str]) -> str:
        """``text`` with each run-time value's marker replaced by ``replace(its number)``."""
        return _LAZY.sub(lambda match: replace(int(match.group(1))), text)

    def lazy_ids(self, text: str) -> list[int]:
        """The run-time values inside ``text``, in order."""
        return [int(m) for m in _LAZY.findall(text)] if "\0" in text else []

    def derive(self, line: int, what: str, *texts: str, nonempty: bool = False) -> str | None:
        """A run-time value computed from others (None when ``texts`` hold none)."""
        for text in texts:
            ids = self.lazy_ids(text)
            if ids:
                origin = self.lazies[ids[0]]
                return self.lazy(line, what, origin.binding, nonempty, ids[0])
        return None

    def describe(self, index: int) -> str:
        """``$PWD (line 3)``, followed by what it was computed from."""
        lazy = self.lazies[index]
        text = f"{lazy.what} (line {lazy.line})"
        seen = 0
        while lazy.cause is not None and seen < 3:
            lazy = self.lazies[lazy.cause]
            text += f", from {lazy.what} (line {lazy.line})"
            seen += 1
        return text

    def shown(self, text: str) -> str:
        """``text`` with its run-time markers written as ``<what>``."""
        if "\0" not in text:
            return text
        return _LAZY.sub(lambda m: f"<{self.lazies[int(m.group(1))].what}>", text)

    def need(self, text: str, line: int | None, purpose: str) -> None:
        """Refuse a run-time value where its content decides what the script does."""
        ids = self.lazy_ids(text)
        if ids:
            self.need_failed(ids[0], line, purpose)

    def need_failed(self, index: int, line: int | None, purpose: str) -> NoReturn:
        """The one-line error for a run-time value needed at ``line``."""
        error = LaunchReadError(
            self.path,
            line or None,
            "run-time value",
            f"{self.describe(index)} {purpose} on line {line}, but is only known when the "
            f"script runs; {self.lazies[index].binding}",
        )
        # Which value it was, for an expansion that can carry it on instead ($((...))).
        error.runtime_index = index  # type: ignore[attr-defined]
        raise error

    def nonempty(self, text: str) -> bool | None:
        """Whether ``text`` is non-empty, None when that is only known at run time."""
        ids = self.lazy_ids(text)
        if not ids:
            return text != ""
        if _LAZY.sub("", text) or any(self.lazies[i].nonempty for i in ids):
            return True
        return None

    def decide_nonempty(self, text: str, line: int, purpose: str) -> bool:
        """``nonempty``, refusing when it is undecidable."""
        decided = self.nonempty(text)
        if decided is None:
            self.need(text, line, purpose)
        return bool(decided)

    def variable_lazy(self, name: str, line: int) -> str:
        """The run-time value of a variable bash sets by itself."""
        return self.lazy(
            line,
            f"${name}",
            f"bind it: --env {name}=VALUE (environment.variables in the manifest)",
            name in _NEVER_EMPTY,
            chars=DIGITS if name in INTEGER_VARIABLES else None,
        )

    def splits_as_one(self, text: str) -> bool:
        """Whether an unquoted ``text`` splits as if its run-time values were one word each:
        each is non-empty and made of characters IFS does not split on (``shapes``)."""
        split_on = self.split_characters()
        if frozenset(split_on) & (DIGITS | {"\0"}):
            return False  # the marker itself would be split
        lazies = [self.lazies[i] for i in self.lazy_ids(text)]
        return all(lazy.nonempty and one_word(lazy.chars, split_on) for lazy in lazies)

    if TYPE_CHECKING:
        # Implemented by Expansion; arithmetic and patterns expand words through them.

        def part(self, part: Node, fb: Fields, quoted: bool, pword: bool) -> None: ...

        def ansi_c(self, text: str, line: int) -> str: ...

        # Implemented by Functions (declarations and `return` are builtins) and by the
        # interpreter (a command substitution runs statements).

        def make_local(self, name: str, line: int) -> None: ...

        def return_builtin(self, words: list[str], line: int) -> int: ...

        def evaluate_substitution(self, part: Node) -> str | None: ...

        def process_substitution(self, part: Node) -> str: ...

        def subscript(self, name: str, index: Node, line: int) -> int | str: ...

        def source_builtin(self, words: list[str], line: int) -> int: ...

        def trap_builtin(self, words: list[str], line: int) -> int: ...

        def stmt(self, stmt: Node, exempt: bool) -> int: ...

        def stmts(self, stmts: list[Node], exempt: bool) -> int: ...

    def charge(self, characters: int) -> None:
        """Count characters produced by expansions against the script's work budget."""
        self.work += characters
        if self.work > MAX_WORK:
            raise BudgetExceeded(f"the script expands more than {MAX_WORK} characters in all")

    # ---------------------------------------------------------------- assignments

    def check_assignable(self, name: str, line: int) -> None:
        """Reject assignments bash would refuse or that change how words split."""
        if name in self.sh.readonly:
            self.fail(line, "assignment", f"{name} is readonly")
        if name == "PATH":
            self.note_path_change(line)

    def ifs(self) -> str | None:
        """IFS, None when the script unset it (bash then splits as with the default)."""
        value = self.sh.vars.get("IFS")
        if value is None:
            return None
        if not isinstance(value, str):
            value = self.lookup("IFS", None, self.line) or ""
        self.need(value, self.line, "is IFS, which decides how words are split,")
        if not value.isascii():
            self.fail(self.line, "IFS", "non-ASCII characters in IFS depend on the locale")
        return value

    def split_characters(self) -> str:
        """The characters unquoted expansions split on."""
        value = self.ifs()
        return " \t\n" if value is None else value

    def join_character(self) -> str:
        """What ``"$*"`` puts between the positional parameters: IFS's first character."""
        value = self.ifs()
        return " " if value is None else value[:1]

    def note_path_change(self, line: int) -> None:
        """Remember the first change to PATH; the launcher refuses to run after one."""
        if self.sh.path_changed is None:
            self.sh.path_changed = line

    def store(self, name: str, value: Value, line: int) -> None:
        """Set a variable, enforcing the size budget and ``set -a``."""
        if isinstance(value, str):
            size = len(value)
        elif isinstance(value, Assoc):
            size = value.size()
            if len(value) > MAX_KEYS:
                self.fail(line, "limit", f"the associative array {name} has too many keys")
        else:
            size = sum(len(v) for v in value.values())
        if size > MAX_VALUE or (not isinstance(value, str) and len(value) > MAX_FIELDS):
            self.fail(line, "limit", f"the value of {name} grows too large")
        self.sh.vars[name] = value
        if "allexport" in self.sh.options:
            self.sh.exported.add(name)

    def set_scalar(self, name: str, value: str, line: int) -> None:
        """``name=value`` as bash does it (element 0 when ``name`` is an array)."""
        self.check_assignable(name, line)
        current = self.sh.vars.get(name)
        if isinstance(current, Assoc):
            updated = current.copy()
            updated.items["0"] = value
            self.store(name, updated, line)
        elif isinstance(current, dict):
            indexed = dict(current)
            indexed[0] = value
            self.store(name, indexed, line)
        else:
            self.store(name, value, line)

    def store_element(
        self, name: str, index: int | str, value: str, append: bool, line: int
    ) -> None:
        """``A[i]=v`` / ``A[i]+=v``, for an indexed or an associative array."""
        current = self.sh.vars.get(name)
        if isinstance(current, Assoc):
            table = current.copy()
            key = str(index)
            table.items[key] = table.items.get(key, "") + value if append else value
            self.store(name, table, line)
            return
        array = dict(current) if isinstance(current, dict) else {}
        if isinstance(current, str):
            array[0] = current
        position = int(index)
        if position < 0:
            position += max(array) + 1 if array else 0
            if position < 0:
                self.fail(line, "assignment", f"{name}: bad array subscript")
        array[position] = array.get(position, "") + value if append else value
        self.store(name, array, line)

    # ---------------------------------------------------------------- variables

    def in_function(self) -> bool:
        """Whether a function is running (``local`` is allowed, FUNCNAME is set)."""
        return any(name != "source" for name, _ in self.calls)

    def computed_array(self, name: str) -> dict[int, str] | None:
        """``BASH_SOURCE``, ``FUNCNAME`` and ``PIPESTATUS`` as bash keeps them, while the script
        leaves them be; None when the script set or unset them (or FUNCNAME outside a function).
        """
        if name in self.sh.vars or name in self.sh.dropped:
            return None
        if name == "BASH_SOURCE":
            return dict(enumerate([*(source for _, source in reversed(self.calls)), self.script]))
        if name == "FUNCNAME" and self.in_function():
            return dict(enumerate([*(called for called, _ in reversed(self.calls)), "main"]))
        if name == "PIPESTATUS":
            return dict(enumerate(str(status) for status in self.sh.pipestatus))
        return None

    def lookup(self, name: str, index: int | str | None, line: int) -> str | None:
        """A variable's value (or one element; a string key of an associative array), or None
        when unset."""
        if name in _COMPUTED and name not in self.sh.vars:
            if name in self.sh.dropped:
                return None
            frames = self.computed_array(name) or {}
            position = 0 if index is None else int(index)
            if position < 0:
                position += len(frames)
            return frames.get(position)
        provided = name in _BASH_PROVIDED and name not in self.sh.dropped
        lazy = name not in _NOT_LAZY and index in (None, 0)
        if name not in self.sh.vars and provided and lazy:
            return self.variable_lazy(name, line)
        if name not in self.sh.vars and provided:
            self.fail(
                line,
                "bash variable",
                f"${name} is set by bash at run time; bind it in the environment to read it",
            )
        value = self.sh.vars.get(name)
        if value is None:
            return None
        if isinstance(value, Assoc):
            return value.items.get("0" if index is None else str(index))
        if isinstance(value, str):
            return value if index in (None, 0) else None
        position = 0 if index is None else int(index)
        if position < 0:
            position += max(value) + 1 if value else 0
        return value.get(position)

    def elements(self, name: str, line: int) -> list[str] | None:
        """All elements of an array (a scalar is one element), or None when unset."""
        if name in _COMPUTED and name not in self.sh.vars:
            frames = self.computed_array(name)
            return None if frames is None else [frames[k] for k in sorted(frames)]
        if name not in self.sh.vars and name in _BASH_PROVIDED and name not in self.sh.dropped:
            self.fail(line, "bash variable", f"${name} is set by bash at run time; bind it")
        value = self.sh.vars.get(name)
        if value is None:
            return None
        if isinstance(value, str):
            return [value]
        if isinstance(value, Assoc):
            return value.values()
        return [value[k] for k in sorted(value)]

    def keys(self, name: str, line: int) -> list[str]:
        """``${!A[@]}``: an array's indices or keys in bash's order (a scalar's is 0)."""
        if name in _COMPUTED and name not in self.sh.vars:
            frames = self.computed_array(name) or {}
            return [str(k) for k in sorted(frames)]
        self.elements(name, line)  # refuses a variable only bash knows
        value = self.sh.vars.get(name)
        if value is None:
            return []
        if isinstance(value, str):
            return ["0"]
        if isinstance(value, Assoc):
            return value.keys()
        return [str(k) for k in sorted(value)]

    def unbound(self, line: int, name: str) -> NoReturn:
        """bash's ``set -u`` abort."""
        self.fail(
            line, "unbound variable", f"{name}: unbound variable (set -u aborts the script here)"
        )
