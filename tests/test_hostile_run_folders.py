"""Hostile run folders (issue #14 item 11): a run folder from someone else never runs code and
never makes the trainer read outside its checkpoint.

Each attack edits a copy of a finished tiny grpo run and resumes it; the payload, where code
could run, is the shared canary (`tests/hostile_canary.py`). Expected verdict per attack: the
resume is refused with a one-line `CheckpointError`/`RunFolderError` naming the file, or
(unlisted files) the file is ignored and the resume proceeds, and the canary never fires.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from hostile_canary import Canary
from run_folder_fixtures import copy_run, grpo_config, relist, tiny_budget, train
from safetensors.torch import load_file, save_file

from reference_trainer.checkpoint import CheckpointError, load_checkpoint
from reference_trainer.config import ReferenceTrainerConfig
from reference_trainer.run_files import RunFolderError


@pytest.fixture(scope="module")
def cfg() -> ReferenceTrainerConfig:
    return grpo_config()


@pytest.fixture(scope="module")
def finished(cfg: ReferenceTrainerConfig, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    train(cfg, out, tiny_budget())
    return out


@pytest.fixture
def run(finished: Path, tmp_path: Path) -> Path:
    return copy_run(finished, tmp_path / "run")


def last_checkpoint(run: Path) -> Path:
    return run / "checkpoints" / "global_step_2"


class _Payload:
    """Unpickling this calls exec(code): what an unsafe torch.load would run."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (self.code,))


def resume(cfg: ReferenceTrainerConfig, run: Path) -> int:
    """Resume the finished run as it was (same budget): the last checkpoint loads, no step runs."""
    return train(cfg, run, tiny_budget(), resume=True).final_step


def test_an_unlisted_pickle_next_to_the_verified_state_is_never_loaded(
    cfg: ReferenceTrainerConfig, run: Path, canary: Canary
) -> None:
    torch.save(_Payload(canary.python), last_checkpoint(run) / "trainer_state.pt")
    assert resume(cfg, run) == 2
    assert not canary.fired()


def test_an_unlisted_state_never_overrides_the_verified_json(
    cfg: ReferenceTrainerConfig, run: Path
) -> None:
    # A weights-only-clean trainer_state.pt claiming step 999 (it would end training at once).
    state = json.loads((last_checkpoint(run) / "trainer_state.json").read_text())
    torch.save({**state, "step": 999}, last_checkpoint(run) / "trainer_state.pt")
    loaded = load_checkpoint(last_checkpoint(run))
    assert loaded["trainer_state"]["step"] == 2
    assert resume(cfg, run) == 2


def test_a_listed_pickle_is_refused_by_the_weights_only_loader(
    cfg: ReferenceTrainerConfig, run: Path, canary: Canary
) -> None:
    path = last_checkpoint(run) / "actor_scheduler.pt"
    torch.save(_Payload(canary.python), path)
    relist(last_checkpoint(run))
    with pytest.raises(CheckpointError, match=rf"^{path}: refused by the weights-only loader"):
        resume(cfg, run)
    assert not canary.fired()


@pytest.mark.parametrize(
    "entry", ["../../outside.json", "/etc/hostname", "sub/inner.json", "..", ".hidden\nx"]
)
def test_manifest_entries_outside_the_checkpoint_are_refused(
    entry: str, cfg: ReferenceTrainerConfig, run: Path
) -> None:
    checkpoint = last_checkpoint(run)
    outside = run / "outside.json"
    outside.write_text('{"step": 999}')
    (checkpoint / "sub").mkdir()
    (checkpoint / "sub" / "inner.json").write_text("{}")
    relist(checkpoint, **{entry: ""})
    manifest = checkpoint / "manifest.json"
    with pytest.raises(CheckpointError, match=rf"^{manifest}: entry .* is not a plain file name"):
        resume(cfg, run)


def test_a_symlinked_checkpoint_file_is_refused(
    cfg: ReferenceTrainerConfig, run: Path, tmp_path: Path
) -> None:
    checkpoint = last_checkpoint(run)
    real = tmp_path / "elsewhere.safetensors"
    (checkpoint / "actor.safetensors").rename(real)
    (checkpoint / "actor.safetensors").symlink_to(real)  # same bytes, same digest
    with pytest.raises(CheckpointError, match=rf"^{checkpoint / 'actor.safetensors'}: a symlink"):
        resume(cfg, run)


def test_a_fifo_in_the_manifest_is_refused_unread(cfg: ReferenceTrainerConfig, run: Path) -> None:
    checkpoint = last_checkpoint(run)
    os.mkfifo(checkpoint / "budget.json.fifo")
    relist(checkpoint, **{"budget.json.fifo": ""})
    fifo = checkpoint / "budget.json.fifo"
    with pytest.raises(CheckpointError, match=rf"^{fifo}: not a regular file"):
        resume(cfg, run)


def test_a_wrong_shape_tensor_is_one_line_naming_the_checkpoint(
    cfg: ReferenceTrainerConfig, run: Path
) -> None:
    checkpoint = last_checkpoint(run)
    tensors = load_file(checkpoint / "actor.safetensors")
    name = sorted(tensors)[0]
    tensors[name] = torch.zeros(3, 5)
    save_file(tensors, checkpoint / "actor.safetensors")
    relist(checkpoint)
    with pytest.raises(
        CheckpointError, match=rf"^{checkpoint}: does not fit this run \("
    ) as raised:
        resume(cfg, run)
    assert "\n" not in str(raised.value)


def test_a_huge_int_in_the_state_is_one_line_naming_the_file(
    cfg: ReferenceTrainerConfig, run: Path
) -> None:
    checkpoint = last_checkpoint(run)
    state = checkpoint / "trainer_state.json"
    state.write_text(state.read_text().replace('"step": 2', '"step": 2' + "0" * 5000, 1))
    relist(checkpoint)
    with pytest.raises(CheckpointError, match=rf"^{state}: cannot be loaded"):
        resume(cfg, run)


def test_invalid_utf8_in_the_state_is_one_line_naming_the_file(
    cfg: ReferenceTrainerConfig, run: Path
) -> None:
    checkpoint = last_checkpoint(run)
    state = checkpoint / "config.json"
    state.write_bytes(b'{"case_id": "\xff"}')
    relist(checkpoint)
    with pytest.raises(CheckpointError, match=rf"^{state}: cannot be loaded"):
        resume(cfg, run)


def test_a_symlinked_lock_file_is_refused(run: Path, cfg: ReferenceTrainerConfig) -> None:
    target = run.parent / "victim"
    target.write_text("keep\n")
    (run / ".lock").unlink(missing_ok=True)
    (run / ".lock").symlink_to(target)
    with pytest.raises(RunFolderError, match=rf"^{run / '.lock'}: the lock file is not a regular"):
        resume(cfg, run)
    assert target.read_text() == "keep\n"


def test_a_symlinked_metrics_file_is_not_replaced(
    run: Path, cfg: ReferenceTrainerConfig, tmp_path: Path
) -> None:
    target = tmp_path / "victim.jsonl"
    (run / "metrics.jsonl").rename(target)
    (run / "metrics.jsonl").symlink_to(target)
    before = target.read_bytes()
    with pytest.raises(RunFolderError, match=rf"^{run / 'metrics.jsonl'}: not a regular file"):
        resume(cfg, run)
    assert target.read_bytes() == before


def test_a_checkpoint_folder_with_a_non_numeric_step_is_not_a_checkpoint(
    cfg: ReferenceTrainerConfig, run: Path
) -> None:
    fake = run / "checkpoints" / "global_step_x"
    fake.mkdir()
    (fake / "COMPLETE").write_text("x\n")
    assert resume(cfg, run) == 2


@pytest.mark.parametrize("step", ['"2"', "7", "-1"])
def test_a_state_whose_step_is_not_the_folders_is_refused(
    step: str, cfg: ReferenceTrainerConfig, run: Path
) -> None:
    checkpoint = last_checkpoint(run)
    state = checkpoint / "trainer_state.json"
    state.write_text(state.read_text().replace('"step": 2', f'"step": {step}', 1))
    relist(checkpoint)
    with pytest.raises(CheckpointError, match=rf"^{state}: step .* is not the folder's step 2$"):
        resume(cfg, run)
