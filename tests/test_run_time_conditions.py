"""Issue 46, class 9: a test only the running system decides is followed down each way.

A recipe picks a local model folder or a hub id (``if [ -d "$HOME/models/..." ]``), a batch size
by a marker file (``[ -f x ] && BS=512 || BS=1000``), a GPU count by whether ``nvidia-smi`` is
installed, a setting by the host it runs on. The reader never guesses which way the run takes:
each way is read (and equals what bash launches in a world where the test goes that way), each
is checked, and ``check`` gives one verdict where they agree and each way's where they differ.
Each class has its twin: a test whose ways agree reads as one way, and a way whose run-time
value reaches a deciding key is refused in that way only.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from bash_oracle import run_bash_stubbed, stub_folder
from reader_checks import HOME, LAUNCH, layout, needs_bash

from pytest_verl_compat.bash import (
    MAX_WAYS,
    LaunchForked,
    LaunchReadError,
    read_launch,
    read_launch_ways,
)
from pytest_verl_compat.model import Bindings

# class -> (script, how bash's world makes the test true (None: leaves it false))
World = Callable[[Path], dict[str, str]]
CLASSES: dict[str, tuple[str, World]] = {
    # a local copy of the model when there is one, else the hub id
    "local-model-or-hub": (
        """
        if [ -d "$MODELS/Qwen2.5-7B-Instruct" ]; then
            MODEL=$MODELS/Qwen2.5-7B-Instruct
        else
            MODEL=Qwen/Qwen2.5-7B-Instruct
        fi
        LAUNCH actor_rollout_ref.model.path=$MODEL trainer.total_epochs=1
        """,
        lambda root: _make(root / "models" / "Qwen2.5-7B-Instruct", folder=True),
    ),
    # one line, two assignments: `[ -f x ] && A=1 || A=2`
    "and-or-assignment": (
        """
        [ -f "$MODELS/.small" ] && BS=512 || BS=1024
        LAUNCH data.train_batch_size=$BS
        """,
        lambda root: _make(root / "models" / ".small"),
    ),
    # whether a program is installed, in an `if` and in an `&&` list
    "program-looked-up": (
        """
        PROBE=verl-gpu-probe
        if command -v verl-gpu-probe >/dev/null 2>&1; then
            BACKEND=vllm
        else
            BACKEND=hf
        fi
        which "$PROBE" >/dev/null 2>&1 && EXTRA=+trainer.probe=1 || EXTRA=
        LAUNCH actor_rollout_ref.rollout.name=$BACKEND $EXTRA
        """,
        lambda root: _program(root, "verl-gpu-probe"),
    ),
    # a setting by the host the script runs on
    "run-time-value-tested": (
        """
        if [ "$(hostname)" = head-node ]; then ROLE=head; else ROLE=worker; fi
        LAUNCH trainer.experiment_name=run-$ROLE
        """,
        lambda root: {"hostname": "head-node"},
    ),
    # a test inside a command substitution
    "test-in-a-substitution": (
        """
        CKPT=$(if [ -d "$MODELS/ckpt" ]; then echo "$MODELS/ckpt"; else echo none; fi)
        LAUNCH trainer.resume_from_path=$CKPT
        """,
        lambda root: _make(root / "models" / "ckpt", folder=True),
    ),
}


def _make(path: Path, folder: bool = False) -> dict[str, str]:
    if folder:
        path.mkdir(parents=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    return {}


def _program(root: Path, name: str) -> dict[str, str]:
    stubs, _ = stub_folder(root / "project")
    program = stubs / name
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    return {}


def _text(script: str) -> str:
    return textwrap.dedent(script).replace("LAUNCH", LAUNCH).lstrip("\n")


def _bash_argv(
    script: str, root: Path, make_true: World | None, variables: dict[str, str]
) -> tuple[str, ...]:
    """What bash launches from a fresh folder where the test goes one way."""
    scripts, work = layout(root)
    substitutions = make_true(root) if make_true is not None else {}
    if "hostname" in script and not substitutions:
        substitutions = {"hostname": "compute-7"}
    bash = run_bash_stubbed(
        _text(script).encode(), scripts / "run.sh", work, variables, substitutions
    )
    assert bash.argv is not None, bash.stderr
    return bash.argv


@needs_bash
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_each_way_is_what_bash_launches_when_the_test_goes_that_way(
    name: str, tmp_path: Path
) -> None:
    script, make_true = CLASSES[name]
    variables = {**HOME, "MODELS": str(tmp_path / "true" / "models")}
    scripts, _ = layout(tmp_path / "reader")
    (scripts / "run.sh").write_text(_text(script))
    ways = read_launch_ways(scripts / "run.sh", Bindings(variables=variables))
    assert len(ways) >= 2 and all(way.read is not None for way in ways), ways
    compared = set()
    for way in ways:
        assert way.read is not None
        # Each script's tests ask one thing of the system (the folder, the program), so bash
        # can only go the ways where they all agree: a world where it is there, or one where
        # it is not (whose launch never names the folder). The reader, keeping each test on
        # its own, also follows the mixed ways, which no run takes.
        values = {condition.value for condition in way.conditions}
        if len(values) != 1:
            continue
        (value,) = values
        world = tmp_path / ("true" if value else "false")
        models = {"MODELS": str(world / "models")}
        argv = _bash_argv(script, world, make_true if value else None, {**HOME, **models})
        assert way.read.argv == argv, way.said()
        compared.add(value)
    assert compared == {True, False}


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_read_alone_a_parting_test_is_refused_as_before(name: str, tmp_path: Path) -> None:
    script, _ = CLASSES[name]
    path = tmp_path / "run.sh"
    path.write_text(_text(script))
    with pytest.raises(LaunchForked) as caught:
        read_launch(path, Bindings(variables={**HOME, "MODELS": "/m"}))
    assert caught.value.line and caught.value.text


# Twins: the same tests, whose ways leave the same shell (the launch does not depend on them).
AGREEING = {
    "local-model-or-hub": 'if [ -d "$MODELS/x" ]; then echo "using a local copy" >&2; fi\n'
    "LAUNCH actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct\n",
    "and-or-assignment": '[ -f "$MODELS/.small" ] && echo small >&2 || echo large >&2\nLAUNCH a=1\n',
    "program-looked-up": "command -v nvidia-smi >/dev/null && nvidia-smi || true\nLAUNCH a=1\n",
    "run-time-value-tested": 'if [ "$(hostname)" = head ]; then echo head >&2; fi\nLAUNCH a=1\n',
}


@pytest.mark.parametrize("name", sorted(AGREEING))
def test_a_test_whose_ways_agree_is_one_way(name: str, tmp_path: Path) -> None:
    path = tmp_path / "run.sh"
    path.write_text(_text(AGREEING[name]))
    (way,) = read_launch_ways(path, Bindings(variables={**HOME, "MODELS": "/m"}))
    assert way.read is not None and way.conditions == ()


def test_a_way_ends_in_its_own_refusal_or_exit(tmp_path: Path) -> None:
    path = tmp_path / "run.sh"
    path.write_text(
        _text(
            """
            [ -f "$HOME/data/train.parquet" ] || { echo "prepare the data first" >&2; exit 1; }
            if command -v nvidia-smi >/dev/null; then N=$(nvidia-smi -L | wc -l); else N=8; fi
            LAUNCH trainer.n_gpus_per_node=$N
            """
        )
    )
    ways = read_launch_ways(path, Bindings(variables=HOME))
    said = {way.said(): way for way in ways}
    assert len(ways) == 3, list(said)
    exits = [way for way in ways if way.error is not None and way.error.construct == "exit"]
    assert [way.conditions[0].value for way in exits] == [False]
    refused = [way for way in ways if way.error is not None and way.error.construct != "exit"]
    assert [c.value for c in refused[0].conditions] == [True, True]
    assert refused[0].error is not None and "nvidia-smi" in refused[0].error.detail
    (read,) = [way.read for way in ways if way.read is not None]
    assert "trainer.n_gpus_per_node=8" in read.argv


def test_past_the_cap_the_script_is_refused_in_one_line(tmp_path: Path) -> None:
    tests = "\n".join(f'[ -f "$HOME/flag{i}" ] && A{i}=1 || A{i}=0' for i in range(4))
    path = tmp_path / "run.sh"
    path.write_text(_text(f"{tests}\nLAUNCH a=$A0$A1$A2$A3\n"))
    with pytest.raises(LaunchReadError) as caught:
        read_launch_ways(path, Bindings(variables=HOME))
    error = caught.value
    assert error.construct == "run-time conditions" and f"more than {MAX_WAYS}" in error.detail
    assert "\n" not in str(error) and "lines 1, 2, 3, 4" in error.detail
