"""The SFT trainer's own construction, run: ``SFTTrainer.__init__`` step by step under torchrun.

``run_sft`` (verl/trainer/sft_trainer.py:451-457) starts a process group of torchrun's world and
constructs ``SFTTrainer``, whose ``__init__`` (:51-80) builds the config dataclasses and checks
the profiler interval (``_build_config``, :138-157), the data sets (``_build_dataset``,
``create_sft_dataset`` :467-483), the ``TrainingWorker`` with its engine (``_build_engine``,
:159-177), the data loaders' batch arithmetic (``_build_dataloader``, :224-270), the engine's
model, optimizer and schedule (``_init_engine``, :179-198) and the checkpoint handler with its
resume (``_build_ckpt_handler`` and ``load_checkpoint``, :82-98 and :73). The probe calls those
methods themselves, in that order, each a step of its own, on rank 0 of the launch's world
(``torchrun_free``): the process group, the data files, the model's files and the user's modules
and checkpoints are stood in (``boundary.laptop``, ``sft_model``), and a resume path is looked up
as data. A step that fails after building what the later steps use lets them run (each failure
is then reported, not only the first); one that fails before ends the construction, but for the
data sets, which leave a stand-in (the steps after them never read their rows).
"""

from __future__ import annotations

import contextlib
import functools
import os
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from pytest_verl_compat.upstream.probes.boundary import laptop
from pytest_verl_compat.upstream.probes.patching import all_patched, attached
from pytest_verl_compat.upstream.probes.records import KEY_REASON, KEY_STEP, Collector
from pytest_verl_compat.upstream.probes.sft import model as sft_model

TRAINER_INIT = "trainer init: SFTTrainer.__init__"
# Values the trainer keeps as its own attributes or hands to the checkpoint handler (never a
# configuration read where they are tested), by their names there, with the keys they come from
# (sft_trainer.py:83-92 and :148).
KNOBS = {
    "profiler_interval": ("trainer.profile_interval",),
    "resume_mode": ("trainer.resume_mode",),
    "resume_from_path": ("trainer.resume_from_path",),
    "default_local_dir": ("trainer.default_local_dir",),
    # FSDPEngine keeps it as an attribute (transformer_impl.py:225) and divides by it (:633)
    "ulysses_sequence_parallel_size": ("engine.ulysses_sequence_parallel_size",),
}
# A stand-in data set holds two steps' rows, so that an epoch has a first step.
STAND_IN_STEPS = 2
# The steps of ``SFTTrainer.__init__`` in its order (sft_trainer.py:61-73), each with what it
# builds that the later steps use: a step that raised before building all of it ends the
# construction (the profiler interval's asserts come after the configs they need).
INIT_STEPS = (
    (
        "_build_config",
        (
            "model_config",
            "engine_config",
            "optimizer_config",
            "checkpoint_config",
            "profiler_config",
        ),
    ),
    ("_build_dataset", ("train_dataset", "val_dataset")),
    ("_build_engine", ("loss_fn", "training_client", "engine")),
    (
        "_build_dataloader",
        (
            "train_sampler",
            "global_batch_size",
            "train_batch_size_per_dp",
            "collate_fn",
            "train_dataloader",
        ),
    ),
    ("_init_engine", ("total_training_steps", "steps_per_epoch", "save_freq", "test_freq")),
    ("_build_ckpt_handler", ("ckpt_handler",)),
)
RESUME_NOTE = {
    KEY_STEP: f"{TRAINER_INIT}: CheckpointHandler.load_checkpoint",
    KEY_REASON: "whether the resume path exists on the training machine is not known here; "
    "it is taken to exist (its name is checked, no file is read)",
}
CUSTOM_DATASET_NOTE = {
    KEY_STEP: f"{TRAINER_INIT}: SFTTrainer._build_dataset (data.custom_cls)",
    KEY_REASON: "the user's data set class is looked up by name only, never imported: a stand-in "
    "data set of its constructor's arguments stands for it",
}


class StandInDataset:
    """A data set of a known length whose rows are never read (the data files are the user's)."""

    def __init__(self, length: int, *_: Any, **__: Any) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        raise IndexError(index)


def stand_in_length(mapping: Mapping[str, Any]) -> int:
    """Rows of a stand-in data set: two global batches, at least one row."""
    try:
        return max(1, int(mapping["data"]["train_batch_size"]) * STAND_IN_STEPS)
    except (TypeError, ValueError):  # a batch size of the wrong type: its own finding
        return STAND_IN_STEPS


class _ModuleAsData(types.ModuleType):
    """The user's module, as data: any attribute name is a stand-in data set class, looked up by
    ``getattr`` as upstream does (a name that is not a string fails as it would there)."""

    def __init__(self, length: int) -> None:
        super().__init__("user_module_not_imported")
        self._length = length

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return functools.partial(StandInDataset, self._length)


class _PathsAsData(types.ModuleType):
    """``os`` for the checkpoint handler: paths are the training machine's, looked up as data.
    The explicit resume path exists there (its name is what upstream checks), any other path
    (``default_local_dir`` in ``auto`` mode, a data loader's state) holds nothing yet: a fresh
    start. A value that is not a path reaches the real ``os.path.exists`` (which raises)."""

    def __init__(self, resume_from_path: Any) -> None:
        super().__init__("os")
        self.path = types.SimpleNamespace(**vars(os.path))
        self.path.exists = functools.partial(_exists_as_data, resume_from_path)

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


def _exists_as_data(resume_from_path: Any, path: Any) -> bool:
    if not isinstance(path, str | bytes | os.PathLike):
        return os.path.exists(path)
    return isinstance(resume_from_path, str) and os.fspath(path) == resume_from_path


def _no_rows(self: Any) -> None:
    self.messages = [None] * self._verl_compat_length


def _refuse_load(*_: Any, **__: Any) -> Any:
    raise ImportError("not evaluated here: it would unpickle a checkpoint file of the user's")


def _checkpoint_not_read(*_: Any, **__: Any) -> None:
    return None


@contextlib.contextmanager
def torchrun_free(mapping: Mapping[str, Any], world: int) -> Iterator[list[dict[str, str]]]:
    """``SFTTrainer`` constructible here: rank 0 of torchrun's ``world`` (``laptop`` with the
    launch's world size, named by no configuration key), the data, the model's weights, the
    user's modules and checkpoints stood in; yields the stand-in model's notes."""
    import torch
    from verl.utils import import_utils
    from verl.utils.checkpoint import checkpoint_handler
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine
    from verl.workers.engine_workers import TrainingWorker

    # ``laptop`` skips the engine's build (RL's workers never need it); here it runs, on the
    # stand-in model (``_init_engine`` calls it, sft_trainer.py:198).
    reset = TrainingWorker.__dict__["reset"]
    length = stand_in_length(mapping)
    resume_from_path = mapping.get("trainer", {}).get("resume_from_path")
    patches = [
        # MultiTurnSFTDataset.__init__ runs its own checks (multiturn_sft_dataset.py:93-117);
        # the parquet files it would then copy and read are the user's.
        (MultiTurnSFTDataset, "_download", lambda self: None),
        (MultiTurnSFTDataset, "_read_files_and_process", _no_rows),
        (import_utils, "load_module", lambda *a, **k: _ModuleAsData(length)),
        (checkpoint_handler, "os", _PathsAsData(resume_from_path)),
        # A resumed run's weights and optimizer state are the user's files.
        (TrainingWorker, "reset", reset),
        (FSDPEngine, "load_checkpoint", _checkpoint_not_read),
        (torch, "load", _refuse_load),
    ]
    with (
        laptop(mapping, world=world, world_keys=(), grouped=True),
        sft_model.stand_in_model() as notes,
        attached(MultiTurnSFTDataset, "_verl_compat_length", length),
        all_patched(patches),
    ):
        yield notes


def _bare_trainer(cfg: Any) -> Any:
    """An ``SFTTrainer`` before its ``__init__`` steps: its config and rank (sft_trainer.py:55-59)."""
    import torch.distributed
    from verl.trainer.sft_trainer import SFTTrainer

    trainer = SFTTrainer.__new__(SFTTrainer)
    trainer.config = cfg
    trainer.rank = torch.distributed.get_rank()
    return trainer


def _dataset_stand_in(trainer: Any, mapping: Mapping[str, Any]) -> None:
    trainer.train_dataset = StandInDataset(stand_in_length(mapping))
    trainer.val_dataset = None


def _step(out: Collector, trainer: Any, name: str) -> bool:
    method: Callable[[], Any] = getattr(trainer, name)
    out.run(TRAINER_INIT, method, f"SFTTrainer.{name}", KNOBS)
    return all(hasattr(trainer, attribute) for attribute in dict(INIT_STEPS)[name])


def sft_trainer_probes(out: Collector, mapping: Mapping[str, Any]) -> Any:
    """``SFTTrainer.__init__``'s steps in order, then ``load_checkpoint`` (inside
    ``torchrun_free``); the trainer as far as it was built, or None when a step it needs failed."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(dict(mapping))
    trainer = _bare_trainer(cfg)
    # _init_engine writes the optimizer's horizon from a value of its own (sft_trainer.py:181-185):
    # the recorder sees a write with no read on its line, so its source is named here.
    given = mapping["trainer"].get("total_training_steps") is not None
    horizon = "trainer.total_training_steps" if given else "trainer.total_epochs"
    out.reads.provenance["optim.total_training_steps"] = frozenset({horizon})
    for name, _ in INIT_STEPS:
        if _step(out, trainer, name):
            continue
        if name != "_build_dataset":
            return None
        _dataset_stand_in(trainer, mapping)
    if mapping["data"]["custom_cls"].get("path"):
        out.not_run.append(dict(CUSTOM_DATASET_NOTE))
    resumed = out.run(
        TRAINER_INIT,
        trainer.ckpt_handler.load_checkpoint,
        "CheckpointHandler.load_checkpoint",
        KNOBS,
    )
    if resumed is not None and mapping["trainer"].get("resume_from_path") is not None:
        out.not_run.append(dict(RESUME_NOTE))
    return trainer
