"""Builtins: those that change the shell (``set``, ``shift``, ``exit``, ...) and assignments.

Builtins whose effect cannot be known statically are rejected here, each with the reason.
"""

from __future__ import annotations

from collections.abc import Callable

from pytest_verl_compat.bash.arrays import Assoc
from pytest_verl_compat.bash.declarations import Declarations
from pytest_verl_compat.bash.errors import LoopControl, ShellExit
from pytest_verl_compat.bash.printing import printf_output
from pytest_verl_compat.bash.state import (
    SET_FLAGS,
    SET_HARMLESS_FLAGS,
    SET_HARMLESS_NAMES,
    SET_NAMED,
)
from pytest_verl_compat.bash.stdin import getopt
from pytest_verl_compat.bash.words import is_name, legal_integer

_NOT_A_DECLARATION = (
    "after an assignment, quoted or expanded, bash reads its arguments as ordinary words"
)
# Builtins whose effect on the shell cannot be reproduced without running something.
_REJECTED_BUILTINS: dict[str, tuple[str, str]] = {
    "eval": ("eval", "evaluates text as code at run time"),
    "alias": ("alias", "aliases can rename any command, including the launcher"),
    "unalias": ("alias", "aliases can rename any command, including the launcher"),
    "enable": ("enable", "can swap builtins for loadable ones"),
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
# `Builtins.builtin` and those it refuses.
ARGUMENT_BUILTINS = (
    frozenset(
        "set shift exit unset break continue exec hash return source . trap read mapfile "
        "readarray getopts".split()
    )
    | _REJECTED_BUILTINS.keys()
)
# shopt options that change nothing this reader computes: it never globs, aliases and
# extended globs are refused where used, the rest are interactive.
_SHOPT_HARMLESS = frozenset(
    "extglob expand_aliases checkwinsize histappend cmdhist lithist promptvars sourcepath "
    "progcomp interactive_comments complete_fullquote hostcomplete checkhash".split()
)

SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh", "mksh", "rbash", "busybox"})
# Programs that run the command given in their arguments: a shell among those arguments runs
# code this reader never sees.
RUNNERS = frozenset(
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
BASH_BUILTINS = frozenset(
    (
        ": . [ alias bg bind break builtin caller cd command compgen complete compopt continue "
        "declare dirs disown echo enable eval exec exit export false fc fg getopts hash help "
        "history jobs kill let local logout mapfile popd printf pushd pwd read readarray "
        "readonly return set shift shopt source suspend test times trap true type typeset "
        "ulimit umask unalias unset wait"
    ).split()
)


class Builtins(Declarations):
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
                parsed = legal_integer(words[1])
                if parsed is None or parsed < 1:
                    self.fail(line, name, f"invalid loop count {words[1]!r}")
                levels = parsed
            raise LoopControl(name, min(levels, self.loop_depth))
        if name == "exec":
            if len(words) > 1:
                self.fail(line, f"{prefix}exec", "replaces the shell with another program")
            return 0
        handler = _HANDLERS.get(name)
        if handler is not None:
            return handler(self, words, line)
        if name == "shopt" and self.harmless_shopt(words):
            return 0
        if name in _REJECTED_BUILTINS:
            construct, detail = _REJECTED_BUILTINS[name]
            self.fail(line, f"{prefix}{construct}", detail)
        if name == "hash" and any(_is_option(a, "p") for a in _options(words[1:])):
            self.fail(
                line, f"{prefix}hash -p", "binds a command name to any file, `python3` included"
            )
        if name == "printf" and len(words) > 1 and words[1].startswith("-v"):
            return self.printf_to_variable(words, line)
        status = self.run_program(words, line)
        if status is not None:
            return status
        return self.external(words, line, argv[0])

    def harmless_shopt(self, words: list[str]) -> bool:
        """``shopt -s|-u NAME...`` of options that change nothing read here."""
        parsed = getopt(words[1:], "supqo")
        if isinstance(parsed, str):
            return False
        options, names = parsed
        flags = {letter for letter, _ in options}
        if flags & {"p", "q"} or not names:
            self.write_unknown("`shopt`")
            return not flags - {"p", "q"}
        return flags <= {"s", "u"} and all(name in _SHOPT_HARMLESS for name in names)

    def printf_to_variable(self, words: list[str], line: int) -> int:
        """``printf -v NAME FORMAT [ARGS...]``: the formatted text becomes NAME's value."""
        name = words[1][2:] or (words[2] if len(words) > 2 else "")
        rest = words[2:] if words[1][2:] else words[3:]
        if rest[:1] == ["--"]:
            rest = rest[1:]
        if not is_name(name) or not rest:
            return 2
        text = printf_output(rest[0], rest[1:])
        if text is None:
            self.fail(line, "printf -v", "a conversion this reader does not model")
        self.set_scalar(name, text, line)
        return 0

    def external(self, words: list[str], line: int, shown: str) -> int:
        """A program this reader skips (as if it succeeded), unless it could run the launcher
        or a child shell; its output is only known at run time."""
        name = words[0]
        launched = next((word for word in words[1:] if self.accepts(word)), None)
        if launched is not None:
            self.fail(line, "indirect launcher", f"`{shown}` runs {launched}; call it directly")
        program = name.rsplit("/", 1)[-1]
        for stem in sorted(self.entry_stems) if program in SHELLS else ():
            if any(stem in word for word in words[1:]):
                self.fail(
                    line, "indirect launcher", f"`{name}` runs shell code that mentions {stem}"
                )
        if program in SHELLS:
            self.child_shell(program, words, line)
        if program in RUNNERS:
            for word in words[1:]:
                if word.rsplit("/", 1)[-1] in SHELLS:
                    self.fail(
                        line,
                        f"{program} {word.rsplit('/', 1)[-1]}",
                        "runs a child shell whose code this reader cannot see",
                    )
        self.consumed(name)
        text = next((text for text in self.command_text if text in self.substitutions), None)
        if text is not None:
            # The same command bound as `$(TEXT)`: what it prints, as `substitution` reads it.
            output = str(self.substitutions[text]).replace("\0", "").rstrip("\n")
            self.write_bound(output, f"`{text}`")
        else:
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
            if wrapper == "builtin" and rest[0] not in BASH_BUILTINS:
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
            raise ShellExit(self.sh.status, line)
        value = legal_integer(argv[1])
        raise ShellExit(2 if value is None else value & 255, line)

    def set_builtin(self, argv: list[str], line: int) -> int:
        """``set`` options and ``set -- ARGS``."""
        options = self.sh.options
        i = 1
        while i < len(argv):
            arg = argv[i]
            if arg == "--":
                self.set_positional(argv[i + 1 :])
                return 0
            if arg == "-":
                if i + 1 < len(argv):
                    self.set_positional(argv[i + 1 :])
                return 0
            if len(arg) < 2 or arg[0] not in "-+":
                self.set_positional(argv[i:])
                return 0
            on = arg[0] == "-"
            for flag in arg[1:]:
                if flag == "o":
                    i += 1
                    if i >= len(argv):
                        return 0  # `set -o` alone lists the options
                    option = argv[i]
                    if option in SET_NAMED:
                        (options.add if on else options.discard)(SET_NAMED[option])
                    elif option not in SET_HARMLESS_NAMES:
                        self.fail(line, f"set -o {option}", "shell option not supported")
                elif flag in SET_FLAGS:
                    (options.add if on else options.discard)(SET_FLAGS[flag])
                elif flag not in SET_HARMLESS_FLAGS:
                    self.fail(line, f"set {arg[0]}{flag}", "shell option not supported")
            i += 1
        return 0

    def set_positional(self, words: list[str]) -> None:
        """``set -- WORDS``: a file sourced with arguments keeps these (``args_set``)."""
        self.sh.positional = words
        self.sh.args_set = True

    def shift_builtin(self, argv: list[str], line: int) -> int:
        """``shift [N]``."""
        count = 1
        if len(argv) > 1:
            parsed = legal_integer(argv[1])
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
            if not is_name(name):
                self.fail(line, "unset", f"not a variable name: {arg!r}")
            if name in self.sh.readonly:
                self.fail(line, "unset", f"{name} is readonly")
            if name == "PATH":
                self.note_path_change(line)
            if bracket:
                if not rest.endswith("]"):
                    self.fail(line, "unset", f"bad array subscript {arg!r}")
                value = self.sh.vars.get(name)
                if isinstance(value, Assoc):
                    value.items.pop(rest[:-1], None)
                    continue
                index = self.arith_text(rest[:-1], line)
                if isinstance(value, dict):
                    value.pop(index, None)
                elif isinstance(value, str) and index == 0:
                    del self.sh.vars[name]
                continue
            self.sh.vars.pop(name, None)
            self.sh.exported.discard(name)
            self.sh.dropped.add(name)
        return 0


# Builtins modelled in a layer of their own, by name.
_HANDLERS: dict[str, Callable[[Builtins, list[str], int], int]] = {
    "read": Builtins.read_builtin,
    "mapfile": Builtins.mapfile_builtin,
    "readarray": Builtins.mapfile_builtin,
    "getopts": Builtins.getopts_builtin,
    "trap": lambda self, words, line: self.trap_builtin(words, line),
    "source": lambda self, words, line: self.source_builtin(words, line),
    ".": lambda self, words, line: self.source_builtin(words, line),
}
