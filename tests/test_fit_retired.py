"""``fit`` on a launch of ``verl.trainer.fsdp_sft_trainer``, the SFT trainer until verl 0.7.0: the
forecast of what verl 0.7.0's trainer would run, composed on its own tree and carried to the
checked release's SFT trainer key by key (data/retired_entry_points.yaml).

Each key moved and each behaviour is the statement at its lines of verl 0.7.0's wheel; the old
tree's defaults (not the new trainer's) decide what the launch leaves out; a launch the old
trainer would refuse, or run in a way the forecast does not carry, is one line; ``check`` still
says the release lacks the module."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_in_process import run

from pytest_verl_compat.memory.release_facts import Fact, facts_from_mapping
from pytest_verl_compat.pipeline.retired import (
    OWN_TREE,
    RETIRED_FILE,
    retired_entries,
    retired_entry,
)
from pytest_verl_compat.releases.wheels import release_tree

OLD = "verl.trainer.fsdp_sft_trainer"
NEW = "verl.trainer.sft_trainer"
LAUNCH = """set -x
torchrun --standalone --nnodes=1 --nproc_per_node=8 -m {module} \\
    data.train_files=$HOME/data/gsm8k/train.parquet \\
    data.val_files=$HOME/data/gsm8k/test.parquet \\
    {keys} \\
    trainer.project_name=gsm8k-sft \\
    trainer.total_epochs=1 $@
"""
OLD_KEYS = "data.prompt_key=extra_info data.response_key=extra_info model.partial_pretrain=Qwen/Qwen2.5-7B-Instruct"


def _script(tmp_path: Path, keys: str = OLD_KEYS, module: str = OLD, name: str = "sft.sh") -> str:
    path = tmp_path / name
    path.write_text(LAUNCH.format(module=module, keys=keys), encoding="utf-8")
    return str(path)


def _payload(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    status, out, err = run(capsys, "fit", *args, "--gpu", "H100", "--format", "json")
    assert status in (0, 1), err
    payload: dict[str, Any] = json.loads(out)
    return payload


def _parts(payload: dict[str, Any], phase: str) -> dict[str, dict[str, Any]]:
    (rank,) = payload["ranks"]
    (found,) = [p for p in rank["phases"] if p["phase"] == phase]
    return {part["key"]: part for part in found["parts"]}


def _one_line(status: int, err: str, *words: str) -> None:
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in lines[0], (word, lines[0])


def _own_tree() -> list[Any]:
    found = [e for e in retired_entries().values() if e.carried == OWN_TREE]
    assert found
    return found


def test_each_move_and_behaviour_is_the_statement_at_its_lines_of_the_last_release(
    release_cache: Path,
) -> None:
    for entry in _own_tree():
        root = release_tree(entry.last_release, fetch=False).root
        assert not (root / entry.file.replace(".py", "")).exists()
        assert (root / entry.file).is_file(), entry.file
        for move in entry.moves:
            fact = Fact(move.value, "", move.where, move.statement)
            assert fact.found_in(root), f"{move.to}: {move.statement!r} not at {move.where}"
        facts = facts_from_mapping(
            {"release": entry.last_release, "facts": entry.behaviour}, RETIRED_FILE.name
        )
        for name, fact in facts.facts.items():
            assert fact.found_in(root), f"{name}: {fact.statement!r} not at {fact.where}"


def test_the_module_is_gone_from_the_release_after_its_last(release_cache: Path) -> None:
    for entry in _own_tree():
        after = release_tree(entry.removed_in, fetch=False).root
        assert not (after / entry.file).exists(), entry.module
        assert (after / "verl" / "trainer" / "sft_trainer.py").is_file()


def test_an_old_sft_launch_is_forecast_as_the_last_release_with_its_trainer(
    here: Path, tmp_path: Path, release_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(capsys, "fit", _script(tmp_path), "--gpu", "H100")
    assert status == 0, err
    assert f"the launch runs {OLD} (removed in verl 0.7.1)" in out
    assert (
        "model.path from model.partial_pretrain (verl/trainer/fsdp_sft_trainer.py:211@0.7.0)" in out
    )
    assert "8 GPUs (torchrun): SFT engine" in out
    # the old tree's defaults: 4 samples of data.max_length 1024 per micro-batch, gradient
    # checkpointing on (sft_trainer.yaml@0.7.0), where the new trainer packs by an 8,192-token budget
    assert "4,096 tokens/micro-batch, checkpointed" in out
    assert "8 copies (torch's cross entropy in fp32 under autocast, shifted copy)" in out


def test_the_forecast_equals_the_same_run_written_for_the_new_trainer(
    here: Path, tmp_path: Path, release_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The near-identical launch of the new trainer, its keys set as the old trainer ran: the same
    model states, activations and micro-batch; only the old trainer's code differs (its gradient
    sync each micro-batch is a key of the new tree, set here too)."""
    old = _payload(capsys, _script(tmp_path, OLD_KEYS + " data.micro_batch_size_per_gpu=2"))
    new_keys = (
        "model.path=Qwen/Qwen2.5-7B-Instruct data.use_dynamic_bsz=False "
        "data.micro_batch_size_per_gpu=2 engine.strategy=fsdp2 model.use_remove_padding=False "
        "++engine.use_no_sync_for_gradient_accumulation=False"
    )
    new = _payload(capsys, _script(tmp_path, new_keys, NEW, "new.sh"))
    old_parts, new_parts = _parts(old, "sft-update"), _parts(new, "sft-update")
    for name in ("actor.params", "actor.grads", "actor.optimizer", "actor.activations"):
        assert old_parts[name]["bytes"] == new_parts[name]["bytes"], name


def test_a_micro_batch_too_large_is_an_error_with_exit_1(
    here: Path, tmp_path: Path, release_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = OLD_KEYS + " data.micro_batch_size_per_gpu=64 model.enable_gradient_checkpointing=False"
    script = _script(tmp_path, keys)
    status, out, _ = run(capsys, "fit", script, "--gpu", "H100", "--brief")
    assert status == 1 and "error[memory.sft-update]" in out
    # the finding names the old launch's keys and only changes it can make (no engine.*, which
    # its tree lacks), located at the script's line that sets its first key
    (error,) = [line for line in out.splitlines() if "error[memory.sft-update]" in line]
    assert "data.micro_batch_size_per_gpu=" in error and "engine." not in error
    assert error.startswith(f"{script}:5:"), error
    # --set reaches the old launch as it reaches a new one
    status, out, _ = run(
        capsys,
        "fit",
        _script(tmp_path),
        "--gpu",
        "H100",
        "--brief",
        "--set",
        "data.micro_batch_size_per_gpu=64",
        "--set",
        "model.enable_gradient_checkpointing=False",
    )
    assert status == 1 and "error[memory.sft-update]" in out


@pytest.mark.parametrize(
    ("keys", "words"),
    [
        # the old trainer asserts remove-padding with sequence parallel (:231-232)
        ("ulysses_sequence_parallel_size=2", ("ulysses_sequence_parallel_size=2", "refuses")),
        # FSDP1's CPUOffload handed to FSDP2: not forecast
        ("model.fsdp_config.cpu_offload=True", ("model.strategy=fsdp2", "not forecast")),
        # a key the old tree does not have
        ("model.partial_pretrian=x", ("verl 0.7.0's sft_trainer tree rejects", "partial_pretrian")),
        # a value the forecast cannot read, named by the launch's key, not the one it moved to
        (
            "ulysses_sequence_parallel_size=-1 use_remove_padding=True",
            ("ulysses_sequence_parallel_size (carried to engine.ulysses_sequence_parallel_size)",),
        ),
        (
            "model.fsdp_config.model_dtype=half",
            ("model.fsdp_config.model_dtype (carried to engine.model_dtype)", "PrecisionType"),
        ),
    ],
)
def test_what_the_old_trainer_refuses_or_the_forecast_does_not_carry_is_one_line(
    here: Path,
    tmp_path: Path,
    release_cache: Path,
    capsys: pytest.CaptureFixture[str],
    keys: str,
    words: tuple[str, ...],
) -> None:
    status, _, err = run(capsys, "fit", _script(tmp_path, f"{OLD_KEYS} {keys}"), "--gpu", "H100")
    _one_line(status, err, *words)


def test_near_identical_valid_launches_of_those_are_forecast(
    here: Path, tmp_path: Path, release_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for keys in (
        "ulysses_sequence_parallel_size=2 use_remove_padding=True",
        "model.strategy=fsdp model.fsdp_config.cpu_offload=True model.fsdp_config.offload_params=True",
        "model.fsdp_config.cpu_offload=False",
        "model.fsdp_config.model_dtype=bf16",
    ):
        status, _, err = run(
            capsys, "fit", _script(tmp_path, f"{OLD_KEYS} {keys}"), "--gpu", "H100"
        )
        assert status == 0, (keys, err)
    # FSDP1's CPUOffload keeps the shards on the host: no resident weights or optimizer states
    offloaded = _payload(
        capsys,
        _script(
            tmp_path,
            f"{OLD_KEYS} model.strategy=fsdp model.fsdp_config.cpu_offload=True "
            "model.fsdp_config.offload_params=True",
        ),
    )
    kept = _payload(capsys, _script(tmp_path, f"{OLD_KEYS} model.strategy=fsdp", name="fsdp.sh"))
    assert "actor.optimizer" in _parts(kept, "sft-update")
    assert "actor.optimizer" not in _parts(offloaded, "sft-update")


def test_remove_padding_without_sequence_parallel_pads_every_sample(
    here: Path, tmp_path: Path, release_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """use_sp is remove-padding *and* a Ulysses size above 1 (fsdp_sft_trainer.py:374@0.7.0):
    alone, remove-padding leaves every sample padded to data.max_length, whatever --lengths says."""
    script = _script(tmp_path, f"{OLD_KEYS} use_remove_padding=True")
    status, out, err = run(capsys, "fit", script, "--gpu", "H100", "--lengths", "100,100")
    assert status == 0, err
    assert "4,096 tokens/micro-batch" in out and "--lengths is not used" in out
    packed = _script(
        tmp_path,
        f"{OLD_KEYS} use_remove_padding=True ulysses_sequence_parallel_size=2",
        name="sp.sh",
    )
    status, out, err = run(capsys, "fit", packed, "--gpu", "H100", "--lengths", "100,100")
    assert status == 0, err
    assert "--lengths is not used" not in out and "4,096 tokens/micro-batch" not in out


def test_check_still_says_the_release_lacks_the_module(
    here: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run(capsys, "check", _script(tmp_path))
    assert status == 1
    assert f"has no entry point {OLD}" in out


def test_a_module_no_release_had_is_still_refused(
    here: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert retired_entry("verl.trainer.fsdp_sft_trainerx") is None
    script = _script(tmp_path, module="verl.trainer.fsdp_sft_trainerx")
    status, _, err = run(capsys, "fit", script, "--gpu", "H100")
    _one_line(status, err, "has no entry point verl.trainer.fsdp_sft_trainerx")


def test_a_default_earlier_releases_had_otherwise_is_said_with_its_forecast(
    here: Path, tmp_path: Path, release_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """verl 0.4.0 and earlier left gradient checkpointing off (sft_trainer.yaml:35@0.4.0): a
    launch that leaves the key out is forecast with 0.7.0's default, and told what its update
    peaks at without it; a launch that sets it is not."""
    status, out, err = run(capsys, "fit", _script(tmp_path), "--gpu", "H100", "--brief")
    assert status == 0, err
    (said,) = [line for line in out.splitlines() if "verl 0.4.0 and earlier had false" in line]
    without = float(said.split("peaks at ")[1].split(" GiB")[0])
    (update,) = [line for line in out.splitlines() if line.strip().startswith("SFT update")]
    assert without > float(update.split()[2]) * 1.5
    keys = f"{OLD_KEYS} model.enable_gradient_checkpointing=False"
    status, out, _ = run(capsys, "fit", _script(tmp_path, keys), "--gpu", "H100", "--brief")
    assert "verl 0.4.0 and earlier" not in out
    (update,) = [line for line in out.splitlines() if line.strip().startswith("SFT update")]
    assert abs(float(update.split()[2]) - without) < 0.01


DAPO = """python3 -m {module} \\
    data.train_files=/d/train.parquet data.val_files=/d/test.parquet \\
    data.max_prompt_length=2048 data.max_response_length=8192 data.train_batch_size=64 \\
    data.gen_batch_size=96 \\
    algorithm.adv_estimator=grpo algorithm.filter_groups.enable=True \\
    algorithm.filter_groups.metric=acc algorithm.filter_groups.max_num_gen_batches=10 \\
    actor_rollout_ref.model.path=Qwen/Qwen2.5-7B \\
    actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=16 \\
    actor_rollout_ref.actor.use_dynamic_bsz=True \\
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20480 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \\
    actor_rollout_ref.rollout.gpu_memory_utilization=0.8 \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=4 \\
    {extra} trainer.n_gpus_per_node=8 trainer.nnodes=1 $@
"""


def _dapo(tmp_path: Path, module: str, extra: str = "", name: str = "dapo.sh") -> str:
    path = tmp_path / name
    path.write_text(DAPO.format(module=module, extra=extra), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("module", ["recipe.dapo.main_dapo", "recipe.dapo.src.main_dapo"])
def test_a_dapo_recipe_launch_is_forecast_as_main_ppo_with_its_overrides(
    here: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], module: str
) -> None:
    """The recipe's trainer builds main_ppo's workers and its config is ppo_trainer's with DAPO's
    keys, which verl 0.9.0's main_ppo reads itself (algorithm.filter_groups, data.gen_batch_size):
    the forecast is the same launch's as main_ppo's, part for part."""
    entry = retired_entry(module)
    assert entry is not None and entry.forecast_as == "verl.trainer.main_ppo"
    assert all(where.startswith("https://github.com/") and said for where, said in entry.shown_by)
    recipe = _payload(capsys, _dapo(tmp_path, module))
    same = _payload(capsys, _dapo(tmp_path, "verl.trainer.main_ppo", name="ppo.sh"))
    assert recipe["assumptions"][0].startswith(f"the launch runs {module}, DAPO's")
    # what the recipe's trainer did otherwise is said with it
    assert ("reference log-prob pass is not forecast" in recipe["assumptions"][0]) is (
        module == "recipe.dapo.src.main_dapo"
    )
    assert recipe["ranks"] == same["ranks"]
    assert recipe["findings"] == same["findings"]


def test_a_dapo_key_the_release_lacks_is_set_aside_and_said(
    here: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The recipe's own reward keys (reward_model.overlong_buffer) are legacy reward keys verl
    0.9.0's main_ppo never reads: said, not a refusal; the forecast is the rest's."""
    extra = "reward_model.reward_manager=dapo reward_model.overlong_buffer.enable=True"
    script = _dapo(tmp_path, "recipe.dapo.main_dapo", extra)
    status, out, err = run(capsys, "fit", script, "--gpu", "H100", "--brief")
    assert status in (0, 1) and "Traceback" not in err, err
    assert "reward_model.reward_manager" in out and "recipe.dapo.main_dapo" in out


def test_a_key_the_old_trainer_never_reads_is_said(
    here: Path, tmp_path: Path, release_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """data.micro_batch_size (the old global size) is read nowhere in 0.7.0's trainer, which
    splits by data.micro_batch_size_per_gpu (fsdp_sft_trainer.py:484@0.7.0): a launch setting it
    is told, and forecast at the per-GPU size; one setting the per-GPU size is not told."""
    import re

    for entry in _own_tree():
        source = (release_tree(entry.last_release, fetch=False).root / entry.file).read_text()
        root = release_tree(entry.last_release, fetch=False).root
        for unread in entry.unread:
            assert Fact(None, "", unread.where, unread.statement).found_in(root), unread.key
            leaf = unread.key.rsplit(".", 1)[1]
            assert not re.search(rf"\b{leaf}\b(?!_)", source), unread.key
            assert unread.instead.rsplit(".", 1)[1] in source
    status, out, err = run(
        capsys, "fit", _script(tmp_path, f"{OLD_KEYS} data.micro_batch_size=64"), "--gpu", "H100"
    )
    assert status == 0, err
    assert "sets data.micro_batch_size, which verl 0.7.0's trainer never reads" in out
    assert "4,096 tokens/micro-batch" in out  # the per-GPU default, 4 samples of 1,024
    keys = f"{OLD_KEYS} data.micro_batch_size_per_gpu=2"
    status, out, _ = run(capsys, "fit", _script(tmp_path, keys, name="per_gpu.sh"), "--gpu", "H100")
    assert "never reads" not in out and "2,048 tokens/micro-batch" in out
