"""Wrapped launchers: programs that run the launcher for the script, as data.

``ray job submit [OPTIONS] -- python3 -m verl.trainer.main_ppo ...``, ``uv run``, ``env``,
``nohup``, ``timeout``, ``srun`` (and more, one :class:`Wrapper` each in :data:`WRAPPERS`) hand
the wrapped command the words after their own options, unchanged. A wrapper is never run: its
options are read with its own parser's rules (GNU getopt, argparse, click, clap or pflag) and
checked, an option it does not have is refused by name, and the effects it has on the wrapped
command (working directory, environment) are applied. The tables of the wrappers scripts use most
are built from their own documented option lists (:mod:`wrapper_tables`, ``data/wrappers``).
An option value the wrapper parses (a duration, a number, JSON) must be known; free text it only
passes on (a cluster address, a folder to upload) may be a run-time value, which is never run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from pytest_verl_compat.bash.wrapper_tables import (
    TABLE_FILES,
    Option,
    ValueKind,
    Wrapper,
    option_list,
)

_SPEC = re.compile(
    r"(?P<names>[-\w/]+)(?P<value>\[?=(?P<kind>\w*)(?:\((?P<choices>[\w|]+)\))?\]?)?(?::(?P<effect>[\w-]+))?"
)


def _options(spec: str) -> tuple[Option, ...]:
    """Options written as ``-C/--chdir=:cwd``: the spellings; ``=KIND`` (text when empty) for a
    value, ``[=KIND]`` for one given only as ``--name=VALUE``, ``=choice(a|b)``; ``:EFFECT``."""
    options = []
    for token in spec.split():
        match = _SPEC.fullmatch(token)
        if match is None:
            raise ValueError(f"bad option spec {token!r}")
        value = match["value"]
        options.append(
            Option(
                tuple(match["names"].split("/")),
                (match["kind"] or "text") if value else None,  # type: ignore[arg-type]
                match["effect"],  # type: ignore[arg-type]
                optional_value=bool(value) and value.startswith("["),
                choices=tuple((match["choices"] or "").split("|")) if match["choices"] else (),
            )
        )
    return tuple(options)


_EXITS = "--help:exits --version:exits"

# Programs that only run the command after their options (and operands), unchanged, in the
# same environment.
_PLAIN_SPECS: tuple[tuple[str, str, tuple[ValueKind, ...], str], ...] = (
    ("nice", f"-n/--adjustment=int {_EXITS}", (), "nice [OPTION] COMMAND [ARG]..."),
    ("setsid", "-c/--ctty -f/--fork -w/--wait", (), "setsid [OPTION] PROGRAM [ARG]..."),
    (
        "stdbuf",
        f"-i/--input= -o/--output= -e/--error= {_EXITS}",
        (),
        "stdbuf OPTION... COMMAND",
    ),
    (
        "taskset",
        f"-a/--all-tasks -c/--cpu-list -p/--pid:refuse {_EXITS}",
        ("text",),
        "taskset [OPTION] MASK|LIST COMMAND [ARG]... (util-linux)",
    ),
    (
        "numactl",
        "-i/--interleave= -m/--membind= -N/--cpunodebind= -C/--physcpubind= -l/--localalloc "
        "-p/--preferred= -P/--preferred-many= -b/--balancing -a/--all "
        "-w/--weighted-interleave= -s/--show:exits -H/--hardware:exits --help:exits",
        (),
        "numactl [OPTION]... COMMAND [ARG]...",
    ),
    (
        "time",
        "-a/--append -f/--format= -o/--output= -p/--portability -q/--quiet -v/--verbose " + _EXITS,
        (),
        "GNU time [OPTION]... COMMAND [ARG]...",
    ),
)
# stdbuf runs its command with its own library preloaded: LD_PRELOAD gets libstdbuf.so (where
# coreutils installed it) in front, and each -i/-o/-e option becomes a _STDBUF_* variable.
_PLAIN_ENVIRONMENTS = {
    "stdbuf": ("the _STDBUF_I, _STDBUF_O and _STDBUF_E variables of its options", ("LD_PRELOAD",))
}
_PLAIN = tuple(
    Wrapper(
        (program,),
        _options(spec),
        "getopt",
        operands=operands,
        evidence=usage,
        adds_variables=_PLAIN_ENVIRONMENTS.get(program, (None, ()))[0],
        changes_variables=_PLAIN_ENVIRONMENTS.get(program, (None, ()))[1],
    )
    for program, spec, operands, usage in _PLAIN_SPECS
)

# The wrappers whose documented option lists are stored as data (torchrun aside: it is a
# launcher, read by `launcher`), then the plain ones above.
_DOCUMENTED = {name: option_list(name).wrapper for name in TABLE_FILES}
TORCHRUN = _DOCUMENTED.pop("torchrun")
WRAPPERS: tuple[Wrapper, ...] = (*_DOCUMENTED.values(), *_PLAIN)
# The programs a wrapper (or torchrun) starts with: a script function of one of these names is
# refused.
WRAPPER_PROGRAMS = frozenset(wrapper.words[0] for wrapper in (*WRAPPERS, TORCHRUN))


def find_wrapper(words: list[str]) -> Wrapper | None:
    """The wrapper ``words`` start with (the program may be named by a path)."""
    if not words:
        return None
    program = words[0].rsplit("/", 1)[-1]
    for wrapper in WRAPPERS:
        if (
            wrapper.words[0] == program
            and tuple(words[1 : len(wrapper.words)]) == wrapper.words[1:]
        ):
            return wrapper
    return None


class WrapperRefusal(Exception):
    """A wrapper's words this reader refuses: the construct and why."""

    def __init__(self, construct: str, detail: str) -> None:
        super().__init__(construct, detail)
        self.construct = construct
        self.detail = detail


@dataclass
class Wrapped:
    """What a wrapper does: the command it runs and how it changes that command's world."""

    wrapper: Wrapper
    command: list[str]
    clear_env: bool = False
    unset: list[str] = field(default_factory=list)
    assignments: list[tuple[str, str]] = field(default_factory=list)
    # Folders the command runs in, in the order the wrapper applies them; None: a folder only
    # known where the command runs (an uploaded copy).
    folders: list[str | None] = field(default_factory=list)
    # srun --export: None keeps the environment, else the names kept (with "ALL" meaning all).
    export: list[str] | None = None
    # Environments added that the script does not show, described.
    unseen: list[str] = field(default_factory=list)
    # The command is a Python module to run (uv run -m, torchrun -m).
    module: bool = False
    # The options read, by canonical name (last given wins): their value, True for a flag.
    options: dict[str, str | bool] = field(default_factory=dict)


# A run-time value's check: needs(word, purpose) raises unless the word is known text.
Need = Callable[[str, str], None]


def parse(wrapper: Wrapper, words: list[str], need: Need) -> Wrapped | None:
    """Read a wrapper's words as its own parser does; the command is what follows its options.

    None when the wrapper runs no command (none given, or ``--help``): it is then an ordinary
    program the script runs.
    """
    rest = words[len(wrapper.words) :]
    result = Wrapped(wrapper, [])
    operands: list[str] = []
    index = 0
    purpose = f"may be an option of `{wrapper.name}`, which decides where its command starts,"
    while index < len(rest):
        word = rest[index]
        # Only the option's name decides: `--working-dir=<run-time value>` is still read.
        need(word.partition("=")[0] if word.startswith("--") else word[:2], purpose)
        if word == "--":
            if wrapper.parser == "argparse":
                # Where argparse drops a `--` among REMAINDER words changed between Python
                # releases: which interpreter runs the wrapper decides the command.
                raise WrapperRefusal(
                    wrapper.name, f"`--` in the words of `{wrapper.name}` (argparse)"
                )
            operands.extend(rest[index + 1 :])
            break
        if len(word) < 2 or not word.startswith("-"):
            if wrapper.parser != "click":
                operands.extend(rest[index:])
                break
            operands.append(word)
            index += 1
            continue
        taken = _read_option(wrapper, rest, index, need, result)
        if taken is None:
            return None
        index = taken
    if wrapper.remote_environment is not None:
        result.unseen.append(wrapper.remote_environment)
    if wrapper.adds_variables is not None:
        result.unseen.append(wrapper.adds_variables)
    for kind in wrapper.operands:
        if not operands:
            return None
        value = operands.pop(0)
        _check_value(wrapper, kind, value, f"its {kind}", need)
    if wrapper.assignments:
        if operands[:1] == ["-"]:
            result.clear_env = True
            operands = operands[1:]
        while operands and "=" in operands[0]:
            name, _, value = operands.pop(0).partition("=")
            need(name, f"names a variable `{wrapper.name}` sets,")
            if not name:
                raise WrapperRefusal(wrapper.name, f"`{wrapper.name}` cannot set {'=' + value!r}")
            result.assignments.append((name, value))
    if not operands:
        return None
    if wrapper.parser == "argparse" and "--" in operands:
        raise WrapperRefusal(wrapper.name, f"`--` in the words of `{wrapper.name}` (argparse)")
    if result.module or wrapper.runs_python:
        result.command = ["python", *(["-m"] if result.module else []), *operands]
    else:
        result.command = operands
    return result


def _read_option(
    wrapper: Wrapper, words: list[str], index: int, need: Need, result: Wrapped
) -> int | None:
    """Apply the option at ``words[index]``: the index after it, None when it ends the run
    (``--help``)."""
    word = words[index]
    if word.startswith("--"):
        name, eq, attached = word.partition("=")
        option = _long_option(wrapper, name)
        if option.value is None:
            if eq:
                raise WrapperRefusal(wrapper.name, f"`{name}` of `{wrapper.name}` takes no value")
            return _effect(wrapper, option, name, None, need, result, index + 1)
        if eq or option.optional_value:
            value = attached if eq else None
            return _effect(wrapper, option, name, value, need, result, index + 1)
        value = _separate_value(wrapper, words, index, name)
        return _effect(wrapper, option, name, value, need, result, index + 2)
    # A cluster of short options: each letter a flag, until one that takes a value.
    position = 1
    while position < len(word):
        need(word[: position + 1], f"may be an option of `{wrapper.name}`,")
        name = "-" + word[position]
        option = _short_option(wrapper, name)
        position += 1
        if option.value is None:
            if _effect(wrapper, option, name, None, need, result, index) is None:
                return None
            continue
        if position < len(word):
            attached = word[position:]
            if wrapper.parser in _SHORT_EQUALS and attached.startswith("="):
                attached = attached[1:]  # `-p=3.11` is `-p 3.11` here, `-p =3.11` for getopt
            return _effect(wrapper, option, name, attached, need, result, index + 1)
        if option.optional_value:
            return _effect(wrapper, option, name, None, need, result, index + 1)
        value = _separate_value(wrapper, words, index, name)
        return _effect(wrapper, option, name, value, need, result, index + 2)
    return index + 1


# Parsers that read `-X=VALUE` as `-X VALUE` (clap, pflag, argparse); GNU getopt keeps the `=`.
_SHORT_EQUALS = frozenset({"clap", "pflag", "argparse"})
# A number argparse takes as a value even though it starts with `-` (its `_negative_number_matcher`,
# while the parser has no option that looks like one).
_NEGATIVE_NUMBER = re.compile(r"-\d+$|-\d*\.\d+$")


def _separate_value(wrapper: Wrapper, words: list[str], index: int, name: str) -> str:
    """The word after an option that requires a value, as the wrapper's parser takes it."""
    if index + 1 >= len(words):
        raise WrapperRefusal(wrapper.name, f"`{name}` of `{wrapper.name}` needs a value")
    value = words[index + 1]
    looks_like_option = value.startswith("-") and value != "-"
    if looks_like_option and (
        wrapper.parser == "clap"
        or (wrapper.parser == "argparse" and not _NEGATIVE_NUMBER.match(value))
    ):
        # clap and argparse read such a word as the next option, and stop with an error.
        raise WrapperRefusal(
            wrapper.name, f"`{name}` of `{wrapper.name}` is followed by the option-like {value!r}"
        )
    return value


def _long_option(wrapper: Wrapper, name: str) -> Option:
    exact = [option for option in wrapper.options if name in option.names]
    if exact:
        return exact[0]
    if wrapper.parser == "argparse":
        # argparse takes a prefix matching one option string; two strings of one option (torchrun's
        # --nproc-per-node and --nproc_per_node for `--nproc`) are ambiguous to Python 3.11 and
        # not to later releases, so such a prefix is refused as ambiguous.
        strings = {n: o for o in wrapper.options for n in o.names if n.startswith(name)}
        if len(strings) == 1 and name.startswith("--"):
            return next(iter(strings.values()))
        if len(strings) > 1:
            raise WrapperRefusal(
                wrapper.name,
                f"`{name}` is ambiguous for `{wrapper.name}` ({', '.join(sorted(strings))})",
            )
    if wrapper.parser == "getopt":
        # GNU getopt_long takes any unambiguous prefix of a long option.
        prefixed = {
            option.names[-1]: option
            for option in wrapper.options
            if any(n.startswith(name) and n.startswith("--") for n in option.names)
        }
        if len(prefixed) == 1:
            return next(iter(prefixed.values()))
        if len(prefixed) > 1:
            raise WrapperRefusal(
                wrapper.name,
                f"`{name}` is ambiguous for `{wrapper.name}` ({', '.join(sorted(prefixed))})",
            )
    raise WrapperRefusal(wrapper.name, f"`{name}` is not an option of `{wrapper.name}`")


def _short_option(wrapper: Wrapper, name: str) -> Option:
    for option in wrapper.options:
        if name in option.names:
            return option
    raise WrapperRefusal(wrapper.name, f"`{name}` is not an option of `{wrapper.name}`")


def _effect(
    wrapper: Wrapper,
    option: Option,
    name: str,
    value: str | None,
    need: Need,
    result: Wrapped,
    following: int,
) -> int | None:
    if value is not None and option.value is not None:
        _check_value(wrapper, option.value, value, f"the value of `{name}`", need, option.choices)
    result.options[option.canonical] = True if option.value is None or value is None else value
    effect = option.effect
    if effect == "exits":
        return None
    if effect == "module":
        result.module = True
    if effect == "refuse":
        raise WrapperRefusal(
            f"{wrapper.name} {name}",
            "changes the command it runs in a way this reader does not model",
        )
    if effect == "clear-env":
        result.clear_env = True
        result.assignments.clear()
        result.unset.clear()
    elif effect == "unset" and value is not None:
        if "=" in value:
            raise WrapperRefusal(f"{wrapper.name} {name}", f"cannot unset {value!r}")
        result.unset.append(value)
    elif effect == "cwd" and value is not None:
        result.folders.append(value)
    elif effect == "working-dir":
        result.folders.append(None)
    elif effect == "env-file" and value is not None:
        result.unseen.append(f"the variables in {value} ({wrapper.name} {name})")
    elif effect == "env-json" and value is not None:
        _runtime_env(wrapper, name, value, result)
    elif effect == "export" and value is not None:
        result.export = value.split(",")
    elif effect == "assign" and value is not None:
        variable, eq, setting = value.partition("=")
        need(variable, f"names a variable `{wrapper.name}` sets,")
        if not eq or not variable:
            raise WrapperRefusal(
                f"{wrapper.name} {name}", f"passes {value!r} from the environment of the script"
            )
        result.assignments.append((variable, setting))
    return following


def _runtime_env(wrapper: Wrapper, name: str, value: str, result: Wrapped) -> None:
    """A Ray runtime environment's ``env_vars`` (strings only, as Ray requires) and folder."""
    parsed = json.loads(value)
    if not isinstance(parsed, dict):
        raise WrapperRefusal(
            f"{wrapper.name} {name}", "the runtime environment is not a JSON object"
        )
    env_vars = parsed.get("env_vars") or {}
    if not isinstance(env_vars, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()
    ):
        raise WrapperRefusal(f"{wrapper.name} {name}", "env_vars must map names to strings")
    result.assignments.extend(sorted(env_vars.items()))
    if "working_dir" in parsed:
        result.folders.append(None)


_DURATION = re.compile(r"([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?[smhd]?")
_SIGNAL = re.compile(r"(SIG)?[A-Z][A-Z0-9+-]*|[0-9]+")
_NUMBER = {
    "int": re.compile(r"[-+]?[0-9]+"),
    "float": re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?"),
}


def _check_value(
    wrapper: Wrapper,
    kind: ValueKind,
    value: str,
    what: str,
    need: Need,
    choices: tuple[str, ...] = (),
) -> None:
    """A value the wrapper parses must be known and what it accepts."""
    if kind == "text":
        return
    need(value, f"is {what} of `{wrapper.name}`, which it parses,")
    valid = True
    if kind == "duration":
        valid = _DURATION.fullmatch(value) is not None
    elif kind == "signal":
        valid = _SIGNAL.fullmatch(value.upper()) is not None
    elif kind in _NUMBER:
        valid = _NUMBER[kind].fullmatch(value.strip()) is not None
    elif kind == "choice":
        valid = value.lower() in choices
    elif kind == "name":
        valid = bool(value)
    elif kind == "json":
        try:
            json.loads(value)
        except ValueError:
            valid = False
    if not valid:
        raise WrapperRefusal(wrapper.name, f"{what} is not a valid {kind}: {value!r}")
