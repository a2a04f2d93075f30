"""Run conformance of the SFT loop's leaves (issue 46): the schedule of a small SFT run's events,
ours against upstream's, for each case of ``corpus/run_conformance/sft_loop.yaml``.

The base run is verl 0.9.0's ``sft_trainer_engine`` tree at its defaults with two conversations a
batch, ``STEPS_PER_EPOCH`` batches per epoch, one validation batch and a console logger. Each case
runs twice in one run folder, each time a fresh trainer as a restarted process is: a previous run
of ``PREVIOUS_STEPS`` steps started fresh, then the case's run. A run's schedule is the
checkpoint it resumed from, its first step and its events in order: training steps, validations
and saves, each at its step.

Ours: ``SFTTrainer.run`` itself (the loop, resume, saving of ``reference_trainer/sft.py`` with
real checkpoint files of the tiny model); ``RecordingSFTTrainer`` and a stand-in ``sft_update``
stand in only for what a step, a validation and the final export compute. Upstream:
``probes/sft_schedule.py`` runs verl 0.9.0's own ``SFTTrainer.__init__``, ``_build_dataloader``,
``_init_engine``, its checkpoint handler and ``fit`` (verl/trainer/sft_trainer.py:51-98,
:179-270, :308-448) in the oracle's sandbox.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from corpus_facts import PINNED_VERSION, needs_release
from loop_schedules import case_variants, phase_record
from run_conformance import SandboxQuestions, assert_conforms, disagreeing, set_off, with_sets
from run_conformance import leaf as value_at

from pytest_verl_compat.upstream.probes import sft_schedule as schedule
from reference_trainer import sft as sft_module
from reference_trainer.sft import SFTBudget, SFTTrainer

pytestmark = [needs_release()]

CASES_PATH = Path(__file__).resolve().parents[1] / "corpus" / "run_conformance" / "sft_loop.yaml"
CASES: list[dict[str, Any]] = yaml.safe_load(CASES_PATH.read_text())
LOOP_LEAVES = (
    "trainer.total_epochs",
    "trainer.total_training_steps",
    "trainer.save_freq",
    "trainer.test_freq",
    "trainer.resume_mode",
    "trainer.resume_from_path",
)
STEPS_PER_EPOCH = 2
TRAIN_BATCH = 2
PREVIOUS_STEPS = 3
# The previous run: three steps, started fresh (it resumes nothing, whatever the case's resume).
PREVIOUS = {
    "trainer.total_training_steps": PREVIOUS_STEPS,
    "trainer.resume_mode": "auto",
    "trainer.resume_from_path": None,
}
SERVED = ("pytest_verl_compat.upstream.probes.sft_schedule",)


def sft_defaults() -> dict[str, Any]:
    """verl's SFT tree, composed with no override."""
    from pytest_verl_compat.pipeline.sft import compose_sft

    return compose_sft([]).mapping


@pytest.fixture(scope="module")
def verl_defaults() -> dict[str, Any]:
    tree = sft_defaults()
    return {key: value_at(tree, key) for key in LOOP_LEAVES}


@pytest.fixture(scope="module")
def base(verl_defaults: dict[str, Any]) -> dict[str, Any]:
    """verl's SFT tree with two conversations a batch, logging to the console, saving under
    ``checkpoints`` of the working folder (as the reference trainer's run folder)."""
    return with_sets(
        sft_defaults(),
        {
            **verl_defaults,
            "data.train_batch_size": TRAIN_BATCH,
            "trainer.logger": ["console"],
            "trainer.default_local_dir": schedule.CHECKPOINTS,
        },
    )


# --- ours ------------------------------------------------------------------------------------


class RecordingSFTTrainer(SFTTrainer):
    """The reference SFT trainer whose validation and export are stand-ins that record; the loop
    (`_run`), resuming (`load`) and saving (`save`) are the trainer's own."""

    events: list[list[Any]]
    start = 0

    def load(self, folder: Path) -> None:
        super().load(folder)
        self.start = self.step

    def validate(self) -> float:
        self.events.append([schedule.VALIDATE, self.step])
        return 0.0

    def save(self) -> Path:
        folder = super().save()
        self.events.append([schedule.SAVE, self.step])
        return folder

    def export(self, folder: Path) -> Path:
        return folder


def _conversations(folder: Path) -> Path:
    """Exactly STEPS_PER_EPOCH batches of conversations, and one validation batch."""
    rows = [
        {
            "split": split,
            "messages": [
                {"role": "user", "content": f"{i}+1="},
                {"role": "assistant", "content": str(i + 1)},
            ],
        }
        for split, count in (("train", STEPS_PER_EPOCH * TRAIN_BATCH), ("val", TRAIN_BATCH))
        for i in range(count)
    ]
    path = folder / "conversations.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def ours(base: Mapping[str, Any], sets: Mapping[str, Any], folder: Path) -> list[dict[str, Any]]:
    """The reference SFT trainer's schedule of the case's two runs in one run folder."""
    from pytest_verl_compat.pipeline.sft import compile_sft, sft_config

    budget = SFTBudget(
        steps=None,
        train_batch_size=TRAIN_BATCH,
        max_length=32,
        conversations=str(_conversations(folder)),
        val_batches=1,
    )
    out = folder / "run"
    out.mkdir()
    phases = []
    for index, overrides in enumerate((PREVIOUS, {})):
        mapping = with_sets(base, {**sets, **overrides})
        cfg = sft_config(mapping, compile_sft(mapping, case_id="sft-loop"))
        trainer = RecordingSFTTrainer(cfg, budget, out, progress=False)
        trainer.events = []

        def step(*_: Any, trainer: RecordingSFTTrainer = trainer, **__: Any) -> dict[str, float]:
            trainer.events.append([schedule.TRAIN, trainer.step + 1])  # the loop counts after
            return {"train/loss": 0.0}

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sft_module, "sft_update", step)
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
            schedule.KEY_DATASET: STEPS_PER_EPOCH * TRAIN_BATCH,
            schedule.KEY_VAL_DATASET: TRAIN_BATCH,
            schedule.KEY_PHASES: [{**variant, **PREVIOUS}, variant],
        }
        for variant in variants
    ]


@pytest.fixture(scope="module")
def upstream(base: dict[str, Any], verl_defaults: dict[str, Any]) -> Iterator[dict[str, list[Any]]]:
    """Upstream's schedules of every case and its variants, asked in one question."""
    runs = {case["id"]: _runs(case["sets"], verl_defaults) for case in CASES}
    asked = [run for case_runs in runs.values() for run in case_runs]
    request = {"kind": schedule.KIND, schedule.KEY_BASE: base, schedule.KEY_RUNS: asked}
    oracle = SandboxQuestions(SERVED, PINNED_VERSION)
    try:
        answered = iter(oracle.ask(request)[schedule.KEY_RUNS])
    finally:
        oracle.close()
    yield {case_id: [next(answered) for _ in case_runs] for case_id, case_runs in runs.items()}


@pytest.fixture(autouse=True)
def _no_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    """The finished run's figure is no part of the schedule (and costs a second to draw)."""
    monkeypatch.setattr(sft_module, "plot_metrics", lambda *a, **k: None)


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_the_sft_loop_schedules_as_upstream_and_each_leaf_moves_it(
    case: dict[str, Any],
    base: dict[str, Any],
    upstream: dict[str, list[Any]],
    verl_defaults: dict[str, Any],
    tmp_path: Path,
) -> None:
    expected, *reset = upstream[case["id"]]
    mine = ours(base, case["sets"], tmp_path)
    assert_conforms(case, mine, expected, reset, verl_defaults, schedule.KEY_ERROR)


def test_every_sft_loop_leaf_is_set_off_its_default(verl_defaults: dict[str, Any]) -> None:
    moved = set_off(CASES, verl_defaults)
    assert set(LOOP_LEAVES) <= moved, f"leaves no case sets: {sorted(set(LOOP_LEAVES) - moved)}"


# Wrong variants of ours: each must make at least one case disagree with upstream.
MUTANTS = {
    "auto always resumes the latest": (
        "sft_resume_folder",
        lambda root, mode, path: sft_module.resume_folder(root, mode, None),
    ),
    "a resumed loader continues its epoch": ("SFTSampler.resumed", lambda self: None),
    "the step budget alone ends the run": ("SFTSampler.next_epoch", property(lambda self: 0)),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_wrong_sft_loop_disagrees_with_upstream(
    mutant: str,
    base: dict[str, Any],
    upstream: dict[str, list[Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target, wrong = MUTANTS[mutant]
    owner, _, name = target.rpartition(".")
    monkeypatch.setattr(getattr(sft_module, owner) if owner else sft_module, name, wrong)
    differing = disagreeing(
        CASES, upstream, lambda sets, folder: ours(base, sets, folder), tmp_path
    )
    assert differing, f"the mutant '{mutant}' agrees with upstream on every case"


# --- coverage of the SFT profile's exact leaves ----------------------------------------------
#
# Each leaf the SFT profile classes `exact` in the SFT step cases' compile reports must be set
# off verl's SFT default by a step case (corpus/sft_step.yaml, compared with upstream's engine
# steps) or by a run conformance case of the SFT tree that shows an effect (every
# corpus/run_conformance/sft_*.yaml: the loop cases above, the data set's cases of
# tests/test_run_conformance_sft_data.py); a leaf with one supported value cannot be moved.


def sft_run_cases() -> list[dict[str, Any]]:
    """The SFT tree's run conformance cases that compare a value with upstream (a case ours
    refuses shows no value that changes the result)."""
    from pytest_verl_compat.conformance.step.plan import load_run_conformance

    return [
        {"id": case.id, "sets": dict(case.sets)}
        for case in load_run_conformance(sft=True)
        if case.shows_an_effect
    ]


def _parent(path: str) -> str:
    """A list item's leaf is its list's (a list moves when any item does)."""
    return re.sub(r"(\[\d+\])+$", "", path)


def step_plan_moves() -> tuple[set[str], dict[str, set[str]]]:
    """The SFT step cases' exact leaves (one supported value aside) and, per leaf, the step cases
    that train it off verl's default (in either optimizer variant)."""
    from pytest_verl_compat.conformance.step.coverage import _differs
    from pytest_verl_compat.conformance.step.sft import load_sft_step_plan
    from pytest_verl_compat.pipeline.compose import iter_leaves
    from pytest_verl_compat.pipeline.profile import default_sft_profile, load_profile
    from pytest_verl_compat.pipeline.sft import compile_sft, compose_sft

    profile = load_profile(default_sft_profile())
    defaults = dict(iter_leaves(sft_defaults()))
    plan = load_sft_step_plan()
    exact: set[str] = set()
    moved: dict[str, set[str]] = {}
    for case in plan.cases:
        for variant in plan.variants.values():
            tree = compose_sft([*case.overrides, *variant.overrides()]).mapping
            for leaf in compile_sft(tree, case_id=case.id).leaves:
                rule = profile.rule_for(leaf.path)
                if leaf.klass == "exact" and not (rule and rule.values and len(rule.values) == 1):
                    exact.add(_parent(leaf.path))
            for path, value in iter_leaves(tree):
                if path not in defaults or _differs(value, defaults[path]):
                    moved.setdefault(_parent(path), set()).add(case.id)
    return exact, moved


def uncovered(
    exact: set[str], step_moved: Mapping[str, set[str]], run_cases: list[dict[str, Any]]
) -> set[str]:
    """The exact leaves neither a step case nor a run case sets off verl's default."""
    defaults = sft_defaults()
    run_moved = {
        _parent(leaf)
        for case in run_cases
        for leaf, value in case["sets"].items()
        if value != value_at(defaults, leaf)
    }
    return exact - set(step_moved) - run_moved


@pytest.fixture(scope="module")
def sft_coverage() -> tuple[set[str], dict[str, set[str]]]:
    return step_plan_moves()


def test_every_exact_sft_leaf_is_moved_by_a_case(
    sft_coverage: tuple[set[str], dict[str, set[str]]],
) -> None:
    exact, step_moved = sft_coverage
    # The loop's leaves are exact in every case, so an empty list would pass nothing.
    assert set(LOOP_LEAVES) <= exact
    missing = uncovered(exact, step_moved, sft_run_cases())
    assert not missing, (
        f"exact SFT leaves no step or run case sets off verl's default: {sorted(missing)}"
    )


def test_the_run_cases_are_every_sft_areas_but_refused_ones() -> None:
    """The coverage reads every SFT area's cases (not only this file's), a case ours refuses
    aside."""
    from pytest_verl_compat.conformance.step.plan import load_run_conformance

    every = load_run_conformance(sft=True)
    read = {case["id"] for case in sft_run_cases()}
    assert {case["id"] for case in CASES} < read, "only the loop's cases are read"
    assert read == {case.id for case in every if case.shows_an_effect}
    assert len({case.area for case in every}) > 1


def test_a_table_missing_a_case_leaves_a_leaf_uncovered(
    sft_coverage: tuple[set[str], dict[str, set[str]]],
) -> None:
    """The check fails on the run cases less any case that alone moves a leaf."""
    exact, step_moved = sft_coverage
    cases = sft_run_cases()
    full = uncovered(exact, step_moved, cases)
    sole_movers = 0
    for index, case in enumerate(cases):
        fewer = cases[:index] + cases[index + 1 :]
        alone = {
            leaf
            for leaf, value in case["sets"].items()
            if leaf not in step_moved
            and value != value_at(sft_defaults(), leaf)
            and not any(leaf in other["sets"] for other in fewer)
        }
        assert uncovered(exact, step_moved, fewer) == full | alone, case["id"]
        sole_movers += bool(alone)
    assert sole_movers, "no run case alone moves a leaf: the check was not shown to fail"
