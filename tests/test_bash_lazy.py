"""Run-time values: what only the running script knows ($PWD, an unbound `$(...)`, `~` without
HOME) may be assigned, copied, concatenated and exported freely; only where the launcher's argv,
a condition, a `case`, arithmetic or a word count depends on its text is the script refused,
with one line naming where the value came from and where it was needed."""

from __future__ import annotations

from pathlib import Path

import pytest
from bash_oracle import BASH, ENV, run_bash

from pytest_verl_compat.bash import LaunchReadError, read_launch_text
from pytest_verl_compat.model import Bindings

LAUNCH = "python3 -m verl.trainer.main_ppo"
HOME = {"HOME": "/home/verl"}
needs_bash = pytest.mark.skipif(BASH is None or ENV is None, reason="bash/env not available")

# The shape of upstream's run_qwen3_5_27b_fsdp.sh: WORKING_DIR and a start time never reach argv.
UNUSED = """\
set -xeuo pipefail
WORKING_DIR=${WORKING_DIR:-"${PWD}"}
start_time=$(date +%Y%m%d)_$(date +%H%M%S)
LOG_DIR="$WORKING_DIR/logs/$start_time"
export RUNTIME_ENV=$WORKING_DIR/runtime_env.yaml
mkdir -p "$LOG_DIR"
cd "$WORKING_DIR"
echo "logs in $LOG_DIR" > "$LOG_DIR/where.txt"
LAUNCH trainer.project_name=p \\
    trainer.total_epochs=1 "$@"
"""


def read(text: str, env: dict[str, str] | None = None, **kw: object) -> tuple[str, ...]:
    b = Bindings(variables={**HOME, **(env or {})}, **kw)  # type: ignore[arg-type]
    return read_launch_text(text.replace("LAUNCH", LAUNCH), b, path="run.sh").argv


def refused(text: str, env: dict[str, str] | None = None) -> LaunchReadError:
    with pytest.raises(LaunchReadError) as caught:
        read(text, env)
    err = caught.value
    assert err.construct == "run-time value", err
    assert "\n" not in str(err) and "\0" not in str(err)
    return err


@needs_bash
def test_a_run_time_value_that_never_reaches_the_argv_reads_as_bash_runs_it(
    tmp_path: Path,
) -> None:
    argv = read(UNUSED)
    assert argv == ("trainer.project_name=p", "trainer.total_epochs=1")
    data = UNUSED.replace("LAUNCH", LAUNCH).encode()
    oracle = run_bash(data, tmp_path, HOME, {"date +%Y%m%d": "20260101", "date +%H%M%S": "0"})
    assert oracle.argv == argv


def test_the_same_value_reaching_the_argv_names_both_lines() -> None:
    err = refused(UNUSED.replace("trainer.total_epochs=1", "trainer.default_local_dir=$LOG_DIR"))
    assert err.line == 9
    assert str(err) == (
        "run.sh:9: run-time value: $PWD (line 2), $(date +%Y%m%d) (line 3), $(date +%H%M%S) "
        "(line 3) reaches the launcher's argv on line 9, but is only known when the script runs; bind it: --env PWD=VALUE (environment.variables in "
        "the manifest)"
    )


def test_a_substitution_reaching_the_argv_names_its_binding() -> None:
    err = refused(UNUSED.replace("trainer.total_epochs=1", 'trainer.experiment_name="$LOG_DIR"'))
    # $PWD comes first in LOG_DIR, so it is the one named.
    assert "$PWD (line 2)" in str(err)
    err = refused(UNUSED.replace("trainer.total_epochs=1", "trainer.experiment_name=$start_time"))
    assert "$(date +%Y%m%d) (line 3)" in str(err) and "--subst 'date +%Y%m%d' OUTPUT" in str(err)


def test_a_binding_still_overrides() -> None:
    text = UNUSED.replace("trainer.total_epochs=1", "trainer.default_local_dir=$LOG_DIR")
    subst = {"date +%Y%m%d": "20260101", "date +%H%M%S": "000000"}
    argv = read(text, {"PWD": "/work"}, substitutions=subst)
    assert "trainer.default_local_dir=/work/logs/20260101_000000" in argv
    assert read(text, {"WORKING_DIR": "/w"}, substitutions=subst)[1] == (
        "trainer.default_local_dir=/w/logs/20260101_000000"
    )


def test_a_bound_value_decides_conditions_again() -> None:
    script = 'if [ "$PWD" = /root ]; then LAUNCH a=root; else LAUNCH a=other; fi\n'
    assert read(script, {"PWD": "/root"}) == ("a=root",)
    assert read(script, {"PWD": "/w"}) == ("a=other",)
    case = 'X=$(uname)\ncase "$X" in Linux) LAUNCH a=linux;; *) LAUNCH a=other;; esac\n'
    assert read(case, substitutions={"uname": "Linux\n"}) == ("a=linux",)
    assert dict(read_launch_text(f"{LAUNCH}\n", Bindings()).runtime) == {}


def test_cd_into_a_known_folder_keeps_pwd_known() -> None:
    # `cd` is assumed to succeed, like every skipped command; the folder it enters is known
    # when its argument and the folder it starts from are.
    assert read("cd sub\nLAUNCH a=1\n", {"PWD": "/w"}) == ("a=1",)
    assert read("(cd sub)\nLAUNCH dir=$PWD\n", {"PWD": "/w"}) == ("dir=/w",)
    got = read("X=1\ncd sub/../x/.\nLAUNCH dir=$PWD old=$OLDPWD\n", {"PWD": "/w"})
    assert got == ("dir=/w/x", "old=/w")
    assert read("cd /opt//a/..\nLAUNCH dir=$PWD now=$(pwd)\n") == ("dir=/opt", "now=/opt")
    # From a run-time folder, or into one, the folder stays a run-time value.
    err = refused("X=1\ncd sub\nLAUNCH dir=$PWD\n")
    assert "$PWD after `cd` (line 2), from $PWD (line 2) reaches the launcher's argv on line 3" in (
        str(err)
    )
    err = refused("cd $(cat where)\nLAUNCH dir=$(pwd)\n", {"PWD": "/w"})
    assert "$PWD after `cd` (line 1), from $(cat where) (line 1) reaches" in str(err)


def test_concatenated_then_passed_is_refused() -> None:
    err = refused('A="x-${PWD}-y"\nB=pre$A\nLAUNCH dir=$B\n')
    assert (err.line, "$PWD (line 1)" in str(err)) == (3, True)


def test_a_derived_value_names_its_origin() -> None:
    assert read("NAME=${PWD##*/}\nUP=${NAME^^}\nLAUNCH a=1\n") == ("a=1",)
    err = refused("NAME=${PWD##*/}\nLAUNCH name=$NAME\n")
    assert "${PWD##...} (line 1), from $PWD (line 1) reaches the launcher's argv on line 2" in str(
        err
    )


@pytest.mark.parametrize(
    ("script", "line"),
    [
        ('if [ "$PWD" = /root ]; then exit 1; fi\nLAUNCH\n', 1),
        ("if [[ $PWD == /root* ]]; then X=root; fi\nLAUNCH\n", 1),
        ('D=$(hostname)\nif [ -n "$D" ]; then LAUNCH a=1; fi\nLAUNCH\n', 2),
        ("D=$(hostname)\n[[ -z $D ]] && exit 1\nLAUNCH\n", 2),
        ('case "$PWD" in /root) exit 1;; esac\nLAUNCH\n', 1),
        ("N=$(nproc)\nLAUNCH trainer.n_gpus_per_node=$((N / 2))\n", 2),
        ("N=$(nproc)\n((N > 1)) && exit 1\nLAUNCH\n", 2),
        ("X=$(cat f)\nY=${X:-default}\nLAUNCH\n", 2),
        ("for d in $PWD/a $PWD/b; do :; done\nLAUNCH\n", 1),
        ("A=($(ls))\nLAUNCH\n", 1),
        ("set -- $(cat args)\nLAUNCH\n", 1),
        ("exit $(cat status)\nLAUNCH\n", 1),
        ("nohup $(cat cmd) &\nLAUNCH\n", 1),
        ("python3 -m $(cat module)\nLAUNCH\n", 1),
        ("/usr/bin/python3 $(cat flag) verl.trainer.main_ppo\nLAUNCH\n", 1),
        ('"$(which python3)" -m verl.trainer.main_ppo\nLAUNCH\n', 1),
        ("echo x > $PWD/log\nLAUNCH\n", 1),
        ("LAUNCH a=$$\n", 1),
        ("LAUNCH home=~\n", 1),
    ],
)
def test_a_run_time_value_that_decides_something_is_refused(script: str, line: int) -> None:
    # `~` is a run-time value only when HOME is unset.
    b = Bindings() if "~" in script else Bindings(variables=HOME)
    with pytest.raises(LaunchReadError) as caught:
        read_launch_text(script.replace("LAUNCH", LAUNCH), b, path="run.sh")
    err = caught.value
    assert (err.construct, err.line) == ("run-time value", line), str(err)
    assert "\n" not in str(err) and "\0" not in str(err)


@needs_bash
@pytest.mark.parametrize(
    "script",
    [
        # Decidable: a value that holds literal text, or $PWD (never empty), is non-empty.
        'D="$(pwd)/x"\nif [ -n "$D" ]; then LAUNCH a=1; fi\n',
        "if [[ $PWD ]]; then LAUNCH a=1; fi\n",
        'W=${WORKING_DIR:-$PWD}\nW=${W:-/never}\nLAUNCH a=1 "$@"\n',
        # Quoted: one word whatever the value, so the loop runs twice.
        'n=0\nfor d in "$PWD/a" "$(pwd)/b"; do n=$((n + 1)); done\nLAUNCH n=$n\n',
        'A=("$PWD" "$(date)")\nLAUNCH count=${#A[@]}\n',
        "cd $PWD\nmkdir -p $(pwd)/logs\necho $PWD >> log.txt\nLAUNCH a=1\n",
        # Python with known first arguments is not the launcher, whatever follows.
        'python3 -c "" --local_dir "$PWD/data" $(pwd)\nLAUNCH a=1\n',
        "export X=$PWD Y=1\nX=$X/y LAUNCH a=1\n",
        "LEN=${#PWD}\nSUB=${PWD:1:3}\nR=${PWD/a/b}\nLAUNCH a=1\n",
        # Once unset, $PWD is an ordinary unset variable.
        'printf "%s\\n" "$PWD" >/dev/null\nunset PWD\nLAUNCH a=${PWD:-d}\n',
    ],
)
def test_a_run_time_value_only_moved_around_reads_like_bash(script: str, tmp_path: Path) -> None:
    text = script.replace("LAUNCH", LAUNCH)
    argv = read(text)
    oracle = run_bash(text.encode(), tmp_path, HOME, {"pwd": str(tmp_path), "date": "d"})
    assert oracle.argv == argv


def test_exported_run_time_values_are_named_not_guessed() -> None:
    got = read_launch_text(
        f"export X=$PWD/x Y=1\nZ=$(hostname) {LAUNCH} a=1\n", Bindings(variables=HOME)
    )
    assert dict(got.exported) == {"HOME": "/home/verl", "Y": "1"}
    assert dict(got.runtime) == {"X": "$PWD (line 1)", "Z": "$(hostname) (line 2)"}


def test_tilde_without_home_is_a_run_time_value() -> None:
    assert read_launch_text(f"D=~/data\n{LAUNCH} a=1\n", Bindings()).argv == ("a=1",)
    with pytest.raises(LaunchReadError) as caught:
        read_launch_text(f"D=~/data\n{LAUNCH} d=$D\n", Bindings(), path="run.sh")
    assert str(caught.value).startswith(
        "run.sh:2: run-time value: ~ (line 1) reaches the launcher's argv on line 2"
    )
    assert "--env HOME=DIR" in str(caught.value)


def test_a_nul_in_a_binding_cannot_forge_a_run_time_value() -> None:
    with pytest.raises(LaunchReadError) as caught:
        read_launch_text(f"{LAUNCH} $X\n", Bindings(variables={"X": "\x000\x00"}))
    assert caught.value.construct == "binding"
