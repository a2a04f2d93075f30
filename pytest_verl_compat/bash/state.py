"""Interpreter state: the launcher it looks for, shell options, variables and their values.

:class:`_State` is the base of the interpreter's mixin layers: it holds the bindings, the
mutable :class:`_Shell` and the variable table operations every layer needs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

from pytest_verl_compat.bash.errors import (
    _MAX_FIELDS,
    _MAX_RUNTIME_VALUES,
    _MAX_VALUE,
    _MAX_WORK,
    LaunchReadError,
    _Budget,
)
from pytest_verl_compat.model import Bindings

if TYPE_CHECKING:
    from pytest_verl_compat.bash.parse import Node
    from pytest_verl_compat.bash.words import _Fields


_LAUNCHER_MODULE = "verl.trainer.main_ppo"
# The program names that run Python: `python`, `python3`, `python3.11`, by PATH or by a path.
_PYTHON = re.compile(r"python(3(\.[0-9]+)?)?")


def _is_python(word: str) -> bool:
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

# A run-time value inside a string: NUL, its number in _State.lazies, NUL. bash values never hold
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


@dataclass(frozen=True)
class LaunchRead:
    """The launcher command as bash would run it."""

    argv: tuple[str, ...]
    line: int
    exported: Mapping[str, str]
    # Exported variables whose value is only known at run time (never needed by the argv): the
    # name and where the value comes from.
    runtime: Mapping[str, str] = field(default_factory=dict)
    # The launcher's working directory, None when only the running script knows it.
    cwd: str | None = None
    # The wrappers the launcher runs under, outermost first (`ray job submit`, `env`, ...).
    wrappers: tuple[str, ...] = ()
    # Environments the launcher also receives that no script text shows (the Ray cluster's, the
    # variables srun sets), each with the wrapper and line it comes from.
    unseen: tuple[str, ...] = ()


Value = str | dict[int, str]


class _Capture:
    """The output of a command substitution being evaluated: known text, or why it is not."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        # What wrote output this reader cannot know (a skipped program), if anything did.
        self.unknown: str | None = None


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
        path_changed: int | None = None,
        dropped: set[str] | None = None,
        functions: dict[str, Node] | None = None,
        cwd: str | None = None,
    ) -> None:
        self.vars = variables
        self.exported = exported
        self.readonly = readonly
        self.positional = positional
        self.options = options
        self.status = status
        # The line of the first change to PATH: after it, `python3` may name another program.
        self.path_changed = path_changed
        # Variables bash provides that the script unset: from then on they are ordinary.
        self.dropped = dropped or set()
        # The functions the script defined: name -> the body statement.
        self.functions = functions or {}
        # The working directory as `cd` left it; None: the one the script starts in.
        self.cwd = cwd

    def fork(self) -> _Shell:
        """An independent copy, as a subshell gets."""
        return _Shell(
            {k: (v if isinstance(v, str) else dict(v)) for k, v in self.vars.items()},
            set(self.exported),
            set(self.readonly),
            list(self.positional),
            set(self.options),
            self.status,
            self.path_changed,
            set(self.dropped),
            dict(self.functions),
            self.cwd,
        )


class _State:
    """The interpreter's state and variables; each layer above adds one group of methods.

    The layers are mixins stacked in import order (arithmetic, patterns, expansion, conditions,
    builtins, interpreter); the few calls that go up the stack are declared here for the type
    checker only.
    """

    def __init__(
        self, path: str, data: bytes, bindings: Bindings, script: str | None = None
    ) -> None:
        self.path = path
        # `$0` and `${BASH_SOURCE[0]}`: the path bash was given to run.
        self.script = path if script is None else script
        self.data = data
        self.lazies: list[_Lazy] = []
        self.substitutions = dict(bindings.substitutions)
        env = {str(k): str(v) for k, v in bindings.variables.items()}
        for name, value in [*env.items(), *(("$@", str(a)) for a in bindings.args)]:
            if "\0" in name or "\0" in value or "\0" in path:
                # bash cannot hold one; it would also forge the run-time marker.
                self.fail(None, "binding", f"{name.replace(chr(0), '')} holds a NUL byte")
        self.sh = _Shell(
            dict(env),
            set(env),
            set(),
            [str(a) for a in bindings.args],
            {"braceexpand"},
            cwd=env.get("PWD"),
        )
        self.launch: LaunchRead | None = None
        # The last `python -m OTHER_MODULE` run, named when no launcher is reached.
        self.other_entry: tuple[int, str] | None = None
        # What the innermost command substitution being evaluated has captured (None outside
        # one), and whether standard output and error lead to it at this point.
        self.capture: _Capture | None = None
        self.stdout_captured = False
        self.stderr_captured = False
        # The functions being run, innermost last (FUNCNAME without "main"), each with the
        # variables it made local: name -> (value, exported, readonly) before the call.
        self.calls: list[str] = []
        # The status of the last command substitution of the command being run.
        self.substitution_status = 0
        # Whether no later command reads the status of the statement about to run, and of the
        # one running (see branches: an undecidable test whose two ways differ only in status).
        self.status_unseen = False
        self.unseen_here = False
        self.frames: list[dict[str, tuple[Value | None, bool, bool]]] = []
        self.steps = 0
        self.pattern_steps = 0
        self.work = 0
        self.loop_depth = 0
        self.line = 0

    # ---------------------------------------------------------------- errors

    def fail(self, line: int | None, construct: str, detail: str) -> NoReturn:
        """Raise the reader's error for this script."""
        raise LaunchReadError(self.path, line or None, construct, self.shown(detail))

    # ---------------------------------------------------------------- run-time values

    def lazy(
        self, line: int, what: str, binding: str, nonempty: bool, cause: int | None = None
    ) -> str:
        """A new run-time value: text that may be copied around but never decided on."""
        if len(self.lazies) >= _MAX_RUNTIME_VALUES:
            raise _Budget(f"the script expands more than {_MAX_RUNTIME_VALUES} run-time values")
        self.lazies.append(_Lazy(line, what, binding, nonempty, cause))
        return f"\0{len(self.lazies) - 1}\0"

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
        )

    if TYPE_CHECKING:
        # Implemented by _Expansion; arithmetic and patterns expand words through them.

        def part(self, part: Node, fb: _Fields, quoted: bool, pword: bool) -> None: ...

        def ansi_c(self, text: str, line: int) -> str: ...

        # Implemented by _Functions (declarations and `return` are builtins) and by the
        # interpreter (a command substitution runs statements).

        def make_local(self, name: str, line: int) -> None: ...

        def return_builtin(self, words: list[str], line: int) -> int: ...

        def evaluate_substitution(self, part: Node) -> str | None: ...

        def stmt(self, stmt: Node, exempt: bool) -> int: ...

        def stmts(self, stmts: list[Node], exempt: bool) -> int: ...

    def charge(self, characters: int) -> None:
        """Count characters produced by expansions against the script's work budget."""
        self.work += characters
        if self.work > _MAX_WORK:
            raise _Budget(f"the script expands more than {_MAX_WORK} characters in all")

    # ---------------------------------------------------------------- assignments

    def check_assignable(self, name: str, line: int) -> None:
        """Reject assignments bash would refuse or that change how words split."""
        if name in self.sh.readonly:
            self.fail(line, "assignment", f"{name} is readonly")
        if name == "IFS":
            self.fail(line, "assignment", "changing IFS changes word splitting; not supported")
        if name == "PATH":
            self.note_path_change(line)

    def note_path_change(self, line: int) -> None:
        """Remember the first change to PATH; the launcher refuses to run after one."""
        if self.sh.path_changed is None:
            self.sh.path_changed = line

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

    # ---------------------------------------------------------------- variables

    def call_array(self, name: str) -> dict[int, str] | None:
        """``BASH_SOURCE`` and ``FUNCNAME`` as bash keeps them, while the script leaves them be.

        Every function is defined in the script itself, so each frame's source is ``$0``;
        FUNCNAME is unset outside a function.
        """
        if name in self.sh.vars or name in self.sh.dropped:
            return None
        if name == "BASH_SOURCE":
            return dict(enumerate([self.script] * (len(self.calls) + 1)))
        if name == "FUNCNAME" and self.calls:
            return dict(enumerate([*reversed(self.calls), "main"]))
        return None

    def lookup(self, name: str, index: int | None, line: int) -> str | None:
        """A variable's value (or one element), or None when unset."""
        if name in ("BASH_SOURCE", "FUNCNAME") and name not in self.sh.vars:
            if name in self.sh.dropped:
                return None
            frames = self.call_array(name) or {}
            position = 0 if index is None else index
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
        if isinstance(value, str):
            return value if index in (None, 0) else None
        if index is None:
            index = 0
        if index < 0:
            index += max(value) + 1 if value else 0
        return value.get(index)

    def elements(self, name: str, line: int) -> list[str] | None:
        """All elements of an array (a scalar is one element), or None when unset."""
        if name in ("BASH_SOURCE", "FUNCNAME") and name not in self.sh.vars:
            frames = self.call_array(name)
            return None if frames is None else [frames[k] for k in sorted(frames)]
        if name not in self.sh.vars and name in _BASH_PROVIDED and name not in self.sh.dropped:
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
