"""Commands whose output a command substitution captures, and ``cd``.

Inside ``$(...)`` the reader evaluates the body as bash would, collecting what reaches its
standard output. ``echo``, ``printf`` and ``pwd`` (builtins) and coreutils' ``dirname``,
``basename``, ``realpath`` and ``readlink -f`` are pure functions of known text here; any other
command that can write to the capture makes the substitution's output a run-time value, as an
unbound substitution always was. ``cd`` changes the working directory these commands see: a
known folder stays known (``cd`` is assumed to succeed, like every skipped command).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest_verl_compat.bash.paths as paths
from pytest_verl_compat.bash.conditions import Conditions
from pytest_verl_compat.bash.parse import Node
from pytest_verl_compat.bash.printing import echo_output, printf_output

_CWD_LOST = "the folder it enters is only known at run time; name it in the script instead"
# Programs that write nothing to standard output when they succeed (unless made verbose), so
# `$(prep)` whose body makes a folder still has a known output.
_SILENT_PROGRAMS = frozenset("mkdir rmdir rm cp mv ln chmod sleep".split())


def _split_options(words: list[str], flags: str) -> tuple[set[str], list[str]] | None:
    """Short options made of ``flags`` (``-ms``), up to ``--`` or the first operand; None when
    a word holds another option (the output is then left unknown)."""
    seen: set[str] = set()
    index = 0
    while index < len(words) and words[index].startswith("-") and words[index] != "-":
        word = words[index]
        index += 1
        if word == "--":
            break
        if word.startswith("--") or set(word[1:]) - set(flags):
            return None
        seen.update(word[1:])
    return seen, words[index:]


class Programs(Conditions):
    """The output of modelled commands, where it goes, and the working directory."""

    # ---------------------------------------------------------------- output

    def write(self, text: str) -> None:
        """Text a command writes to its standard output."""
        capture = self.capture
        if capture is not None and self.stdout_captured:
            self.charge(len(text))
            if text and capture.open_newlines is not None and capture.unknown is None:
                capture.unknown = f"the trailing newlines {capture.open_newlines} printed"
            capture.pieces.append(text)
            if text:
                capture.open_newlines = None

    def write_bound(self, output: str, what: str) -> None:
        """A skipped program whose command text is bound prints the bound output: exactly, up
        to the trailing newlines a `$(...)` drops (the binding holds the output without them)."""
        capture = self.capture
        if capture is None or not self.stdout_captured:
            return
        if self.stderr_captured or not capture.strips_trailing_newlines:
            self.write_unknown(f"{what} (its trailing newlines)")
            return
        self.write(output)
        capture.open_newlines = what

    def write_unknown(self, what: str) -> None:
        """A command whose output (on either stream) is only known at run time."""
        capture = self.capture
        if capture is not None and capture.unknown is None:
            if self.stdout_captured or self.stderr_captured:
                capture.unknown = what

    @contextmanager
    def routed(self, redirs: list[Node]) -> Iterator[None]:
        """Follow where standard output and error lead under ``redirs``, in their order."""
        saved = (self.stdout_captured, self.stderr_captured)
        fds = {1: saved[0], 2: saved[1]}
        for redir in redirs:
            op = redir.get("Op", "")
            number = (redir.get("N") or {}).get("Value", "")
            target = _literal_text(redir.get("Word"))
            if op in ("&>", "&>>"):
                fds = {1: False, 2: False}
            elif op in (">&", "<&") and target is not None and target.isdigit():
                fd = int(number or (1 if op == ">&" else 0))
                fds[fd] = fds.get(int(target), False)
            elif op == ">&" and not number and target != "-":
                fds = {1: False, 2: False}  # `>&file` is `&>file`
            elif op.startswith(">") or op in ("<>", "<&"):
                fds[int(number or (1 if op.startswith(">") else 0))] = False
        self.stdout_captured, self.stderr_captured = fds.get(1, False), fds.get(2, False)
        try:
            yield
        finally:
            self.stdout_captured, self.stderr_captured = saved

    # ---------------------------------------------------------------- the commands

    def run_program(self, words: list[str], line: int) -> int | None:
        """Run a command modelled here and return its status; None for any other command."""
        name = words[0]
        if name == "echo":
            return self.print_text(echo_output(words[1:]), "`echo -e`")
        if name == "printf":
            arguments = words[2:] if words[1:2] == ["--"] else words[1:]
            if not arguments:
                return 2
            return self.print_text(printf_output(arguments[0], arguments[1:]), "`printf`")
        if name == "pwd":
            return self.pwd(words, line)
        if name in ("cd", "pushd", "popd"):
            return self.cd(words, line)
        program = name.rsplit("/", 1)[-1]
        model = COREUTILS.get(program)
        if model is not None:
            if self.sh.path_changed is not None:
                self.write_unknown(f"`{program}` after a PATH change")
                return 0
            return model(self, words, line)
        if program in _SILENT_PROGRAMS and not any(
            word == "--verbose" or (word[:1] == "-" and word[1:2] != "-" and "v" in word)
            for word in words[1:]
        ):
            return 0
        return None

    def print_text(self, text: str | None, what: str) -> int:
        if text is None:
            self.write_unknown(what)
        else:
            self.write(text)
        return 0

    def pwd(self, words: list[str], line: int) -> int:
        """``pwd [-LP]``: the working directory, resolved through links with ``-P``."""
        parsed = _split_options(words[1:], "LP")
        if parsed is None:
            return 2
        options, _ = parsed
        folder = self.working_directory(line)
        if "P" in options and not self.lazy_ids(folder):
            folder = paths.physical(folder)
        elif "P" in options:
            folder = self.lost(line, "`pwd -P`", self.cause(folder))
        self.write(folder + "\n")
        return 0

    def working_directory(self, line: int) -> str:
        """The current folder: known, or the run-time folder the script started in."""
        if self.sh.cwd is None:
            return self.variable_lazy("PWD", line)
        return self.sh.cwd

    def cause(self, text: str) -> int | None:
        ids = self.lazy_ids(text)
        return ids[0] if ids else None

    def lost(self, line: int, what: str, cause: int | None) -> str:
        """A run-time value computed from ``cause``, bound the way its origin is bound."""
        binding = _CWD_LOST if cause is None else self.lazies[cause].binding
        return self.lazy(line, what, binding, nonempty=True, cause=cause)

    def cd(self, words: list[str], line: int) -> int:
        """``cd [-L|-P] [DIR]``; ``pushd``/``popd`` lose track of the folder."""
        name = words[0]
        old = self.lookup("PWD", None, line)
        if name != "cd":
            self.write_unknown(f"`{name}`")  # it prints the folder stack
            self.enter(None, line, name)
        else:
            parsed = _split_options(words[1:], "LPe@")
            if parsed is None:
                return 2
            options, operands = parsed
            if len(operands) > 1:
                return 1  # bash: too many arguments
            if not operands:
                target = self.lookup("HOME", None, line)
                if not target:
                    return 1
            elif operands[0] == "-":
                target = self.lookup("OLDPWD", None, line)
                if target is None:
                    return 1
            else:
                target = operands[0]
            if target and target[0] not in "./" and self.lookup("CDPATH", None, line):
                self.fail(
                    line, "cd", "with CDPATH set, `cd` searches folders on the running system"
                )
            self.enter(target, line, "cd", physical="P" in options)
            if operands == ["-"]:
                self.write(self.working_directory(line) + "\n")
        if old is not None:
            self.sh.vars["OLDPWD"] = old
        return 0

    def enter(self, target: str | None, line: int, name: str, physical: bool = False) -> None:
        """Make ``target`` the working directory (None: a folder only known at run time)."""
        base = self.sh.cwd
        folder: str | None = None
        if target is not None and not self.lazy_ids(target):
            if target.startswith("/"):
                folder = paths.logical(target)
            elif base is not None and not self.lazy_ids(base):
                folder = paths.logical(paths.joined(base, target))
        if folder is not None and physical:
            folder = paths.physical(folder)
        if folder is None:
            cause = self.cause(target or "")
            if cause is None and base is not None:
                cause = self.cause(base)
            if cause is None and base is None:
                cause = self.cause(self.variable_lazy("PWD", line))
            folder = self.lost(line, f"$PWD after `{name}`", cause)
        self.sh.cwd = folder
        self.sh.vars["PWD"] = folder

    # ---------------------------------------------------------------- coreutils

    def dirname_program(self, words: list[str], line: int) -> int:
        parsed = _split_options(words[1:], "")
        if parsed is None or not parsed[1]:
            return self.print_text(None, "`dirname`")
        for operand in parsed[1]:
            self.write(self.path_function(operand, paths.dirname, line, "dirname") + "\n")
        return 0

    def basename_program(self, words: list[str], line: int) -> int:
        parsed = _split_options(words[1:], "")
        if parsed is None or not 1 <= len(parsed[1]) <= 2:
            return self.print_text(None, "`basename`")
        operand, suffix = parsed[1][0], (parsed[1][1:] or [""])[0]
        if self.lazy_ids(suffix):
            self.write_unknown("`basename`")
            return 0
        function: Callable[[str], str] = lambda path: paths.basename(path, suffix)  # noqa: E731
        self.write(self.path_function(operand, function, line, "basename") + "\n")
        return 0

    def canonical_program(self, words: list[str], line: int) -> int:
        """``realpath [-s|-L|-P|-e|-m|-q] FILE...`` and ``readlink -f|-e|-m [-n] FILE``."""
        program = words[0].rsplit("/", 1)[-1]
        if program == "readlink":
            parsed = _split_options(words[1:], "femnqsv")
            if parsed is None or not parsed[0] & set("fem") or not parsed[1]:
                return self.print_text(None, "`readlink`")
            options, operands = parsed
            end = "" if "n" in options and len(operands) == 1 else "\n"
        else:
            parsed = _split_options(words[1:], "sLPemq")
            if parsed is None or not parsed[1]:
                return self.print_text(None, "`realpath`")
            options, operands = parsed
            end = "\n"
        for operand in operands:
            self.write(self.resolve(operand, line, program, lexical="s" in options) + end)
        return 0

    def resolve(self, path: str, line: int, program: str, lexical: bool) -> str:
        """``path`` made absolute against the working directory and canonical."""
        absolute = paths.joined(self.working_directory(line), path) if path else path
        if self.lazy_ids(absolute):
            return self.lost(line, f"`{program}`", self.cause(absolute))
        return paths.logical(absolute) if lexical else paths.physical(absolute)

    def path_function(
        self, path: str, function: Callable[[str], str], line: int, program: str
    ) -> str:
        """``function(path)`` where the run-time values in ``path`` cannot change the result.

        The cut ``dirname``/``basename`` make is at the last slash; when that slash lies in
        known text after every run-time value, the run-time part is copied through unchanged.
        """
        ids = self.lazy_ids(path)
        if not ids:
            return function(path)
        tail_start = path.rfind("\0") + 1
        tail = path[tail_start:].rstrip("/")
        if "/" in tail:
            cut = tail_start + tail.rfind("/")
            head = path[:cut]
            placeholder = "x" * len(head)  # no slash, so the known tail decides alone
            result = function(placeholder + path[cut:])
            if result.startswith(placeholder):
                return head + result[len(placeholder) :]
            if placeholder not in result:
                return result
        return self.lost(line, f"`{program}`", ids[0])

    def seq_program(self, words: list[str], line: int) -> int:
        """``seq [-s SEP] [-w] [FIRST [INCREMENT]] LAST`` over integers (else unknown)."""
        separator, width, operands = "\n", False, list(words[1:])
        while operands and operands[0].startswith("-") and not _ascii_integer(operands[0]):
            option = operands.pop(0)
            if option == "--":
                break
            if option == "-w":
                width = True
            elif option.startswith("-s") and (option[2:] or operands):
                separator = option[2:] or operands.pop(0)
            else:
                return self.print_text(None, "`seq`")
        numbers = [int(word) for word in operands if _ascii_integer(word)]
        if len(numbers) != len(operands) or not 1 <= len(numbers) <= 3 or self.lazy_ids(separator):
            return self.print_text(None, "`seq`")
        if len(numbers) == 3:
            first, step, last = numbers
        else:
            first, step, last = (numbers[0] if len(numbers) == 2 else 1), 1, numbers[-1]
        if step == 0 or abs((last - first) // step) > _MAX_SEQ:
            return self.print_text(None, "`seq`")
        values = list(range(first, last + (1 if step > 0 else -1), step))
        texts = [str(value) for value in values]
        if width and texts:
            size = max(len(str(first)), len(str(last)))
            texts = [_zero_padded(value, size) for value in values]
        self.write(separator.join(texts) + "\n" if texts else "")
        return 0


# More numbers than this from `seq` are left to the running system.
_MAX_SEQ = 100_000


def _ascii_integer(word: str) -> bool:
    body = word[1:] if word[:1] in "+-" else word
    return body.isascii() and body.isdigit()


def _zero_padded(value: int, size: int) -> str:
    text = str(abs(value)).rjust(size - (value < 0), "0")
    return f"-{text}" if value < 0 else text


COREUTILS: dict[str, Callable[[Programs, list[str], int], int]] = {
    "dirname": Programs.dirname_program,
    "basename": Programs.basename_program,
    "realpath": Programs.canonical_program,
    "readlink": Programs.canonical_program,
    "seq": Programs.seq_program,
}


def _literal_text(word: Node | None) -> str | None:
    parts = (word or {}).get("Parts") or []
    if len(parts) == 1 and parts[0].get("Type") == "Lit":
        value: str = parts[0].get("Value", "")
        return value
    return None
