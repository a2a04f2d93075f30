"""Differential oracle for the launch reader: what real bash hands to the launcher.

A script is copied into a scratch directory with two edits, both located through the positions
in shfmt's syntax tree (never by pattern-matching the text):

* every outermost ``$(...)`` / backtick substitution becomes ``$(printf %s 'OUTPUT')`` with its
  bound output, so nothing the script names is executed (an unbound one becomes a marker);
* the words ``python3 -m MODULE`` of every launcher (main_ppo, or another entry point) become a bash one-liner that
  writes its arguments and its environment, NUL-separated, into the scratch directory.

bash then runs the copy as ``env -i HOME=... bash copy.sh ARGS...``.  This module is test code:
it runs bash on purpose, the reader under test never does.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BASH = shutil.which("bash")
ENV = shutil.which("env")
UNBOUND_MARKER = "<<unbound substitution>>"

LAUNCHER_WORDS = (("python3", "python"), ("-m",))


def _launched(module: str | None) -> bool:
    """A module the reader takes as the launch: main_ppo, or any module ``ReleaseModules``
    accepts where verl is installed (another entry point, or one the release lacks)."""
    if module == "verl.trainer.main_ppo":
        return True
    if module is None or not module.startswith("verl."):
        return False
    from corpus_facts import PINNED_VERSION

    from pytest_verl_compat.pipeline.entry_registry import ReleaseModules
    from pytest_verl_compat.releases.wheels import release_tree

    accepts = ReleaseModules.from_site(release_tree(PINNED_VERSION).root).accepts
    return accepts is not None and accepts(module)


# Variables bash (and the printer's own bash) add to every child environment.
BASH_OWN_EXPORTS = frozenset({"PWD", "OLDPWD", "SHLVL", "_"})


def shfmt_binary() -> str:
    """shfmt beside this interpreter, else on PATH."""
    local = Path(sys.executable).parent / "shfmt"
    if local.is_file():
        return str(local)
    found = shutil.which("shfmt")
    if found is None:
        raise RuntimeError("shfmt is not installed")
    return found


def syntax_tree(data: bytes) -> dict[str, Any]:
    """shfmt's typed JSON syntax tree of a bash script."""
    proc = subprocess.run(
        [shfmt_binary(), "--language-dialect=bash", "--to-json"],
        input=data,
        capture_output=True,
        check=True,
        timeout=30,
    )
    return json.loads(proc.stdout)


def _walk(node: Any, visit: Callable[[dict[str, Any]], bool]) -> None:
    """Depth-first walk; ``visit`` returns False to skip a node's children."""
    if isinstance(node, list):
        for item in node:
            _walk(item, visit)
    elif isinstance(node, dict):
        if visit(node) is False:
            return
        for value in node.values():
            if isinstance(value, (dict, list)):
                _walk(value, visit)


def _literal(word: dict[str, Any]) -> str | None:
    """The text of a word made of one unquoted literal, else None."""
    parts = word.get("Parts") or []
    if len(parts) == 1 and parts[0].get("Type") == "Lit":
        return parts[0].get("Value")
    return None


@dataclass(frozen=True)
class Instrumented:
    """The instrumented copy and what was found while making it."""

    text: bytes
    launcher_lines: tuple[int, ...]


PRINTER = ': > argv.bin; [ "$#" -eq 0 ] || printf "%s\\0" "$@" > argv.bin; exec {env} -0 > env.bin'


def instrument(
    data: bytes, substitutions: Mapping[str, str], *, stubbed: bool = False
) -> Instrumented:
    """Replace substitutions by their bound outputs and launchers by an argv printer.

    ``stubbed``: leave launchers and unbound substitutions as they are (the stubs on PATH
    print the launcher's argv; the substitutions run for real, so only scripts of our own).
    """
    tree = syntax_tree(data)
    edits: list[tuple[int, int, bytes]] = []
    lines: list[int] = []
    printer = f"{BASH} -c {shlex.quote(PRINTER.format(env=ENV))} launcher"

    def visit(node: dict[str, Any]) -> bool:
        kind = node.get("Type")
        if kind == "CmdSubst":
            start = node["Left"]["Offset"] + (1 if node.get("Backquotes") else 2)
            key = data[start : node["Right"]["Offset"]].decode()
            if stubbed and key not in substitutions:
                return True
            output = substitutions.get(key, UNBOUND_MARKER)
            stub = f"$(printf %s {shlex.quote(output)})".encode()
            edits.append((node["Pos"]["Offset"], node["End"]["Offset"], stub))
            return False
        if kind == "CallExpr" and not stubbed:
            args = node.get("Args") or []
            words = [_literal(w) for w in args[:3]]
            pairs = zip(words[:2], LAUNCHER_WORDS, strict=False)
            if (
                len(words) == 3
                and all(word in allowed for word, allowed in pairs)
                and _launched(words[2])
            ):
                edits.append((args[0]["Pos"]["Offset"], args[2]["End"]["Offset"], printer.encode()))
                lines.append(node["Pos"]["Line"])
        return True

    _walk(tree, visit)
    out = data
    for start, end, replacement in sorted(edits, reverse=True):
        out = out[:start] + replacement + out[end:]
    return Instrumented(out, tuple(lines))


@dataclass(frozen=True)
class BashRun:
    """What bash did with the instrumented copy."""

    returncode: int
    argv: tuple[str, ...] | None
    exported: dict[str, str] | None
    stderr: str
    launcher_lines: tuple[int, ...]


def run_bash(
    data: bytes,
    workdir: Path,
    env: Mapping[str, str],
    substitutions: Mapping[str, str],
    args: Sequence[str] = (),
) -> BashRun:
    """Run the instrumented copy of ``data`` under ``env -i`` in ``workdir``."""
    if BASH is None or ENV is None:
        raise RuntimeError("bash and env are needed for the oracle")
    made = instrument(data, substitutions)
    (workdir / "copy.sh").write_bytes(made.text)
    for stale in ("argv.bin", "env.bin"):
        (workdir / stale).unlink(missing_ok=True)
    proc = subprocess.run(
        [ENV, "-i", *(f"{k}={v}" for k, v in env.items()), BASH, "copy.sh", *args],
        cwd=workdir,
        capture_output=True,
        timeout=30,
        check=False,
    )
    argv = exported = None
    if (workdir / "argv.bin").exists():
        raw = (workdir / "argv.bin").read_bytes().decode()
        argv = tuple(raw.split("\0")[:-1])
        exported = {}
        for entry in (workdir / "env.bin").read_bytes().decode().split("\0")[:-1]:
            name, _, value = entry.partition("=")
            if name not in BASH_OWN_EXPORTS:
                exported[name] = value
    return BashRun(
        proc.returncode, argv, exported, proc.stderr.decode(errors="replace"), made.launcher_lines
    )


# --------------------------------------------------------------------------- stubbed wrappers

# Executables put first on PATH for the stubbed oracle. `python3` records what the launcher
# receives (argv after the module, environment, folder) and does nothing else; `ray`, `uv`,
# `srun`, `docker exec`, `conda run`, `taskset` and `numactl` run their command as the real ones
# do on a one-node machine (ray: the entrypoint words joined by shlex.join under /bin/sh, in
# the runtime env's variables only; docker: in the container's environment, here empty but
# PATH). `env`, `nohup`, `timeout` and GNU `time` are their own.
_LAUNCHER_STUB = """
import os, sys
args = sys.argv[1:]
for k, word in enumerate(args):
    if word == "verl.trainer.main_ppo" and k and args[k - 1].startswith("-") and args[k - 1].endswith("m"):
        out = {out!r}
        with open(os.path.join(out, "argv.bin"), "wb") as f:
            f.write(b"".join(os.fsencode(a) + b"\\0" for a in args[k + 1 :]))
        with open(os.path.join(out, "env.bin"), "wb") as f, open("/proc/self/environ", "rb") as env:
            # The environment as exec gave it: Python adds LC_CTYPE to os.environ at start.
            f.write(env.read())
        with open(os.path.join(out, "cwd.txt"), "w") as f:
            f.write(os.getcwd())
        break
"""

_RAY_STUB = """
import json, os, shlex, sys
args = sys.argv[1:]
if args[:2] != ["job", "submit"]:
    sys.exit(0)  # ray start, stop, status: a cluster that is there
rest = args[2:]
split = rest.index("--")
options, entrypoint = rest[:split], rest[split + 1 :]
env = {{"PATH": os.environ.get("PATH", "")}}
folder = None
k = 0
while k < len(options):
    name, eq, value = options[k].partition("=")
    if name in ("--runtime-env-json", "--working-dir") and not eq:
        k += 1
        value = options[k]
    if name == "--runtime-env-json":
        parsed = json.loads(value)
        env.update(parsed.get("env_vars", {{}}))
        folder = parsed.get("working_dir", folder)
    if name == "--working-dir":
        folder = value
    k += 1
if folder:
    os.chdir(folder)
os.execve("/bin/sh", ["/bin/sh", "-c", shlex.join(entrypoint)], env)
"""

_RUN_STUB = """
import os, sys
# The environment exec gave this stub: Python adds LC_CTYPE to os.environ when it starts.
with open("/proc/self/environ", "rb") as given:
    original = dict(
        entry.split(b"=", 1) for entry in given.read().split(b"\\0") if b"=" in entry
    )
os.environ.clear()
os.environ.update({{os.fsdecode(k): os.fsdecode(v) for k, v in original.items()}})
VALUED = {valued!r}
args = sys.argv[1:]
if {subcommand!r}:
    assert args[0] == {subcommand!r}, args
    args = args[1:]
if {container!r}:
    # A container's environment: the script's variables do not reach it.
    for variable in list(os.environ):
        if variable != "PATH":
            del os.environ[variable]
module = False
k = 0
while k < len(args):
    word = args[k]
    if word == "--":
        k += 1
        break
    if not word.startswith("-") or word == "-":
        break
    name, eq, value = word.partition("=")
    if name in ("-m", "--module"):
        module = True
    elif name in VALUED and not eq:
        k += 1
        value = args[k]
    elif len(name) == 2 and name in VALUED:
        pass
    elif len(name) > 2 and not name.startswith("--") and name[:2] in VALUED:
        name, value = name[:2], name[2:]
    if name in ("-D", "--chdir", "--directory", "-w", "--workdir", "--cwd"):
        os.chdir(value)
    if name in ("-e", "--env"):
        variable, _, setting = value.partition("=")
        os.environ[variable] = setting
    if name == "--export":
        keep = value.split(",")
        if "ALL" not in keep:
            names = [item for item in keep if "=" not in item]
            for variable in list(os.environ):
                if variable not in names and variable != "PATH":
                    del os.environ[variable]
        for item in keep:
            if "=" in item:
                variable, _, setting = item.partition("=")
                os.environ[variable] = setting
    k += 1
command = args[k + {operands}:]
if module:
    command = ["python", "-m", *command]
os.execvp(command[0], command)
"""

_UV_VALUED = (
    "--directory --project --with --with-editable --with-requirements --python -p --env-file "
    "--extra --group --package --index --index-url --extra-index-url -f --find-links"
).split()
_DOCKER_VALUED = "-e --env --env-file -u --user -w --workdir --detach-keys".split()
_CONDA_VALUED = "-n --name -p --prefix --cwd".split()
_SRUN_VALUED = (
    "-N --nodes -n --ntasks --ntasks-per-node -c --cpus-per-task --gres --gpus-per-node -G "
    "--gpus -p --partition -A --account -t --time -J --job-name --mem -w --nodelist -D "
    "--chdir --export -o --output -e --error --mpi --cpu-bind --container-image "
    "--container-mounts"
).split()


@dataclass(frozen=True)
class StubbedRun:
    """What the launcher stub saw when bash ran the script with the wrappers stubbed."""

    returncode: int
    argv: tuple[str, ...] | None
    exported: dict[str, str] | None
    cwd: str | None
    stderr: str
    path: str  # the PATH the script ran with (bind it for the reader too)


def stub_folder(root: Path) -> tuple[Path, Path]:
    """The stub executables (made once per root) and the folder the launcher stub writes to."""
    stubs, out = root / "stubs", root / "launcher-out"
    if not stubs.is_dir():
        stubs.mkdir(parents=True)
        out.mkdir(parents=True)
        programs = {
            "python3": _LAUNCHER_STUB.format(out=str(out)),
            "ray": _RAY_STUB.format(),
            "uv": _RUN_STUB.format(
                valued=_UV_VALUED, subcommand="run", container=False, operands=0
            ),
            "srun": _RUN_STUB.format(
                valued=_SRUN_VALUED, subcommand="", container=False, operands=0
            ),
            "docker": _RUN_STUB.format(
                valued=_DOCKER_VALUED, subcommand="exec", container=True, operands=1
            ),
            "conda": _RUN_STUB.format(
                valued=_CONDA_VALUED, subcommand="run", container=False, operands=0
            ),
            "taskset": _RUN_STUB.format(valued=[], subcommand="", container=False, operands=1),
            "numactl": _RUN_STUB.format(valued=[], subcommand="", container=False, operands=0),
        }
        for name, body in programs.items():
            path = stubs / name
            path.write_text(f"#!{sys.executable}\n{body}")
            path.chmod(0o755)
        for alias in ("python", "python3.11"):
            (stubs / alias).symlink_to(stubs / "python3")
    return stubs, out


def run_bash_stubbed(
    data: bytes,
    script: Path,
    workdir: Path,
    env: Mapping[str, str],
    substitutions: Mapping[str, str] = {},
    args: Sequence[str] = (),
) -> StubbedRun:
    """Run ``data`` as ``bash /absolute/script`` from ``workdir``, wrappers and Python stubbed.

    Bound substitutions are replaced by their outputs; the others run (our scripts only).
    """
    if BASH is None or ENV is None:
        raise RuntimeError("bash and env are needed for the oracle")
    stubs, out = stub_folder(script.parent.parent)
    for stale in out.iterdir():
        stale.unlink()
    # The script's own background jobs (`nohup ... &`) finish before bash exits. Its output
    # is closed first: a logger fed by `exec > >(tee log)` ends only when it reads the end.
    tail = b"\nexec >/dev/null 2>&1\nwait\n"
    script.write_bytes(instrument(data, substitutions, stubbed=True).text + tail)
    path = f"{stubs}:/usr/bin:/bin"
    proc = subprocess.run(
        [
            ENV,
            "-i",
            *(f"{k}={v}" for k, v in {**env, "PATH": path}.items()),
            BASH,
            str(script),
            *args,
        ],
        cwd=workdir,
        capture_output=True,
        timeout=60,
        check=False,
    )
    argv = exported = cwd = None
    if (out / "argv.bin").exists():
        argv = tuple(os.fsdecode(a) for a in (out / "argv.bin").read_bytes().split(b"\0")[:-1])
        exported = {}
        for entry in (out / "env.bin").read_bytes().decode().split("\0")[:-1]:
            name, _, value = entry.partition("=")
            if name not in BASH_OWN_EXPORTS:
                exported[name] = value
        cwd = (out / "cwd.txt").read_text()
    return StubbedRun(
        proc.returncode, argv, exported, cwd, proc.stderr.decode(errors="replace"), path
    )


# --------------------------------------------------------------------------- sandboxed runs

# A sandboxed run executes the script as it is written, with nothing real but bash, its
# builtins and the pure programs the reader models: PATH holds only those (and recorders for
# the launchers and stubs for the wrappers), and bash's command_not_found_handle makes every
# other command succeed silently, which is what the reader assumes of a command it skips.
# Substitutions bound in the bindings print their bound output; the others run in the sandbox.
SANDBOX_PROGRAMS = (
    "dirname basename realpath readlink seq cat tr cut head tail wc sort uniq awk sed tee mkdir "
    "env nohup timeout nice stdbuf setsid"
).split()
NOT_FOUND_HANDLER = ("BASH_FUNC_command_not_found_handle%%", "() {  return 0\n}")
# `ulimit` raising a limit this container does not allow fails here, where it would succeed on
# the machines launch scripts are written for; the reader takes it as succeeding.
ULIMIT = ("BASH_FUNC_ulimit%%", '() {  builtin ulimit "$@" 2> /dev/null || true\n}')
SANDBOX_OWN_EXPORTS = BASH_OWN_EXPORTS | {NOT_FOUND_HANDLER[0]}

# The Python recorder: reads its words with CPython's own option grammar (`python3 --help`),
# records a launch of a module or a script file, and hands `-m torch.distributed.run` to the
# torchrun recorder. `-c`, `-` and no program at all are not launches.
_PYTHON_RECORDER = """
import json, os, sys
sys.path.insert(0, {folder!r})
import launch_record
args = sys.argv[1:]
k = 0
target = None
while k < len(args):
    word = args[k]
    if word == "--":
        k += 1
        break
    if word == "--check-hash-based-pycs":
        k += 2
        continue
    if not word.startswith("-") or word == "-":
        break
    if word.startswith("--"):
        sys.exit(0)  # --help, --version: prints and exits
    position = 1
    while position < len(word):
        letter = word[position]
        position += 1
        if letter in "cmWX":
            value = word[position:] or (args[k + 1] if k + 1 < len(args) else "")
            if not word[position:]:
                k += 1
            if letter == "c":
                sys.exit(0)
            if letter == "m":
                target = ("module", value)
            break
        if letter in "h?V":
            sys.exit(0)
    k += 1
    if target:
        break
if target is None:
    if k >= len(args) or args[k] == "-":
        sys.exit(0)
    target = ("script", args[k])
# After `-m MODULE` k is already past the module; a script file is the word at k.
rest = args[k:] if target[0] == "module" else args[k + 1 :]
if target == ("module", "torch.distributed.run"):
    launch_record.torchrun(rest)
else:
    launch_record.record("python", target, rest)
"""

_TORCHRUN_RECORDER = """
import sys
sys.path.insert(0, {folder!r})
import launch_record
launch_record.torchrun(sys.argv[1:])
"""

# Shared by the recorders: where launches are written, and torchrun read by torch itself.
_LAUNCH_RECORD = """
import json, os

LOG = {log!r}


def record(launcher, target, args, torchrun=None):
    with open("/proc/self/environ", "rb") as given:
        env = dict(
            entry.decode().split("=", 1) for entry in given.read().split(b"\\0") if b"=" in entry
        )
    entry = {{
        "launcher": launcher,
        "kind": target[0],
        "target": target[1],
        "args": args,
        "env": env,
        "cwd": os.getcwd(),
        "torchrun": torchrun,
    }}
    with open(LOG, "a") as out:
        out.write(json.dumps(entry) + "\\n")


def torchrun(words):
    # The words as torchrun got them, with its environment: torch's own parser reads them in the
    # test process (parse_torchrun), where torch is imported once, not once per launch (~2 s).
    record("torchrun", (None, None), list(words))
"""


def parse_torchrun(words: list[str], env: dict[str, str]) -> dict[str, Any] | None:
    """What torchrun reads from the words it got, by torch's own parser with the environment the
    launch had (its PET_* defaults are read when the parser is built): the target, the training
    script's words, and the options with the world size they make (None when elastic or
    ``gpu``)."""
    import contextlib
    import io
    from unittest import mock

    from torch.distributed.run import get_args_parser, parse_min_max_nnodes

    # argparse prints a usage error to stderr, where the stub's bash run would have printed it.
    with mock.patch.dict(os.environ, env, clear=True), contextlib.redirect_stderr(io.StringIO()):
        try:
            parsed = get_args_parser().parse_args(words)
        except SystemExit:  # a usage error (argparse prints it and exits 2)
            return None
    options = {
        key: value
        for key, value in vars(parsed).items()
        if key not in ("training_script", "training_script_args")
    }
    try:
        low, high = parse_min_max_nnodes(parsed.nnodes)
        nodes = low if low == high else None
        world = int(parsed.nproc_per_node) * nodes if nodes is not None else None
    except ValueError:
        world = None
    options["world_size"] = world
    return {
        "kind": "module" if parsed.module else "script",
        "target": parsed.training_script,
        "args": list(parsed.training_script_args),
        "torchrun": options,
    }


@dataclass(frozen=True)
class Launch:
    """One launch a recorder saw: who ran what, with which words, environment and folder."""

    launcher: str
    kind: str  # "module" or "script"
    target: str
    args: tuple[str, ...]
    exported: dict[str, str]
    cwd: str
    torchrun: dict[str, Any] | None


@dataclass(frozen=True)
class SandboxRun:
    """What bash did with the script in the sandbox: its status and every launch, in order."""

    returncode: int
    launches: tuple[Launch, ...]
    stderr: str
    path: str  # the PATH the script ran with (bind it for the reader too)

    def last(self, accepted: Callable[[Launch], bool]) -> Launch | None:
        """The last launch ``accepted`` takes, as the reader keeps the last one."""
        return next((launch for launch in reversed(self.launches) if accepted(launch)), None)


def sandbox(root: Path) -> tuple[Path, Path]:
    """The sandbox's program folder (made once per root) and its launch log."""
    programs, log = root / "sandbox-bin", root / "launches.jsonl"
    if programs.is_dir():
        return programs, log
    programs.mkdir(parents=True)
    for name in SANDBOX_PROGRAMS:
        real = shutil.which(name, path="/usr/bin:/bin")
        if real is not None:
            (programs / name).symlink_to(real)
    (programs / "launch_record.py").write_text(_LAUNCH_RECORD.format(log=str(log)))
    recorders = {
        "python3": _PYTHON_RECORDER.format(folder=str(programs)),
        "torchrun": _TORCHRUN_RECORDER.format(folder=str(programs)),
        "ray": _RAY_STUB.format(),
        "uv": _RUN_STUB.format(valued=_UV_VALUED, subcommand="run", container=False, operands=0),
        "srun": _RUN_STUB.format(valued=_SRUN_VALUED, subcommand="", container=False, operands=0),
        "docker": _RUN_STUB.format(
            valued=_DOCKER_VALUED, subcommand="exec", container=True, operands=1
        ),
        "conda": _RUN_STUB.format(
            valued=_CONDA_VALUED, subcommand="run", container=False, operands=0
        ),
    }
    for name, body in recorders.items():
        path = programs / name
        path.write_text(f"#!{sys.executable}\n{body}")
        path.chmod(0o755)
    for alias in ("python", "python3.11", "python3.10", "python3.12"):
        (programs / alias).symlink_to(programs / "python3")
    return programs, log


def run_bash_sandboxed(
    data: bytes,
    script: Path,
    workdir: Path,
    env: Mapping[str, str],
    substitutions: Mapping[str, str] = {},
    args: Sequence[str] = (),
    programs: Mapping[str, str] = {},
) -> SandboxRun:
    """Run ``data`` as ``bash /absolute/script`` from ``workdir`` in the sandbox; ``programs``
    adds programs to it (name -> a /bin/sh body), such as a `date` printing a bound output.

    The script is written to ``script`` (instrumented only where a substitution is bound); the
    reader reads the same path, so ``$0`` and the script's folder are the same for both.
    """
    if BASH is None or ENV is None:
        raise RuntimeError("bash and env are needed for the oracle")
    folder, log = sandbox(script.parent.parent)
    for name, body in programs.items():
        (folder / name).unlink(missing_ok=True)
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    log.unlink(missing_ok=True)
    if substitutions:
        data = instrument(data, substitutions, stubbed=True).text
    # The script's own background jobs (`nohup ... &`) finish before bash exits. Two newlines:
    # a backslash ending the script still continues into an empty line, as at its end.
    script.write_bytes(data + b"\n\nexec >/dev/null 2>&1\nwait\n")
    variables = {
        **env,
        "PATH": str(folder),
        NOT_FOUND_HANDLER[0]: NOT_FOUND_HANDLER[1],
        ULIMIT[0]: ULIMIT[1],
    }
    proc = subprocess.run(
        [ENV, "-i", *(f"{k}={v}" for k, v in variables.items()), BASH, str(script), *args],
        cwd=workdir,
        capture_output=True,
        timeout=120,
        check=False,
    )
    launches = []
    if log.exists():
        for line in log.read_text().splitlines():
            entry = json.loads(line)
            if entry["launcher"] == "torchrun":
                read = parse_torchrun(entry["args"], entry["env"])
                if read is None:
                    continue  # torchrun refuses its words and starts nothing
                entry.update(read)
            exported = {
                k: v
                for k, v in entry["env"].items()
                if k not in SANDBOX_OWN_EXPORTS and not k.startswith("BASH_FUNC_")
            }
            launches.append(
                Launch(
                    entry["launcher"],
                    entry["kind"],
                    entry["target"],
                    tuple(entry["args"]),
                    exported,
                    entry["cwd"],
                    entry["torchrun"],
                )
            )
    return SandboxRun(
        proc.returncode, tuple(launches), proc.stderr.decode(errors="replace"), str(folder)
    )
