"""Hostile launch scripts: each one is read, never run, and gives bash's argv or a one-line refusal.

Every script carries the canary's payload where an attacker would put code. Each case goes
through the public reader API (``read_launch`` on the file and ``read_launch_text`` on its text)
and through the CLI (``verl-compat read SCRIPT``: its ``main`` in a child process forked from a
server that imported it once, ``cli_child``); the verdict is either a refusal naming the script,
the line and the construct, or an argv (or an exit) that real bash gives too (checked with the
oracle, which runs bash on an instrumented copy). The CLI runs first and with a timeout and a
memory cap, so a reader that hangs on a FIFO or reads /dev/zero fails the test instead of taking
the machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import cli_child
import pytest
from bash_oracle import BASH, ENV, run_bash
from hostile_canary import Canary

import pytest_verl_compat.bash.parse as bash_parse
from pytest_verl_compat.bash import (
    LaunchExited,
    LaunchRead,
    LaunchReadError,
    read_launch,
    read_launch_text,
)
from pytest_verl_compat.model import Bindings

LAUNCH = "python3 -m verl.trainer.main_ppo"
HOME = {"HOME": "/home/verl"}
BIG = "9" * 5000  # past Python's 4300-digit limit for int(str)
CLI_TIMEOUT = 120
CLI_MEMORY = 4 << 30

needs_bash = pytest.mark.skipif(BASH is None or ENV is None, reason="bash/env not available")


@dataclass(frozen=True)
class Refused:
    """The reader refuses: ``file:line: construct: ...`` (line None: the file as a whole)."""

    line: int | None
    construct: str


@dataclass(frozen=True)
class Reads:
    """The reader gives this argv, and so does bash."""

    argv: tuple[str, ...]


@dataclass(frozen=True)
class Exits:
    """The script exits with this status before the launcher, in bash and in the reader."""

    line: int
    status: int


Verdict = Refused | Reads | Exits


@dataclass(frozen=True)
class Case:
    script: str  # dedented; LAUNCH, PAYLOAD and BIG are replaced; bytes via latin-1 if raw
    verdict: Verdict
    env: Mapping[str, str] = field(default_factory=dict)
    raw: bool = False  # the script is bytes (written as latin-1), not UTF-8 text
    # Bash itself runs the payload (the code of an EXIT trap): the oracle fires the canary.
    bash_runs_payload: bool = False


def _case(script: str, verdict: Verdict, **kw: object) -> Case:
    return Case(textwrap.dedent(script).lstrip("\n"), verdict, **kw)  # type: ignore[arg-type]


CASES: dict[str, Case] = {
    # ----------------------------------------------------------- builtins behind wrappers
    "builtin-eval": _case('builtin eval "PAYLOAD"\nLAUNCH a=1\n', Refused(1, "builtin eval")),
    "command-eval": _case('command eval "PAYLOAD"\nLAUNCH a=1\n', Refused(1, "command eval")),
    "command-p-eval": _case(
        'command -p eval "PAYLOAD"\nLAUNCH a=1\n', Refused(1, "command -p eval")
    ),
    "builtin-builtin-eval": _case(
        'builtin builtin eval "PAYLOAD"\nLAUNCH\n', Refused(1, "builtin builtin eval")
    ),
    "builtin-command-eval": _case(
        'X=1\nbuiltin command -- eval "PAYLOAD"\nLAUNCH\n', Refused(2, "builtin command eval")
    ),
    "quoted-builtin-eval": _case(
        '"builtin" \\eval "PAYLOAD"\nLAUNCH\n', Refused(1, "builtin eval")
    ),
    "expanded-builtin-eval": _case(
        'B=built; E=ev\n${B}in ${E}al "PAYLOAD"\nLAUNCH\n', Refused(2, "builtin eval")
    ),
    # /dev/stdin is outside the script's folder: `source` reads no file there.
    "builtin-source-stdin": _case(
        'builtin source /dev/stdin <<< "PAYLOAD"\nLAUNCH\n', Refused(1, "source")
    ),
    "command-dot-stdin": _case(
        "command . /dev/stdin <<EOF\nPAYLOAD\nEOF\nLAUNCH\n", Refused(1, "source")
    ),
    "builtin-read": _case('builtin read -r X <<< "PAYLOAD"\nLAUNCH "$X"\n', Reads(("PAYLOAD",))),
    # bash runs the EXIT trap's code (the reader reads it and skips the program it names).
    "builtin-trap": _case(
        "builtin trap 'PAYLOAD' EXIT\nLAUNCH\n", Reads(()), bash_runs_payload=True
    ),
    "command-alias": _case(
        "command alias python3='PAYLOAD;'\nLAUNCH\n", Refused(1, "command alias")
    ),
    "builtin-enable": _case(
        "builtin enable -f ./evil.so python3\nLAUNCH\n", Refused(1, "builtin enable")
    ),
    "command-exec": _case('command exec bash -c "PAYLOAD"\nLAUNCH\n', Refused(1, "command exec")),
    "builtin-exec-launcher": _case("builtin exec LAUNCH a='PAYLOAD'\n", Refused(1, "builtin exec")),
    "builtin-mapfile": _case(
        'builtin mapfile -t A <<< "PAYLOAD"\nLAUNCH "${A[@]}"\n', Reads(("PAYLOAD",))
    ),
    # ----------------------------------------------------------- sourced files, traps, input
    "source-etc": _case("source /etc/profile\nLAUNCH\n", Refused(1, "source")),
    "source-outside-script-folder": _case(
        '. "$(dirname "$0")/../evil"\nLAUNCH\n', Refused(1, "source")
    ),
    "source-run-time-name": _case('source "$(PAYLOAD)"\nLAUNCH\n', Refused(1, "run-time value")),
    "source-process-substitution": _case(
        "source <(echo 'PAYLOAD')\nLAUNCH\n", Refused(1, "run-time value")
    ),
    "trap-debug": _case("trap 'PAYLOAD' DEBUG\nLAUNCH\n", Refused(1, "trap DEBUG")),
    "trap-return": _case("trap 'PAYLOAD' RETURN EXIT\nLAUNCH\n", Refused(1, "trap RETURN")),
    "trap-run-time-code": _case('trap "$(PAYLOAD)" EXIT\nLAUNCH\n', Refused(1, "run-time value")),
    "trap-exit-launcher": _case(
        "trap 'LAUNCH b=PAYLOAD' EXIT\nLAUNCH a=1\n", Refused(1, "trap EXIT")
    ),
    "trap-err-launcher": _case(
        "trap 'LAUNCH b=PAYLOAD' ERR\nfalse\nLAUNCH a=1\n", Refused(1, "trap ERR")
    ),
    "process-substitution-launcher": _case(
        "cat <(LAUNCH b='PAYLOAD')\nLAUNCH a=1\n", Refused(1, "launcher")
    ),
    "process-substitution-bash": _case(
        "exec > >(bash -c 'PAYLOAD')\nLAUNCH\n", Refused(1, "bash -c")
    ),
    "heredoc-loop-into-launcher": _case(
        'while read -r x; do\n  LAUNCH "$x"\ndone <<EOF\nPAYLOAD\nEOF\n',
        Refused(2, "here-document"),
    ),
    "read-a-file": _case('read -r X < /etc/hostname\nLAUNCH "$X"\n', Refused(1, "read")),
    "read-standard-input": _case('read -r X\nLAUNCH "$X" PAYLOAD\n', Refused(1, "read")),
    "ifs-run-time": _case("IFS=$(PAYLOAD)\nLAUNCH a b\n", Refused(2, "run-time value")),
    "assoc-run-time-key": _case(
        "declare -A M\nM[$(PAYLOAD)]=1\nLAUNCH\n", Refused(2, "run-time value")
    ),
    "indirect-run-time-name": _case('X=$(PAYLOAD)\nLAUNCH "${!X}"\n', Refused(2, "run-time value")),
    "exec-child-shell": _case("exec bash -c 'PAYLOAD'\nLAUNCH\n", Refused(1, "bash -c")),
    # ----------------------------------------------------------- input bash reads, never run
    "heredoc-read": _case(
        "read -r -d '' X <<'EOF' || true\nPAYLOAD\nEOF\nLAUNCH \"$X\"\n", Reads(("PAYLOAD",))
    ),
    "pipe-read-loop": _case(
        "printf '%s\\n' a 'PAYLOAD' | while read -r l; do echo \"$l\"; done > /dev/null\n"
        "LAUNCH b\n",
        Reads(("b",)),
    ),
    "process-substitution-read": _case(
        "mapfile -t L < <(printf '%s\\n' 'PAYLOAD' b)\nLAUNCH \"${L[@]}\"\n",
        Reads(("PAYLOAD", "b")),
    ),
    # ----------------------------------------------------------- which program `python3` is
    "hash-p-python3": _case("hash -p ./evil python3\nLAUNCH a=1\n", Refused(1, "hash -p")),
    "hash-p-python": _case(
        "hash -p ./evil python\npython -m verl.trainer.main_ppo a=1\n", Refused(1, "hash -p")
    ),
    "hash-rp": _case("hash -rp ./evil python3\nLAUNCH a=1\n", Refused(1, "hash -p")),
    "command-hash-p": _case(
        "command hash -p ./evil python3\nLAUNCH a=1\n", Refused(1, "command hash -p")
    ),
    "path-assignment": _case("PATH=./bin\nLAUNCH a=1\n", Refused(1, "PATH change")),
    "path-export": _case("X=1\nexport PATH=./bin\nLAUNCH a=1\n", Refused(2, "PATH change")),
    "path-declare-x": _case("declare -x PATH=./bin\nLAUNCH a=1\n", Refused(1, "PATH change")),
    "path-prefix": _case("PATH=./bin LAUNCH a=1\n", Refused(1, "PATH change")),
    "path-for-loop": _case(
        "for PATH in ./bin; do :; done\nLAUNCH a=1\n", Refused(1, "PATH change")
    ),
    "path-unset": _case("unset PATH\nLAUNCH a=1\n", Refused(1, "PATH change")),
    "path-prepend-bound": _case(
        'PATH="./bin:$PATH"\nLAUNCH a=1\n', Refused(1, "PATH change"), env={"PATH": "/usr/bin"}
    ),
    "path-in-branch": _case(
        'if [ "$X" = 1 ]; then PATH=./bin; fi\nLAUNCH a=1\n',
        Refused(1, "PATH change"),
        env={"X": "1"},
    ),
    # ----------------------------------------------------------- code fed to a child shell
    "pipe-into-bash": _case('echo "PAYLOAD" | bash\nLAUNCH\n', Refused(1, "bash stdin")),
    "heredoc-into-bash": _case("bash <<EOF\nPAYLOAD\nEOF\nLAUNCH\n", Refused(1, "bash stdin")),
    "herestring-into-sh": _case('sh -s <<< "PAYLOAD"\nLAUNCH\n', Refused(1, "sh stdin")),
    "pipe-into-command-p-sh": _case(
        'echo "PAYLOAD" | command -p sh\nLAUNCH\n', Refused(1, "sh stdin")
    ),
    "sh-c": _case('sh -c "PAYLOAD"\nLAUNCH\n', Refused(1, "sh -c")),
    "bash-ec": _case("bash -ec 'PAYLOAD'\nLAUNCH\n", Refused(1, "bash -c")),
    "bin-bash-script": _case("/bin/bash ./evil\nLAUNCH\n", Refused(1, "bash script")),
    "command-bash-c": _case('command bash -c "PAYLOAD"\nLAUNCH\n', Refused(1, "bash -c")),
    "nohup-bash-c": _case('nohup bash -c "PAYLOAD" &\nLAUNCH\n', Refused(1, "nohup bash")),
    "env-sh": _case('env -i FOO=1 sh -c "PAYLOAD"\nLAUNCH\n', Refused(1, "env sh")),
    "timeout-bash": _case("timeout 5 /usr/bin/bash ./evil\nLAUNCH\n", Refused(1, "timeout bash")),
    # ----------------------------------------------------------- bytes bash reads otherwise
    "crlf": _case("X='PAYLOAD'\r\nLAUNCH a=1\r\n", Refused(1, "carriage return")),
    "crlf-last-line": _case("X=1\nLAUNCH a=1\r\n", Refused(2, "carriage return")),
    "nul": _case("X='PAYLOAD'\0\nLAUNCH a=1\n", Refused(1, "NUL byte")),
    "nul-in-word": _case("X=1\nLAUNCH a=1\0b\n", Refused(2, "NUL byte")),
    "invalid-utf8": _case("X='PAYLOAD'\nY='\xff\xfe'\nLAUNCH\n", Refused(2, "encoding"), raw=True),
    # ----------------------------------------------------------- nesting and size
    "nested-parens": _case("(" * 100_000 + "PAYLOAD" + ")" * 100_000 + "\n", Refused(1, "nesting")),
    "nested-substitutions": _case(
        "X=" + "$(" * 100_000 + "PAYLOAD" + ")" * 100_000 + "\nLAUNCH\n", Refused(1, "nesting")
    ),
    "nested-blocks": _case(
        "{ " * 100_000 + "PAYLOAD; " + "}; " * 100_000 + "\nLAUNCH\n", Refused(1, "nesting")
    ),
    "nested-arithmetic": _case(
        "X=$((" + "(" * 300_000 + "1" + ")" * 300_000 + "))\nLAUNCH\n", Refused(1, "nesting")
    ),
    "nested-if": _case(
        "if true; then\n" * 9000 + "PAYLOAD\n" + "fi\n" * 9000 + "LAUNCH\n",
        Refused(None, "nesting"),
    ),
    "too-large": _case("# PAYLOAD\n" + "#" * (1 << 20) + "\nLAUNCH a=1\n", Refused(None, "size")),
    # ----------------------------------------------------------- huge integers (bash's values)
    "huge-arithmetic": _case("X=$((BIG))\nLAUNCH a=$X b='PAYLOAD'\n", Reads(("a=-1", "b=PAYLOAD"))),
    "huge-test-operand": _case(
        "[ BIG -eq 1 ] || X=big\nLAUNCH a=$X b='PAYLOAD'\n", Reads(("a=big", "b=PAYLOAD"))
    ),
    "huge-brace-sequence": _case("LAUNCH {1..BIG} 'PAYLOAD'\n", Reads(("{1..BIG}", "PAYLOAD"))),
    "huge-positional": _case(
        'LAUNCH "x${BIG}" "${#BIG}" \'PAYLOAD\'\n', Reads(("x", "0", "PAYLOAD"))
    ),
    "huge-array-index": _case("A[BIG & 3]=z\nLAUNCH ${A[@]} 'PAYLOAD'\n", Reads(("z", "PAYLOAD"))),
    "huge-exit": _case("X='PAYLOAD'\nexit BIG\nLAUNCH\n", Exits(2, 2)),
    "huge-brace-step": _case(
        "LAUNCH {1..3..-9223372036854775808} 'PAYLOAD'\n",
        Reads(("{1..3..-9223372036854775808}", "PAYLOAD")),
    ),
    # ----------------------------------------------------------- run-time values, never run
    "runtime-subst-moved-around": _case(
        'X=$(PAYLOAD)\nexport Y="$X/y"\necho "$X" > /dev/null\nLAUNCH a=1\n', Reads(("a=1",))
    ),
    "runtime-subst-to-launcher": _case(
        'X=$(PAYLOAD)\nLAUNCH a="$X"\n', Refused(2, "run-time value")
    ),
    "runtime-subst-command-name": _case(
        "$(PAYLOAD) -m verl.trainer.main_ppo a=1\nLAUNCH\n", Refused(1, "run-time value")
    ),
    "runtime-subst-word-run": _case('E=$(PAYLOAD)\n$E "x"\nLAUNCH\n', Refused(2, "run-time value")),
    "runtime-subst-nohup": _case("nohup $(PAYLOAD) &\nLAUNCH\n", Refused(1, "run-time value")),
    "runtime-subst-python-module": _case(
        "python3 -m $(PAYLOAD) a=1\nLAUNCH\n", Refused(1, "run-time value")
    ),
    "runtime-subst-case": _case(
        "case $(PAYLOAD) in *) :;; esac\nLAUNCH\n", Refused(1, "run-time value")
    ),
    "runtime-pwd-prefix": _case(
        "cd \"$PWD\"\nLAUNCH a=1 b='PAYLOAD'\n", Reads(("a=1", "b=PAYLOAD"))
    ),
    "runtime-values-many": _case(
        "for i in {1..1000}; do echo ${PWD}{1..200}; done\nLAUNCH 'PAYLOAD'\n", Refused(1, "limit")
    ),
    # ----------------------------------------------------------- glob backtracking
    "glob-backtracking-test": _case(
        "X=A9000\n[[ $X == *a*a*a*a*a*a*a*a*[b] ]] || Y=no\nLAUNCH a=$Y 'PAYLOAD'\n",
        Reads(("a=no", "PAYLOAD")),
    ),
    "glob-backtracking-case": _case(
        "X=A9000\ncase $X in *a*a*a*a*a*a*a*a*b) Y=yes ;; *) Y=no ;; esac\nLAUNCH a=$Y\n",
        Reads(("a=no",)),
    ),
    "glob-backtracking-replace": _case(
        "X=A9000\nY=${X//*a*a*a*a*a*b/z}\nLAUNCH ${#Y} 'PAYLOAD'\n", Reads(("9000", "PAYLOAD"))
    ),
    "glob-backtracking-suffix": _case(
        "X=A9000\nY=${X%%a*a*a*a*a*a*[b]}\nLAUNCH ${#Y} 'PAYLOAD'\n", Reads(("9000", "PAYLOAD"))
    ),
    # ----------------------------------------------------------- work bombs (each step is small)
    "copy-bomb": _case(
        "X=xxxxxxxxxx\nX=$X$X$X$X$X$X$X$X$X$X; X=$X$X$X$X$X$X$X$X$X$X; X=$X$X$X$X$X$X$X$X$X$X\n"
        "X=$X$X$X$X$X$X$X$X$X$X; X=$X$X$X$X$X$X$X$X$X$X\n"
        "for i in {1..99999}; do\n  [[ $X == *y* ]] || Y=$X\ndone\nLAUNCH 'PAYLOAD'\n",
        Refused(5, "limit"),
    ),
    "huge-shift": _case("shift BIG\nLAUNCH 'PAYLOAD'\n", Refused(1, "shift")),
    # ----------------------------------------------------------- wrapped builtins bash runs
    "builtin-set": _case("builtin set -- a 'PAYLOAD'\nLAUNCH \"$@\"\n", Reads(("a", "PAYLOAD"))),
    "command-set": _case("command set -- 'PAYLOAD'\nLAUNCH \"$1\"\n", Reads(("PAYLOAD",))),
    "builtin-shift": _case("set -- 'PAYLOAD' b\nbuiltin shift\nLAUNCH \"$@\"\n", Reads(("b",))),
    "builtin-unset": _case("X='PAYLOAD'\nbuiltin unset X\nLAUNCH \"x$X\"\n", Reads(("x",))),
    "builtin-false": _case(
        "builtin false || X=1\nLAUNCH a=$X 'PAYLOAD'\n", Reads(("a=1", "PAYLOAD"))
    ),
    "builtin-test": _case(
        "builtin test 1 -eq 2 || X=no\nLAUNCH a=$X 'PAYLOAD'\n", Reads(("a=no", "PAYLOAD"))
    ),
    "builtin-not-a-builtin": _case("builtin nope 'PAYLOAD'; X=$?\nLAUNCH a=$X\n", Reads(("a=1",))),
    "builtin-bad-option": _case("builtin -x eval 'PAYLOAD'; X=$?\nLAUNCH a=$X\n", Reads(("a=2",))),
    "builtin-launcher-is-no-builtin": _case(
        "builtin LAUNCH 'PAYLOAD'\nLAUNCH a=1\n", Reads(("a=1",))
    ),
    "builtin-exit": _case("X='PAYLOAD'\nbuiltin exit 3\nLAUNCH\n", Exits(2, 3)),
    "command-exit": _case("X='PAYLOAD'\ncommand -- exit 4\nLAUNCH\n", Exits(2, 4)),
}


def _script_bytes(case: Case, canary: Canary) -> bytes:
    text = case.script.replace("LAUNCH", LAUNCH).replace("BIG", BIG).replace("A9000", "a" * 9000)
    text = text.replace("PAYLOAD", canary.payload)
    return text.encode("latin-1" if case.raw else "utf-8")


def _expected(verdict: Verdict, canary: Canary) -> Verdict:
    if isinstance(verdict, Reads):
        argv = tuple(a.replace("PAYLOAD", canary.payload).replace("BIG", BIG) for a in verdict.argv)
        return Reads(argv)
    return verdict


def _bindings(env: Mapping[str, str]) -> Bindings:
    return Bindings(variables={**HOME, **env})


def run_cli(workdir: Path, script: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """``verl-compat read`` in a child process, bounded in time and memory."""
    flags = [f"--env={name}={value}" for name, value in env.items()]
    return cli_child.run_cli(
        ["read", script, *flags], workdir, timeout=CLI_TIMEOUT, memory=CLI_MEMORY
    )


def assert_one_line_refusal(stderr: str, script: str, verdict: Refused | Exits) -> None:
    __tracebackhide__ = True
    line = verdict.line
    construct = verdict.construct if isinstance(verdict, Refused) else "exit"
    where = script if line is None else f"{script}:{line}"
    assert "Traceback" not in stderr, stderr[-2000:]
    assert stderr.endswith("\n") and stderr.count("\n") == 1, f"stderr={stderr[:2000]!r}"
    assert stderr.startswith(f"verl-compat read: {where}: {construct}: "), stderr[:500]


def check_api(read: Callable[[], LaunchRead], verdict: Verdict, label: str) -> None:
    """The reader's answer through one API entry point."""
    __tracebackhide__ = True
    if isinstance(verdict, Reads):
        assert read().argv == verdict.argv
        return
    with pytest.raises(LaunchReadError) as caught:
        read()
    err = caught.value
    if isinstance(verdict, Exits):
        assert isinstance(err, LaunchExited)
        assert (err.line, err.status) == (verdict.line, verdict.status)
        return
    assert not isinstance(err, LaunchExited)
    assert (err.path, err.line, err.construct) == (label, verdict.line, verdict.construct)
    assert "\n" not in str(err)


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_script(
    name: str, tmp_path: Path, canary: Canary, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = CASES[name]
    data = _script_bytes(case, canary)
    verdict = _expected(case.verdict, canary)
    work = tmp_path / "work"
    work.mkdir()
    (work / "run.sh").write_bytes(data)
    for evil in ("evil", "bin/python3"):
        (work / evil).parent.mkdir(exist_ok=True)
        (work / evil).write_text(f"#!/bin/sh\n{canary.payload}\n")
        (work / evil).chmod(0o755)

    cli = run_cli(work, "run.sh", case.env)
    if isinstance(verdict, Reads):
        assert (cli.returncode, cli.stderr) == (0, "")
        assert tuple(cli.stdout.splitlines()) == verdict.argv
    else:
        assert cli.returncode == 2, cli.stdout[:500]
        assert_one_line_refusal(cli.stderr, "run.sh", verdict)

    monkeypatch.chdir(work)
    b = _bindings(case.env)
    check_api(lambda: read_launch("run.sh", b), verdict, "run.sh")
    if not case.raw:
        text = data.decode("utf-8")
        check_api(lambda: read_launch_text(text, b, path="run.sh"), verdict, "run.sh")
    assert not canary.fired()


ORACLE_CASES = sorted(name for name, case in CASES.items() if not isinstance(case.verdict, Refused))


@needs_bash
@pytest.mark.parametrize("name", ORACLE_CASES)
def test_verdict_is_what_bash_does(name: str, tmp_path: Path, canary: Canary) -> None:
    """Where the reader answers with an argv or an exit, real bash gives the same."""
    case = CASES[name]
    data = _script_bytes(case, canary)
    verdict = _expected(case.verdict, canary)
    oracle = run_bash(data, tmp_path, {**HOME, **case.env}, {})
    if isinstance(verdict, Reads):
        assert oracle.argv == verdict.argv, oracle.stderr[:500]
    else:
        assert isinstance(verdict, Exits)
        assert (oracle.argv, oracle.returncode) == (None, verdict.status)
    assert canary.fired() == case.bash_runs_payload


# --------------------------------------------------------------------------- files that are not


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _dev_null(path: Path) -> None:
    path.symlink_to("/dev/null")


@pytest.mark.parametrize(
    ("make", "kind"),
    [(_fifo, "a FIFO"), (_dev_zero, "a character device"), (_dev_null, "a character device")],
    ids=["fifo", "symlink-to-dev-zero", "symlink-to-dev-null"],
)
def test_script_that_is_not_a_regular_file(
    make: Callable[[Path], None], kind: str, tmp_path: Path, canary: Canary
) -> None:
    make(tmp_path / "run.sh")
    cli = run_cli(tmp_path, "run.sh", {})
    assert cli.returncode == 2
    assert_one_line_refusal(cli.stderr, "run.sh", Refused(None, "read"))
    assert kind in cli.stderr
    with pytest.raises(LaunchReadError) as caught:
        read_launch(tmp_path / "run.sh", _bindings({}))
    assert caught.value.construct == "read"
    assert not canary.fired()


def test_regular_file_behind_a_symlink_is_read(tmp_path: Path) -> None:
    (tmp_path / "real.sh").write_text(f"{LAUNCH} a=1\n")
    (tmp_path / "run.sh").symlink_to(tmp_path / "real.sh")
    assert read_launch(tmp_path / "run.sh", _bindings({})).argv == ("a=1",)


def test_shfmt_memory_budget_is_a_limit_not_a_syntax_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, canary: Canary
) -> None:
    """A tree too big for shfmt's memory cap is reported as a limit (cap lowered to test it)."""
    monkeypatch.setattr(bash_parse, "SHFMT_MEMORY", 8 << 20)
    bash_parse._TREES.clear()
    script = f"X='{canary.payload}'\n" + "echo a b c d\n" * 40_000 + f"{LAUNCH}\n"
    with pytest.raises(LaunchReadError) as caught:
        read_launch_text(script, _bindings({}), path="big.sh")
    assert caught.value.construct == "limit"
    assert str(caught.value).startswith("big.sh: limit: too large or too deeply nested")
    monkeypatch.undo()
    assert read_launch_text(f"{LAUNCH} a=1\n", _bindings({})).argv == ("a=1",)
    assert not canary.fired()


def test_size_limit_is_inclusive(tmp_path: Path) -> None:
    """A script of exactly the limit is read; one byte more is refused."""
    body = f"{LAUNCH} a=1\n"
    pad = bash_parse.MAX_SCRIPT_BYTES - len(body) - 1
    exact = "#" * pad + "\n" + body
    assert len(exact.encode()) == bash_parse.MAX_SCRIPT_BYTES
    (tmp_path / "ok.sh").write_text(exact)
    assert read_launch(tmp_path / "ok.sh", _bindings({})).argv == ("a=1",)
    (tmp_path / "big.sh").write_text("#" + exact)
    with pytest.raises(LaunchReadError) as caught:
        read_launch(tmp_path / "big.sh", _bindings({}))
    assert caught.value.construct == "size"


@needs_bash
def test_crlf_is_refused_because_bash_keeps_the_carriage_return(tmp_path: Path) -> None:
    """shfmt reads CRLF as a newline, bash keeps the \\r in the last word of each line."""
    data = f"X=1\r\n{LAUNCH} a=$X b\r\n".encode()
    oracle = run_bash(data, tmp_path, HOME, {})
    assert oracle.argv == ("a=1\r", "b\r")
    with pytest.raises(LaunchReadError) as caught:
        read_launch_text(data.decode(), _bindings({}), path="crlf.sh")
    assert (caught.value.line, caught.value.construct) == (1, "carriage return")


def test_error_stays_on_one_line_whatever_the_file_name(tmp_path: Path, canary: Canary) -> None:
    name = "run\n.sh"
    (tmp_path / name).write_text(f"X=$({canary.payload})\n{LAUNCH} x=$X\n")
    cli = run_cli(tmp_path, name, {})
    assert cli.returncode == 2
    assert cli.stderr.count("\n") == 1, cli.stderr
    assert cli.stderr.startswith("verl-compat read: run\\n.sh:2: run-time value: ")
    assert not canary.fired()


# --------------------------------------------------------------------------- the CLI's child


@pytest.mark.parametrize("name", ["builtin-read", "builtin-eval", "command-exit"])
def test_the_forked_cli_answers_as_python_m_does(name: str, tmp_path: Path, canary: Canary) -> None:
    """``cli_child`` (the CLI's ``main`` forked from a server that imported it) gives the exit
    status, stdout and stderr that ``python -m pytest_verl_compat.cli`` gives on the same script."""
    (tmp_path / "run.sh").write_bytes(_script_bytes(CASES[name], canary))
    forked = run_cli(tmp_path, "run.sh", {})
    started = subprocess.run(
        [sys.executable, "-m", cli_child.CLI_MODULE, "read", "run.sh"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=CLI_TIMEOUT,
        check=False,
    )
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        started.returncode,
        started.stdout,
        started.stderr,
    )
    assert not canary.fired()


def test_the_forked_cli_is_bounded_in_time_and_memory(tmp_path: Path) -> None:
    (tmp_path / "run.sh").write_text(f"{LAUNCH} a=1\n")
    with pytest.raises(subprocess.TimeoutExpired):
        cli_child.run_cli(["read", "run.sh"], tmp_path, timeout=0.001)
    starved = cli_child.run_cli(["read", "run.sh"], tmp_path, timeout=CLI_TIMEOUT, memory=1 << 20)
    assert starved.returncode != 0 and starved.stdout == ""
    assert cli_child.run_cli(["read", "run.sh"], tmp_path, timeout=CLI_TIMEOUT).stdout == "a=1\n"
