"""Issue 46, class 9: a run-time value that only names something is a placeholder.

``pytest_verl_compat/data/naming.yaml`` says where a value only names (a run, a project, a file,
a rendezvous port) and where verl reads it. Each class below is a script in a recipe's style (a
timestamp in the run's name, a random port for torchrun, the host in a log folder, a free port
from Python) that gets its verdict, with its near-identical twin where the same run-time value
reaches a key that decides something and stays ``launch.unreadable``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from corpus_facts import release_root

from pytest_verl_compat import cli
from pytest_verl_compat.pipeline.naming import decides, may_carry, naming
from pytest_verl_compat.releases.index import load_release_index

GRPO = """#!/usr/bin/env bash
set -xeuo pipefail
{setup}
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_files=$HOME/data/gsm8k/train.parquet \\
    data.val_files=$HOME/data/gsm8k/test.parquet \\
    data.train_batch_size=64 \\
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \\
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \\
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \\
    actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=4 \\
    trainer.project_name=gsm8k_grpo \\
    trainer.n_gpus_per_node=8 trainer.nnodes=1 {extra}
"""

SFT = """#!/usr/bin/env bash
set -xeuo pipefail
{setup}
torchrun --nnodes=1 {world} \\
    -m verl.trainer.sft_trainer \\
    data.train_files=$HOME/data/gsm8k/train.parquet \\
    data.val_files=$HOME/data/gsm8k/test.parquet \\
    data.micro_batch_size_per_gpu=4 \\
    data.messages_key=messages \\
    model.path=Qwen/Qwen2.5-0.5B-Instruct \\
    trainer.project_name=gsm8k-sft \\
    trainer.total_epochs=1
"""

# class -> (template, what it fills in, the rule its twin breaks)
CLASSES: dict[str, tuple[str, dict[str, str], dict[str, str]]] = {
    # verl's own examples: EXPERIMENT_NAME=..._$(date +%Y%m%d_%H%M) (grpo_trainer/run_qwen3_8b_fsdp.sh)
    "timestamp-in-the-run-name": (
        GRPO,
        {
            "setup": "NOW=$(date +%Y%m%d-%H%M%S)",
            "extra": "trainer.experiment_name=qwen_grpo_${NOW}",
        },
        {
            "setup": "NOW=$(date +%Y%m%d-%H%M%S)",
            "extra": "trainer.experiment_name=qwen_grpo trainer.total_epochs=${NOW}",
        },
    ),
    # recipes' `exp_name="...-$(whoami)"`, a log folder per host and commit
    "host-user-and-commit-in-the-log-folder": (
        GRPO,
        {
            "setup": 'RUN=grpo-$(whoami)-$(git rev-parse --short HEAD)\nLOGS="$HOME/logs/$(hostname)"',
            "extra": 'trainer.experiment_name="$RUN" trainer.default_local_dir="$LOGS/ckpt" '
            '2>&1 | tee "$LOGS/$RUN.log"',
        },
        {
            "setup": 'RUN=grpo-$(whoami)\nLOGS="$HOME/logs/$(hostname)"',
            "extra": 'trainer.experiment_name="$RUN" trainer.nnodes="$(hostname | wc -c)"',
        },
    ),
    # DAPO/SimpleRL-style torchrun SFT steps: MASTER_PORT=$((RANDOM % 1000 + 20000))
    "random-port-for-torchrun": (
        SFT,
        {
            "setup": "PORT=$((RANDOM % 1000 + 20000))",
            "world": "--nproc_per_node=8 --master_port=$PORT",
        },
        {
            "setup": "PORT=$((RANDOM % 1000 + 20000))",
            "world": "--nproc_per_node=$((RANDOM % 8 + 1)) --master_port=$PORT",
        },
    ),
    "shuf-port-in-the-rendezvous-endpoint": (
        SFT,
        {
            "setup": "PORT=$(shuf -i 20000-30000 -n 1)",
            "world": "--nproc_per_node=8 --rdzv_endpoint=localhost:$PORT",
        },
        {
            "setup": "PORT=$(shuf -i 20000-30000 -n 1)",
            "world": "--nproc_per_node=8 --nnodes=$PORT",
        },
    ),
    # a free port from Python (quoted: how many words Python prints is only known at run time)
    "free-port-from-python": (
        SFT,
        {
            "setup": 'PORT=$(python3 -c \'import socket; s=socket.socket(); s.bind(("", 0)); '
            "print(s.getsockname()[1])')",
            "world": '--nproc_per_node=8 --master_port="$PORT"',
        },
        {
            "setup": "N=$(python3 -c 'import torch; print(torch.cuda.device_count())')",
            "world": '--nproc_per_node="$N"',
        },
    ),
}


def check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    status = cli.main(["check", "--no-upstream-checks", *args])
    out, _ = capsys.readouterr()
    return status, out.splitlines()


def rules(lines: list[str], rule: str) -> list[str]:
    return [line for line in lines if f"[{rule}]" in line]


def _script(tmp_path: Path, template: str, fill: dict[str, str]) -> Path:
    path = tmp_path / "run.sh"
    path.write_text(template.format(**{"setup": "", "extra": "", "world": "", **fill}))
    return path


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_a_value_that_only_names_gets_the_verdict_with_a_note(
    name: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    template, fill, _ = CLASSES[name]
    status, lines = check(capsys, str(_script(tmp_path, template, fill)))
    assert not rules(lines, "launch.unreadable"), lines
    notes = rules(lines, "launch.run-time-value")
    assert notes and all("only names" in note for note in notes), lines
    assert status == 0, lines


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_the_same_value_where_it_decides_stays_unreadable(
    name: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    template, _, twin = CLASSES[name]
    status, lines = check(capsys, str(_script(tmp_path, template, twin)))
    refused = rules(lines, "launch.unreadable")
    assert status == 1 and refused, lines
    assert "only known when the script runs" in refused[0], refused


def test_the_run_name_decides_under_the_gdpo_reward_manager(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    fill = {
        "setup": "NOW=$(date +%Y%m%d-%H%M%S)",
        "extra": "trainer.experiment_name=qwen_grpo_${NOW}",
    }
    _, lines = check(capsys, str(_script(tmp_path, GRPO, fill)))
    assert not rules(lines, "launch.unreadable"), lines
    fill["extra"] += " reward.reward_manager.name=gdpo"
    status, lines = check(capsys, str(_script(tmp_path, GRPO, fill)))
    (refused,) = rules(lines, "launch.unreadable")
    assert status == 1 and "GDPO reward manager" in refused, refused


def test_a_model_whose_config_the_checks_read_is_not_a_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    fill = {"setup": "ROOT=$(pwd)", "extra": "data.train_files=$ROOT/data/train.parquet"}
    status, lines = check(capsys, str(_script(tmp_path, GRPO, fill)))
    assert status == 0 and rules(lines, "launch.run-time-value"), lines
    fill["extra"] = "actor_rollout_ref.model.path=$ROOT/models/Qwen2.5-0.5B-Instruct"
    status, lines = check(capsys, str(_script(tmp_path, GRPO, fill)))
    (refused,) = rules(lines, "launch.unreadable")
    assert status == 1 and "config.json" in refused, refused


def test_the_registry_answers_per_key_and_argv() -> None:
    assert may_carry("trainer.experiment_name", "run_RUNTIME_1", ()) is None
    assert may_carry("torchrun --master_port", "", ()) is None
    assert may_carry("torchrun --nproc_per_node", "", ()) == ""
    assert may_carry("data.train_batch_size", "RUNTIME_1", ()) == ""
    gdpo = ("reward_model.reward_manager=gdpo",)
    assert "GDPO" in (decides("trainer.experiment_name", "x_RUNTIME_1", gdpo) or "")
    assert decides("critic.model.path", "RUNTIME_PWD/m") == "the model checks read its config.json"


# --- the registry's citations --------------------------------------------------------------

READ = re.compile(r"\b(?:trainer|trace)(?:\.get\(\s*[\"']|\.)(experiment_name|project_name)\b")


def _cited(place: str) -> tuple[Path, int]:
    file, _, line = place.partition(":")
    return release_root(load_release_index().citations) / file, int(line)


def test_every_cited_read_reads_its_key() -> None:
    wrong = []
    for entry in [*naming().keys.values()]:
        leaf = entry.key.rpartition(".")[2]
        for place in (*entry.reads, *entry.deciding_reads):
            path, line = _cited(place)
            if leaf not in path.read_text().splitlines()[line - 1]:
                wrong.append(f"{entry.key}: {place} does not read {leaf}")
    assert not wrong, "\n".join(wrong)


def test_every_read_of_a_run_or_project_name_is_cited() -> None:
    """A new read of the run's name in verl (a reward function, a data path that branches on
    it) must be looked at before the registry keeps calling it a name."""
    root = release_root(load_release_index().citations)
    cited = {
        place for entry in naming().keys.values() for place in (*entry.reads, *entry.deciding_reads)
    }
    found = set()
    for path in sorted((root / "verl").rglob("*.py")):
        for number, text in enumerate(path.read_text().splitlines(), 1):
            if READ.search(text):
                found.add(f"{path.relative_to(root)}:{number}")
    assert found, "the scan found no read at all"
    assert sorted(found - cited) == []
