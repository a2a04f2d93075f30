"""Builtins: those that change the shell (``set``, ``shift``, ``exit``, ...) and assignments.

Builtins whose effect cannot be known statically are rejected here, each with the reason.
"""

from __future__ import annotations

from pytest_verl_compat.bash.arithmetic import _legal_integer
from pytest_verl_compat.bash.errors import _Exit, _LoopControl
from pytest_verl_compat.bash.parse import Node, _line
from pytest_verl_compat.bash.programs import _Programs
from pytest_verl_compat.bash.state import (
    _LAUNCHER_MODULE,
    _SET_FLAGS,
    _SET_HARMLESS_FLAGS,
    _SET_HARMLESS_NAMES,
    _SET_NAMED,
)
from pytest_verl_compat.bash.words import _is_name

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
    "coproc": ("coproc", "runs a command concurrently with the script"),
    "fc": ("fc", "re-runs commands from history"),
    "local": ("local", _NOT_A_DECLARATION),
    "declare": ("declare", _NOT_A_DECLARATION),
    "typeset": ("typeset", _NOT_A_DECLARATION),
    "export": ("export", _NOT_A_DECLARATION),
    "readonly": ("readonly", _NOT_A_DECLARATION),
    "let": ("let", "`let` after an assignment, quoted or expanded: its words are not arithmetic"),
}

# The builtins whose arguments decide what they do to the shell: those modelled in
# `_Builtins.builtin` and those it refuses.
_ARGUMENT_BUILTINS = (
    frozenset("set shift exit unset break continue exec hash return".split())
    | _REJECTED_BUILTINS.keys()
)

_SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh", "mksh", "rbash", "busybox"})
# Programs that run the command given in their arguments: a shell among those arguments runs
# code this reader never sees.
_RUNNERS = frozenset(
    "env nice nohup timeout stdbuf setsid sudo doas xargs time taskset numactl chrt ionice "
    "chroot flock unbuffer script watch strace ltrace".split()
)


def _options(words: list[str]) -> list[str]:
    """The leading option words (``-x``/``+x``), up to ``--`` or the first operand."""
    found: list[str] = []
    for word in words:
        if word == "--" or len(word) < 2 or word[0] not in "-+":
            break
        found.append(word)
    return found


def _operands(words: list[str]) -> list[str]:
    """The words after the leading options (and after ``--``)."""
    rest = words[len(_options(words)) :]
    return rest[1:] if rest[:1] == ["--"] else rest


def _is_option(word: str, letter: str) -> bool:
    """Whether a short-option word such as ``-ec`` holds ``letter``."""
    return not word.startswith("--") and letter in word[1:]


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


class _Builtins(_Programs):
    """The modelled builtins, declarations and assignments."""

    def builtin(self, argv: list[str], line: int) -> int:
        """Builtins that change the shell; anything else is skipped as a success."""
        unwrapped = self.unwrap(argv, line)
        if isinstance(unwrapped, int):
            return unwrapped
        words, wrappers = unwrapped
        # A builtin reached through `builtin`/`command` is named with them in errors.
        prefix = "".join(f"{wrapper} " for wrapper in wrappers)
        name = words[0]
        if name in (":", "true"):
            return 0
        if name == "false":
            return 1
        if name in ("[", "test"):
            return self.test_builtin(words, line)
        if name == "exit":
            return self.exit_builtin(words, line)
        if name == "set":
            if len(words) == 1:
                self.write_unknown("`set`")  # it lists every variable
            return self.set_builtin(words, line)
        if name == "return":
            return self.return_builtin(words, line)
        if name == "shift":
            return self.shift_builtin(words, line)
        if name == "unset":
            return self.unset_builtin(words, line)
        if name in ("break", "continue"):
            if not self.loop_depth:
                self.fail(line, name, f"`{name}` outside a loop")
            levels = 1
            if len(words) > 1:
                parsed = _legal_integer(words[1])
                if parsed is None or parsed < 1:
                    self.fail(line, name, f"invalid loop count {words[1]!r}")
                levels = parsed
            raise _LoopControl(name, min(levels, self.loop_depth))
        if name == "exec":
            if len(words) > 1:
                self.fail(line, f"{prefix}exec", "replaces the shell with another program")
            return 0
        if name == "trap" and self.signal_trap(words):
            return 0
        if name in _REJECTED_BUILTINS:
            construct, detail = _REJECTED_BUILTINS[name]
            self.fail(line, f"{prefix}{construct}", detail)
        if name == "hash" and any(_is_option(a, "p") for a in _options(words[1:])):
            self.fail(
                line, f"{prefix}hash -p", "binds a command name to any file, `python3` included"
            )
        if name == "printf" and len(words) > 1 and words[1].startswith("-v"):
            self.fail(line, f"{prefix}printf -v", "sets a variable from formatted output")
        status = self.run_program(words, line)
        if status is not None:
            return status
        return self.external(words, line, argv[0])

    def signal_trap(self, words: list[str]) -> bool:
        """Whether a ``trap`` only handles signals: a run the audit follows gets none, so the
        handler never runs. Code for EXIT, ERR, DEBUG or RETURN runs in every run: refused."""
        if words[1:2] == ["--"]:
            words = words[1:]
        if len(words) < 2 or (words[1].startswith("-") and words[1] != "-"):
            self.write_unknown("`trap`")  # it lists the traps
            return True
        action, signals = words[1], words[2:]
        if not signals:
            return False
        synchronous = {"EXIT", "0", "ERR", "DEBUG", "RETURN"}
        named = {signal.upper().removeprefix("SIG") for signal in signals}
        return action in ("", "-") or not named & synchronous

    def external(self, words: list[str], line: int, shown: str) -> int:
        """A program this reader skips (as if it succeeded), unless it could run the launcher
        or a child shell; its output is only known at run time."""
        name = words[0]
        if _LAUNCHER_MODULE in words[1:]:
            self.fail(
                line, "indirect launcher", f"`{shown}` runs {_LAUNCHER_MODULE}; call it directly"
            )
        program = name.rsplit("/", 1)[-1]
        if program in _SHELLS and any("main_ppo" in a for a in words[1:]):
            self.fail(line, "indirect launcher", f"`{name}` runs shell code that mentions main_ppo")
        if program in _SHELLS:
            self.child_shell(program, words, line)
        if program in _RUNNERS:
            for word in words[1:]:
                if word.rsplit("/", 1)[-1] in _SHELLS:
                    self.fail(
                        line,
                        f"{program} {word.rsplit('/', 1)[-1]}",
                        "runs a child shell whose code this reader cannot see",
                    )
        self.write_unknown(f"`{name}`")
        return 0

    def unwrap(self, argv: list[str], line: int) -> tuple[list[str], list[str]] | int:
        """The command that ``builtin``/``command`` prefixes run, with the prefixes; or the
        status bash gives when they run nothing (no name, a bad option, not a builtin)."""
        words = argv
        wrappers: list[str] = []
        while words[0] in ("builtin", "command"):
            wrapper, rest = words[0], words[1:]
            options = ""
            while rest and rest[0].startswith("-") and rest[0] != "-":
                if rest[0] == "--":
                    rest = rest[1:]
                    break
                if wrapper == "builtin" or set(rest[0][1:]) - set("pvV"):
                    return 2  # bash: invalid option
                options += rest[0][1:]
                rest = rest[1:]
            if not rest:
                return 0
            if wrapper == "builtin" and rest[0] not in _BASH_BUILTINS:
                return 1  # bash: not a shell builtin
            if "v" in options or "V" in options:
                # `command -v NAME` only describes NAME; like any other command it is assumed
                # to succeed.
                self.write_unknown(f"`{wrapper} -{options}`")
                return 0
            wrappers.append(f"{wrapper} -{options}" if options else wrapper)
            words = rest
        return words, wrappers

    def child_shell(self, program: str, words: list[str], line: int) -> None:
        """A shell started as a command runs code this reader never sees: refuse it."""
        operands = list(_operands(words[1:]))
        if any(_is_option(a, "c") for a in _options(words[1:])):
            self.fail(line, f"{program} -c", "runs a string as code in a child shell")
        if not operands or any(_is_option(a, "s") for a in _options(words[1:])):
            self.fail(
                line,
                f"{program} stdin",
                "a child shell runs the code fed to its standard input",
            )
        self.fail(
            line,
            f"{program} script",
            f"runs {operands[0]!r} in a child shell; read that file on its own",
        )

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
        """``unset [-v|-f] NAME...``."""
        functions = False
        for arg in argv[1:]:
            if arg in ("-v", "-f", "-fv", "-vf"):
                functions = arg == "-f"
                continue
            if arg.startswith("-"):
                self.fail(line, f"unset {arg}", "option not supported")
            if functions:
                self.sh.functions.pop(arg, None)
                continue
            name, bracket, rest = arg.partition("[")
            if not _is_name(name):
                self.fail(line, "unset", f"not a variable name: {arg!r}")
            if name in self.sh.readonly:
                self.fail(line, "unset", f"{name} is readonly")
            if name == "PATH":
                self.note_path_change(line)
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
            self.sh.dropped.add(name)
        return 0

    # ---------------------------------------------------------------- declarations

    def declaration(self, cmd: Node, line: int) -> int:
        """``export``, ``declare``/``typeset`` and ``readonly`` with the options modelled here."""
        variant = (cmd.get("Variant") or {}).get("Value", "")
        if variant == "local" and not self.calls:
            self.fail(line, "local", "`local` outside a function")
        allowed = {
            "export": ("np", ""),
            "declare": ("axgrp", "x"),
            "typeset": ("axgrp", "x"),
            "local": ("axrp", "x"),
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
        if "p" in on or not assigns:
            if assigns:
                self.fail(line, f"{variant} -p", "printing with names is not supported")
            self.write_unknown(f"`{variant}`")  # it lists variables
            return 0
        # In a function, `local` and `declare` without -g make each name local to it.
        local = variant == "local" or (variant in ("declare", "typeset") and self.calls)
        local = local and "g" not in on
        export = (variant == "export" and "n" not in on) or "x" in on
        unexport = (variant == "export" and "n" in on) or "x" in off
        readonly = variant == "readonly" or "r" in on
        for assign in assigns:
            name = assign["Name"]["Value"]
            if local:
                self.make_local(name, line)
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
                fields = self.fields(
                    [elem["Value"]], assignment_words=False, use="elements the array gets"
                )
                elements.extend((None, f) for f in fields)
        return elements
