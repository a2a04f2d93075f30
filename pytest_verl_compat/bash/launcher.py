"""The launcher: ``python3 -m verl.trainer.main_ppo``, directly or under wrappers.

Python is found by its name (``python``, ``python3``, ``python3.11``, through PATH or by a
path); options before ``-m`` (``-u``, ``-X dev``) are read as Python reads them. Wrappers
(:mod:`wrappers`) are peeled off outermost first; the launcher's environment and working
directory are the script's, changed by each wrapper in turn.
"""

from __future__ import annotations

from pytest_verl_compat.bash import paths
from pytest_verl_compat.bash.builtins import _SHELLS
from pytest_verl_compat.bash.sources import _Sources
from pytest_verl_compat.bash.state import _LAUNCHER_MODULE, CarriedValue, LaunchRead, _is_python
from pytest_verl_compat.bash.wrappers import Wrapped, WrapperRefusal, find_wrapper, parse

# Python's one-letter options that take no value, and those that take one (python3 --help).
_PYTHON_FLAGS = frozenset("bBdEiIOPqsSuvx")
_PYTHON_VALUED = frozenset("WX")
# Wrappers around wrappers (`nohup env timeout ...`) deeper than this are not a launch script.
_MAX_WRAPPERS = 8


class _Launcher(_Sources):
    """Finds the launcher in a command and records what it receives."""

    def launcher_argv(self, words: list[str], line: int) -> list[str] | None:
        """The words Hydra receives if ``words`` run the launcher, else None.

        Every word up to the module name must be known: it decides whether this is the
        launcher at all.
        """
        if not words or not _is_python(words[0]):
            return None
        purpose = f"is an argument of `{words[0]}` that could make it the launcher,"
        index = 1
        while index < len(words):
            word = words[index]
            self.need(word, line, purpose)
            if not word.startswith("-") or word in ("-", "--") or word.startswith("--"):
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
                    if value == _LAUNCHER_MODULE:
                        return words[index + 1 :]
                    self.other_entry = (line, f"{words[0]} -m {value}")
                    return None
                break
            index += 1
        return None

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
            if program in _SHELLS:
                self.fail(
                    line,
                    f"{wrapper.name} {program}",
                    "runs a child shell whose code this reader cannot see",
                )
        return words, uses

    def record_launch(
        self,
        python: str,
        hydra_argv: list[str],
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
            unseen.extend(f"{what} ({name}, line {line})" for what in used.unseen)
        if changed is not None and "/" not in python:
            # bash (or the wrapper) looks `python3` up in the changed PATH: any program.
            self.fail(
                changed,
                "PATH change",
                f"PATH is changed before the launcher on line {line}, so Python may be another "
                "program",
            )
        argv, carried = self.carry_runtime(hydra_argv, line)
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
