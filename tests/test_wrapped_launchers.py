"""Scripts as users write them: wrapped launchers, the script-directory idiom, shell functions.

Each reads as real bash runs it, checked by the stubbed oracle (bash_oracle.run_bash_stubbed):
bash runs the script as ``bash /absolute/path`` with ``python3``, ``ray``, ``uv`` and ``srun``
stubbed on PATH (``env``, ``nohup`` and ``timeout`` are coreutils' own), and the Python stub
records the argv, environment and folder the launcher receives. The hostile variants are
refused with their line and construct, and never run anything.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hostile_canary import make_canary
from reader_checks import HOME, LAUNCH, layout, needs_bash, refused, same_as_bash

from pytest_verl_compat.bash import LaunchReadError, paths, read_launch
from pytest_verl_compat.bash.wrappers import WRAPPERS
from pytest_verl_compat.model import Bindings

USER_SCRIPTS = Path(__file__).resolve().parent / "user_scripts"


# --------------------------------------------------------------------------- wrappers

WRAPPED = {
    "ray-submit": (
        'ray job submit --address="http://127.0.0.1:8265" --no-wait -- LAUNCH a=1 "b=x y"\n',
        ("ray job submit",),
    ),
    "ray-runtime-env-json": (
        """\
        export LOCAL=1
        ray job submit --runtime-env-json='{"env_vars": {"A": "1", "B": "x y"}}' \\
            --entrypoint-num-gpus 0.5 --log-style=record -v -- LAUNCH a=$LOCAL
        """,
        ("ray job submit",),
    ),
    "ray-working-dir": (
        'ray job submit --working-dir "$PWD" --runtime-env=env.yaml -- python3 -u -m '
        "verl.trainer.main_ppo a=1\n",
        ("ray job submit",),
    ),
    "uv-run-python": (
        "uv run --with wandb --no-sync -p 3.11 python3 -m verl.trainer.main_ppo a=1\n",
        ("uv run",),
    ),
    "uv-run-module": ("uv run --directory /tmp -m verl.trainer.main_ppo a=1 b=2\n", ("uv run",)),
    "uv-run-dashdash": ("uv run --frozen -- python -m verl.trainer.main_ppo a=1\n", ("uv run",)),
    "env-assignments": (
        "export X=1 Y=2\nenv -u Y Z='3 4' W= LAUNCH a=1\n",
        ("env",),
    ),
    "env-ignore-chdir": ('export X=1\nenv -i -C /tmp PATH="$PATH" A=1 LAUNCH a=1\n', ("env",)),
    "env-dash": ('export X=1\nenv - PATH="$PATH" B=2 LAUNCH a=1\n', ("env",)),
    "env-long-abbreviated": ("export X=1\nenv --unse=X --chd=/tmp LAUNCH a=1\n", ("env",)),
    "nohup": ("nohup LAUNCH a=1 > /dev/null 2>&1 &\nwait\n", ("nohup",)),
    "timeout": ("timeout -k 30s --signal=TERM 1.5h LAUNCH a=1\n", ("timeout",)),
    "timeout-preserve": ("timeout --preserve-status 0 LAUNCH a=1\n", ("timeout",)),
    "srun": (
        "export KEEP=1\nsrun -N 1 --ntasks-per-node=1 --gres=gpu:8 --exclusive -l LAUNCH a=1\n",
        ("srun",),
    ),
    "srun-export-chdir": (
        "export KEEP=1 DROP=2\nsrun --export=KEEP,NEW=3 -D /tmp LAUNCH a=1\n",
        ("srun",),
    ),
    "docker-exec": (
        "export X=1\ndocker exec -it -e A=1 --env 'B=x y' -w /tmp verl LAUNCH a=1\n",
        ("docker exec",),
    ),
    "conda-run": ("export X=1\nconda run -n verl --no-capture-output LAUNCH a=1\n", ("conda run",)),
    "taskset-numactl": (
        "taskset -c 0-7 numactl --cpunodebind=0 --membind=0 LAUNCH a=1\n",
        ("taskset", "numactl"),
    ),
    "gnu-time": ("/usr/bin/time -v -o /dev/null LAUNCH a=1\n", ("time",)),
    "python-variable": (
        'PYTHON=${PYTHON_BIN:-python3}\n"$PYTHON" -m verl.trainer.main_ppo a=1\n',
        (),
    ),
    "python-variable-unquoted": ("PY=python\n$PY -m verl.trainer.main_ppo a=$PY\n", ()),
    "python-versioned": ("python3.11 -X dev -um verl.trainer.main_ppo a=1\n", ()),
    "combined": (
        """\
        export GPUS=0,1
        PY=${PY:-python3}
        nohup env CUDA_VISIBLE_DEVICES=$GPUS timeout 47h srun --nodes=1 \\
            uv run --no-project $PY -u -m verl.trainer.main_ppo a=1 > log 2>&1 &
        wait
        """,
        ("nohup", "env", "timeout", "srun", "uv run"),
    ),
    "combined-ray-env": (
        'env -i HOME=/h PATH="$PATH" ray job submit -- env K=v LAUNCH a=1\n',
        ("env", "ray job submit", "env"),
    ),
    "prefix-assignment": ("X=1 nohup env Y=2 LAUNCH a=1\n", ("nohup", "env")),
    "wrapper-without-command": ("env | grep -c X > /dev/null\nnohup\nLAUNCH a=1\n", ()),
}


@needs_bash
@pytest.mark.parametrize("name", sorted(WRAPPED))
def test_a_wrapped_launcher_gets_what_bash_and_the_wrapper_give_it(
    name: str, tmp_path: Path
) -> None:
    script, wrappers = WRAPPED[name]
    read, _ = same_as_bash(script, tmp_path)
    assert read.wrappers == wrappers


@needs_bash
def test_wrappers_change_the_environment_and_folder_as_they_do(tmp_path: Path) -> None:
    read, bash = same_as_bash("export X=1 Y=2\nenv -u Y -C /tmp Z=3 LAUNCH a=1\n", tmp_path)
    assert (read.cwd, bash.cwd) == ("/tmp", "/tmp")
    assert {k: read.exported[k] for k in ("X", "Z")} == {"X": "1", "Z": "3"}
    assert "Y" not in read.exported
    # The script's variables never travel to a Ray cluster; the runtime env's do.
    read, _ = same_as_bash(
        'export X=1\nray job submit --runtime-env-json \'{"env_vars": {"R": "2"}}\' '
        "-- LAUNCH a=1\n",
        tmp_path,
    )
    assert dict(read.exported) == {"R": "2"}
    assert read.cwd is None
    assert read.unseen == ("the Ray cluster's environment (ray job submit, line 2)",)


@pytest.mark.parametrize(
    ("script", "construct", "detail"),
    [
        (
            "ray job submit LAUNCH a=1\n",
            "ray job submit",
            "`-m` is not an option of `ray job submit`",
        ),
        ("uv run --python\n", "uv run", "`--python` of `uv run` needs a value"),
        ("ray job submit --bogus -- LAUNCH a=1\n", "ray job submit", "`--bogus` is not an option"),
        ("timeout -q 5 LAUNCH a=1\n", "timeout", "`-q` is not an option of `timeout`"),
        ("timeout soon LAUNCH a=1\n", "timeout", "its duration is not a valid duration: 'soon'"),
        ("env --ig LAUNCH a=1\n", "env", "`--ig` is ambiguous for `env`"),
        ("env -S 'python3 -m x' a=1\n", "env -S", "changes the command it runs"),
        ("srun --frobnicate LAUNCH a=1\n", "srun", "`--frobnicate` is not an option of `srun`"),
        ("uv run --no-wait LAUNCH a=1\n", "uv run", "`--no-wait` is not an option of `uv run`"),
        ("docker exec -e HOME c LAUNCH a=1\n", "docker exec -e", "passes 'HOME' from"),
        ("docker exec --rm c LAUNCH a=1\n", "docker exec", "`--rm` is not an option"),
        ("taskset -p 1 LAUNCH a=1\n", "taskset -p", "changes the command it runs"),
        (
            "ray job submit --entrypoint-memory=lots -- LAUNCH a=1\n",
            "ray job submit",
            "is not a valid int",
        ),
        (
            'ray job submit --runtime-env-json=\'{"env_vars": {"A": 1}}\' -- LAUNCH a=1\n',
            "ray job submit --runtime-env-json",
            "env_vars must map names to strings",
        ),
        (
            "nohup LAUNCH a=1\nexport PATH=/opt/bin:$PATH\nnohup LAUNCH a=1\n",
            "PATH change",
            "Python may be another",
        ),
        ("env PATH=/opt/bin LAUNCH a=1\n", "PATH change", "Python may be another"),
    ],
)
def test_a_wrapper_option_it_does_not_have_or_a_bad_value_is_refused_by_name(
    script: str, construct: str, detail: str
) -> None:
    err = refused(script)
    # A PATH change is named where it happens, everything else where the wrapper runs.
    line = 2 if construct == "PATH change" and "export" in script else script.count("\n")
    assert (err.construct, err.line) == (construct, line)
    assert detail in err.detail


def test_an_absolute_python_is_python_whatever_path() -> None:
    read = read_launch(
        "/w/run.sh",
        Bindings(variables=HOME),
        text="export PATH=/opt/bin:$PATH\n/opt/bin/python3 -m verl.trainer.main_ppo a=1\n",
    )
    assert read.argv == ("a=1",)


def test_every_wrapper_is_data_with_its_evidence() -> None:
    names = [wrapper.name for wrapper in WRAPPERS]
    assert len(names) == len(set(names))
    assert {"ray job submit", "uv run", "env", "nohup", "timeout", "srun"} <= set(names)
    for wrapper in WRAPPERS:
        assert wrapper.evidence, wrapper.name
        spellings = [name for option in wrapper.options for name in option.names]
        assert len(spellings) == len(set(spellings)), wrapper.name


# --------------------------------------------------------------------------- hostile wrappers

HOSTILE = {
    "ray-bash-c": (
        "ray job submit -- bash -c 'PAYLOAD; LAUNCH'\nLAUNCH a=1\n",
        "ray job submit bash",
    ),
    "uv-sh": ("uv run sh -c 'PAYLOAD'\nLAUNCH a=1\n", "uv run sh"),
    "env-bash-script": ("env X=1 bash ./x.sh\nLAUNCH a=1\n", "env bash"),
    "nohup-env-bash": ("nohup env bash -c 'PAYLOAD' &\nLAUNCH a=1\n", "env bash"),
    "timeout-subshell-string": ("timeout 5 sh -c '(PAYLOAD)'\nLAUNCH a=1\n", "timeout sh"),
    "docker-exec-bash": ("docker exec c bash -c 'PAYLOAD'\nLAUNCH a=1\n", "docker exec bash"),
    "conda-run-sh": ("conda run -n e sh -c 'PAYLOAD'\nLAUNCH a=1\n", "conda run sh"),
    "srun-bash-stdin": ("echo 'PAYLOAD' | srun bash\nLAUNCH a=1\n", "srun bash"),
    "function-python3": ("python3() { PAYLOAD; }\nLAUNCH a=1\n", "function definition"),
    "function-python": ("function python { PAYLOAD; }\nLAUNCH a=1\n", "function definition"),
    "function-cd": ("cd() { PAYLOAD; }\nLAUNCH a=1\n", "function definition"),
    "function-nohup": ("nohup() { PAYLOAD; }\nnohup LAUNCH a=1\n", "function definition"),
    "function-dirname": ("dirname() { PAYLOAD; }\nLAUNCH a=1\n", "function definition"),
    "recursion": ('f() { f "$@"; }\nf x\nLAUNCH a=1\n', "function recursion"),
    "mutual-recursion": ("a() { b; }\nb() { a; }\na\nLAUNCH a=1\n", "function recursion"),
    "timeout-duration-substitution": (
        'timeout "$(PAYLOAD; echo 10)" LAUNCH a=1\n',
        "run-time value",
    ),
    "ray-json-substitution": (
        'ray job submit --runtime-env-json="$(PAYLOAD)" -- LAUNCH a=1\n',
        "run-time value",
    ),
    "env-unset-substitution": ('env -u "$(PAYLOAD)" LAUNCH a=1\n', "run-time value"),
    "wrapper-option-split": ("OPTS=$(PAYLOAD)\nnohup env $OPTS LAUNCH a=1\n", "run-time value"),
    "wrapped-program-substitution": (
        'nohup "$(PAYLOAD)" -m verl.trainer.main_ppo\n',
        "run-time value",
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_wrappers_and_functions_are_refused_and_run_nothing(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body, construct = HOSTILE[name]
    canary = make_canary(tmp_path)
    text = body.replace("PAYLOAD", canary.payload).replace("LAUNCH", LAUNCH)
    script = tmp_path / "run.sh"
    script.write_text(text)
    (tmp_path / "x.sh").write_text(f"{canary.payload}\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LaunchReadError) as caught:
        read_launch("run.sh", Bindings(variables=HOME))
    err = caught.value
    assert err.construct == construct, err
    last = text.count("\n")
    assert err.line is not None and 1 <= err.line <= last
    assert str(err).startswith(f"run.sh:{err.line}: {construct}: ")
    assert not canary.fired()


def test_a_wrapper_option_that_is_free_text_may_be_a_run_time_value() -> None:
    # ray reads neither the address nor the folder: a run-time value there is never needed.
    read = read_launch(
        "/w/run.sh",
        Bindings(variables=HOME),
        text=f'ray job submit --address "$(cat addr)" --working-dir "$PWD" -- {LAUNCH} a=1\n',
    )
    assert read.argv == ("a=1",)


# --------------------------------------------------------------------------- script directory

SCRIPT_DIR = {
    "bash-source": 'D=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)\nLAUNCH d=$D\n',
    "dashdash-devnull": (
        'D=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" >/dev/null 2>&1 && pwd)\nLAUNCH d=$D\n'
    ),
    "amp-devnull": 'D="$( cd "$( dirname "${BASH_SOURCE[0]}" )" &> /dev/null && pwd )"\nLAUNCH d=$D\n',
    "dollar-zero": 'D=$(cd "$(dirname "$0")"; pwd)\nLAUNCH d=$D\n',
    "up-two": 'ROOT=$(cd "$(dirname "$0")/../.." && pwd)\nLAUNCH root=$ROOT\n',
    "up-one-separate": 'D=$(dirname "$0")\nROOT=$(cd "$D/.." && pwd)\nLAUNCH root=$ROOT d=$D\n',
    "pwd-physical": 'D=$(cd "$(dirname "$0")" && pwd -P)\nLAUNCH d=$D\n',
    "realpath-dirname": 'D=$(realpath "$(dirname "$0")")\nLAUNCH d=$D\n',
    "dirname-readlink": 'D=$(dirname "$(readlink -f "$0")")\nLAUNCH d=$D\n',
    "dirname-realpath": 'D=$(dirname "$(realpath "${BASH_SOURCE[0]}")")\nLAUNCH d=$D\n',
    "backticks": "D=`dirname $0`\nB=`basename $0 .sh`\nLAUNCH d=$D b=$B\n",
    "cd-in-script": 'cd "$(dirname "$0")/.."\nLAUNCH here=$PWD back=$OLDPWD now=$(pwd)\n',
    "cd-then-relative": 'cd "$(dirname "$0")"\ncd ../data\nLAUNCH here=$PWD\n',
    "bash-source-length": "LAUNCH n=${#BASH_SOURCE[@]} s=${BASH_SOURCE} f=${FUNCNAME[0]:-none}\n",
    "echo-printf": (
        'D=$(cd "$(dirname "$0")" && echo "$PWD")\nP=$(printf "%s/%03d" "$D" 7)\n'
        "E=$(echo -n x; echo -e 'a\\tb')\nLAUNCH p=$P e=\"$E\"\n"
    ),
}


@needs_bash
@pytest.mark.parametrize("bind_pwd", [True, False], ids=["pwd-bound", "pwd-unbound"])
@pytest.mark.parametrize("name", sorted(SCRIPT_DIR))
def test_the_script_directory_is_the_folder_of_the_script_as_bash_gives_it(
    name: str, bind_pwd: bool, tmp_path: Path
) -> None:
    if name.startswith("cd-") and not bind_pwd:
        pytest.skip("$OLDPWD is the folder bash starts in")
    (tmp_path / "project" / "data").mkdir(parents=True)
    read, _ = same_as_bash(SCRIPT_DIR[name], tmp_path, bind_pwd=bind_pwd)
    assert not any("\0" in field for field in read.argv)


def test_the_script_directory_resolves_from_a_relative_path_as_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripts, _ = layout(tmp_path)
    (scripts / "run.sh").write_text(
        f'ROOT=$(cd "$(dirname "$0")/.." && pwd)\n{LAUNCH} root=$ROOT zero=$0\n'
    )
    monkeypatch.chdir(tmp_path / "project")
    read = read_launch("scripts/run.sh", Bindings(variables=HOME))
    # Read from its file, the script runs as `bash /absolute/path`.
    assert read.argv == (f"root={tmp_path / 'project'}", f"zero={scripts / 'run.sh'}")
    # Given as text, $0 is the label as given, relative to the folder bash starts in.
    text = (scripts / "run.sh").read_text()
    read = read_launch("scripts/run.sh", Bindings(variables={**HOME, "PWD": "/w"}), text=text)
    assert read.argv == ("root=/w", "zero=scripts/run.sh")
    err = refused_text(text, "scripts/run.sh")
    assert "$PWD after `cd`" in str(err) and "--env PWD=VALUE" in str(err)


def refused_text(text: str, label: str) -> LaunchReadError:
    with pytest.raises(LaunchReadError) as caught:
        read_launch(label, Bindings(variables=HOME), text=text)
    assert caught.value.construct == "run-time value"
    return caught.value


@pytest.mark.parametrize(
    ("script", "what"),
    [
        ('D=$(cd "$(dirname "$(cat where)")" && pwd)\nLAUNCH d=$D\n', "$PWD after `cd`"),
        ("D=$(cd data && pwd)\nLAUNCH d=$D\n", "$PWD after `cd`"),
        ('D=$(dirname "$(hostname)")\nLAUNCH d=$D\n', "`dirname`"),
        ("D=$(cd /opt && ls | head -1)\nLAUNCH d=$D\n", "$(cd /opt && ls | head -1)"),
        ('D=$(basename "$PWD")\nLAUNCH d=$D\n', "`basename`"),
        ("D=$(pwd)\nLAUNCH d=$D\n", "$PWD (line 1)"),
    ],
)
def test_what_only_the_running_script_knows_stays_a_run_time_value(script: str, what: str) -> None:
    err = refused(script)
    assert err.construct == "run-time value"
    assert what in err.detail


def test_path_programs_print_what_coreutils_prints(tmp_path: Path) -> None:
    cases = [
        "",
        "/",
        "//",
        "///",
        "a",
        "a/",
        "a//",
        "/a",
        "//a",
        "a/b",
        "a/b/",
        "/a/b//",
        "./a",
        "../a/b",
        "a/.",
        ".",
        "..",
        "a.sh",
        ".sh",
        "/x/run.sh",
    ]
    for path in cases:
        want = subprocess.run(["dirname", "--", path], capture_output=True, text=True).stdout
        assert paths.dirname(path) + "\n" == want, path
        for suffix in ("", ".sh", "sh"):
            args = ["basename", "--", path, suffix] if suffix else ["basename", "--", path]
            want = subprocess.run(args, capture_output=True, text=True).stdout
            if path:
                assert paths.basename(path, suffix) + "\n" == want, (path, suffix)
    for path in ("/a/./b/../c", "//a/b", "/a/b/..", "/..", "/a//b/"):
        assert paths.logical(path) == os.path.normpath(path) or path.startswith("//")


# --------------------------------------------------------------------------- functions

FUNCTIONS = {
    "positional": 'f() { LAUNCH "n=$#" "first=$1" "all=$*"; }\nset -- outer\nf a "b c"\n',
    "restores-positional": 'f() { shift; }\nset -- a b\nf x y z\nLAUNCH "$@"\n',
    "local": (
        "X=global\nf() { local X=inner Y; Y=set; LAUNCH x=$X y=$Y; }\nf\nLAUNCH x=$X y=${Y-unset}\n"
    ),
    "local-exported": "export X=1\nf() { local X=2; LAUNCH x=$X; }\nf\n",
    "declare-is-local": "f() { declare -a A=(1 2); declare -g G=g; }\nf\nLAUNCH n=${#A[@]} g=$G\n",
    "return-status": (
        "ok() { return 0; }\nno() { return 3; }\nno || s=$?\nok && t=yes\nLAUNCH s=$s t=$t\n"
    ),
    "return-last-status": "f() { false; return; }\nf || s=$?\nLAUNCH s=$s\n",
    "output-in-substitution": 'greet() { echo "hi $1"; }\nG=$(greet you)\nLAUNCH "g=$G"\n',
    "recursion-bounded": (
        "fact() { if (( $1 <= 1 )); then echo 1; else echo $(( $1 * $(fact $(( $1 - 1 ))) )); fi; }\n"
        "LAUNCH f=$(fact 10)\n"
    ),
    "funcname": 'outer() { inner; }\ninner() { LAUNCH f="${FUNCNAME[*]}" s=${#BASH_SOURCE[@]}; }\nouter\n',
    "prefix-assignment": "f() { LAUNCH v=$V; }\nV=1 f\nLAUNCH v=${V-unset}\n",
    "set-e-in-condition": "set -e\nf() { false; LAUNCH reached=yes; }\nif f; then :; fi\n",
    "exit-in-function": "f() { LAUNCH a=1; exit 0; }\nf\nLAUNCH a=2\n",
    "redefined": "f() { LAUNCH v=1; }\nf() { LAUNCH v=2; }\nf\n",
    "unset-f": "f() { LAUNCH v=1; }\nunset -f f\nf\nLAUNCH v=2\n",
    "in-subshell": "f() { LAUNCH v=sub; }\n(f)\n",
    "launcher-in-function-with-args": (
        'train() {\n  local exp=$1; shift\n  LAUNCH trainer.experiment_name="$exp" "$@"\n}\n'
        "train e1 a=1 'b=2 3'\n"
    ),
    "log-to-stderr": (
        'log() { echo "[$(date)] $*" >&2; }\nlog start\nLAUNCH a=1\nlog "took $(( $(date +%s) - 1 )) s"\n'
    ),
}


@needs_bash
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_a_function_runs_its_body_as_bash_does(name: str, tmp_path: Path) -> None:
    same_as_bash(FUNCTIONS[name], tmp_path)


def test_a_function_output_is_a_run_time_value_only_when_its_body_is() -> None:
    err = refused("now() { date +%s; }\nLAUNCH t=$(now)\n")
    assert "$(now) (line 2)" in err.detail and "--subst 'now' OUTPUT" in err.detail
    read = read_launch(
        "/w/run.sh",
        Bindings(variables=HOME, substitutions={"now": "1700000000"}),
        text=f"now() {{ date +%s; }}\n{LAUNCH} t=$(now)\n",
    )
    assert read.argv == ("t=1700000000",)
    read = read_launch(
        "/w/run.sh", Bindings(variables=HOME), text=f"now() {{ echo 5; }}\n{LAUNCH} t=$(now)\n"
    )
    assert read.argv == ("t=5",)


def test_the_same_refusals_hold_inside_a_function() -> None:
    err = refused("f() {\n  eval \"$1\"\n}\nf 'echo hi'\nLAUNCH a=1\n")
    assert (err.construct, err.line) == ("eval", 2)
    err = refused("f() { LAUNCH dir=$PWD; }\nf\n")
    assert (err.construct, err.line) == ("run-time value", 1)


# --------------------------------------------------------------------------- more habits

HABITS = {
    "while-counter": (
        "i=0\nwhile [ $i -lt 5 ]; do i=$((i+1)); [ $i -eq 3 ] && continue; X=$X$i; done\n"
        "LAUNCH x=$X i=$i\n"
    ),
    "until-ready": "until command -v ray >/dev/null; do sleep 1; done\nLAUNCH a=1\n",
    "c-style-for": (
        'for ((i = 0, j = 10; i < 4; i++, j -= 2)); do S+="$i:$j "; done\nLAUNCH "s=$S" i=$i\n'
    ),
    "while-break": "n=0\nwhile :; do n=$((n+1)); if ((n > 3)); then break; fi; done\nLAUNCH n=$n\n",
    "signal-trap": "trap 'echo interrupted >&2; exit 130' INT TERM\ntrap - INT\nLAUNCH a=1\n",
    "list-slices": (
        'set -- a b "c d" e\nA=([0]=x [3]=y [4]=z)\n'
        'LAUNCH "${@:2}" "${@:0:1}" "${@: -2:1}" ${A[@]:1} "${A[@]: -2}" "${*:2:2}"\n'
    ),
    "shift-style-args": 'f() { LAUNCH first=$1 "${@:2}"; }\nf a b "c d"\n',
}


# A test only the running system decides (a file, a run-time value) that changes nothing: both
# ways leave the same shell, so the script reads whichever way it goes.
EITHER_WAY = {
    "mkdir-if-missing": 'CKPT=$HOME/ckpt\nif [ ! -d "$CKPT" ]; then mkdir -p "$CKPT"; fi\nLAUNCH d=$CKPT\n',
    "or-preprocess": "[ -f /nonexistent/train.parquet ] || python3 prepare.py >&2\nLAUNCH a=1\n",
    "and-cleanup": "[[ -e /nonexistent/lock ]] && rm -f /nonexistent/lock\nLAUNCH a=1\n",
    "elif-chain": (
        "if [[ -f /etc/hostname && -n $HOME ]]; then echo x >&2; elif [ -d /opt ]; then :; "
        "else echo y >&2; fi\nLAUNCH a=1\n"
    ),
    "same-launch": "if [ -d /opt ]; then LAUNCH a=1; else LAUNCH a=1; fi\n",
    "run-time-value": 'if [ "$(hostname)" = head ]; then echo "on the head node" >&2; fi\nLAUNCH a=1\n',
    "in-function": (
        'prep() {\n  [ -d "$1" ] || mkdir -p "$1"\n  echo "$1/train.parquet"\n}\n'
        "LAUNCH data.train_files=$(prep $HOME/data)\n"
    ),
}


@needs_bash
@pytest.mark.parametrize("name", sorted(EITHER_WAY))
def test_an_undecidable_test_that_changes_nothing_reads_either_way(
    name: str, tmp_path: Path
) -> None:
    same_as_bash(EITHER_WAY[name], tmp_path)


@pytest.mark.parametrize(
    ("script", "construct", "line"),
    [
        ("if [ -f /x ]; then X=1; fi\nLAUNCH x=$X\n", "test -f", 1),
        ("[ -f /x ] || exit 1\nLAUNCH a=1\n", "test -f", 1),
        ("if [ -d /x ]; then LAUNCH a=1; else LAUNCH a=2; fi\n", "test -d", 1),
        # The status differs and the next command reads it.
        ("[ -f /x ] && rm /x\necho $? >&2\nLAUNCH a=1\n", "test -f", 1),
        # Not a pure test: the condition itself acts.
        ("if X=1 && [ -f /x ]; then :; fi\nLAUNCH a=1\n", "test -f", 1),
        ('if [ "$PWD" = /root ]; then cd /; fi\nLAUNCH a=1\n', "run-time value", 1),
    ],
)
def test_an_undecidable_test_whose_ways_differ_stays_refused(
    script: str, construct: str, line: int
) -> None:
    err = refused(script)
    assert (err.construct, err.line) == (construct, line)


@needs_bash
@pytest.mark.parametrize("name", sorted(HABITS))
def test_other_habits_of_user_scripts_read_as_bash_runs_them(name: str, tmp_path: Path) -> None:
    same_as_bash(HABITS[name], tmp_path)


@pytest.mark.parametrize(
    ("script", "construct"),
    [
        ("while true; do :; done\nLAUNCH a=1\n", "while loop"),
        ("until false; do sleep 1; done\nLAUNCH a=1\n", "until loop"),
        ("while [ -f /tmp/lock ]; do sleep 1; done\nLAUNCH a=1\n", "test -f"),
        ("trap 'rm -rf /tmp/x' DEBUG\nLAUNCH a=1\n", "trap DEBUG"),
        ('trap "rm -rf $(mktemp -d)" EXIT\nLAUNCH a=1\n', "run-time value"),
    ],
)
def test_a_loop_without_end_or_a_trap_bash_cannot_be_followed_in_stays_refused(
    script: str, construct: str
) -> None:
    err = refused(script)
    assert (err.construct, err.line) == (construct, 1)


# --------------------------------------------------------------------------- user scripts

# Scripts in the styles of verl 0.7/0.8 recipes and users' own folders (none a copy of an
# upstream file): each reads exactly as bash runs it. The files they source are in lib/.
USER = sorted(p.name for p in USER_SCRIPTS.glob("*.sh"))
ARGS = {
    "ray_runtime_env_json.sh": ("trainer.total_epochs=1",),
    "getopts_launcher.sh": ("-m", "Qwen/Qwen3-4B", "-ln4", "--", "trainer.val_before_train=False"),
    "long_options_loop.sh": ("--model=Qwen/Qwen3-4B", "--algo", "rloo", "data.seed=3"),
    "model_presets_function.sh": ("qwen3_4b", "trainer.total_epochs=2"),
}
# Run-time values the script really has: the user who runs it.
SUBSTITUTIONS = {"gspo_slurm_tee.sh": {"whoami 2>/dev/null || echo user": "verl"}}
# What only the running system decides, refused with its line: the Python PATH finds, and
# whether an optional file exists.
REFUSED = {"check_and_launch.sh": (11, "run-time value"), "lora_from_env_file.sh": (4, "test -f")}


@needs_bash
@pytest.mark.parametrize("name", USER)
def test_a_user_script_reads_as_bash_runs_it(name: str, tmp_path: Path) -> None:
    text = (USER_SCRIPTS / name).read_text()
    if name in REFUSED:
        with pytest.raises(LaunchReadError) as caught:
            read_launch(USER_SCRIPTS / name, Bindings(variables=HOME))
        assert (caught.value.line, caught.value.construct) == REFUSED[name]
        return
    (tmp_path / "project" / "data").mkdir(parents=True)
    shutil.copytree(USER_SCRIPTS / "lib", tmp_path / "project" / "scripts" / "lib")
    (tmp_path / "home").mkdir()
    read, _ = same_as_bash(
        text,
        tmp_path,
        {"HOME": str(tmp_path / "home")},
        name=name,
        bind_pwd=False,
        args=ARGS.get(name, ()),
        substitutions=SUBSTITUTIONS.get(name),
    )
    assert len(read.argv) >= 4


def test_the_user_scripts_read_from_their_own_folder() -> None:
    read = read_launch(USER_SCRIPTS / "readlink_root.sh", Bindings(variables=HOME))
    root = os.path.realpath(USER_SCRIPTS / ".." / "..")
    assert f"data.train_files={root}/data/train.parquet" in read.argv
    assert f"--config-path={os.path.realpath(USER_SCRIPTS)}/config" in read.argv


def test_cli_read_resolves_the_script_directory(tmp_path: Path) -> None:
    scripts, _ = layout(tmp_path)
    (scripts / "run.sh").write_text(
        'HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)\n'
        f"{LAUNCH} data.train_files=$HERE/train.parquet\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_verl_compat.cli", "read", "scripts/run.sh"],
        cwd=tmp_path / "project",
        capture_output=True,
        text=True,
        check=False,
    )
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.splitlines() == [f"data.train_files={scripts}/train.parquet"]


# --------------------------------------------------------------------------- environment

ENV_SCRIPTS = {
    "export": ("export RUN=exported\nLAUNCH trainer.project_name='${oc.env:RUN}'\n", "exported"),
    "env": (
        "export RUN=outer\nenv RUN=inner LAUNCH trainer.project_name='${oc.env:RUN}'\n",
        "inner",
    ),
    "ray-runtime-env": (
        'export RUN=local\nray job submit --runtime-env-json=\'{"env_vars": {"RUN": "job"}}\' '
        "-- LAUNCH trainer.project_name='${oc.env:RUN}'\n",
        "job",
    ),
    "default-when-unset": (
        "env -u HOME LAUNCH trainer.project_name='${oc.env:HOME,nohome}'\n",
        "nohome",
    ),
}


@pytest.mark.parametrize("name", sorted(ENV_SCRIPTS))
def test_oc_env_reads_the_launchers_environment(name: str, tmp_path: Path) -> None:
    """``${oc.env:NAME}`` answers from what the launcher receives, after its wrappers."""
    pytest.importorskip("verl")
    from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession

    text, expected = ENV_SCRIPTS[name]
    script = tmp_path / "run.sh"
    script.write_text(text.replace("LAUNCH", LAUNCH))
    session = AuditSession.start(AuditOptions())
    composition = session.outcome(session.case_for_script(script)).composition
    assert composition.composed, composition.reason
    assert composition.mapping["trainer"]["project_name"] == expected


@pytest.mark.parametrize(
    ("script", "line", "entry"),
    [
        (
            "ray job submit -- python3 -m recipe.dapo.main_dapo a=1\n",
            1,
            "python3 -m recipe.dapo.main_dapo",
        ),
        (
            "X=1\ntorchrun --nproc_per_node=8 -m verl.trainer.sft_trainer a=1\n",
            2,
            "torchrun -m verl.trainer.sft_trainer",
        ),
    ],
)
def test_another_entry_point_is_named_with_its_line(script: str, line: int, entry: str) -> None:
    err = refused(script)
    assert (err.construct, err.line) == ("no launcher", line)
    assert f"line {line} runs `{entry}`, another entry point" in err.detail


def test_the_readme_counts_the_user_scripts_the_reader_reads() -> None:
    """docs/launch-reader.md's row for tests/user_scripts is what the reader reads today."""
    import re

    from pytest_verl_compat.pipeline.manifest import default_manifest_path, load_manifest

    bindings = load_manifest(default_manifest_path()).bindings
    scripts = sorted(USER_SCRIPTS.glob("*.sh"))
    read = 0
    for script in scripts:
        try:
            read_launch(script, bindings)
            read += 1
        except LaunchReadError:
            pass
    readme = (USER_SCRIPTS.parents[1] / "docs" / "launch-reader.md").read_text()
    row = re.search(
        r"\| `tests/user_scripts/\*\.sh` \((\d+) scripts.*?\| [^|]* \| (\d+) / (\d+) \|", readme
    )
    assert row is not None
    assert (int(row[1]), int(row[2]), int(row[3])) == (len(scripts), read, len(scripts))
