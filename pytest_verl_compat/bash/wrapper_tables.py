"""Wrapper option tables, built from each wrapper's own documented option list (data).

``data/wrappers/<tool>.txt`` holds, for one wrapper, the option list its own documentation gives
(its ``--help``, or its option table), one option per line in the tool's own notation, and an
overlay of what this reader needs beyond the list: the value kinds it must parse, the effects on
the wrapped command, and options the tool accepts without listing them (each with its evidence
in a comment). A wrapper's table is the list read with these rules, then the overlay applied:

* a line is one option: its spellings separated by ``, `` (``-p, --python <PYTHON>``);
* a spelling followed by ``[=X]`` or ``[<X>]`` takes a value only attached (getopt's optional
  argument); ``[a|b]`` or ``{a,b}`` lists the values it accepts; any other text after the
  spelling (``=X``, `` <X>``, `` TEXT``, `` string``) is a value it requires; ``...`` or nothing
  is a flag;
* click's ``INTEGER``/``FLOAT`` and pflag's ``int`` are numbers the tool parses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Literal, cast

# What an option's value is. "text" is passed on unread and may be a run-time value; every
# other kind is parsed by the wrapper, so this reader checks it and needs it known.
ValueKind = Literal["text", "name", "int", "float", "duration", "signal", "json", "choice", "bool"]
# What an option does to the wrapped command.
Effect = Literal[
    "cwd",  # runs it in this folder
    "clear-env",  # starts it with an empty environment
    "unset",  # removes one variable
    "env-json",  # a Ray runtime environment: its env_vars (and working_dir)
    "env-file",  # variables from a file the reader never opens
    "working-dir",  # runs it in an uploaded copy of this folder
    "export",  # srun --export: which variables it gets
    "assign",  # NAME=VALUE: one variable it sets
    "module",  # the command is a Python module (uv run -m, torchrun -m)
    "refuse",  # the option changes the command line in a way not modelled
    "exits",  # prints something and runs nothing (--help, --version)
]
Parser = Literal["getopt", "clap", "click", "pflag", "argparse"]
_VALUE_KINDS = frozenset(ValueKind.__args__)  # type: ignore[attr-defined]
_EFFECTS = frozenset(Effect.__args__)  # type: ignore[attr-defined]
_PARSERS = frozenset(Parser.__args__)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Option:
    """One option of a wrapper: its spellings, its value and its effect."""

    names: tuple[str, ...]
    value: ValueKind | None = None
    effect: Effect | None = None
    # A value given only attached (`--name=VALUE`, `-nVALUE`: getopt's optional argument).
    optional_value: bool = False
    choices: tuple[str, ...] = ()

    @property
    def canonical(self) -> str:
        """The option's name without dashes: its first long spelling (argparse's ``dest``)."""
        longs = [name for name in self.names if name.startswith("--")]
        return (longs or list(self.names))[0].lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class Wrapper:
    """A program that runs the command in its arguments."""

    words: tuple[str, ...]  # the program and its subcommand
    options: tuple[Option, ...]
    # How options are read: "getopt" (GNU, long options abbreviable, stops at the first
    # operand), "argparse" (the same, with Python's rules for abbreviations and values), "clap"
    # and "pflag" (no abbreviations), "click" (options anywhere among the operands until `--`).
    parser: Parser
    # Operands the wrapper reads before the command (timeout's DURATION).
    operands: tuple[ValueKind, ...] = ()
    # NAME=VALUE operands before the command set variables (env).
    assignments: bool = False
    # The command runs elsewhere, in an environment the script never sees (a Ray cluster).
    remote_environment: str | None = None
    # Variables the wrapper itself sets for the command, not visible in the script.
    adds_variables: str | None = None
    # Variables of the script's environment the wrapper changes in a way only known where it
    # runs (stdbuf prepends its own library to LD_PRELOAD).
    changes_variables: tuple[str, ...] = ()
    # The wrapper runs its operands under its own Python (torchrun): `python SCRIPT ARGS`, or
    # `python -m MODULE ARGS` with a "module" option; this variable names another interpreter.
    runs_python: bool = False
    interpreter_variable: str | None = None
    # The wrapper is also a Python module run as `python -m MODULE` (torch.distributed.run).
    python_module: str | None = None
    # Options also read from the environment: the variable prefix (PET_ + the option's
    # canonical name in capitals), and the options that are not.
    environment_prefix: str | None = None
    environment_ignored: tuple[str, ...] = ()
    # Where this behaviour is written in the wrapper's own code or documentation.
    evidence: str = ""
    # Where the option list comes from: the tool's version and the command or page.
    version: str = ""
    source: str = ""

    @property
    def name(self) -> str:
        return " ".join(self.words)


@dataclass(frozen=True)
class OptionList:
    """A wrapper's stored option list, read as the file states it (before the overlay)."""

    tool: str
    options: tuple[Option, ...]
    wrapper: Wrapper = field(compare=False)


_SPELLING = re.compile(r"(--?[A-Za-z0-9?][\w?-]*)(.*)")
_CHOICES = re.compile(r"\[([^=<\]]*\|[^\]]*)\]|\{([^}]*)\}")
_NUMBER_WORDS = {"INTEGER": "int", "FLOAT": "float", "int": "int", "float": "float"}


def option_line(line: str) -> Option:
    """One line of an option list: its spellings and what value they take."""
    names: list[str] = []
    value: ValueKind | None = None
    optional = False
    choices: tuple[str, ...] = ()
    for part in re.split(r",\s+(?=-)", line.strip()):
        match = _SPELLING.fullmatch(part.strip())
        if match is None:
            raise ValueError(f"not an option spelling: {part!r}")
        names.append(match[1])
        rest = match[2].strip()
        if not rest or rest == "...":
            continue
        listed = _CHOICES.match(rest)
        if listed is not None:
            found = listed[1] or listed[2]
            choices = tuple(re.split(r"[|,]", found))
            value = "choice"
        elif rest.startswith(("[=", "[<")):
            optional, value = True, value or "text"
        else:
            value = cast(ValueKind, _NUMBER_WORDS.get(rest.lstrip("= <").split(">")[0], "text"))
    return Option(tuple(names), value, optional_value=optional, choices=choices)


def _overlay(options: list[Option], line: str, tool: str) -> None:
    """Apply one overlay line: ``SPELLING[/SPELLING] [hidden[=value|=optional]] [value=KIND]
    [effect=EFFECT]``."""
    spellings, *settings = line.split()
    names = tuple(spellings.split("/"))
    given = dict(setting.partition("=")[::2] for setting in settings)
    unknown = set(given) - {"hidden", "value", "effect"}
    if unknown:
        raise ValueError(f"{tool}: unknown overlay setting {sorted(unknown)} in {line!r}")
    if "hidden" in given:
        takes = given["hidden"]
        hidden = Option(
            names,
            "text" if takes in ("value", "optional") else None,
            optional_value=takes == "optional",
        )
        options.append(hidden)
    index = next((i for i, o in enumerate(options) if set(names) & set(o.names)), None)
    if index is None:
        raise ValueError(f"{tool}: the overlay names {spellings}, which the list does not have")
    option = options[index]
    kind = given.get("value")
    if kind is not None:
        kind, _, listed = kind.partition("(")
        if kind not in _VALUE_KINDS:
            raise ValueError(f"{tool}: unknown value kind {kind!r}")
        choices = tuple(listed.rstrip(")").split("|")) if listed else option.choices
        option = replace(option, value=cast(ValueKind, kind), choices=choices)
    effect = given.get("effect")
    if effect is not None:
        if effect not in _EFFECTS:
            raise ValueError(f"{tool}: unknown effect {effect!r}")
        option = replace(option, effect=cast(Effect, effect))
    options[index] = option


def parse_table(text: str) -> OptionList:
    """A wrapper table file: its header, its option list and its overlay."""
    header: dict[str, str] = {}
    listed: list[Option] = []
    overlay: list[str] = []
    section = "header"
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line in ("[options]", "[overlay]"):
            section = line.strip("[]")
        elif section == "header":
            key, _, value = line.partition(":")
            header[key.strip()] = value.strip()
        elif section == "options":
            listed.append(option_line(line))
        else:
            overlay.append(line)
    tool = header["tool"]
    options = list(listed)
    for line in overlay:
        _overlay(options, line, tool)
    parser = header["parser"]
    if parser not in _PARSERS:
        raise ValueError(f"{tool}: unknown parser {parser!r}")
    operands = tuple(header["operands"].split()) if header.get("operands") else ()
    wrapper = Wrapper(
        tuple(tool.split()),
        tuple(options),
        cast(Parser, parser),
        operands=cast(tuple[ValueKind, ...], operands),
        assignments=header.get("assignments") == "yes",
        remote_environment=header.get("remote-environment"),
        adds_variables=header.get("adds-variables"),
        runs_python=header.get("runs") == "python",
        interpreter_variable=header.get("interpreter-variable"),
        python_module=header.get("module"),
        environment_prefix=header.get("environment-prefix"),
        environment_ignored=tuple(header.get("environment-ignored", "").split()),
        evidence=header.get("evidence", ""),
        version=header.get("version", ""),
        source=header.get("source", ""),
    )
    return OptionList(tool, tuple(listed), wrapper)


# The wrappers whose tables are stored as data, by file name.
TABLE_FILES = (
    "ray-job-submit",
    "uv-run",
    "env",
    "nohup",
    "timeout",
    "srun",
    "docker-exec",
    "conda-run",
    "torchrun",
)


def option_list(name: str) -> OptionList:
    """The stored option list and table of one wrapper (``uv-run``, ``torchrun``, ...)."""
    folder = resources.files("pytest_verl_compat").joinpath("data", "wrappers")
    return parse_table(folder.joinpath(f"{name}.txt").read_text(encoding="utf-8"))
