"""The launcher: the command that runs an entry module, directly or under wrappers.

A launch runs an entry module the read accepts (by default ``verl.trainer.main_ppo``; see
:mod:`entry_points`) by any of: ``python [OPTIONS] -m MODULE ARGS``, ``python [OPTIONS]
PATH/verl/.../module.py ARGS``, ``torchrun [OPTIONS] -m MODULE ARGS``, ``torchrun [OPTIONS]
PATH/verl/.../module.py ARGS`` and ``python -m torch.distributed.run [OPTIONS] ...``. Python is
found by its name (``python``, ``python3``, ``python3.11``, through PATH or by a path); options
before ``-m`` (``-u``, ``-X dev``) are read as Python reads them, torchrun's with its own table
(``data/wrappers/torchrun.txt``, read as argparse reads it). Wrappers (:mod:`wrappers`) are
peeled off outermost first; the launcher's environment and working directory are the script's,
changed by each wrapper in turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest_verl_compat.bash.paths as paths
from pytest_verl_compat.bash.builtins import SHELLS
from pytest_verl_compat.bash.entry_points import WorldSize, module_of_file, torchrun_world_size
from pytest_verl_compat.bash.results import CarriedValue, LaunchRead
from pytest_verl_compat.bash.sources import Sources
from pytest_verl_compat.bash.state import is_python
from pytest_verl_compat.bash.wrappers import (
    TORCHRUN,
    Wrapped,
    WrapperRefusal,
    find_wrapper,
    parse,
)

# Python's one-letter options that take no value, and those that take one (python3 --help).
_PYTHON_FLAGS = frozenset("bBdEiIOPqsSuvx")
_PYTHON_VALUED = frozenset("WX")
# Wrappers around wrappers (`nohup env timeout ...`) deeper than this are not a launch script.
_MAX_WRAPPERS = 8


@dataclass(frozen=True)
class EntryLaunch:
    """A command that runs an accepted entry module: what the module receives, and how."""

    module: str
    argv: list[str]
    # The word that names the program bash looks up: `python3`, `/usr/bin/python3`, `torchrun`.
    program: str
    launcher: str = "python"
    # torchrun's options as read (None for a plain Python launch).
    torchrun: Wrapped | None = field(default=None)


class Launcher(Sources):
    """Finds the launcher in a command and records what it receives."""

    def entry_launch(self, words: list[str], line: int) -> EntryLaunch | None:
        """The launch ``words`` make, if they run an entry module the read accepts.

        Every word up to the module (or script) must be known: it decides whether this is the
        launcher at all. ``python -m OTHER`` is remembered as another entry point.
        """
        if not words:
            return None
        if words[0].rsplit("/", 1)[-1] == TORCHRUN.words[0]:
            return self.torchrun_launch(words, words[0], line)
        if not is_python(words[0]):
            return None
        target = self.python_target(words, line)
        if target is None:
            return None
        kind, name, rest = target
        if kind == "module" and name == TORCHRUN.python_module:
            launch = self.torchrun_launch(words[:1] + rest, f"{words[0]} -m {name}", line)
            if launch is None:
                self.other_entry = (line, f"{words[0]} -m {name}")
            return launch
        if kind == "module":
            if self.accepts(name):
                return EntryLaunch(name, rest, words[0])
            self.other_entry = (line, f"{words[0]} -m {name}")
            return None
        module = self.file_module(name, line)
        return EntryLaunch(module, rest, words[0]) if module is not None else None

    def python_target(self, words: list[str], line: int) -> tuple[str, str, list[str]] | None:
        """What Python runs: ("module", NAME, ARGS) for ``-m``, ("script", PATH, ARGS) for a
        file; None for ``-c``, standard input, ``--help`` and the like."""
        purpose = f"is an argument of `{words[0]}` that could make it the launcher,"
        index = 1
        while index < len(words):
            word = words[index]
            self.need(word, line, purpose)
            if not word.startswith("-") and word:
                return "script", word, words[index + 1 :]
            if word in ("-", "--") or word.startswith("--") or not word:
                return None
            position = 1
            while position < len(word):
                letter = word[position]
                position += 1
                if letter in _PYTHON_FLAGS:
                    continue
                if letter not in _PYTHON_VALUED and letter != "m":
                    return None
                value = word[position:]
                if not value:
                    index += 1
                    if index >= len(words):
                        return None
                    value = words[index]
                    self.need(value, line, purpose)
                if letter == "m":
                    return "module", value, words[index + 1 :]
                break
            index += 1
        return None

    def file_module(self, path: str, line: int) -> str | None:
        """The accepted entry module a Python file is, or None; a file named like one in a
        folder only known at run time is refused rather than skipped."""
        module = module_of_file(path, self.sh.cwd)
        if module is not None:
            return module if self.accepts(module) else None
        stem = path.rsplit("/", 1)[-1].removesuffix(".py")
        if path.endswith(".py") and not path.startswith("/") and stem in self.entry_stems:
            folder = self.sh.cwd if self.sh.cwd is not None else self.variable_lazy("PWD", line)
            self.need(folder, line, f"is the folder `{path}` is found in")
        return None

    def torchrun_launch(self, words: list[str], shown: str, line: int) -> EntryLaunch | None:
        """``torchrun [OPTIONS] (-m MODULE | SCRIPT) ARGS`` (or ``python -m
        torch.distributed.run ...``, given as ``words[0]`` and the rest) launching an accepted
        entry module, read with torchrun's own table; None when it runs anything else."""
        need = lambda word, purpose: self.need(word, line, purpose)  # noqa: E731
        try:
            used = parse(TORCHRUN, [TORCHRUN.words[0], *words[1:]], need)
        except WrapperRefusal as exc:
            if any(self.accepts(word) or self.accepts_file(word) for word in words[1:]):
                self.fail(line, exc.construct.replace("torchrun", shown, 1), exc.detail)
            return None
        if used is None:
            return None
        command = used.command
        if used.module:
            module: str | None = command[2]
            self.need(command[2], line, f"is the module `{shown}` runs")
            if not self.accepts(command[2]):
                return None
            rest = command[3:]
        else:
            self.need(command[1], line, f"is the script `{shown}` runs")
            module = self.file_module(command[1], line)
            rest = command[2:]
        if module is None:
            return None
        return EntryLaunch(module, rest, words[0], "torchrun", used)

    def accepts_file(self, word: str) -> bool:
        module = module_of_file(word, self.sh.cwd)
        return module is not None and self.accepts(module)

    def note_entry(self, words: list[str], line: int) -> None:
        """Remember a ``torchrun ... -m MODULE``: the entry point a script runs instead."""
        if words and words[0].rsplit("/", 1)[-1] == "torchrun" and "-m" in words[1:-1]:
            module = words[words.index("-m", 1) + 1]
            if not self.lazy_ids(module):
                self.other_entry = (line, f"torchrun -m {module}")

    def unwrap_launchers(
        self, argv: list[str], uncertain: str | None, line: int
    ) -> tuple[list[str], list[Wrapped]]:
        """The command under the wrappers ``argv`` starts with, and what each wrapper does."""
        words = argv
        uses: list[Wrapped] = []
        while (wrapper := find_wrapper(words)) is not None:
            if len(uses) >= _MAX_WRAPPERS:
                self.fail(line, "wrapper", f"more than {_MAX_WRAPPERS} wrappers in one command")
            # How many words a split run-time value makes decides where the command starts.
            self.need(
                uncertain or "", line, f"is split into words in the arguments of `{wrapper.name}`"
            )
            try:
                used = parse(wrapper, words, lambda word, purpose: self.need(word, line, purpose))
            except WrapperRefusal as exc:
                self.fail(line, exc.construct, exc.detail)
            if used is None:
                break
            uses.append(used)
            words = used.command
            program = words[0].rsplit("/", 1)[-1]
            self.need(words[0], line, "decides which command runs")
            if program in SHELLS:
                self.fail(
                    line,
                    f"{wrapper.name} {program}",
                    "runs a child shell whose code this reader cannot see",
                )
        return words, uses

    def record_launch(
        self,
        entry: EntryLaunch,
        line: int,
        temporary: dict[str, str],
        uses: list[Wrapped],
    ) -> None:
        """Remember the launcher's argv, environment and folder (the last launcher wins)."""
        if self.substituting:
            self.fail(line, "launcher", f"runs inside {self.substituting[-1]}")
        if self.stdin.heredoc and self.stdin.text is not None:
            self.fail(line, "here-document", "feeds the launcher's standard input")
        env = self.environment()
        # A PATH given its own value again (`env -i PATH="$PATH"`) changes nothing.
        changed = self.sh.path_changed
        if temporary.get("PATH", env.get("PATH")) != env.get("PATH"):
            changed = line
        current_path = env.get("PATH")
        env.update(temporary)
        cwd = self.sh.cwd
        unseen: list[str] = []
        for used in uses:
            name = used.wrapper.name
            if used.wrapper.remote_environment is not None:
                env, cwd = {}, None
            if used.clear_env:
                env = {}
            for variable in used.unset:
                env.pop(variable, None)
            if used.export is not None:
                env = _exported(env, used.export)
            for variable, value in used.assignments:
                env[variable] = value
                if variable == "PATH" and value != current_path:
                    changed = line
            for folder in used.folders:
                cwd = _entered(cwd, folder)
            for variable in used.wrapper.changes_variables:
                env[variable] = self.lazy(
                    line, f"${variable} as `{name}` sets it", "only known where it runs", True
                )
            unseen.extend(f"{what} ({name}, line {line})" for what in used.unseen)
        if changed is not None and "/" not in entry.program:
            # bash (or the wrapper) looks `python3` up in the changed PATH: any program.
            what = "Python" if entry.launcher == "python" else entry.program
            self.fail(
                changed,
                "PATH change",
                f"PATH is changed before the launcher on line {line}, so {what} may be another "
                "program",
            )
        argv, carried = self.carry_runtime(list(entry.argv), line)
        options: dict[str, str | bool] = {}
        runtime_options: dict[str, str] = {}
        options_given: dict[str, str | bool] = {}
        size = WorldSize(
            None, "launched by Python, not torchrun: the module starts its own workers"
        )
        if entry.torchrun is not None:
            options_given = self.torchrun_given(entry.torchrun, env, line)
            options, runtime_options = self.split_options(options_given)
            size = torchrun_world_size(options, runtime_options)
            unseen.extend(f"{what} (torchrun, line {line})" for what in entry.torchrun.unseen)
        known, runtime = self.split_runtime(env)
        self.launch = LaunchRead(
            tuple(argv),
            line,
            known,
            runtime,
            cwd=None if cwd is None or self.lazy_ids(cwd) else cwd,
            wrappers=tuple(used.wrapper.name for used in uses),
            unseen=tuple(unseen),
            path=self.path,
            module=entry.module,
            launcher=entry.launcher,
            torchrun=options,
            torchrun_runtime=runtime_options,
            carried_options=tuple(self.carried_options(options_given, line)),
            world_size=size.size,
            world_size_reason=size.reason,
            carried=tuple(carried),
        )
        self.write_unknown("the launcher")

    def carry_runtime(self, words: list[str], line: int) -> tuple[list[str], list[CarriedValue]]:
        """The argv with each run-time value in an override's value (``data.train_files=$PWD/x``)
        written as a placeholder (``RUNTIME_PWD/x``), and what each carried word holds; a run-time
        value anywhere else (a key, a flag, a whole word of its own) is refused here, and the
        reader's caller refuses a carried one where the value decides more than a file's name."""
        argv: list[str] = []
        carried: list[CarriedValue] = []
        for index, word in enumerate(words):
            key, _, value = word.partition("=")
            if not self.lazy_ids(word):
                argv.append(word)
                continue
            if not self.carriable(word):
                self.need(word, line, "reaches the launcher's argv")
            ids = self.lazy_ids(value)
            lazies = [self.lazies[i] for i in ids]
            argv.append(f"{key}={self.replace_runtime(value, self.placeholder)}")
            carried.append(
                CarriedValue(
                    index,
                    key.lstrip("+~"),
                    ", ".join(self.describe(i) for i in ids),
                    tuple(self.placeholder(i) for i in ids),
                    lazies[0].binding,
                    line,
                )
            )
        return argv, carried

    def carriable(self, word: str) -> bool:
        """An override whose run-time values all lie in its value (``key=$PWD/x``)."""
        key, equals, _ = word.partition("=")
        return bool(equals) and not word.startswith("-") and not self.lazy_ids(key)

    def placeholder(self, index: int) -> str:
        """The text a carried run-time value stands as: ``RUNTIME_PWD`` for ``$PWD``, else
        ``RUNTIME_<n>`` (letters, digits and ``_`` only, which Hydra's override grammar reads as
        plain text)."""
        what = self.lazies[index].what
        name = what[1:] if what.startswith("$") and what[1:].isidentifier() else str(index)
        return f"RUNTIME_{name}"

    def torchrun_given(
        self, used: Wrapped, env: dict[str, str], line: int
    ) -> dict[str, str | bool]:
        """torchrun's options as it reads them: its words, else its PET_* environment."""
        wrapper = used.wrapper
        interpreter = wrapper.interpreter_variable
        if interpreter is not None and interpreter in env:
            self.fail(
                line,
                wrapper.name,
                f"{interpreter} in its environment names the interpreter it starts, so Python "
                "may be another program",
            )
        options: dict[str, str | bool] = dict(used.options)
        prefix = wrapper.environment_prefix
        for option in wrapper.options if prefix is not None else ():
            variable = f"{prefix}{option.canonical.upper()}"
            ignored = set(option.names) & set(wrapper.environment_ignored)
            if option.canonical in options or variable not in env or ignored:
                continue
            given = env[variable]
            if option.effect is not None:
                self.fail(
                    line, wrapper.name, f"{variable} in its environment sets {option.names[-1]}"
                )
            if option.value is None:
                # check_env: bool(int(VALUE)), and a value int() refuses stops torchrun.
                self.need(given, line, f"is {variable}, which decides {option.names[-1]},")
                try:
                    options[option.canonical] = bool(int(given))
                except ValueError:
                    self.fail(line, wrapper.name, f"it stops on {variable}={given!r}")
            else:
                options[option.canonical] = given
        return options

    def split_options(
        self, options: dict[str, str | bool]
    ) -> tuple[dict[str, str | bool], dict[str, str]]:
        """Options known, and those only known at run time, described."""
        known: dict[str, str | bool] = {}
        runtime: dict[str, str] = {}
        for name, setting in sorted(options.items()):
            ids = self.lazy_ids(setting) if isinstance(setting, str) else []
            if ids:
                runtime[name] = self.describe(ids[0])
            else:
                known[name] = setting
        return known, runtime

    def carried_options(self, options: dict[str, str | bool], line: int) -> list[CarriedValue]:
        """torchrun's options holding a run-time value, as carried values keyed ``torchrun
        --NAME`` (the reader's caller decides which only name something)."""
        carried = []
        for name, setting in sorted(options.items()):
            ids = self.lazy_ids(setting) if isinstance(setting, str) else []
            if ids:
                carried.append(
                    CarriedValue(
                        -1,
                        f"torchrun --{name}",
                        ", ".join(self.describe(i) for i in ids),
                        tuple(self.placeholder(i) for i in ids),
                        self.lazies[ids[0]].binding,
                        line,
                    )
                )
        return carried

    def environment(self) -> dict[str, str]:
        """The exported scalar variables (bash does not export arrays)."""
        env: dict[str, str] = {}
        for name in self.sh.exported:
            value = self.sh.vars.get(name)
            if isinstance(value, str):
                env[name] = value
        return env

    def split_runtime(self, env: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
        """The environment's known values, and where each run-time value comes from."""
        known: dict[str, str] = {}
        runtime: dict[str, str] = {}
        for name, value in sorted(env.items()):
            ids = self.lazy_ids(value)
            if ids:
                runtime[name] = self.describe(ids[0])
            else:
                known[name] = value
        return known, runtime


def _exported(env: dict[str, str], items: list[str]) -> dict[str, str]:
    """srun ``--export``: ALL keeps the environment, NONE drops it, names keep only those."""
    keep_all = any(item.upper() == "ALL" for item in items)
    result = dict(env) if keep_all else {}
    for item in items:
        name, eq, value = item.partition("=")
        if eq:
            result[name] = value
        elif not keep_all and name.upper() not in ("NONE", "NIL") and name in env:
            result[name] = env[name]
    return result


def _entered(cwd: str | None, folder: str | None) -> str | None:
    """The folder a wrapper runs its command in (None: only known where it runs)."""
    if folder is None or "\0" in folder:
        return None
    if folder.startswith("/"):
        return paths.logical(folder)
    if cwd is None or "\0" in cwd:
        return None
    return paths.logical(paths.joined(cwd, folder))
