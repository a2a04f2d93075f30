"""Launches of every verl entry point: python, torchrun, torch.distributed.run, a module's file.

By default a read accepts ``verl.trainer.main_ppo`` alone (every caller above the reader
assumes it); ``entry_modules`` opts in to others. Each read here is compared with what real
bash hands the launcher in the sandbox (``bash_oracle.run_bash_sandboxed``), where torchrun's
words are read by torch's own argument parser.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from reader_checks import agrees_with_bash, needs_bash, read_and_run, refused

from pytest_verl_compat.bash import LaunchRead, LaunchReadError, read_launch, read_launch_text
from pytest_verl_compat.bash.entry_points import module_of_file, torchrun_world_size
from pytest_verl_compat.model import Bindings

SFT = "verl.trainer.sft_trainer"
PPO = "verl.trainer.main_ppo"
UPSTREAM = Path(
    os.environ.get("VERL_UPSTREAM")
    or Path(__file__).resolve().parents[2] / "shared/upstream/verl-v0.9.0"
)
needs_upstream = pytest.mark.skipif(not UPSTREAM.is_dir(), reason="no verl v0.9.0 checkout")
# The SFT examples take <nproc_per_node> <save_path> [overrides...]; the bindings each needs
# beyond them: what the script reads from its environment before the launch (set -u).
SFT_BINDINGS: dict[str, dict[str, str]] = {
    "gsm8k/run_deepseek_v4_megatron_lite.sh": {"MODEL_PATH": "/models/dsv4"},
    # It runs `$COMMAND ...` and never sets COMMAND: the user gives it.
    "gsm8k/run_mimo_7b_mtp_megatron.sh": {
        "PYTHONPATH": "/opt/py",
        "COMMAND": "torchrun --standalone --nnodes=1 --nproc_per_node=8 -m verl.trainer.sft_trainer",
    },
    "gsm8k/run_nemotron_nano_v3_megatron.sh": {"ckpts_home": "/ckpts"},
}
# Folders under HOME a script enters that a clone would have made (bash fails a `cd` into a
# missing folder; the reader assumes it is there, as it assumes of every command it skips).
SFT_FOLDERS = {
    "gsm8k/run_mimo_7b_mtp_megatron.sh": ("pythonpath/Megatron-LM", "pythonpath/mbridge")
}
# The world size each reads to: nproc_per_node (the first argument, 8) times nnodes.
SFT_WORLD = {"gsm8k/run_qwen3_5_397b_a17b_megatron.sh": 128, "gsm8k/run_mimo_7b_mtp_megatron.sh": 8}
SFT_SCRIPTS = (
    sorted(
        str(p.relative_to(UPSTREAM / "examples/sft"))
        for p in (UPSTREAM / "examples/sft").rglob("*.sh")
    )
    if UPSTREAM.is_dir()
    else []
)


@needs_upstream
def test_there_are_fifteen_sft_examples() -> None:
    assert len(SFT_SCRIPTS) == 15


@needs_bash
@needs_upstream
@pytest.mark.parametrize("script", SFT_SCRIPTS)
def test_an_sft_example_reads_as_its_torchrun_launch_as_bash_runs_it(
    script: str, tmp_path: Path
) -> None:
    pytest.importorskip("torch.distributed.run")
    text = (UPSTREAM / "examples/sft" / script).read_text()
    env = SFT_BINDINGS.get(script, {})
    read = agrees_with_bash(
        text,
        tmp_path,
        env,
        args=("8", "/tmp/sft-ckpt", "trainer.total_epochs=2"),
        entry_modules={SFT},
        name=script.replace("/", "_"),
        home_folders=SFT_FOLDERS.get(script, ()),
    )
    if script.endswith("run_deepseek_v4_megatron_lite.sh"):
        # It runs `torchrun -m verl_mlite.launch verl.trainer.sft_trainer ...`: Megatron Lite's
        # launcher module, which starts the trainer in a way this reader does not model.
        assert isinstance(read, LaunchReadError)
        assert read.construct == "indirect launcher"
        assert f"runs {SFT}" in read.detail
        return
    assert isinstance(read, LaunchRead), read
    assert (read.module, read.launcher) == (SFT, "torchrun")
    assert read.world_size == SFT_WORLD.get(script, 8), read.world_size_reason


@needs_upstream
@pytest.mark.parametrize("script", SFT_SCRIPTS)
def test_by_default_an_sft_example_is_another_entry_point(script: str) -> None:
    """What callers saw before the opt-in: no launcher, naming the other entry point."""
    env = {"HOME": "/home/verl", "PWD": "/w", **SFT_BINDINGS.get(script, {})}
    bindings = Bindings(variables=env, args=("8", "/tmp/sft-ckpt"))
    with pytest.raises(LaunchReadError) as caught:
        read_launch(UPSTREAM / "examples/sft" / script, bindings)
    assert caught.value.construct == "no launcher"


# --------------------------------------------------------------------------- torchrun's words

TORCHRUN_SPELLINGS = {
    "underscores": ("--nproc_per_node=4 --nnodes=2", 8),
    "dashes-separate": ("--nproc-per-node 4 --nnodes 2", 8),
    "abbreviated": ("--nproc-per 2 --nn=3", 6),
    "standalone": ("--standalone --nproc_per_node=8", 8),
    "standalone-one-node": ("--standalone --nnodes=1 --nproc_per_node=2", 2),
    "default-one-process": ("", 1),
    "last-wins": ("--nproc_per_node=2 --nproc_per_node=3", 3),
    "nnodes-range-fixed": ("--nnodes=2:2 --nproc_per_node=2", 4),
    "elastic": ("--nnodes=1:4 --nproc_per_node=2", None),
    "gpu": ("--nproc_per_node=gpu", None),
    "flags-and-values": ("--max-restarts=3 --rdzv-backend c10d --rdzv_endpoint=h:29400 -r3", 1),
    "master": ("--master_addr 10.0.0.1 --master-port=29501 --node_rank 0 --nnodes 2", 2),
}


@needs_bash
@pytest.mark.parametrize("name", sorted(TORCHRUN_SPELLINGS))
def test_torchrun_options_read_as_torch_reads_them(name: str, tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed.run")
    options, world = TORCHRUN_SPELLINGS[name]
    text = f"torchrun {options} -m {SFT} data.x=1 'a b'\n"
    read = agrees_with_bash(text, tmp_path, entry_modules={SFT})
    assert isinstance(read, LaunchRead), read
    assert read.world_size == world, read.world_size_reason
    assert read.argv == ("data.x=1", "a b")
    if world is None:
        assert read.world_size_reason


@needs_bash
def test_torchrun_reads_its_options_from_pet_variables(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed.run")
    text = f"export PET_NPROC_PER_NODE=4 PET_NNODES=2\ntorchrun -m {SFT} a=1\n"
    read = agrees_with_bash(text, tmp_path, entry_modules={SFT})
    assert isinstance(read, LaunchRead)
    assert read.world_size == 8
    assert read.torchrun["nproc_per_node"] == "4"


def test_a_run_time_torchrun_option_leaves_the_world_size_to_the_run() -> None:
    read = read_launch_text(
        f'torchrun "--nproc_per_node=$(nvidia-smi -L | wc -l)" -m {SFT} a=1\n',
        Bindings(variables={"HOME": "/h"}),
        entry_modules={SFT},
    )
    assert read.world_size is None
    assert "nproc_per_node" in read.torchrun_runtime
    assert "only known at run time" in read.world_size_reason


@pytest.mark.parametrize(
    ("text", "construct", "detail"),
    [
        (f"export PYTHON_EXEC=/bin/sh\ntorchrun -m {SFT} a=1\n", "torchrun", "PYTHON_EXEC"),
        ("export PET_MODULE=1\ntorchrun verl/trainer/sft_trainer.py\n", "torchrun", "PET_MODULE"),
        (f"torchrun --bogus -m {SFT} a=1\n", "torchrun", "not an option"),
        (f"torchrun --nproc 2 -m {SFT} a=1\n", "torchrun", "ambiguous"),
        (f"torchrun --no-python -m {SFT} a=1\n", "torchrun --no-python", "does not model"),
        (f"torchrun -m {SFT} -- a=1\n", "torchrun", "`--`"),
    ],
)
def test_torchrun_words_it_would_read_otherwise_are_refused(
    text: str, construct: str, detail: str
) -> None:
    with pytest.raises(LaunchReadError) as caught:
        read_launch_text(text, Bindings(variables={"HOME": "/h"}), entry_modules={SFT})
    assert caught.value.construct == construct
    assert detail in caught.value.detail
    assert caught.value.line == text.count("\n")


# --------------------------------------------------------------------------- module files


@needs_bash
def test_a_module_file_launch_maps_to_its_module(tmp_path: Path) -> None:
    text = (
        'ROOT="$(cd "$(dirname "$0")/.." && pwd)"\n'
        "python3 -u $ROOT/verl/trainer/sft_trainer.py a=1\n"
    )
    read = agrees_with_bash(text, tmp_path, entry_modules={SFT})
    assert isinstance(read, LaunchRead), read
    assert (read.module, read.launcher, read.argv) == (SFT, "python", ("a=1",))


@needs_bash
def test_torchrun_of_a_module_file_relative_to_a_known_folder(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed.run")
    text = "cd /opt\ntorchrun --nproc_per_node=2 verl/trainer/sft_trainer.py a=1\n"
    read = agrees_with_bash(text, tmp_path, entry_modules={SFT})
    assert isinstance(read, LaunchRead), read
    assert (read.module, read.world_size) == (SFT, 2)


@needs_bash
def test_python_m_torch_distributed_run_is_torchrun(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed.run")
    text = f"python3 -m torch.distributed.run --nproc-per-node 4 -m {SFT} a=1\n"
    read = agrees_with_bash(text, tmp_path, entry_modules={SFT})
    assert isinstance(read, LaunchRead), read
    assert (read.module, read.launcher, read.world_size) == (SFT, "torchrun", 4)


def test_a_file_named_like_the_launcher_in_an_unknown_folder_is_refused() -> None:
    with pytest.raises(LaunchReadError) as caught:
        read_launch_text('cd "$X"\npython3 sft_trainer.py a=1\n', Bindings(), entry_modules={SFT})
    assert (caught.value.construct, caught.value.line) == ("run-time value", 2)


@pytest.mark.parametrize(
    ("path", "cwd", "module"),
    [
        ("/opt/verl/verl/trainer/main_ppo.py", None, PPO),
        ("verl/trainer/main_ppo.py", None, PPO),
        ("main_ppo.py", "/opt/verl/verl/trainer", PPO),
        ("../trainer/./main_ppo.py", "/opt/verl/verl/utils", PPO),
        ("/x/recipe/dapo/main_dapo.py", None, "recipe.dapo.main_dapo"),
        ("main_ppo.py", None, None),
        ("/opt/src/setup.py", None, None),
        ("/opt/verl/verl/trainer/main_ppo.sh", None, None),
        ("/opt/verl/verl/trainer/main-ppo.py", None, None),
    ],
)
def test_module_of_file(path: str, cwd: str | None, module: str | None) -> None:
    assert module_of_file(path, cwd) == module


# --------------------------------------------------------------------------- opting in


def test_the_default_reads_main_ppo_under_torchrun_now() -> None:
    """Before, `torchrun -m verl.trainer.main_ppo` was refused as an indirect launcher."""
    read = read_launch_text(f"torchrun --nproc_per_node=2 -m {PPO} a=1\n", Bindings())
    assert (read.module, read.launcher, read.world_size, read.argv) == (
        PPO,
        "torchrun",
        2,
        ("a=1",),
    )


def test_the_final_accepted_launch_wins_and_a_predicate_selects() -> None:
    text = f"python3 -m {PPO} a=1\ntorchrun -m {SFT} b=2\npython3 -m verl.other c=3\n"
    assert read_launch_text(text, Bindings()).argv == ("a=1",)
    both = read_launch_text(text, Bindings(), entry_modules={PPO, SFT})
    assert (both.module, both.argv) == (SFT, ("b=2",))
    every = read_launch_text(text, Bindings(), entry_modules=lambda module: True)
    assert (every.module, every.argv) == ("verl.other", ("c=3",))
    # Only entry packages count: `python -m pip` is never a launch.
    only = read_launch_text(
        "python3 -m pip install x\n" + text, Bindings(), entry_modules=lambda m: True
    )
    assert only.module == "verl.other"


def test_no_accepted_launch_names_what_the_script_runs_instead() -> None:
    err = refused(f"torchrun -m {SFT} a=1\n")
    assert "another entry point" in err.detail
    with pytest.raises(LaunchReadError) as caught:
        read_launch_text(f"python3 -m {PPO} a=1\n", Bindings(), entry_modules={SFT})
    assert "no launch of an accepted entry module" in caught.value.detail
    assert f"python3 -m {PPO}" in caught.value.detail


@pytest.mark.parametrize(
    ("options", "runtime", "size", "reason"),
    [
        ({}, {}, 1, ""),
        ({"nproc_per_node": "8", "nnodes": "2"}, {}, 16, ""),
        ({"nproc_per_node": "8", "standalone": True}, {}, 8, ""),
        ({"nproc_per_node": "8", "standalone": True, "nnodes": "2"}, {}, None, "standalone"),
        ({"nproc_per_node": "auto"}, {}, None, "devices"),
        ({"nproc_per_node": "npu"}, {}, None, "device backend"),
        ({"nproc_per_node": " 8 "}, {}, 8, ""),
        ({"nnodes": "1:2:3"}, {}, None, "rejects"),
        ({}, {"nnodes": "$N (line 1)"}, None, "run time"),
    ],
)
def test_world_size(
    options: dict[str, str | bool], runtime: dict[str, str], size: int | None, reason: str
) -> None:
    found = torchrun_world_size(options, runtime)
    assert found.size == size
    assert reason in found.reason


@needs_bash
def test_read_and_run_records_every_launch(tmp_path: Path) -> None:
    read, bash, last = read_and_run(f"python3 -m {PPO} a=1\npython3 -c 'x'\n", tmp_path)
    assert isinstance(read, LaunchRead)
    assert last is not None and last.args == ("a=1",)
    assert len(bash.launches) == 1
