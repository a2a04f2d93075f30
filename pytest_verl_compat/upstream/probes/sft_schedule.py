"""The schedule of an SFT run's events, decided by upstream's own SFT loop: answered in the oracle
process (``--serve``) for the run conformance of the SFT loop's leaves
(tests/test_run_conformance_sft_loop.py).

An ``sft_schedule`` question holds a base resolved ``sft_trainer_engine`` mapping and runs; a run
is a data set size, a validation set size and phases, each a mapping's overrides (dotted key →
value). The phases of a run share one run folder, each a fresh trainer as a restarted process
is: verl 0.9.0's ``SFTTrainer.__init__`` runs (verl/trainer/sft_trainer.py:51-80) with its own
``_build_dataloader`` (:224-270: the DistributedSampler and StatefulDataLoader, whose state a
checkpoint keeps), ``_init_engine`` (:179-198: total_training_steps from total_epochs × batches
per epoch, the ``after_each_epoch`` cadences), ``_build_ckpt_handler`` and the handler's
``load_checkpoint`` (:73, :82-98; verl/utils/checkpoint/checkpoint_handler.py:143-233:
resume_mode, resume_from_path, the tracker file) and ``save_checkpoint`` (:90-141), then its
``fit`` (:308-448: the epochs, the last step, test_freq and save_freq).

The stand-in boundary: what a step and a validation compute is not the schedule, so the model
config (``_build_config``'s tokenizer and dataclasses), the data sets (rows are their indexes),
the engine and its training client (``_build_engine``), the tensordict packing, the loggers,
the progress bar, the cache and memory reports and the process group's barrier are recorders,
identities or no-ops; the engine's checkpoint files are one marker file; the device is the CPU
and the loader reads in the process (``num_workers`` 0).

The answer holds, per run, per phase: the checkpoint it resumed from (a folder name, or None),
its first step, and its events in order: a training step, a validation and a checkpoint save,
each at its step.
"""

from __future__ import annotations

import os
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

# The request's and the answer's keys are the RL loop's probe's (``run_schedule``), and so is
# the way a run's phases run one after another in one folder (``answer_runs``).
from pytest_verl_compat.upstream.probes.run_schedule import (
    CHECKPOINTS,
    EVENTS,
    KEY_BASE,
    KEY_DATASET,
    KEY_ERROR,
    KEY_PHASES,
    KEY_RUNS,
    RESUMED,
    SAVE,
    START,
    TRAIN,
    VALIDATE,
    answer_runs,
)

KIND = "sft_schedule"
KEY_VAL_DATASET = "val dataset"

__all__ = [
    "CHECKPOINTS",
    "EVENTS",
    "KEY_BASE",
    "KEY_DATASET",
    "KEY_ERROR",
    "KEY_PHASES",
    "KEY_RUNS",
    "KEY_VAL_DATASET",
    "KIND",
    "RESUMED",
    "SAVE",
    "START",
    "TRAIN",
    "VALIDATE",
]


class Engine:
    """One data-parallel rank that outputs; its checkpoint is a marker file."""

    def __init__(self) -> None:
        self.loaded: list[str] = []

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_data_parallel_size(self) -> int:
        return 1

    def get_data_parallel_group(self) -> None:
        return None

    def is_mp_src_rank_with_outputs(self) -> bool:
        return True

    def save_checkpoint(self, local_path: str, global_step: int = 0, **_: Any) -> None:
        os.makedirs(local_path, exist_ok=True)
        Path(local_path, "model").write_text(f"{global_step}\n")

    def load_checkpoint(self, local_path: str, **_: Any) -> None:
        self.loaded.append(local_path)


class TrainingClient:
    """The training worker: each trained batch and validated batch is an event at its step."""

    def __init__(self, engine: Engine, events: list[list[Any]]) -> None:
        self.engine, self.events = engine, events
        self.step = 0

    def reset(self) -> None:
        pass

    def train_batch(self, data: Any) -> dict[str, Any]:
        # fit adds one to its step before each batch (sft_trainer.py:371).
        self.step += 1
        self.events.append([TRAIN, self.step])
        return {"metrics": {"loss": 0.0}}

    def infer_batch(self, data: Any) -> dict[str, Any]:
        self.events.append([VALIDATE, self.step])
        return {"metrics": {"loss": 0.0}}

    def __getattr__(self, name: str) -> Callable[..., None]:  # the profiler's hooks
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *_, **__: None


class Quiet:
    """A logger that records nothing."""

    def __init__(self, *_: Any, **__: Any) -> None:
        pass

    def log(self, *_: Any, **__: Any) -> None:
        pass


def phase(mapping: Mapping[str, Any], dataset: int, val_dataset: int) -> dict[str, Any]:
    """One process's run in the working folder: upstream's construction (resume), then ``fit``."""
    import torch
    from omegaconf import OmegaConf
    from verl.trainer import sft_trainer

    from pytest_verl_compat.upstream.probes.patching import all_patched

    events: list[list[Any]] = []
    engine = Engine()
    upstream = sft_trainer.SFTTrainer

    def build_config(self: Any) -> None:
        self.model_config = types.SimpleNamespace(
            tokenizer=types.SimpleNamespace(pad_token_id=0), processor=None
        )
        self.optimizer_config = types.SimpleNamespace()
        self.profiler_interval = self.config.trainer.profile_interval
        self._validate_profiler_interval()

    def build_dataset(self: Any) -> None:
        self.train_dataset = list(range(dataset))
        self.val_dataset = list(range(val_dataset)) or None

    def build_engine(self: Any) -> None:
        self.engine = engine
        self.training_client = TrainingClient(engine, events)

    tensordicts = types.SimpleNamespace(
        get_tensordict=lambda tensor_dict, non_tensor_dict=None: tensor_dict,
        assign_non_tensor=lambda *_, **__: None,
        get=lambda output, key: output[key],
    )
    patches = [
        (upstream, "_build_config", build_config),
        (upstream, "_build_dataset", build_dataset),
        (upstream, "_build_engine", build_engine),
        (upstream, "_get_batch_seqlens", lambda self, data: [1] * len(data)),
        (sft_trainer, "SFTTensorCollator", lambda pad_mode: list),
        (sft_trainer, "tu", tensordicts),
        (sft_trainer, "Tracking", Quiet),
        (sft_trainer, "tqdm", lambda iterable, **_: iterable),
        (sft_trainer, "aggressive_empty_cache", lambda **_: None),
        (sft_trainer, "log_gpu_memory_usage", lambda *_, **__: None),
        (torch.distributed, "get_rank", lambda *_, **__: 0),
        (torch.distributed, "barrier", lambda *_, **__: None),
    ]
    cfg = OmegaConf.create(dict(mapping))
    # The sandbox's CPU, and the loader reading in this process (neither decides the schedule).
    cfg.trainer.device, cfg.data.num_workers = "cpu", 0
    with all_patched(patches):
        trainer = upstream(config=cfg)
        start = trainer.resume_global_step
        trainer.training_client.step = start
        save = trainer.ckpt_handler.save_checkpoint

        def save_and_record(step: int) -> None:
            save(step=step)
            events.append([SAVE, step])

        trainer.ckpt_handler.save_checkpoint = save_and_record
        trainer.fit()
    return {
        RESUMED: Path(engine.loaded[-1]).name if engine.loaded else None,
        START: start,
        EVENTS: events,
    }


def answer(request: Mapping[str, Any]) -> dict[str, Any]:
    def one(mapping: dict[str, Any], run: Mapping[str, Any]) -> dict[str, Any]:
        return phase(mapping, int(run[KEY_DATASET]), int(run[KEY_VAL_DATASET]))

    return answer_runs(request, one, "sft-schedule-")


ORACLE_HANDLERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {KIND: answer}
