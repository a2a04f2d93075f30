"""Run conformance of the loop's leaves (issue 46): the schedule of a small run's events, ours
against upstream's, for each case of ``corpus/run_conformance/loop.yaml``.

The base run is the official ``ppo`` case (a critic, so both roles' checkpoints) with the loop's
leaves at verl's defaults, two full batches per epoch, and a console logger. Each case runs twice
in one run folder, each time a fresh trainer as a restarted process is: a previous run of
``PREVIOUS_STEPS`` steps started fresh, then the case's run. A run's schedule is the checkpoint it
resumed from, its first step and its events in order: validations, training steps, and saves with
the steps whose actor and critic parts remain on disk after each.

Ours: ``ReferenceTrainer.run`` itself (the loop, resume, saving and retention of
``reference_trainer/trainer.py`` and ``checkpoint.py``, real checkpoint files of the tiny model);
``RecordingTrainer`` stands in only for what a step, a validation and the final export compute.
Upstream: ``probes/run_schedule.py`` runs verl 0.9.0's own ``_init_dataloader``,
``_load_checkpoint``, ``fit`` and ``_save_checkpoint`` (verl/trainer/ppo/v1/trainer_base.py:387-509,
:653-731, :789-853, :885-946) and its checkpoint manager's retention
(verl/utils/checkpoint/checkpoint_manager.py:166-194) in the oracle's sandbox.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from corpus_facts import needs_release
from loop_schedules import case_variants, phase_record
from run_conformance import SandboxQuestions, assert_conforms, disagreeing, set_off, with_sets
from run_conformance import leaf as value_at

from pytest_verl_compat.upstream.probes import run_schedule as schedule
from reference_trainer.budget import LocalBudget
from reference_trainer.checkpoint import PREFIX, role_files
from reference_trainer.trainer import ReferenceTrainer

pytestmark = [needs_release()]

CASES_PATH = Path(__file__).resolve().parents[1] / "corpus" / "run_conformance" / "loop.yaml"
CASES: list[dict[str, Any]] = yaml.safe_load(CASES_PATH.read_text())
LOOP_LEAVES = (
    "trainer.total_epochs",
    "trainer.total_training_steps",
    "trainer.save_freq",
    "trainer.test_freq",
    "trainer.val_before_train",
    "trainer.resume_mode",
    "trainer.resume_from_path",
    "trainer.max_actor_ckpt_to_keep",
    "trainer.max_critic_ckpt_to_keep",
)
STEPS_PER_EPOCH = 2
LOCAL_TRAIN_BATCH = 2
PREVIOUS_STEPS = 3
# The previous run: three steps, started fresh (it resumes nothing, whatever the case's resume).
PREVIOUS = {
    "trainer.total_training_steps": PREVIOUS_STEPS,
    "trainer.resume_mode": "auto",
    "trainer.resume_from_path": None,
}
SERVED = ("pytest_verl_compat.upstream.probes.run_schedule",)


@pytest.fixture(scope="module")
def verl_defaults(upstream_session: Any) -> dict[str, Any]:
    tree = upstream_session.composer().compose((), {}).mapping
    return {key: value_at(tree, key) for key in LOOP_LEAVES}


@pytest.fixture(scope="module")
def base(upstream_session: Any, verl_defaults: dict[str, Any]) -> dict[str, Any]:
    """The ppo case with the loop's leaves at verl's defaults, logging to the console, saving
    under ``checkpoints`` of the working folder (as the reference trainer's run folder)."""
    mapping = upstream_session.outcome(upstream_session.manifest.case("ppo")).composition.mapping
    return with_sets(
        mapping,
        {
            **verl_defaults,
            "trainer.logger": ["console"],
            "trainer.default_local_dir": schedule.CHECKPOINTS,
        },
    )


# --- ours ------------------------------------------------------------------------------------


class _NoSamples:
    """A step's batch when no step computes one: no sample to log."""

    def __len__(self) -> int:
        return 0


class RecordingTrainer(ReferenceTrainer):
    """The reference trainer whose step, validation and export are stand-ins that record; the
    loop (`_run`), resuming (`load`), saving (`save`) and retention are the trainer's own."""

    events: list[list[Any]]
    start = 0

    def load(self, folder: Path) -> None:
        super().load(folder)
        self.start = self.step

    def train_step(self) -> dict[str, float]:
        self.step += 1
        self.last_batch = _NoSamples()  # type: ignore[assignment]  # nothing samples here
        self.events.append([schedule.TRAIN, self.step])
        return {"critic/score/mean": 0.0, "perf/throughput": 0.0}  # what the progress line shows

    def validate(self) -> dict[str, float]:
        self.events.append([schedule.VALIDATE, self.step])
        return {"val/stand-in": 0.0}

    def save(self) -> Path:
        folder = super().save()
        self.events.append([schedule.SAVE, self.step, _kept(folder.parent)])
        return folder

    def export(self, folder: Path) -> Path:
        return folder


def _kept(root: Path) -> dict[str, list[int]]:
    """The steps whose actor and critic weights are on disk."""
    return {
        role: sorted(
            int(folder.name[len(PREFIX) :])
            for folder in root.glob(f"{PREFIX}*")
            if (folder / role_files(role)[0]).is_file()
        )
        for role in schedule.ROLES
    }


def _prompts(folder: Path) -> Path:
    """A data set of exactly STEPS_PER_EPOCH local batches, and one validation prompt."""
    rows = [
        {"uid": f"train-{i}", "prompt": f"{i}+1=", "answer": str(i + 1), "split": "train"}
        for i in range(STEPS_PER_EPOCH * LOCAL_TRAIN_BATCH)
    ]
    rows.append({"uid": "val-0", "prompt": "2+2=", "answer": "4", "split": "val"})
    path = folder / "prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def ours(base: Mapping[str, Any], sets: Mapping[str, Any], folder: Path) -> list[dict[str, Any]]:
    """The reference trainer's schedule of the case's two runs in one run folder."""
    from pytest_verl_compat.pipeline.compile import compile_resolved
    from pytest_verl_compat.pipeline.lower import reference_config

    budget = LocalBudget(
        steps=None,
        train_batch_size=LOCAL_TRAIN_BATCH,
        prompts_path=str(_prompts(folder)),
        val_prompts=1,
        max_response_length=4,
    )
    out = folder / "run"
    out.mkdir()
    phases = []
    for index, overrides in enumerate((PREVIOUS, {})):
        mapping = with_sets(base, {**sets, **overrides})
        report = compile_resolved(mapping, case_id="loop")
        trainer = RecordingTrainer(reference_config(mapping, report), budget, out, progress=False)
        trainer.events = []
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(out)  # resume_from_path is relative to the working folder, as verl's
            trainer.run(resume=index > 0)
        phases.append(phase_record(trainer))
    return phases


# --- upstream --------------------------------------------------------------------------------


def _runs(sets: Mapping[str, Any], verl_defaults: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The case's run, then one per leaf it sets with that leaf back at verl's default."""
    variants = case_variants(sets, verl_defaults)
    return [
        {
            schedule.KEY_DATASET: STEPS_PER_EPOCH,  # scaled by the base's train_batch_size below
            schedule.KEY_PHASES: [{**variant, **PREVIOUS}, variant],
        }
        for variant in variants
    ]


@pytest.fixture(scope="module")
def upstream(
    upstream_session: Any, base: dict[str, Any], verl_defaults: dict[str, Any]
) -> Iterator[dict[str, list[Any]]]:
    """Upstream's schedules of every case and its variants, asked in one question."""
    runs = {case["id"]: _runs(case["sets"], verl_defaults) for case in CASES}
    batch = int(base["data"]["train_batch_size"])
    asked = [
        {**run, schedule.KEY_DATASET: run[schedule.KEY_DATASET] * batch}
        for case_runs in runs.values()
        for run in case_runs
    ]
    request = {"kind": schedule.KIND, schedule.KEY_BASE: base, schedule.KEY_RUNS: asked}
    oracle = SandboxQuestions(SERVED, upstream_session.version)
    try:
        answered = iter(oracle.ask(request)[schedule.KEY_RUNS])
    finally:
        oracle.close()
    yield {case_id: [next(answered) for _ in case_runs] for case_id, case_runs in runs.items()}


@pytest.fixture(autouse=True)
def _no_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    """The finished run's figure is no part of the schedule (and costs a second to draw)."""
    monkeypatch.setattr("reference_trainer.trainer.plot_metrics", lambda *a, **k: None)


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_the_loop_schedules_as_upstream_and_each_leaf_moves_it(
    case: dict[str, Any],
    base: dict[str, Any],
    upstream: dict[str, list[Any]],
    verl_defaults: dict[str, Any],
    tmp_path: Path,
) -> None:
    expected, *reset = upstream[case["id"]]
    mine = ours(base, case["sets"], tmp_path)
    assert_conforms(case, mine, expected, reset, verl_defaults, schedule.KEY_ERROR)


def test_every_loop_leaf_is_set_off_its_default(verl_defaults: dict[str, Any]) -> None:
    moved = set_off(CASES, verl_defaults)
    area = set(LOOP_LEAVES) - {"trainer.total_training_steps"}
    assert area <= moved, f"leaves no case sets off verl's default: {sorted(area - moved)}"


# Wrong variants of ours: each must make at least one case disagree with upstream.
MUTANTS = {
    "keeps every checkpoint": (
        "reference_trainer.trainer.retire_role",
        lambda saved, role, keep: saved,
    ),
    "always resumes the latest": (
        "reference_trainer.trainer.resume_folder",
        lambda root, mode, path: (sorted(root.glob(f"{PREFIX}*")) or [None])[-1],
    ),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_wrong_loop_disagrees_with_upstream(
    mutant: str,
    base: dict[str, Any],
    upstream: dict[str, list[Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target, wrong = MUTANTS[mutant]
    monkeypatch.setattr(target, wrong)
    differing = disagreeing(
        CASES, upstream, lambda sets, folder: ours(base, sets, folder), tmp_path
    )
    assert differing, f"the mutant '{mutant}' agrees with upstream on every case"
