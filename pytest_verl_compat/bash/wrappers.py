"""Wrapped launchers: programs that run the launcher for the script, as data.

``ray job submit [OPTIONS] -- python3 -m verl.trainer.main_ppo ...``, ``uv run``, ``env``,
``nohup``, ``timeout``, ``srun`` (and more, one :class:`Wrapper` each in :data:`WRAPPERS`) hand
the wrapped command the words after their own options, unchanged. A wrapper is never run: its
options are read with its own parser's rules (GNU getopt, click or clap) and checked, an option
it does not have is refused by name, and the effects it has on the wrapped command (working
directory, environment) are applied. An option value the wrapper parses (a duration, a number,
JSON) must be known; free text it only passes on (a cluster address, a folder to upload) may be
a run-time value, which is never run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

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
    "module",  # the command is a Python module (uv run -m)
    "refuse",  # the option changes the command line in a way not modelled
    "exits",  # prints something and runs nothing (--help, --version)
]


@dataclass(frozen=True)
class Option:
    """One option of a wrapper: its spellings, its value and its effect."""

    names: tuple[str, ...]
    value: ValueKind | None = None
    effect: Effect | None = None
    # A value given only as `--name=VALUE` (getopt's optional argument).
    optional_value: bool = False
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Wrapper:
    """A program that runs the command in its arguments."""

    words: tuple[str, ...]  # the program and its subcommand
    options: tuple[Option, ...]
    # How options are read: "getopt" (GNU, long options abbreviable, stops at the first
    # operand), "clap" (the same without abbreviations), "click" (options anywhere among the
    # operands until `--`).
    parser: Literal["getopt", "clap", "click"]
    # Operands the wrapper reads before the command (timeout's DURATION).
    operands: tuple[ValueKind, ...] = ()
    # NAME=VALUE operands before the command set variables (env).
    assignments: bool = False
    # The command runs elsewhere, in an environment the script never sees (a Ray cluster).
    remote_environment: str | None = None
    # Variables the wrapper itself sets for the command, not visible in the script.
    adds_variables: str | None = None
    # Where this behaviour is written in the wrapper's own code or documentation.
    evidence: str = ""

    @property
    def name(self) -> str:
        return " ".join(self.words)


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

_RAY_JOB_SUBMIT = Wrapper(
    ("ray", "job", "submit"),
    _options(
        "--address= --job-id= --submission-id= --runtime-env=:env-file "
        "--runtime-env-json=json:env-json --working-dir=:working-dir --metadata-json=json "
        "--entrypoint-num-cpus=float --entrypoint-num-gpus=float --entrypoint-memory=int "
        "--entrypoint-resources=json --entrypoint-label-selector=json --no-wait --verify= "
        "--headers=json --log-style=choice(auto|record|pretty) "
        "--log-color=choice(auto|false|true) -v/--verbose --help:exits"
    ),
    "click",
    remote_environment="the Ray cluster's environment",
    evidence=(
        "ray 2.60 dashboard/modules/job/cli.py:316 submits shlex.join(entrypoint), which "
        "job_supervisor.py:184 runs with shell=True on the cluster, with the runtime "
        "environment's env_vars (dashboard_sdk.py parse_runtime_env_args)"
    ),
)

_UV_RUN = Wrapper(
    ("uv", "run"),
    _options(
        "--extra= --no-extra= --group= --no-group= --only-group= --with= --with-editable= "
        "--with-requirements= --package= --project= --index= --default-index= "
        "--extra-index-url= --upgrade-package= --reinstall-package= --refresh-package= "
        "--resolution= --prerelease= --fork-strategy= --exclude-newer= --exclude-newer-package= "
        "--index-strategy= --keyring-provider= --config-settings-package= "
        "--no-build-isolation-package= --no-build-package= --no-binary-package= --link-mode= "
        "--cache-dir= --python-preference= --color= --allow-insecure-host= --config-file= "
        "--max-recursion-depth= -p/--python= -i/--index-url= -f/--find-links= -P= "
        "-C/--config-setting= --directory=:cwd --env-file=:env-file -m/--module:module "
        "-s/--script --all-extras --no-dev --dev --only-dev --all-groups --no-default-groups "
        "--no-editable --exact --no-env-file --isolated --active --no-active --no-sync --locked "
        "--frozen --gui-script --no-project --show-resolution --no-index --no-sources "
        "--reinstall --refresh --compile-bytecode --no-build-isolation --no-build --no-binary "
        "--managed-python --no-managed-python --no-python-downloads --native-tls --offline "
        "--no-progress --no-config --preview --no-preview -U/--upgrade -n/--no-cache -q/--quiet "
        "-v/--verbose -h/--help:exits -V/--version:exits"
    ),
    "clap",
    adds_variables="VIRTUAL_ENV, PATH and UV_* as uv run sets them",
    evidence="uv run [OPTIONS] [COMMAND]: the first operand starts the command (docs.astral.sh/uv/reference/cli/#uv-run)",
)

_ENV = Wrapper(
    ("env",),
    _options(
        "-i/--ignore-environment:clear-env -0/--null:refuse -u/--unset=name:unset "
        "-C/--chdir=:cwd -S/--split-string=:refuse --block-signal[=signal] "
        f"--default-signal[=signal] --ignore-signal[=signal] --list-signal-handling -v/--debug {_EXITS}"
    ),
    "getopt",
    assignments=True,
    evidence="coreutils env: [OPTION]... [-] [NAME=VALUE]... [COMMAND [ARG]...]",
)

_NOHUP = Wrapper(
    ("nohup",), _options(_EXITS), "getopt", evidence="coreutils nohup COMMAND [ARG]..."
)

_TIMEOUT = Wrapper(
    ("timeout",),
    _options(
        "--preserve-status --foreground -k/--kill-after=duration -s/--signal=signal -v/--verbose "
        + _EXITS
    ),
    "getopt",
    operands=("duration",),
    evidence="coreutils timeout [OPTION] DURATION COMMAND [ARG]...",
)

_SRUN = Wrapper(
    ("srun",),
    _options(
        "-A/--account= --acctg-freq= --bb= --bbf= --bcast-exclude= -b/--begin= "
        "-c/--cpus-per-task= --comment= --container= --container-id= --cpu-freq= "
        "-d/--dependency= --deadline= -e/--error= --epilog= --gres= --gres-flags= -i/--input= "
        "-J/--job-name= -L/--licenses= -M/--clusters= -m/--distribution= --mail-type= "
        "--mail-user= --mcs-label= --mpi= -n/--ntasks= --ntasks-per-node= -N/--nodes= "
        "--network= -o/--output= -p/--partition= --power= --priority= --prolog= -q/--qos= "
        "-r/--relative= --reservation= --signal= --slurmd-debug= --switches= -S/--core-spec= "
        "--thread-spec= -T/--threads= -t/--time= --task-epilog= --task-prolog= --time-min= "
        "--tres-bind= --tres-per-task= -W/--wait= --wckey= --het-group= --cluster-constraint= "
        "-C/--constraint= --mem= --mincpus= --tmp= -w/--nodelist= -x/--exclude= --mem-per-cpu= "
        "-B/--extra-node-info= --sockets-per-node= --cores-per-socket= --threads-per-core= "
        "--ntasks-per-core= --ntasks-per-socket= --ntasks-per-gpu= --hint= --cpu-bind= "
        "--mem-bind= --cpus-per-gpu= -G/--gpus= --gpu-bind= --gpu-freq= --gpus-per-node= "
        "--gpus-per-socket= --gpus-per-task= --mem-per-gpu= --container-image= "
        "--container-mounts= --container-name= --container-save= --container-env= "
        "-D/--chdir=:cwd --container-workdir=:cwd --export=:export --bcast[=] --compress[=] "
        "--exclusive[=] --nice[=] --propagate[=] --resv-ports[=] --send-libs[=] "
        "-I/--immediate[=] -K/--kill-on-bad-exit[=] -E/--preserve-env -H/--hold -k/--no-kill "
        "-l/--label --multi-prog -O/--overcommit --overlap --pty -Q/--quiet --quit-on-interrupt "
        "--spread-job --test-only -u/--unbuffered --use-min-nodes -v/--verbose "
        "-X/--disable-status -Z/--no-allocate --contiguous --reboot --exact -s/--oversubscribe "
        "--external-launcher --container-mount-home --no-container-mount-home "
        "--container-remap-root --no-container-remap-root --container-entrypoint "
        "--no-container-entrypoint --container-writable --container-readonly -h/--help:exits "
        "--usage:exits -V/--version:exits"
    ),
    "getopt",
    adds_variables="the SLURM_* variables srun sets for each task",
    evidence="srun [OPTIONS] executable [ARGS]: options end at the executable (slurm.schedmd.com/srun.html)",
)

_DOCKER_EXEC = Wrapper(
    ("docker", "exec"),
    _options(
        "-d/--detach --detach-keys= -e/--env=:assign --env-file=:env-file -i/--interactive "
        "--privileged -t/--tty -u/--user= -w/--workdir=:cwd --help:exits"
    ),
    "clap",
    operands=("text",),
    remote_environment="the container's environment",
    evidence=(
        "docker exec [OPTIONS] CONTAINER COMMAND [ARG...]: the command runs in the container "
        "with its environment and -e/--env variables (docs.docker.com/reference/cli/docker/"
        "container/exec)"
    ),
)

_CONDA_RUN = Wrapper(
    ("conda", "run"),
    _options(
        "-n/--name= -p/--prefix= --cwd=:cwd --no-capture-output --live-stream -v/--verbose "
        "--debug-wrapper-scripts --dev -h/--help:exits"
    ),
    "getopt",
    adds_variables="the variables activating the conda environment sets",
    evidence="conda run [-n ENV | -p PREFIX] [OPTIONS] COMMAND...: argparse, options first",
)

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
_PLAIN = tuple(
    Wrapper((program,), _options(spec), "getopt", operands=operands, evidence=usage)
    for program, spec, operands, usage in _PLAIN_SPECS
)

WRAPPERS: tuple[Wrapper, ...] = (
    _RAY_JOB_SUBMIT,
    _UV_RUN,
    _ENV,
    _NOHUP,
    _TIMEOUT,
    _SRUN,
    _DOCKER_EXEC,
    _CONDA_RUN,
    *_PLAIN,
)
# The programs a wrapper starts with: a script function of one of these names is refused.
WRAPPER_PROGRAMS = frozenset(wrapper.words[0] for wrapper in WRAPPERS)


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
    # The command is a Python module to run (uv run -m).
    module: bool = False


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
    result.command = ["python", "-m", *operands] if result.module else operands
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
        if index + 1 >= len(words):
            raise WrapperRefusal(wrapper.name, f"`{name}` of `{wrapper.name}` needs a value")
        return _effect(wrapper, option, name, words[index + 1], need, result, index + 2)
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
            return _effect(wrapper, option, name, word[position:], need, result, index + 1)
        if option.optional_value:
            return _effect(wrapper, option, name, None, need, result, index + 1)
        if index + 1 >= len(words):
            raise WrapperRefusal(wrapper.name, f"`{name}` of `{wrapper.name}` needs a value")
        return _effect(wrapper, option, name, words[index + 1], need, result, index + 2)
    return index + 1


def _long_option(wrapper: Wrapper, name: str) -> Option:
    exact = [option for option in wrapper.options if name in option.names]
    if exact:
        return exact[0]
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
