"""The interpreter: statements, commands and the launcher, over the layers below it.

:func:`read_launch` and :func:`read_launch_text` parse a script and run :class:`Interpreter`
on its tree; every failure surfaces as a :class:`LaunchReadError`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from pytest_verl_compat.bash.branches import Branches, Undecided
from pytest_verl_compat.bash.builtins import (
    ARGUMENT_BUILTINS,
    BASH_BUILTINS,
    RUNNERS,
    SHELLS,
)
from pytest_verl_compat.bash.entry_points import EntryModules, acceptor, entry_stems
from pytest_verl_compat.bash.errors import (
    MAX_STEPS,
    BudgetExceeded,
    LaunchExited,
    LaunchForked,
    LaunchReadError,
    LoopControl,
    ShellExit,
    ShellReturn,
)
from pytest_verl_compat.bash.launcher import EntryLaunch
from pytest_verl_compat.bash.parse import Node, line_of, load_script, parse_script
from pytest_verl_compat.bash.results import LaunchRead
from pytest_verl_compat.bash.scope import SourceScope
from pytest_verl_compat.bash.state import LAUNCHER_MODULE, Capture, StandardInput
from pytest_verl_compat.bash.wrappers import Wrapped, find_wrapper
from pytest_verl_compat.model import Bindings

# Commands whose arguments this reader reads: the modelled builtins (their text decides what
# they do) and those that run their arguments as a command (one could be the launcher).
_CHECKED_PROGRAMS = ARGUMENT_BUILTINS | RUNNERS | SHELLS
# A loop still running after this many rounds is not one to follow.
_MAX_ITERATIONS = 10_000
# Refusals inside a command substitution that are about the whole read, not about the output:
# a budget, or a launcher that runs where its output is taken.
_RESOURCE_ERRORS = frozenset({"limit", "nesting", "launcher"})


# Whether a run-time value may stay unknown where it is: (the override's key or `torchrun
# --NAME`, its value with the placeholders, the argv with them) -> None when it may, else why
# it decides something there (may be empty). The reader's caller knows which keys and options
# only name something.
Carry = Callable[[str, str, tuple[str, ...]], str | None]


def read_launch(
    path: str | os.PathLike[str],
    bindings: Bindings,
    *,
    text: str | None = None,
    scope: SourceScope | None = None,
    entry_modules: EntryModules = None,
    carry: Carry | None = None,
) -> LaunchRead:
    """Read the script at ``path`` (or ``text``, labelled with ``path``) without executing it.

    A script read from its file runs as ``bash /absolute/path``: ``$0`` is that path, so the
    script-directory idiom (``$(cd "$(dirname "$0")" && pwd)``) names the script's folder
    whatever folder it is started from. Given as ``text``, ``$0`` is ``path`` as given.
    ``scope``: the files ``source`` may read (by default those under the script's folder).

    ``entry_modules``: which entry modules the launch may run (dotted names, or a predicate;
    only modules under an entry package of ``data/entry_packages.txt`` count). By default
    ``verl.trainer.main_ppo`` alone: another module's launch is then no launch, and the read
    fails with "no launcher" naming it as another entry point. With it, the read returns the
    script's final launch of any accepted module.

    ``carry``: the overrides whose value may hold a run-time value, as a placeholder
    (``LaunchRead.carried``), and torchrun's options that may (``carried_options``); without
    it every run-time value in the argv is refused, and torchrun's are left to the caller.
    """
    label, data = load_script(path, text)
    script = label if text is not None else os.path.abspath(label)
    read = _read(label, data, bindings, script, scope or SourceScope.around(label), entry_modules)
    for value in read.carried:
        word = read.argv[value.index].partition("=")[2]
        why = "" if carry is None else carry(value.key, word, read.argv)
        if why is not None:
            detail = value.refusal(why)
            raise LaunchReadError(read.path or label, value.line, "run-time value", detail)
    for value in read.carried_options:
        why = None if carry is None else carry(value.key, "", read.argv)
        if why is not None:
            detail = value.refusal(why)
            raise LaunchReadError(read.path or label, value.line, "run-time value", detail)
    return read


def read_launch_text(
    text: str, bindings: Bindings, *, path: str = "<string>", entry_modules: EntryModules = None
) -> LaunchRead:
    """Read a script given as text; ``path`` only labels error messages and ``$0`` (it sources
    no file). ``entry_modules`` as for :func:`read_launch`. Every run-time value in the argv
    is refused."""
    label, data = load_script(path, text)
    read = _read(label, data, bindings, label, None, entry_modules)
    if read.carried:
        value = read.carried[0]
        raise LaunchReadError(read.path or label, value.line, "run-time value", value.refusal())
    return read


def _read(
    label: str,
    data: bytes,
    bindings: Bindings,
    script: str,
    scope: SourceScope | None,
    entry_modules: EntryModules,
) -> LaunchRead:
    """Parse and interpret; every failure surfaces as a LaunchReadError."""
    tree = parse_script(label, data)
    accepts, stems = acceptor(entry_modules), entry_stems(entry_modules)
    interpreter = Interpreter(label, data, bindings, script, scope, accepts, stems)
    interpreter.default_entry = entry_modules is None
    try:
        return interpreter.run(tree)
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


class Interpreter(Branches):
    """Interprets a shfmt syntax tree with bash semantics, recording launcher commands."""

    # Whether the read accepts main_ppo alone (its "no launcher" message names that command).
    default_entry = True

    # ---------------------------------------------------------------- top level

    def run(self, tree: Node) -> LaunchRead:
        """Run the whole script (and its EXIT trap) and return its last launcher command."""
        exited: ShellExit | None = None
        try:
            try:
                self.stmts(tree.get("Stmts") or [], exempt=False)
            except ShellExit as done:
                exited = done
            if exited is None or not exited.replaced:
                status = self.exit_trap(self.sh.status if exited is None else exited.status)
                if exited is not None:
                    exited = ShellExit(status, exited.line)
        except LoopControl:
            self.fail(self.line, "loop control", "`break`/`continue` outside a loop")
        except ShellReturn:
            self.fail(self.line, "return", "`return` outside a function or sourced file")
        except BudgetExceeded as exc:
            self.fail(self.line, "limit", str(exc))
        if exited is not None and self.launch is None:
            raise LaunchExited(self.path, exited.line, exited.status)
        if self.launch is None:
            where, other = self.other_entry or (None, "")
            wanted = f"`python3 -m {LAUNCHER_MODULE}` command"
            if not self.default_entry:
                wanted = "launch of an accepted entry module"
            self.fail(
                where,
                "no launcher",
                f"no {wanted} is reached with these bindings"
                + (f"; line {where} runs `{other}`, another entry point" if other else ""),
            )
        return replace(
            self.launch,
            sources=tuple(sorted(self.sourced.items())),
            conditions=tuple(self.taken),
        )

    def stmts(self, stmts: list[Node], exempt: bool) -> int:
        """Run a statement list; its status is the last statement's."""
        status = 0
        for index, stmt in enumerate(stmts):
            # Which statement could read this one's status (None: the list's caller, taken to
            # read it); asked only when an undecidable test's two ways end in different statuses.
            self.status_reader = stmts[index + 1] if index + 1 < len(stmts) else None
            status = self.stmt(stmt, exempt)
        return status

    def stmt(self, stmt: Node, exempt: bool) -> int:
        """Run one statement. ``exempt``: set -e is ignored here (conditions, && lists, !)."""
        self.steps += 1
        if self.steps > MAX_STEPS:
            self.fail(line_of(stmt), "limit", "the script runs too many commands")
        self.line = line_of(stmt)
        # Only this statement's own `if`/`&&`/`||` may leave a status nobody reads.
        self.reader_here, self.status_reader = self.status_reader, None
        cmd = stmt.get("Cmd")
        redirs = stmt.get("Redirs") or []
        if stmt.get("Coprocess"):
            self.fail(self.line, "coprocess", "`|&` runs a command concurrently with the script")
        if stmt.get("Background"):
            # A background job runs in a subshell: it may launch, but changes nothing here.
            self.subshell(lambda: self.command(cmd, redirs, stmt, exempt))
            self.sh.background = True
            status = 0
        elif stmt.get("Negated"):
            status = 0 if self.status_of(cmd, redirs, stmt, exempt=True) else 1
        else:
            status = self.status_of(cmd, redirs, stmt, exempt)
        self.sh.status = status
        return status

    def status_of(self, cmd: Node | None, redirs: list[Node], stmt: Node, exempt: bool) -> int:
        """Run a command; bash keeps the status of a simple command (or of a subshell, a test,
        arithmetic) in PIPESTATUS, while a compound command leaves the one its last pipeline
        set (a pipeline sets its own)."""
        status = self.command(cmd, redirs, stmt, exempt)
        if cmd is None or cmd.get("Type") in _SETS_PIPESTATUS:
            self.sh.pipestatus = [status]
        return status

    def errexit(self, status: int, exempt: bool, line: int) -> int:
        """A command's status where ``set -e`` and the ERR trap act on it."""
        if status and not exempt:
            self.err_trap()
            if "errexit" in self.sh.options:
                raise ShellExit(status, line)
        return status

    @contextmanager
    def forked(self) -> Iterator[None]:
        """Run the body on a copy of the shell state, as bash runs a subshell."""
        saved, depth = self.sh, self.loop_depth
        self.sh = saved.fork()
        self.subshell_traps()
        self.loop_depth = 0
        try:
            yield
        finally:
            self.sh, self.loop_depth = saved, depth

    def subshell(self, body: Callable[[], int]) -> int:
        """Run ``body`` in a subshell (and the EXIT trap it sets) and return its exit status."""
        with self.forked():
            try:
                status = body()
            except ShellExit as done:
                if done.replaced:
                    return done.status
                status = done.status
            except ShellReturn as done:
                status = done.status
            except LoopControl:
                status = 0
            return self.exit_trap(status)

    def evaluate_substitution(self, part: Node) -> str | None:
        """What ``$(...)`` prints, evaluated in a subshell; None when only running it would tell.

        A refusal inside the body (a construct this reader does not model) also leaves the
        output unknown: the substitution is then the run-time value it always was, refused
        only where its text decides something.
        """
        output = self.captured_output(
            part.get("Stmts") or [], "a command substitution", strips_trailing_newlines=True
        )
        if output is None:
            return None
        text, self.substitution_status = output
        return text.rstrip("\n")

    def captured_output(
        self, stmts: list[Node], what: str, strips_trailing_newlines: bool = False
    ) -> tuple[str, int] | None:
        """The output and status of ``stmts`` run in a subshell whose output is captured (None:
        only running them would tell)."""
        if reads_a_file(stmts):
            # `$(< FILE)`: bash prints the file, which this reader never opens.
            return None
        saved = (self.capture, self.stdout_captured, self.stderr_captured, self.launch)
        capture = Capture(strips_trailing_newlines)
        self.capture, self.stdout_captured, self.stderr_captured = capture, True, False
        self.substituting.append(what)
        try:
            with self.forked(), self.reading(StandardInput(None, "the script's standard input")):
                # bash does not apply set -e inside a substitution (no inherit_errexit).
                self.sh.options.discard("errexit")
                try:
                    status = self.stmts(stmts, exempt=False)
                except ShellExit as done:
                    status = done.status
                except ShellReturn as done:
                    status = done.status
                except LoopControl:
                    status = 0
                status = self.exit_trap(status)
        except LaunchReadError as exc:
            if exc.construct in _RESOURCE_ERRORS or isinstance(exc, LaunchForked):
                raise
            return None
        finally:
            self.substituting.pop()
            self.capture, self.stdout_captured, self.stderr_captured, self.launch = saved
        if capture.unknown is not None:
            return None
        return "".join(capture.pieces), status

    def process_substitution(self, part: Node) -> str:
        """``<(...)`` and ``>(...)``: a path only the running system names. The output of
        ``<(...)`` is what reading that path gives; ``>(...)`` runs with unknown input."""
        line = line_of(part)
        stmts = part.get("Stmts") or []
        op = part.get("Op", "<(")
        output: str | None = None
        if op == "<(":
            captured = self.captured_output(stmts, "a process substitution")
            output = None if captured is None else captured[0]
        else:
            saved = (self.capture, self.stdout_captured, self.stderr_captured)
            self.capture, self.stdout_captured, self.stderr_captured = None, False, False
            self.substituting.append("a process substitution")
            try:
                with self.reading(StandardInput(None, "the output of the script")):
                    self.subshell(lambda: self.stmts(stmts, exempt=False))
            finally:
                self.substituting.pop()
                self.capture, self.stdout_captured, self.stderr_captured = saved
        path = self.lazy(line, f"{op}...)", "bash names its pipe /dev/fd/N when it runs", True)
        self.process_outputs[path] = output
        return path

    # ---------------------------------------------------------------- commands

    def command(self, cmd: Node | None, redirs: list[Node], stmt: Node, exempt: bool) -> int:
        """Run the command of a statement with its redirections."""
        line = line_of(stmt)
        if cmd is None:
            self.redirections(redirs, launcher=False)
            return 0
        kind = cmd.get("Type")
        if kind == "CallExpr":
            # As written, and without its redirections (`date 2>/dev/null` prints what `date`
            # does, its standard output followed as `routed` follows it).
            self.command_text = (
                _statement_text(self.source_text(stmt)),
                self.source_text(cmd).strip(),
            )
            return self.call(cmd, redirs, exempt)
        stdin = self.redirections(redirs, launcher=False)
        with self.routed(redirs), self.reading(stdin):
            return self.compound(cmd, str(kind), exempt, line)

    def compound(self, cmd: Node, kind: str, exempt: bool, line: int) -> int:
        """A command other than a simple command."""
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
            return self.while_clause(cmd, exempt, line)
        if kind == "FuncDecl":
            return self.define_function(cmd, line)
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
            reader, self.reader_here = self.reader_here, None
            status = self.condition([cmd["X"]])
            if isinstance(status, Undecided):
                # `[ -d X ] || mkdir -p X`: the test's own status when it skips the other side.
                run_other = lambda: self.stmt(cmd["Y"], exempt)  # noqa: E731
                skip = lambda: 0 if op == "||" else 1  # noqa: E731
                if op == "&&":
                    return self.either(run_other, skip, status, reader, [cmd["X"]])
                return self.either(skip, run_other, status, reader, [cmd["X"]])
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
        # Every element of a pipeline runs in its own subshell (lastpipe is off in scripts),
        # reading what the one before it wrote; only the last one writes where the
        # pipeline's output goes.
        statuses: list[int] = []
        source: StandardInput | None = None
        for part in parts[:-1]:
            capture = Capture()
            statuses.append(self.piped(part, exempt, op == "|&", capture, source))
            known = "".join(capture.pieces) if capture.unknown is None else None
            origin = f"the output of line {line_of(part)}"
            source = StandardInput(known, origin if known is not None else f"{origin} (unknown)")
        with self.reading(source):
            statuses.append(self.subshell(lambda: self.stmt(parts[-1], exempt)))
        self.sh.pipestatus = statuses
        if "pipefail" in self.sh.options:
            status = next((s for s in reversed(statuses) if s), 0)
        else:
            status = statuses[-1]
        return self.errexit(status, exempt, line)

    def piped(
        self,
        stmt: Node,
        exempt: bool,
        with_errors: bool,
        capture: Capture,
        source: StandardInput | None,
    ) -> int:
        """A pipeline element whose output goes to the next one (into ``capture``)."""
        saved = (self.capture, self.stdout_captured, self.stderr_captured)
        if saved[0] is not None and saved[2] and not with_errors:
            # Its errors go where the pipeline's do, into the capture around it, which cannot
            # be followed at the same time as the pipe.
            saved[0].unknown = saved[0].unknown or "errors of a pipeline"
        self.capture, self.stdout_captured = capture, True
        self.stderr_captured = with_errors
        try:
            with self.reading(source):
                return self.subshell(lambda: self.stmt(stmt, exempt))
        finally:
            self.capture, self.stdout_captured, self.stderr_captured = saved

    def if_clause(self, cmd: Node, exempt: bool) -> int:
        """``if``/``elif``/``else``; conditions run with set -e ignored."""
        reader, self.reader_here = self.reader_here, None
        clause: Node | None = cmd
        while clause is not None:
            cond = clause.get("Cond")
            if not cond:
                return self.stmts(clause.get("Then") or [], exempt)
            status = self.condition(cond)
            if isinstance(status, Undecided):
                then, rest = clause.get("Then") or [], clause.get("Else")
                return self.either(
                    lambda then=then: self.stmts(then, exempt),  # type: ignore[misc]
                    lambda rest=rest: self.if_clause(rest, exempt) if rest else 0,  # type: ignore[misc]
                    status,
                    reader,
                    cond,
                )
            if status == 0:
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
        """``for NAME in WORDS`` (the word list bounds the rounds) and ``for ((...))``."""
        line = line_of(cmd)
        loop = cmd.get("Loop") or {}
        if cmd.get("Select"):
            self.fail(line, "select loop", "reads its choice from input at run time")
        if loop.get("Type") == "CStyleLoop":
            if loop.get("Init") is not None:
                self.arith(loop["Init"])
            first = [True]

            def more() -> bool:
                if not first[0] and loop.get("Post") is not None:
                    self.arith(loop["Post"])
                first[0] = False
                return loop.get("Cond") is None or self.arith(loop["Cond"]) != 0

            return self.loop(cmd, exempt, line, "for ((...)) loop", more)
        name = loop["Name"]["Value"]
        if "InPos" in loop:
            items = iter(self.fields(loop.get("Items") or [], use="iterations the loop makes"))
        else:
            items = iter(list(self.sh.positional))

        def next_item() -> bool:
            item = next(items, None)
            if item is not None:
                self.set_scalar(name, item, line)
            return item is not None

        # The word list bounds the rounds: no cap.
        return self.loop(cmd, exempt, line, "", next_item)

    def while_clause(self, cmd: Node, exempt: bool, line: int) -> int:
        """``while``/``until``: run while the condition says so, as bash would.

        The condition is evaluated like any command (a skipped program succeeds, so `until
        ray status; do sleep 5; done` ends at once).
        """
        until = bool(cmd.get("Until"))

        def more() -> bool:
            return (self.stmts(cmd.get("Cond") or [], exempt=True) == 0) != until

        return self.loop(cmd, exempt, line, "until loop" if until else "while loop", more)

    def loop(
        self, cmd: Node, exempt: bool, line: int, construct: str, more: Callable[[], bool]
    ) -> int:
        """Run the body while ``more()`` says so; a loop with a ``construct`` still running
        after ``_MAX_ITERATIONS`` rounds is refused rather than followed."""
        status = 0
        rounds = 0
        self.loop_depth += 1
        try:
            while more():
                rounds += 1
                if construct and rounds > _MAX_ITERATIONS:
                    self.fail(
                        line,
                        construct,
                        f"it does not end within {_MAX_ITERATIONS} rounds with what is known",
                    )
                try:
                    status = self.stmts(cmd.get("Do") or [], exempt)
                except LoopControl as ctl:
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
        """A simple command: assignments, a function, the launcher (perhaps wrapped), a
        modelled builtin or program, or a skipped command."""
        line = line_of(cmd)
        assigns = cmd.get("Assigns") or []
        self.substitution_status = 0
        text = self.command_text
        argv, uncertain = self.fields_split(cmd.get("Args") or [])
        if not argv:
            # Assignment-only (or empty after expansion): the assignments persist, and the
            # status is the last command substitution's.
            for assign in assigns:
                self.assign(assign)
            self.redirections(redirs, launcher=False)
            return self.errexit(self.substitution_status, exempt, line)
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
        self.check_command(argv, uncertain, line)
        # The words' substitutions ran statements of their own.
        self.command_text = text
        if argv[0] == "exec" and len(argv) > 1:
            return self.exec_command(argv, uncertain, redirs, temporary, line)
        if argv[0] in self.sh.functions:
            stdin = self.redirections(redirs, launcher=False)
            with self.routed(redirs), self.reading(stdin):
                status = self.call_function(argv, temporary, exempt, line)
            return self.errexit(status, exempt, line)
        words, uses = self.unwrap_launchers(argv, uncertain, line)
        entry = self.entry_launch(words, line)
        if entry is not None:
            self.launcher(entry, uncertain, redirs, temporary, uses, line)
            return 0
        self.note_entry(words, line)
        if argv[0] in BASH_BUILTINS and not uses:
            stdin = self.redirections(redirs, launcher=False)
        else:
            with self.forked():
                stdin = self.redirections(redirs, launcher=False)
        with self.routed(redirs), self.reading(stdin):
            if uses:
                # A wrapper runs a program, never a builtin or a function of this shell.
                status = self.external(words, line, uses[-1].wrapper.name)
            else:
                with self.temporarily(temporary, line):
                    status = self.builtin(argv, line)
        return self.errexit(status, exempt, line)

    def launcher(
        self,
        entry: EntryLaunch,
        uncertain: str | None,
        redirs: list[Node],
        temporary: dict[str, str],
        uses: list[Wrapped],
        line: int,
    ) -> None:
        """The launcher runs: record what it receives (its redirections open nothing)."""
        split = [word for word in entry.argv if uncertain and uncertain in word]
        if not split or not all(self.carriable(word) for word in split):
            # An override's value split unquoted is carried as one word (a file's name holds no
            # blank); the read stage refuses it where the value decides more than a file.
            self.need(uncertain or "", line, "reaches the launcher's argv")
        with self.forked():
            stdin = self.redirections(redirs, launcher=True)
        with self.routed(redirs), self.reading(stdin):
            self.record_launch(entry, line, temporary, uses)

    def exec_command(
        self,
        argv: list[str],
        uncertain: str | None,
        redirs: list[Node],
        temporary: dict[str, str],
        line: int,
    ) -> int:
        """``exec COMMAND``: the shell becomes the command (the launcher, or a program this
        reader skips); nothing after it runs, not even the EXIT trap."""
        words = argv[1:]
        while words and words[0].startswith("-") and words[0] != "--":
            if words[0] not in ("-c", "-l", "-cl", "-lc"):
                self.fail(line, f"exec {words[0]}", "changes the command's name or environment")
            if "c" in words[0]:
                self.fail(line, "exec -c", "runs the command with an empty environment")
            words = words[1:]
        if words[:1] == ["--"]:
            words = words[1:]
        if not words:
            return 0
        inner, uses = self.unwrap_launchers(words, uncertain, line)
        entry = self.entry_launch(inner, line)
        if entry is not None:
            self.launcher(entry, uncertain, redirs, temporary, uses, line)
        else:
            self.note_entry(inner, line)
            with self.forked():
                self.redirections(redirs, launcher=False)
            with self.routed(redirs):
                shown = uses[-1].wrapper.name if uses else words[0]
                self.external(inner, line, shown)
        raise ShellExit(0, line, replaced=True)

    @contextmanager
    def temporarily(self, assignments: dict[str, str], line: int) -> Iterator[None]:
        """Prefix assignments of a builtin (``IFS=, read``, ``X=1 source f``) last for it."""
        if not assignments:
            yield
            return
        shell = self.sh
        saved = {name: (shell.vars.get(name), name in shell.exported) for name in assignments}
        path_changed = shell.path_changed
        for name, text in assignments.items():
            self.set_scalar(name, text, line)
            shell.exported.add(name)
        try:
            yield
        finally:
            for name, (old, exported) in saved.items():
                if old is None:
                    shell.vars.pop(name, None)
                else:
                    shell.vars[name] = old
                (shell.exported.add if exported else shell.exported.discard)(name)
            shell.path_changed = path_changed

    def check_command(self, argv: list[str], uncertain: str | None, line: int) -> None:
        """Refuse run-time values that decide which program runs, or what a builtin does.

        Other programs are skipped, so their arguments may hold run-time values (``mkdir -p
        "$PWD/logs"``); but one that runs its arguments as a command (``sudo``, ``xargs``)
        could turn out to run the launcher. Wrappers check their own words as they read them,
        and Python the words that decide whether it is the launcher.
        """
        program = argv[0].rsplit("/", 1)[-1]
        self.need(program, line, "decides which command runs")
        if argv[0] in self.sh.functions or find_wrapper(argv) is not None:
            return
        purpose = f"is an argument of `{program}`, which acts on its text,"
        if argv[0] in ("builtin", "command") or program in _CHECKED_PROGRAMS:
            for word in [*argv[1:], uncertain or ""]:
                self.need(word, line, purpose)
        elif program in ("test", "["):
            # `test` decides what it can (a value certainly non-empty), but not a word count.
            self.need(uncertain or "", line, purpose)
        elif program == "printf" and len(argv) > 1:
            # Only `printf -v NAME` changes the shell; the format and arguments just print.
            self.need(argv[1] if uncertain is None else uncertain, line, purpose)


def _statement_text(text: str) -> str:
    """A statement's source as a substitution binding writes it: without the `;` that ends it."""
    return text.strip().removesuffix(";").rstrip()


def reads_a_file(stmts: list[Node]) -> bool:
    """Whether a substitution's body is bash's ``$(< FILE)``: one statement that is nothing but
    one input redirection of standard input (then bash prints the file; ``$(: ; < f)``,
    ``$(X=1 < f)``, ``$(< f 2>&1)`` and ``$(1< f)`` print nothing)."""
    if len(stmts) != 1:
        return False
    stmt = stmts[0]
    redirs = stmt.get("Redirs") or []
    if stmt.get("Cmd") is not None or len(redirs) != 1:
        return False
    if stmt.get("Background") or stmt.get("Negated") or stmt.get("Coprocess"):
        return False
    number = (redirs[0].get("N") or {}).get("Value", "")
    return redirs[0].get("Op") == "<" and number in ("", "0")


# The commands whose status bash records in PIPESTATUS as a pipeline of one.
_SETS_PIPESTATUS = frozenset(
    {"CallExpr", "DeclClause", "TestClause", "ArithmCmd", "LetClause", "Subshell"}
)
