"""The launch reader against real bash (differential), hostile scripts and every construct."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping
from pathlib import Path

import pytest
from bash_oracle import BASH, ENV, UNBOUND_MARKER, run_bash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_verl_compat.bash import (
    LaunchExited,
    LaunchRead,
    LaunchReadError,
    command_substitutions,
    read_launch,
    read_launch_text,
)
from pytest_verl_compat.model import Bindings

UPSTREAM = Path(
    os.environ.get("VERL_UPSTREAM")
    or Path(__file__).resolve().parents[2] / "shared/upstream/verl-v0.9.0"
)
needs_upstream = pytest.mark.skipif(
    not UPSTREAM.is_dir(), reason=f"upstream verl checkout not found at {UPSTREAM} (VERL_UPSTREAM)"
)
needs_bash = pytest.mark.skipif(BASH is None or ENV is None, reason="bash/env not available")

NPU_PROBE = "python3 -c 'import torch_npu' 2>/dev/null && echo npu || echo gpu"
DATE = "date +%Y%m%d_%H%M"
HOME = {"HOME": "/home/verl"}
SUBSTITUTIONS = {NPU_PROBE: "gpu", DATE: "20260101_0000"}
DEFAULT = Bindings(variables=HOME, substitutions=SUBSTITUTIONS)
LAUNCH = "python3 -m verl.trainer.main_ppo"

OFFICIAL = (
    "examples/ppo_trainer/run_qwen3_8b_fsdp.sh",
    "examples/grpo_trainer/run_qwen3_8b_fsdp.sh",
    "examples/rloo_trainer/run_qwen3_8b_fsdp.sh",
    "examples/reinforce_plus_plus_trainer/run_qwen3_8b_fsdp.sh",
    "examples/tuning/lora/run_qwen3_8b_fsdp.sh",
    "examples/grpo_trainer/run_mistral_nemo_12b_skyworkrm_fsdp.sh",
)
GRPO = "examples/grpo_trainer/run_qwen3_8b_fsdp.sh"


def bindings(env: Mapping[str, str] | None = None, args: tuple[str, ...] = ()) -> Bindings:
    """The default bindings with extra variables and positional parameters."""
    return Bindings(variables={**HOME, **(env or {})}, substitutions=SUBSTITUTIONS, args=args)


def assert_same_as_bash(data: bytes, tmp_path: Path, b: Bindings, label: str) -> LaunchRead:
    """The reader's launch equals bash's (argv, environment, line); returns the reader's."""
    oracle = run_bash(data, tmp_path, b.variables, b.substitutions, b.args)
    read = read_launch(label, b, text=data.decode())
    assert oracle.argv is not None, f"bash exited {oracle.returncode}: {oracle.stderr}"
    assert all(UNBOUND_MARKER not in field for field in oracle.argv)
    assert read.argv == oracle.argv
    assert dict(read.exported) == oracle.exported
    assert list(read.exported) == sorted(read.exported)
    assert read.line == oracle.launcher_lines[-1] or read.line in oracle.launcher_lines
    return read


# --------------------------------------------------------------------------- official scripts


@needs_upstream
@needs_bash
@pytest.mark.parametrize("script", OFFICIAL)
def test_official_script_matches_bash(script: str, tmp_path: Path) -> None:
    data = (UPSTREAM / script).read_bytes()
    read = assert_same_as_bash(data, tmp_path, DEFAULT, script)
    assert len(read.argv) > 30


GRPO_VARIANTS = {
    "npu": ({"DEVICE": "npu"}, ()),
    "gb200-sglang": ({"MACHINE": "gb200", "INFER_BACKEND": "sglang"}, ()),
    "gb200-vllm": ({"MACHINE": "gb200"}, ()),
    "npu-sglang": ({"DEVICE": "npu", "INFER_BACKEND": "sglang"}, ()),
    "overrides": ({"NGPUS_PER_NODE": "2", "ROLLOUT_TP": "4", "EXPERIMENT_NAME": "mine"}, ()),
    "extra-args": ({}, ("trainer.total_epochs=1", "a b")),
    "empty-arg": ({}, ("",)),
}


@needs_upstream
@needs_bash
@pytest.mark.parametrize("variant", sorted(GRPO_VARIANTS))
def test_grpo_branch_variant_matches_bash(variant: str, tmp_path: Path) -> None:
    env, args = GRPO_VARIANTS[variant]
    data = (UPSTREAM / GRPO).read_bytes()
    read = assert_same_as_bash(data, tmp_path, bindings(env, args), GRPO)
    if args:
        assert read.argv[-len(args) :] == args


@needs_upstream
@needs_bash
def test_grpo_npu_variant_takes_the_npu_branch(tmp_path: Path) -> None:
    data = (UPSTREAM / GRPO).read_bytes()
    read = assert_same_as_bash(data, tmp_path, bindings({"DEVICE": "npu"}), GRPO)
    assert "data.max_response_length=32768" in read.argv
    assert "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=4" in read.argv
    assert read.exported["HCCL_CONNECT_TIMEOUT"] == "1500"
    assert "+ray_kwargs.ray_init.num_gpus=4" not in read.argv


@needs_upstream
@needs_bash
def test_grpo_gb200_sglang_variant(tmp_path: Path) -> None:
    data = (UPSTREAM / GRPO).read_bytes()
    b = bindings({"MACHINE": "gb200", "INFER_BACKEND": "sglang"})
    read = assert_same_as_bash(data, tmp_path, b, GRPO)
    assert "+ray_kwargs.ray_init.num_gpus=4" in read.argv
    sglang = "+actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=flashinfer"
    assert sglang in read.argv
    assert "trainer.n_gpus_per_node=4" in read.argv


@needs_upstream
@needs_bash
@pytest.mark.parametrize(
    "env",
    [{"INFER_BACKEND": "trtllm", "DEVICE": "npu"}, {"DEVICE": "tpu"}],
    ids=["trtllm-on-npu", "unknown-device"],
)
def test_grpo_exit_variant(env: dict[str, str], tmp_path: Path) -> None:
    data = (UPSTREAM / GRPO).read_bytes()
    b = bindings(env)
    oracle = run_bash(data, tmp_path, b.variables, b.substitutions, b.args)
    assert oracle.returncode == 1
    assert oracle.argv is None
    with pytest.raises(LaunchExited) as caught:
        read_launch(UPSTREAM / GRPO, b)
    assert caught.value.status == 1
    assert caught.value.line is not None
    assert str(caught.value).startswith(f"{UPSTREAM / GRPO}:{caught.value.line}: exit:")


@needs_upstream
def test_grpo_explicit_fields_are_what_hydra_receives() -> None:
    read = read_launch(UPSTREAM / GRPO, DEFAULT)
    argv = read.argv
    files = "'/home/verl/data/gsm8k/train.parquet', '/home/verl/data/math/train.parquet'"
    assert f"data.train_files=[{files}]" in argv
    assert "trainer.experiment_name=qwen3_8b_grpo_vllm_fsdp_20260101_0000" in argv
    assert 'trainer.logger=["console","wandb"]' in argv
    assert "data.truncation=error" in argv
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=2" in argv
    assert argv[0] == "algorithm.adv_estimator=grpo"
    assert dict(read.exported) == HOME
    launcher_line = next(
        number
        for number, text in enumerate((UPSTREAM / GRPO).read_text().splitlines(), 1)
        if text.startswith(LAUNCH)
    )
    assert read.line == launcher_line


@needs_upstream
def test_official_scripts_list_their_substitutions() -> None:
    found = command_substitutions(UPSTREAM / GRPO)
    assert [text for _, text in found] == [NPU_PROBE, DATE]
    lines = (UPSTREAM / GRPO).read_text().splitlines()
    for line, text in found:
        assert f"$({text})" in lines[line - 1]
    assert command_substitutions(UPSTREAM / "examples/rloo_trainer/run_qwen3_8b_fsdp.sh") == []


@needs_upstream
def test_unbound_probe_is_reported_not_run() -> None:
    with pytest.raises(LaunchReadError) as caught:
        read_launch(UPSTREAM / GRPO, Bindings(variables=HOME))
    err = caught.value
    # The probe's output is a run-time value: assigned on line 19, refused where `case` needs it.
    assert (err.construct, err.line) == ("run-time value", 53)
    assert NPU_PROBE in err.detail and "--subst" in err.detail and "(line 19)" in err.detail
    # With DEVICE bound, bash never evaluates the probe, so it needs no binding.
    read = read_launch(
        UPSTREAM / GRPO, Bindings(variables={**HOME, "DEVICE": "gpu"}, substitutions={DATE: "x"})
    )
    assert "trainer.experiment_name=qwen3_8b_grpo_vllm_fsdp_x" in read.argv


# --------------------------------------------------------------------------- hostile scripts

HOSTILE = {
    "eval": ('eval "touch SOMEFILE"\n', 1, "eval"),
    # The folder bash starts in is unknown, so is the file; /etc is outside the script's.
    "source": ("source ./x.sh\n", 1, "run-time value"),
    "dot": (". /etc/passwd\n", 1, "source"),
    "process-subst": (f"cat <({LAUNCH} b=2)\n", 1, "launcher"),
    "exec": ("exec bash -c 'touch SOMEFILE'\n", 1, "bash -c"),
    "function": ("python3() { touch SOMEFILE; }\n", 1, "function definition"),
    "here-string": (f'{LAUNCH} <<< "x"\n', 1, "here-string"),
    "here-doc": (f"{LAUNCH} <<EOF\nx\nEOF\n", 1, "here-document"),
    "trap": ("trap 'touch SOMEFILE' DEBUG\n", 1, "trap DEBUG"),
    "alias": ("alias python3='touch SOMEFILE'\n", 1, "alias"),
    "coproc": ("coproc touch SOMEFILE\n", 1, "coproc"),
    "while": ("while true; do touch SOMEFILE; done\n", 1, "while loop"),
    "bash-c": (f"bash -c '{LAUNCH} a=1'\n", 1, "indirect launcher"),
    "read": ("read X < /etc/passwd\n", 1, "read"),
    "declare-i": ("declare -i N=1+1\n", 1, "declare -i"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_script_is_rejected_without_side_effects(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body, line, construct = HOSTILE[name]
    script = tmp_path / "run.sh"
    script.write_text(f"{body}{LAUNCH} a=1\n")
    (tmp_path / "x.sh").write_text("touch SOMEFILE\n")
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(LaunchReadError) as caught:
        read_launch("run.sh", DEFAULT)
    err = caught.value
    assert not isinstance(err, LaunchExited)
    assert (err.path, err.line, err.construct) == ("run.sh", line, construct)
    assert str(err).startswith(f"run.sh:{line}: {construct}: ")
    assert sorted(os.listdir(tmp_path)) == before
    assert not (tmp_path / "SOMEFILE").exists()


UNBOUND_SUBSTITUTIONS = {
    "dollar-subst": ("X=$(touch SOMEFILE)\n", 1),
    "backticks": ("echo start\nX=`touch SOMEFILE`\n", 2),
    "passwd": ("\nX=$(cat /etc/passwd)\n", 2),
}


@pytest.mark.parametrize("name", sorted(UNBOUND_SUBSTITUTIONS))
def test_unbound_substitution_is_a_run_time_value_never_run(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unused, it reads (bash doesn't care); passed to the launcher, it is refused there."""
    body, line = UNBOUND_SUBSTITUTIONS[name]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.sh").write_text(f"{body}{LAUNCH} a=1\n")
    assert read_launch("run.sh", DEFAULT).argv == ("a=1",)
    (tmp_path / "run.sh").write_text(f"{body}{LAUNCH} a=$X\n")
    with pytest.raises(LaunchReadError) as caught:
        read_launch("run.sh", DEFAULT)
    launcher = body.count("\n") + 1
    assert (caught.value.line, caught.value.construct) == (launcher, "run-time value")
    assert f"(line {line}) reaches the launcher's argv on line {launcher}" in str(caught.value)
    assert os.listdir(tmp_path) == ["run.sh"]


def test_bound_substitution_is_never_executed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    b = Bindings(substitutions={"touch SOMEFILE": "made\n\n"})
    read = read_launch_text(f"X=$(touch SOMEFILE)\n{LAUNCH} x=$X\n", b)
    assert read.argv == ("x=made",)
    assert os.listdir(tmp_path) == []


def test_unbound_substitution_message_names_file_line_and_text() -> None:
    script = "A=1\n\nSTAMP=$(date)\n"
    assert read_launch_text(script + f"{LAUNCH}\n", Bindings(), path="run.sh").argv == ()
    with pytest.raises(LaunchReadError) as caught:
        read_launch_text(script + f"{LAUNCH} x=$STAMP\n", Bindings(), path="run.sh")
    assert str(caught.value) == (
        "run.sh:4: run-time value: $(date) (line 3) reaches the launcher's argv on line 4, but "
        "is only known when the script runs; bind it: --subst 'date' OUTPUT "
        "(environment.substitutions in the manifest)"
    )
    with pytest.raises(LaunchReadError) as caught:
        read_launch_text(f"{LAUNCH} `hostname -f`\n", Bindings(), path="run.sh")
    assert "`hostname -f`" in str(caught.value)
    assert caught.value.line == 1


# --------------------------------------------------------------------------- constructs vs bash

CONSTRUCTS: dict[str, tuple[str, dict[str, str], tuple[str, ...]]] = {
    "assignments-and-export": (
        """
        A=1
        export B=2 C
        C=3
        export D
        E=5; export E
        F=6 G=$F
        export -n E
        LAUNCH "$A" "$B" "$C" "$G" "${D-unset}"
        """,
        {},
        (),
    ),
    "append-strings-and-arrays": (
        """
        S=a; S+=b; S+="$S"
        A=(x "y z"); A+=(w); A+=("$S" '')
        N+=new
        LAUNCH "${A[@]}" "${#A[@]}" $S "$N"
        """,
        {},
        (),
    ),
    "array-expansions": (
        """
        A=("a b" c "")
        E=()
        LAUNCH ${A[@]} "${A[*]}" ${A[*]} "${A[1]}" ${A} "${E[@]}" x"${E[@]}"y ${#A[@]} ${#A}
        """,
        {},
        (),
    ),
    "array-indices": (
        """
        A=([2]=b [0]=a c)
        A[5]=f
        A[1]+=+
        B=scalar
        B+=(more)
        LAUNCH "${A[@]}" ${#A[@]} "${A[2]}" "${A[-1]}" "${B[@]}" "${B[0]}"
        """,
        {},
        (),
    ),
    "list-operators-under-set-u": (
        """
        set -u
        E=()
        N=("")
        A=("a b" c)
        LAUNCH "${E[@]:-d}" . ${E[@]+"${E[@]}"} . "${N[@]:+p}" . "${N[@]-d}" . "${A[@]:-d}" \\
            . "${A[*]:+p}" . "${@:-none}" . ${*-q} . x"${E[@]:+p}"y . "${U[@]:-unset}"
        """,
        {},
        ("", ""),
    ),
    "parameter-defaults": (
        """
        X=
        Y=v
        LAUNCH "${X:-d1}" "${X-d2}" "${Z-d3}" "${Y:+alt}" "${X:+alt}" "${X+set}" "${Z+set}" \\
            "${Y:=no}" "${W:=assigned}" "$W" ${#Y} ${#W} "${X:=filled}" "$X" ${Z:-}
        """,
        {},
        (),
    ),
    "nested-default-words": (
        """
        LAUNCH ${N:-$((1024 * 2))} "${M:-$(date +%Y%m%d_%H%M)}" ${Q:-"a b"} ${R:-a b} \\
            "${S:-'quoted'}" ${T:-x\\ y} ${U:-${V:-deep}} "${W:-"$HOME"/x}" ${X:-~/tilde} "${Y:-~}"
        """,
        {},
        (),
    ),
    "quoting": (
        r"""
        X=val
        LAUNCH 'single $X' "double $X" $'tab\there' $'nl\nx\x41\101\c[' "esc \$ \" \\ \` \q" \
            a\ b "a"'b'c $"locale" '' "" \$X "a\
        b"
        """,
        {},
        (),
    ),
    "word-splitting": (
        """
        X="  a   b  "
        T=$'x\\ty\\nz'
        E=
        LAUNCH $X "$X" $T pre$X post $E "$E" $E$E "" x$E
        """,
        {},
        (),
    ),
    "glob-characters-stay-literal": (
        """
        X='*.nothing'
        Y='q?z'
        LAUNCH $X $Y no[match] 'lit*' "data.files=[a,b]" data.files=[a,b] nothing*here
        """,
        {},
        (),
    ),
    "arithmetic": (
        """
        A=7; B=3; C=-7
        LAUNCH $((A + B)) $((A - B)) $((A * B)) $((A / B)) $((A % B)) $((C / B)) $((C % B)) \\
            $(( (A + 1) * 2 )) $((A > B)) $((A == 7 && B != 3)) $((A || 0)) $((A, B)) \\
            $((2 ** 10)) $((0x10 + 010 + 2#101)) $((A++)) $A $((++A)) $((A += 2)) \\
            $((1 << 4 >> 1)) $((A < B ? 1 : 0)) $((-A)) $((!A)) $((~A)) $(( $B * 2 )) \\
            $((A <= 10)) $((A >= 10)) $((B & 1)) $((B | 4)) $((B ^ 1)) $((U)) \\
            $((9223372036854775807 + 1)) $((-9223372036854775807 - 1)) $((7 ** 40))
        """,
        {},
        (),
    ),
    "case-nested-and-globs": (
        """
        D=npu; M=gb200
        case "$D" in
            gpu | npu)
                case $M in
                    gb*) R=blackwell ;;
                    *) R=other ;;
                esac
                ;;
            *) R=none ;;
        esac
        case x.txt in *.sh) T=sh ;; *.t?t) T=txt ;; esac
        case ab in [a-c]b) U=range ;; *) U=no ;; esac
        case "*" in "*") V=star ;; esac
        case a in [!b]) W=neg ;; esac
        case "a*" in a\\*) Q=escaped ;; esac
        case 5 in [[:digit:]]) K=class ;; esac
        case z in a) ;& z) F=first ;& y) F+=-fell ;; x) F=no ;; esac
        case nothing in a) N=matched ;; esac
        LAUNCH $R $T $U $V $W $Q $K $F "${N-none}"
        """,
        {},
        (),
    ),
    "if-and-tests": (
        """
        set -euo pipefail
        X=npu; N=5; E=
        if [ "$X" = gpu ]; then a=1; elif [ "$X" == npu ] && [ -n "$X" ]; then a=2; else a=3; fi
        if [[ $N -gt 3 && $N -le 5 ]]; then b=yes; else b=no; fi
        if ! [ -z "$E" ] || [[ $X != n* ]]; then c=1; else c=0; fi
        if [ "$N" -eq 5 -a "$X" != gpu ]; then d=1; else d=0; fi
        [[ -z $E ]] && e=empty || e=nonempty
        [ "$N" -lt 2 ] && f=small || f=big
        if [[ $X == "n*" ]]; then g=literal; else g=pattern; fi
        if [ $N -ne 5 ]; then h=1; else h=0; fi
        if [ $N -ge 5 ] && [ $N -le 5 ] && [ $N -gt 4 ] && [ $N -lt 6 ]; then i=1; fi
        if [[ ! -n $E && ( $X == npu || $X == gpu ) ]]; then j=1; fi
        if [ ! "$X" = gpu ]; then k=1; fi
        if [[ a < b ]] && [ b \\> a ]; then l=1; fi
        if [ "$E" ]; then m=1; else m=0; fi
        if [ -n "$X" -o -z "$X" ] && [ \\( "$N" = 5 \\) ]; then o=1; fi
        if (( N > 4 )); then p=1; fi
        if [[ -v X && ! -v NOPE ]]; then q=1; fi
        if [ abc ]; then r=1; fi
        LAUNCH $a $b $c $d $e $f $g $h $i $j $k $l $m $o $p $q $r
        """,
        {},
        (),
    ),
    "set-u-with-defaults": (
        """
        set -xeuo pipefail
        X=${X:-d}
        E=()
        LAUNCH "$X" "${Y-}" "$@" "${E[@]}" "${U[@]}" ${#E[@]} "${Z:-}" $#
        """,
        {},
        (),
    ),
    "continuations-and-comments": (
        """
        # leading comment
        X=1 # trailing comment
        LAUNCH \\
            a=$X \\
            b=2 # not an argument
        # after
        """,
        {},
        (),
    ),
    "positional-parameters": (
        """
        LAUNCH "$@" $@ $# "$1" "${2}" "$*" $* "${3:-third}" "x$@y" "${@}"
        """,
        {},
        ("a b", "c", ""),
    ),
    "true-colon-and-skipped-commands": (
        """
        set -euo pipefail
        : && A=1 || A=2
        true && B=1
        echo hi >/dev/null && C=1 || C=2
        mkdir -p nested/dir 2>/dev/null || true
        printf '%s' x >&2
        ulimit -n 1024 2>/dev/null || :
        cd . && D=ok
        echo x | cat >/dev/null
        LAUNCH $A $B $C $D
        """,
        {},
        (),
    ),
    "brace-expansion": (
        """
        LAUNCH a{b,c}d {1..3} {a..e..2} {01..3} x{,y} {a}b "{q,r}" \\{s,t} {5..1..2} \\
            pre{x,{y,z}}post {a,b}{1,2} {,} {-01..1} {a..c}{$HOME,x} {}
        """,
        {},
        (),
    ),
    "tilde": (
        """
        Q=~/q:~/r
        LAUNCH ~ ~/x a=~/y "~" x.y=~/z P=a:~/b "$Q" \\~ ~"/quoted"
        """,
        {},
        (),
    ),
    "pattern-operators": (
        """
        X=Qwen/Qwen3-8B/extra
        Y=MiXeD
        LAUNCH ${X#*/} ${X##*/} ${X%/*} ${X%%/*} ${X/Qwen/Q} ${X//Qwen/Q} ${X:1:3} ${X: -5} \\
            ${X:4} ${Y^^} ${Y,,} ${Y^} ${Y,} ${X/#Qwen/L} ${X/%extra/E} "${X//[0-9]/#}" \\
            ${X/Qwen/[&]} ${X#"Qwen"} ${X%%"/"*}
        """,
        {},
        (),
    ),
    "last-launcher-wins": (
        """
        LAUNCH first
        if true; then
            LAUNCH second "$1"
        fi
        if false; then LAUNCH never; fi
        """,
        {},
        ("arg",),
    ),
    "python-and-prefix-assignment": (
        """
        export KEEP=1
        TMP=zz echo no
        FOO=bar HOME=/elsewhere python -m verl.trainer.main_ppo "$HOME" "${TMP-unset}"
        """,
        {},
        (),
    ),
    "for-loop": (
        """
        A=()
        for x in a "b c" d {1..2}; do
            if [ "$x" = d ]; then continue; fi
            A+=("--$x")
        done
        for y; do B=$y; done
        for z in 1 2 3; do C=$z; [ $z = 2 ] && break; done
        LAUNCH "${A[@]}" "$B" "$C" "$x"
        """,
        {},
        ("p", "q"),
    ),
    "errexit-exemptions": (
        """
        set -e
        false || true
        [ 1 = 2 ] && X=1
        if false; then :; fi
        ! true
        X=${X:-ok}
        LAUNCH $X
        """,
        {},
        (),
    ),
    "subshell-and-pipeline": (
        """
        X=1
        (X=2; export Y=3)
        { Z=4; }
        echo a | W=5
        LAUNCH $X ${Y:-unset} $Z ${W:-unset}
        """,
        {},
        (),
    ),
    "declarations": (
        """
        declare -a A=(1 2)
        declare -x E=1
        declare G=g
        readonly R=r
        typeset -g T=t
        declare -r RO=ro
        export P="p q"
        LAUNCH "${A[@]}" $E $G $R $T $RO
        """,
        {},
        (),
    ),
    "unset-shift-set": (
        """
        set -- a b c
        shift
        X=1
        unset X
        A=(1 2 3)
        unset 'A[1]'
        LAUNCH "$@" ${X:-gone} "${A[@]}" $#
        """,
        {},
        ("ignored",),
    ),
    "status-variable": (
        """
        false
        S=$?
        [ 1 = 2 ]
        T=$?
        [ 1 = 1 ]
        LAUNCH $S $T $?
        """,
        {},
        (),
    ),
    "heredoc-to-skipped-command": (
        """
        X=1
        cat > /dev/null <<EOF
        $HOME ${Y:=from_heredoc}
        EOF
        cat > /dev/null <<'EOF'
        $NOT_EXPANDED
        EOF
        LAUNCH $X $Y
        """,
        {},
        (),
    ),
    "allexport": (
        """
        set -a
        A=1
        set +a
        B=2
        LAUNCH $A $B
        """,
        {},
        (),
    ),
    "environment-bindings": (
        """
        set -u
        LAUNCH "$MODEL_PATH" "${NNODES:-1}" "${EMPTY:-default}" "${EMPTY-kept}"
        """,
        {"MODEL_PATH": "/models/q w", "NNODES": "2", "EMPTY": ""},
        (),
    ),
}


@needs_bash
@pytest.mark.parametrize("name", sorted(CONSTRUCTS))
def test_construct_matches_bash(name: str, tmp_path: Path) -> None:
    script, env, args = CONSTRUCTS[name]
    text = textwrap.dedent(script).lstrip("\n").replace("LAUNCH", LAUNCH)
    b = bindings(env, args)
    work = tmp_path / "work"
    work.mkdir()
    assert_same_as_bash(text.encode(), work, b, "construct.sh")


def read(
    script: str, env: Mapping[str, str] | None = None, args: tuple[str, ...] = ()
) -> LaunchRead:
    """Read a dedented snippet where LAUNCH stands for the launcher words."""
    text = textwrap.dedent(script).lstrip("\n").replace("LAUNCH", LAUNCH)
    return read_launch_text(text, bindings(env, args), path="t.sh")


def test_explicit_values_of_common_constructs() -> None:
    got = read(
        """
        A=(x "y z"); A+=(w)
        S=a; S+=b
        LAUNCH "${A[@]}" ${#A[@]} $S ${N:-$((1024 * 2))} trainer.logger='["console","wandb"]'
        """
    )
    assert got.argv == ("x", "y z", "w", "3", "ab", "2048", 'trainer.logger=["console","wandb"]')
    assert got.line == 3
    assert read("X='a  b'\nLAUNCH $X \"$X\"\n").argv == ("a", "b", "a  b")
    assert read("LAUNCH ${A:-1} {1..3}\n").argv == ("1", "1", "2", "3")
    assert read("LAUNCH $(( (2 + 3) * 4 % 7 ))\n").argv == ("6",)
    assert read("case b in a|b) X=ab ;; *) X=other ;; esac\nLAUNCH $X\n").argv == ("ab",)
    assert read("LAUNCH x\nexit 3\n").argv == ("x",)


def test_exported_variables_are_sorted_and_include_prefix_assignments() -> None:
    got = read("export Z=1 A=2\nB=3 LAUNCH\n", env={"M": "m"})
    assert list(got.exported.items()) == [
        ("A", "2"),
        ("B", "3"),
        ("HOME", "/home/verl"),
        ("M", "m"),
        ("Z", "1"),
    ]


# --------------------------------------------------------------------------- errors


@needs_bash
@pytest.mark.parametrize(
    ("script", "construct", "line", "needle"),
    [
        ("set -u\nX=1\nLAUNCH $NOPE\n", "unbound variable", 3, "NOPE"),
        ("set -euo pipefail\nY=${MISSING}\nLAUNCH\n", "unbound variable", 2, "MISSING"),
        ("set -u\nLAUNCH $((COUNT + 1))\n", "unbound variable", 2, "COUNT"),
        ('set -u\nLAUNCH "$1"\n', "unbound variable", 2, "$1"),
        ("X=${X:?need X set}\nLAUNCH\n", "parameter check", 1, "need X set"),
        ("E=\n: ${E:?}\nLAUNCH\n", "parameter check", 2, "parameter null or not set"),
    ],
)
def test_errors_where_bash_aborts(
    script: str, construct: str, line: int, needle: str, tmp_path: Path
) -> None:
    text = script.replace("LAUNCH", LAUNCH)
    oracle = run_bash(text.encode(), tmp_path, HOME, {})
    assert oracle.argv is None and oracle.returncode != 0
    with pytest.raises(LaunchReadError) as caught:
        read_launch_text(text, bindings(), path="t.sh")
    err = caught.value
    assert (err.construct, err.line) == (construct, line)
    assert needle in str(err)
    assert str(err).startswith(f"t.sh:{line}: {construct}: ")


@needs_bash
@pytest.mark.parametrize(
    ("script", "status"),
    [
        ("X=1\nif [ $X = 1 ]; then exit 3; fi\nLAUNCH\n", 3),
        ("set -e\n[ 1 = 2 ]\nLAUNCH\n", 1),
        ("set -e\nX=0\n(( X++ ))\nLAUNCH\n", 1),
        ("set -e\nfalse\nLAUNCH\n", 1),
        ("false\nexit\nLAUNCH\n", 1),
        ("exit 258\nLAUNCH\n", 2),
        ("set -eo pipefail\nfalse | true\nLAUNCH\n", 1),
    ],
)
def test_exit_before_launcher(script: str, status: int, tmp_path: Path) -> None:
    text = script.replace("LAUNCH", LAUNCH)
    oracle = run_bash(text.encode(), tmp_path, HOME, {})
    assert oracle.argv is None and oracle.returncode == status
    with pytest.raises(LaunchExited) as caught:
        read_launch_text(text, bindings())
    assert caught.value.status == status


@pytest.mark.parametrize(
    ("script", "construct", "line"),
    [
        ("echo hi\n", "no launcher", None),
        ("if false; then LAUNCH; fi\n", "no launcher", None),
        ("if then\n", "syntax error", 1),
        ('X=1\nLAUNCH "unterminated\n', "syntax error", 2),
        ("for ((i=0; ; i++)); do :; done\n", "for ((...)) loop", 1),
        ("until false; do :; done\n", "until loop", 1),
        ("LAUNCH $PWD\n", "run-time value", 1),
        ("LAUNCH ${BASH_ARGV[0]}\n", "bash variable", 1),
        ("if [ -f /etc/passwd ]; then X=1; fi\n", "test -f", 1),
        ("R='\\<b'\n[[ x =~ $R ]]\n", "[[ =~ ]]", 2),
        ("LAUNCH ${!X}\n", "parameter expansion", 1),
        ("LAUNCH $$\n", "run-time value", 1),
        ("set -u\nLAUNCH $!\n", "unbound variable", 2),
        ("IFS=$PWD\nLAUNCH a\n", "run-time value", 2),
        ("readonly R=1\nR=2\n", "assignment", 2),
        ("shopt -s nullglob\n", "shopt", 1),
        ("local x=1\n", "local", 1),
        ("/usr/bin/env bash -c 'python3 -m verl.trainer.main_ppo a=1'\n", "env bash", 1),
        ("LAUNCH $((1 / 0))\n", "arithmetic", 1),
        ("X='1+2'\nLAUNCH $((X * 2))\n", "arithmetic", 2),
        ("LAUNCH @(a|b)\n", "extended glob", 1),
        ("LAUNCH {1..200000}\n", "brace expansion", 1),
        ("cat <(LAUNCH a=1)\n", "launcher", 1),
        ("set -n\nLAUNCH\n", "set -n", 1),
        ("break\n", "break", 1),
        ("LAUNCH ~nobody\n", "tilde expansion", 1),
    ],
)
def test_rejected_constructs(script: str, construct: str, line: int | None) -> None:
    text = script.replace("LAUNCH", LAUNCH)
    with pytest.raises(LaunchReadError) as caught:
        read_launch_text(text, bindings(), path="t.sh")
    err = caught.value
    assert (err.construct, err.line) == (construct, line)
    where = "t.sh" if line is None else f"t.sh:{line}"
    assert str(err).startswith(f"{where}: {construct}: ")


def test_missing_file_is_a_read_error(tmp_path: Path) -> None:
    with pytest.raises(LaunchReadError) as caught:
        read_launch(tmp_path / "absent.sh", DEFAULT)
    assert caught.value.construct == "read"


def test_command_substitutions_lists_outermost_in_order() -> None:
    script = 'A=$(date)\nB="x`id -u`" C=${C:-$(nproc --all)}\nD=$(echo $(inner))\n'
    assert command_substitutions("t.sh", text=script) == [
        (1, "date"),
        (2, "id -u"),
        (2, "nproc --all"),
        (3, "echo $(inner)"),
    ]


def test_results_and_errors_pickle_round_trip() -> None:
    import pickle

    got = read_launch_text(f"export A=1\n{LAUNCH} x\n", DEFAULT)
    assert pickle.loads(pickle.dumps(got)) == got

    err = LaunchExited("a.sh", 3, 1)
    back = pickle.loads(pickle.dumps(err))
    assert (back.status, str(back)) == (1, str(err))
    plain = LaunchReadError("a.sh", None, "no launcher", "none")
    assert str(pickle.loads(pickle.dumps(plain))) == "a.sh: no launcher: none"


# --------------------------------------------------------------------------- property

TOKENS = [
    "$(",
    ")",
    "${",
    "}",
    "X=",
    "A=(",
    f"{LAUNCH} ",
    "\n",
    "'",
    '"',
    "`",
    "case $X in ",
    "a|b) ",
    ";;",
    "esac",
    "if ",
    "then ",
    "else ",
    "fi",
    "[[ ",
    " ]]",
    "[ ",
    " ]",
    "$((",
    "))",
    "{a,b}",
    "{1..3}",
    "~",
    "set -u\n",
    "set -e\n",
    "exit 1\n",
    "for i in 1 2; do ",
    "done",
    "${A[@]}",
    "$@",
    "&&",
    "||",
    "|",
    ";",
    "#",
    "\\",
    "<<<",
    "${X:-",
    "${X#",
    "${X/",
    "$X",
    " ",
    "=",
    "-eq",
    "!",
    "*",
    "?",
    "[",
]


@settings(
    max_examples=100,
    deadline=1000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(st.one_of(st.sampled_from(TOKENS), st.text(max_size=4)), max_size=40).map("".join))
def test_garbage_yields_a_read_or_a_read_error(text: str) -> None:
    try:
        result = read_launch_text(text, DEFAULT)
    except LaunchReadError as err:
        assert isinstance(str(err), str)
    else:
        assert isinstance(result, LaunchRead)
        assert all(isinstance(field, str) for field in result.argv)


WORD_PIECES = [
    "a",
    "b",
    '"b c"',
    '"$X"',
    "$X",
    "${X:-d e}",
    '"${A[@]}"',
    "${A[@]}",
    "$@",
    '"$@"',
    "'q r'",
    "\\ ",
    "{",
    "}",
    ",",
    "..",
    "1",
    "~",
    "=",
    ":",
    "/",
    "$((1+2))",
    '""',
    "$E",
    '"$E"',
    "${#X}",
    "${X#*a}",
    "$'\\t'",
    '"${E:+y}"',
    '"${A[*]}"',
    "$*",
    "${X// /_}",
    "${U:-~/h}",
    "{a,b}",
    "{1..3}",
]
PRELUDE = 'X=" a  b "; E=; A=("p q" "" r)\n'


@needs_bash
@settings(
    max_examples=25,
    deadline=None,  # each example runs bash; a loaded machine must not fail the test
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    words=st.lists(
        st.lists(st.sampled_from(WORD_PIECES), min_size=1, max_size=4).map("".join),
        min_size=1,
        max_size=4,
    ),
    context=st.sampled_from(["args", "assign", "array"]),
)
def test_random_words_expand_like_bash(
    words: list[str], context: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    line = " ".join(words)
    if context == "args":
        body = f"{LAUNCH} {line}\n"
    elif context == "assign":
        body = f'V={words[0]}\n{LAUNCH} "$V"\n'
    else:
        body = f'B=({line})\n{LAUNCH} "${{B[@]}}"\n'
    text = PRELUDE + body
    b = Bindings(variables=HOME, args=("1 2", "", "3"))
    try:
        got = read_launch_text(text, b)
    except LaunchReadError as err:
        # Refusals these pieces can reach: `~user` needs the password database, and shfmt
        # rejects a few words bash accepts (such as the array element `=`).
        assert err.construct in ("tilde expansion", "syntax error"), str(err)
        return
    oracle = run_bash(text.encode(), tmp_path_factory.mktemp("words"), b.variables, {}, b.args)
    assert got.argv == oracle.argv
