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

import json
import textwrap
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
from bash_oracle import run_bash_stubbed, stub_folder
from reader_checks import HOME, LAUNCH, layout, needs_bash

from pytest_verl_compat import cli
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


# --- check: one result, in every format ------------------------------------------------------

GRPO = """#!/usr/bin/env bash
{setup}
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_files=$HOME/data/gsm8k/train.parquet \\
    data.val_files=$HOME/data/gsm8k/test.parquet \\
    data.train_batch_size=$BS \\
    actor_rollout_ref.model.path=$MODEL \\
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \\
    actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=5 \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \\
    trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.total_epochs=15
"""
MODEL = (
    'if [ -d "$HOME/models/Qwen2.5-7B" ]; then MODEL=$HOME/models/Qwen2.5-7B; '
    "else MODEL=Qwen/Qwen2.5-7B; fi"
)
SAME = f"{MODEL}\nBS=1024"
# 1000 prompts x 5 = 5000 responses do not fill mini-batches of 256 x 5 on 8 GPUs: padded.
DIFFER = f'{MODEL}\n[ -f "$HOME/.small" ] && BS=512 || BS=1000'
# The way without nvidia-smi reads; the other takes the GPU count from it at run time.
DECIDES = (
    f"{MODEL}\nBS=1024\nif command -v nvidia-smi >/dev/null 2>&1; then "
    "N=$(nvidia-smi -L | wc -l); else N=8; fi"
)


def check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    status = cli.main(["check", "--no-upstream-checks", *args])
    out, _ = capsys.readouterr()
    return status, out


def _grpo(tmp_path: Path, setup: str) -> Path:
    path = tmp_path / "run.sh"
    text = GRPO.format(setup=setup)
    if "nvidia-smi" in setup:
        text = text.replace("trainer.n_gpus_per_node=8", "trainer.n_gpus_per_node=$N")
    path.write_text(text)
    return path


def _schema() -> dict[str, object]:
    text = resources.files("pytest_verl_compat").joinpath("data/check.schema.json").read_text()
    return dict(json.loads(text))


def test_ways_that_agree_give_one_verdict_and_a_note(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, out = check(capsys, str(_grpo(tmp_path, SAME)), "--format", "json")
    report = json.loads(out)
    jsonschema.validate(report, _schema(), cls=jsonschema.Draft202012Validator)
    (file,) = report["files"]
    assert status == 0 and file["valid"] is True and "ways" not in file
    (note,) = file["findings"]
    assert note["rule"] == "launch.run-time-condition" and "each way gives" in note["message"]
    assert note["location"]["line"] == 2 and "when" not in note


def test_ways_that_differ_give_each_finding_with_its_way(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    script = str(_grpo(tmp_path, DIFFER))
    status, out = check(capsys, script, "--format", "json")
    report = json.loads(out)
    jsonschema.validate(report, _schema(), cls=jsonschema.Draft202012Validator)
    (file,) = report["files"]
    assert status == 0 and file["valid"] is True and len(file["ways"]) == 4
    (padded,) = [f for f in file["findings"] if f["rule"] == "batch.padded-step"]
    # The one test that singles its ways out, not the model test they share.
    assert padded["when"] == 'when [ -f "$HOME/.small" ] (line 3) is false'
    _, text = check(capsys, script)
    assert any(
        line.endswith('[when [ -f "$HOME/.small" ] (line 3) is false]')
        for line in text.splitlines()
    ), text
    _, sarif = check(capsys, script, "--format", "sarif")
    (result,) = [r for r in json.loads(sarif)["runs"][0]["results"] if "padded" in r["ruleId"]]
    assert result["message"]["text"].endswith("(line 3) is false]")
    assert result["properties"]["when"] == padded["when"]
    _, github = check(capsys, script, "--format", "github")
    assert any("padded-step" in line and "is false]" in line for line in github.splitlines())


def test_a_way_whose_run_time_value_decides_is_refused_in_that_way(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, out = check(capsys, str(_grpo(tmp_path, DECIDES)), "--format", "json")
    (file,) = json.loads(out)["files"]
    assert status == 1 and file["valid"] is False
    (refused,) = [f for f in file["findings"] if f["rule"] == "launch.unreadable"]
    assert refused["when"] == "when command -v nvidia-smi >/dev/null 2>&1 (line 4) is true"
    assert {way["valid"] for way in file["ways"]} == {True, False}
