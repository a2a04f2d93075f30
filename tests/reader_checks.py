"""What the reader tests share: a script read by the reader and run by bash must agree.

``same_as_bash`` runs a script with real bash (``bash_oracle.run_bash_stubbed``: Python and the
wrappers stubbed to record what the launcher receives) and reads it with the reader; the argv,
the exported environment and the launcher's folder must be equal.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from bash_oracle import (
    BASH,
    ENV,
    Launch,
    SandboxRun,
    StubbedRun,
    run_bash_sandboxed,
    run_bash_stubbed,
)

from pytest_verl_compat.bash import LaunchRead, LaunchReadError, read_launch
from pytest_verl_compat.bash.entry_points import EntryModules, acceptor, module_of_file
from pytest_verl_compat.model import Bindings

LAUNCH = "python3 -m verl.trainer.main_ppo"
HOME = {"HOME": "/home/verl"}
USER_SCRIPTS = Path(__file__).resolve().parent / "user_scripts"
needs_bash = pytest.mark.skipif(BASH is None or ENV is None, reason="bash/env not available")
# Variables the launcher gets from its wrappers (uv, srun) or bash, not from the script's text.
NOT_COMPARED = frozenset({"PATH", "PWD", "OLDPWD", "SHLVL", "_"})


def layout(tmp_path: Path) -> tuple[Path, Path]:
    """The script's folder (tmp/project/scripts) and the folder bash starts in (tmp/work)."""
    scripts, work = tmp_path / "project" / "scripts", tmp_path / "work"
    scripts.mkdir(parents=True, exist_ok=True)
    work.mkdir(exist_ok=True)
    return scripts, work


def same_as_bash(
    text: str,
    tmp_path: Path,
    env: dict[str, str] | None = None,
    *,
    bind_pwd: bool = True,
    substitutions: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
    name: str = "run.sh",
    files: dict[str, str] | None = None,
) -> tuple[LaunchRead, StubbedRun]:
    """Read ``text`` and run it under bash; the launcher's argv, environment and folder agree."""
    text = textwrap.dedent(text).replace("LAUNCH", LAUNCH)
    scripts, work = layout(tmp_path)
    for relative, content in (files or {}).items():
        (scripts / relative).parent.mkdir(parents=True, exist_ok=True)
        (scripts / relative).write_text(textwrap.dedent(content).replace("LAUNCH", LAUNCH))
    script = scripts / name
    variables = {**HOME, **(env or {})}
    bash = run_bash_stubbed(text.encode(), script, work, variables, substitutions or {}, args)
    variables["PATH"] = bash.path
    if bind_pwd:
        variables["PWD"] = str(work)
    bindings = Bindings(variables=variables, substitutions=substitutions or {}, args=args)
    read = read_launch(str(script), bindings, text=text)
    assert bash.argv is not None, f"bash exited {bash.returncode}: {bash.stderr}"
    assert read.argv == bash.argv
    assert bash.exported is not None
    ours = {k: v for k, v in read.exported.items() if k not in NOT_COMPARED}
    theirs = {k: v for k, v in bash.exported.items() if k not in NOT_COMPARED}
    if read.unseen:
        # The wrapper adds variables of its own (the cluster's, srun's): ours are among them.
        assert ours.items() <= theirs.items()
    else:
        assert ours == theirs
    if read.cwd is not None:
        assert read.cwd == bash.cwd
    return read, bash


def refused(text: str, env: dict[str, str] | None = None) -> LaunchReadError:
    text = textwrap.dedent(text).replace("LAUNCH", LAUNCH)
    with pytest.raises(LaunchReadError) as caught:
        read_launch("/work/run.sh", Bindings(variables={**HOME, **(env or {})}), text=text)
    assert "\n" not in str(caught.value) and "\0" not in str(caught.value)
    return caught.value


def launch_module(launch: Launch, cwd_known: bool = True) -> str | None:
    """The dotted module a recorded launch runs (a script file mapped as the reader maps it)."""
    if launch.kind == "module":
        return launch.target
    return module_of_file(launch.target, launch.cwd if cwd_known else None)


def read_and_run(
    text: str,
    tmp_path: Path,
    env: dict[str, str] | None = None,
    *,
    args: tuple[str, ...] = (),
    substitutions: dict[str, str] | None = None,
    entry_modules: EntryModules = None,
    name: str = "run.sh",
    files: dict[str, str] | None = None,
    home_folders: tuple[str, ...] = (),
    programs: dict[str, str] | None = None,
) -> tuple[LaunchRead | LaunchReadError, SandboxRun, Launch | None]:
    """The reader's read of ``text`` (or its refusal), and what bash did in the sandbox with
    the same script at the same path (``bash_oracle.run_bash_sandboxed``): every launch, and the
    last one the read accepts."""
    scripts, work = layout(tmp_path)
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    for folder in home_folders:
        # Folders the script enters (the reader assumes `cd` succeeds, as if they existed).
        (home / folder).mkdir(parents=True, exist_ok=True)
    for relative, content in (files or {}).items():
        (scripts / relative).parent.mkdir(parents=True, exist_ok=True)
        (scripts / relative).write_text(content)
    script = scripts / name
    variables = {"HOME": str(home), **(env or {})}
    bash = run_bash_sandboxed(
        text.encode(), script, work, variables, substitutions or {}, args, programs or {}
    )
    bindings = Bindings(
        variables={**variables, "PATH": bash.path, "PWD": str(work)},
        substitutions=substitutions or {},
        args=args,
    )
    accepts = acceptor(entry_modules)
    last = bash.last(
        lambda launch: (module := launch_module(launch)) is not None and accepts(module)
    )
    try:
        read: LaunchRead | LaunchReadError = read_launch(
            str(script), bindings, text=text, entry_modules=entry_modules
        )
    except LaunchReadError as exc:
        assert "\n" not in str(exc) and exc.path, exc
        read = exc
    return read, bash, last


def agrees_with_bash(
    text: str,
    tmp_path: Path,
    env: dict[str, str] | None = None,
    **kwargs: object,
) -> LaunchRead | LaunchReadError:
    """The reader never gives a value bash would not: when it reads the script, its launch is
    bash's last accepted one (module, argv, environment, folder, torchrun's world size); when
    it refuses, the refusal names the file and a line."""
    __tracebackhide__ = True
    read, bash, last = read_and_run(text, tmp_path, env, **kwargs)  # type: ignore[arg-type]
    if isinstance(read, LaunchReadError):
        assert read.construct and read.path, read
        return read
    assert last is not None, f"the reader read a launch bash never ran: {read}\n{bash.stderr}"
    assert read.argv == last.args, (read.argv, last.args)
    assert read.module == launch_module(last)
    assert read.launcher == last.launcher
    ours = {k: v for k, v in read.exported.items() if k not in NOT_COMPARED}
    theirs = {k: v for k, v in last.exported.items() if k not in NOT_COMPARED}
    if read.unseen:
        assert ours.items() <= theirs.items()
    else:
        assert ours == theirs
    if read.cwd is not None:
        assert read.cwd == last.cwd
    if last.torchrun is not None:
        if read.world_size is not None:
            assert read.world_size == last.torchrun["world_size"]
        for option, value in read.torchrun.items():
            assert str(value) == str(last.torchrun[option]), option
    return read
