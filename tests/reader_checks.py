"""What the reader tests share: a script read by the reader and run by bash must agree.

``same_as_bash`` runs a script with real bash (``bash_oracle.run_bash_stubbed``: Python and the
wrappers stubbed to record what the launcher receives) and reads it with the reader; the argv,
the exported environment and the launcher's folder must be equal.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from bash_oracle import BASH, ENV, StubbedRun, run_bash_stubbed

from pytest_verl_compat.bash import LaunchRead, LaunchReadError, read_launch
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
