"""The schedule of a run's events, decided by upstream's own loop: answered in the oracle process
(``--serve``) for the run conformance of the loop's leaves (tests/test_run_conformance_loop.py).

A ``run_schedule`` question holds a base resolved mapping and runs; a run is a data set size and
phases, each a mapping's overrides (dotted key → value). The phases of a run share one run
folder, each a fresh trainer as a restarted process is: upstream's ``PPOTrainer`` is constructed
and its loaders set up (``_init_dataloader``: steps per epoch and total_training_steps,
verl/trainer/ppo/v1/trainer_base.py:653-731) in the probes' sandbox (``trainer.ray_free``), then
its own ``_load_checkpoint`` (:789-853: resume_mode, resume_from_path, find_latest_ckpt_path)
and ``fit`` (:387-509: val_before_train, the epoch and step bounds, save_freq, test_freq) run in
a fresh folder of the oracle's, and its ``_save_checkpoint`` (:885-946) writes there.

The stand-in boundary: what a step, a validation and a worker's checkpoint files compute is not
the schedule, so ``step``, ``_validate``, ``_compute_metrics``, the loggers, the progress bar,
the transfer queue's clearing and the rollout replicas' weight updates are recorders or no-ops;
each role's worker saves through upstream's checkpoint manager retention
(``BaseCheckpointManager.ensure_checkpoint_capacity`` and ``register_checkpoint``,
verl/utils/checkpoint/checkpoint_manager.py:166-194, in the order the FSDP manager calls them,
fsdp_checkpoint_manager.py:296-297 and :475-476), its model files stood in by one marker file.

The answer holds, per run, per phase: the checkpoint it resumed from (a folder name, or None),
its first step, and its events in order: a validation at a step, a training step, a checkpoint
save at a step with, after it, the steps whose actor and critic parts remain on disk.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import tempfile
import types
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

KIND = "run_schedule"
KEY_BASE = "base"
KEY_RUNS = "runs"
KEY_DATASET = "dataset"
KEY_PHASES = "phases"
KEY_ERROR = "error"
# What a phase's answer holds.
RESUMED = "resumed from"
START = "start"
EVENTS = "events"
VALIDATE = "validate"
TRAIN = "train"
SAVE = "save"
ROLES = ("actor", "critic")
# The run folder's checkpoint root, relative to the working folder as verl's default is.
CHECKPOINTS = "checkpoints"
_STEP_FOLDER = re.compile(r"global_step_([0-9]+)")


class Quiet:
    """A logger, progress bar or manager that records nothing: any call answers None."""

    def __init__(self, *_: Any, **__: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *_, **__: None


class LoaderState:
    """The train loader's resumable state, saved to and loaded from ``data.pt`` by upstream."""

    def __init__(self) -> None:
        self.loaded: Any = None

    def state_dict(self) -> dict[str, int]:
        return {"stand-in": 0}

    def load_state_dict(self, state: Any) -> None:
        self.loaded = state


class RoleCheckpoints:
    """A role's worker group saving through upstream's checkpoint manager retention, with one
    manager per phase (a restarted process's starts with no previous saves, as upstream's)."""

    def __init__(self) -> None:
        from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager

        # The constructor needs a process group for its rank; retention reads only this list.
        self.manager = BaseCheckpointManager.__new__(BaseCheckpointManager)
        self.manager.previous_saved_paths = []
        self.loaded: list[str] = []

    def save_checkpoint(
        self,
        local_path: str,
        hdfs_path: str | None = None,
        global_step: int = 0,
        max_ckpt_to_keep: int | None = None,
    ) -> None:
        self.manager.ensure_checkpoint_capacity(max_ckpt_to_keep)
        os.makedirs(local_path, exist_ok=True)
        Path(local_path, "model").write_text(f"{global_step}\n")
        self.manager.register_checkpoint(local_path, max_ckpt_to_keep)

    def load_checkpoint(self, local_path: str, del_local_after_load: bool = False) -> None:
        self.loaded.append(local_path)


def _kept(root: Path, critic_name: str) -> dict[str, list[int]]:
    """The steps whose actor and critic parts are on disk."""
    kept: dict[str, list[int]] = {role: [] for role in ROLES}
    folders = sorted(root.iterdir()) if root.is_dir() else []
    for folder in folders:
        found = _STEP_FOLDER.fullmatch(folder.name)
        if found is None:
            continue
        for role, name in zip(ROLES, ("actor", critic_name), strict=True):
            if (folder / name).is_dir():
                kept[role].append(int(found.group(1)))
    return {role: sorted(steps) for role, steps in kept.items()}


def _trainer(mapping: Mapping[str, Any], dataset: int) -> Any:
    """Upstream's trainer constructed and its loaders set up on a data set of `dataset` rows."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1 import get_trainer_cls, trainer_base

    from pytest_verl_compat.upstream.probes import trainer as trainer_probe
    from pytest_verl_compat.upstream.probes.patching import all_patched

    cfg = OmegaConf.create(dict(mapping))
    stand_in = trainer_probe.StandInDataset(dataset)
    with (
        trainer_probe.ray_free(mapping),
        all_patched([(trainer_base, "create_rl_dataset", lambda *a, **k: stand_in)]),
    ):
        trainer = get_trainer_cls(cfg.trainer.v1.trainer_mode)(config=cfg)
        trainer.tokenizer = trainer.processor = None  # handed to the stand-in data set only
        trainer._init_dataloader()
    return trainer


def phase(mapping: Mapping[str, Any], dataset: int) -> dict[str, Any]:
    """One process's run in the working folder: upstream's resume, then its ``fit``."""
    from verl.trainer.ppo.utils import Role
    from verl.trainer.ppo.v1 import trainer_base

    from pytest_verl_compat.upstream.probes.patching import all_patched

    trainer = _trainer(mapping, dataset)
    events: list[list[Any]] = []
    root = Path(CHECKPOINTS)
    workers = {role: RoleCheckpoints() for role in ROLES}
    trainer.actor_rollout_wg, trainer.critic_wg = workers["actor"], workers["critic"]
    trainer.train_dataloader = LoaderState()
    trainer.checkpoint_manager = Quiet()
    trainer._init_dump_executor()

    def step(metrics: dict[str, Any], timing_raw: dict[str, Any]) -> Any:
        events.append([TRAIN, trainer.global_steps])
        return types.SimpleNamespace(keys=[], tags=[], partition_id="train")

    def validate() -> dict[str, float]:
        events.append([VALIDATE, trainer.global_steps])
        return {"val-core/stand-in": 0.0}

    save = trainer._save_checkpoint

    def save_and_look() -> None:
        save()
        events.append([SAVE, trainer.global_steps, _kept(root, str(Role.Critic))])

    trainer.step, trainer._validate, trainer._save_checkpoint = step, validate, save_and_look
    trainer._compute_metrics = lambda *a, **k: None
    quiet = [
        (trainer_base, name, Quiet)
        for name in ("Tracking", "ValidationGenerationsLogger", "DapoFilteredRewardTableLogger")
    ]
    with all_patched(
        [
            *quiet,
            (trainer_base, "tqdm", Quiet),
            (trainer_base, "tq", types.SimpleNamespace(kv_clear=lambda *a, **k: None)),
        ]
    ):
        trainer._load_checkpoint()
        loaded = workers["actor"].loaded
        start = trainer.global_steps
        trainer.fit(agent_loop_manager=None)
    return {
        RESUMED: Path(loaded[-1]).parent.name if loaded else None,
        START: start,
        EVENTS: events,
    }


# One phase of a run: upstream's trainer built on the phase's configuration and its loop run,
# given the run's request (its data set's size); what it recorded.
Phase = Callable[[dict[str, Any], Mapping[str, Any]], dict[str, Any]]


def run_phases(
    base: Mapping[str, Any], run: Mapping[str, Any], phase: Phase, prefix: str
) -> list[dict[str, Any]] | dict[str, str]:
    """A run's phases (``KEY_PHASES``: overrides of ``base``) one after another in one fresh
    folder; a phase upstream refuses ends the run with its error."""
    from omegaconf import OmegaConf

    phases: list[dict[str, Any]] = []
    previous = os.getcwd()
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        os.chdir(folder)
        # Upstream's checkpoint folders are made under a lock file in the temp folder
        # (``local_mkdir_safe``, verl/utils/fs.py:293-294): kept in the run's own folder, which
        # goes with it, not left in the machine's /tmp (tempfile's documented ``tempdir``).
        saved_tempdir = tempfile.tempdir
        tempfile.tempdir = str(Path(folder) / "tmp")
        Path(tempfile.tempdir).mkdir()
        try:
            for overrides in run[KEY_PHASES]:
                cfg = OmegaConf.create(dict(base))
                for key, value in overrides.items():
                    OmegaConf.update(cfg, key, value, force_add=True)
                mapping = OmegaConf.to_container(cfg)
                assert isinstance(mapping, dict)
                phases.append(phase({str(k): v for k, v in mapping.items()}, run))
        except Exception as exc:  # upstream's refusal is the answer
            first = (str(exc).strip().splitlines() or [""])[0]
            return {KEY_ERROR: f"{type(exc).__name__}: {first[:300]}"}
        finally:
            tempfile.tempdir = saved_tempdir
            os.chdir(previous)
    return phases


def answer_runs(request: Mapping[str, Any], phase: Phase, prefix: str) -> dict[str, Any]:
    """Every run of the request (``KEY_RUNS``), quietly: upstream prints and warns as it goes."""
    runs = []
    for run in request[KEY_RUNS]:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runs.append(run_phases(request[KEY_BASE], run, phase, prefix))
    return {KEY_RUNS: runs}


def answer(request: Mapping[str, Any]) -> dict[str, Any]:
    return answer_runs(
        request, lambda mapping, run: phase(mapping, int(run[KEY_DATASET])), "run-schedule-"
    )


ORACLE_HANDLERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {KIND: answer}
