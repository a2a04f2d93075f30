"""Issue 46, class 4: the V1 trainer's loop over the whole run (``checks/run_loop.py``).

``PPOTrainer.fit`` (verl/trainer/ppo/v1/trainer_base.py:380-500) decides at every step whether to
profile, update the actor, save and validate; a script decides the steps' bounds alone when it
sets ``trainer.total_training_steps``, caps verl's own data set with ``data.train_max_samples``, or
resumes from a named step. Each class below fires on its example and stays quiet on a
near-identical valid twin; the loop of another trainer (the legacy one, the asynchronous ones) is
not claimed.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from pathlib import Path

import pytest

from pytest_verl_compat.model import Case, Finding
from pytest_verl_compat.pipeline.audit import AuditSession
from pytest_verl_compat.upstream.verdict.case import check_case

_ids = itertools.count()
TOTAL = "trainer.total_training_steps=100"
RESUME = "trainer.resume_mode=resume_path"
FULLY_ASYNC = Path(__file__).resolve().parent / "data" / "fully_async_grpo.sh"


@pytest.fixture(scope="module")
def session(upstream_session: AuditSession) -> AuditSession:
    return upstream_session


def _case(session: AuditSession, overrides: Sequence[str], base: Path | None = None) -> Case:
    if base is not None:
        case = session.case_for_script(base)
    else:
        assert session.manifest is not None
        case = session.manifest.case("grpo")
    case = dataclasses.replace(case, id=f"{case.id}+loop{next(_ids)}")
    case = session.with_overrides(case, tuple(overrides))
    assert session.outcome(case).composition.composed, session.outcome(case).composition.reason
    return case


def loop_findings(
    session: AuditSession, overrides: Sequence[str], base: Path | None = None
) -> list[Finding]:
    """The run.* findings of the grpo case (or ``base``) with ``overrides``, statically."""
    result = check_case(session, _case(session, overrides, base), None)
    return [f for f in result.findings if f.check.startswith("run.")]


# (rule, the overrides that fire, the key the finding names, words of its message, the twin).
CLASSES = {
    # len(data set) <= train_max_samples (rl_dataset.py:185-192) < one batch: 0 steps an epoch,
    # and fit's `global_steps // steps_per_epoch` (trainer_base.py:425) divides by zero
    "no step per epoch": (
        "run.no-step-per-epoch",
        ("data.train_max_samples=1000",),
        "data.train_max_samples",
        "ZeroDivisionError",
        ("data.train_max_samples=1024",),
    ),
    # ... unless the run only validates (trainer_base.py:421-423 returns first)
    "no step per epoch, validation only": (
        "run.no-step-per-epoch",
        ("data.train_max_samples=1000", "trainer.val_only=False"),
        "data.train_max_samples",
        "ZeroDivisionError",
        ("data.train_max_samples=1000", "trainer.val_only=True"),
    ),
    # while epoch < total_epochs (trainer_base.py:443)
    "no epoch": (
        "run.trains-nothing",
        ("trainer.total_epochs=0",),
        "trainer.total_epochs",
        "trains no step",
        ("trainer.total_epochs=1",),
    ),
    # while step (from 1) <= total_training_steps
    "no step": (
        "run.trains-nothing",
        ("trainer.total_training_steps=0",),
        "trainer.total_training_steps",
        "trains no step",
        ("trainer.total_training_steps=1",),
    ),
    # a resumed run starts one past its step (trainer_base.py:815, :429)
    "resumed at the last step": (
        "run.trains-nothing",
        (TOTAL, RESUME, "trainer.resume_from_path=ckpt/global_step_100"),
        "trainer.total_training_steps",
        "from 101",
        (TOTAL, RESUME, "trainer.resume_from_path=ckpt/global_step_99"),
    ),
    # a step is profiled only when fit takes it (trainer_base.py:434-437, :1295-1298)
    "profile step past the run": (
        "run.profile-step-unreached",
        (TOTAL, "global_profiler.steps=[150,160]"),
        "global_profiler.steps",
        "the profiler never starts",
        (TOTAL, "global_profiler.steps=[90,100]"),
    ),
    "profile step 0": (
        "run.profile-step-unreached",
        ("global_profiler.steps=[0,1]",),
        "global_profiler.steps",
        "[0] before the first step, 1",
        ("global_profiler.steps=[1,2]",),
    ),
    "profile step before the resumed one": (
        "run.profile-step-unreached",
        (
            TOTAL,
            RESUME,
            "trainer.resume_from_path=ckpt/global_step_50",
            "global_profiler.steps=[50]",
        ),
        "trainer.resume_from_path",
        "before the first step, 51",
        (
            TOTAL,
            RESUME,
            "trainer.resume_from_path=ckpt/global_step_50",
            "global_profiler.steps=[51]",
        ),
    ),
    # save at a multiple of save_freq or the last step (trainer_base.py:457-459)
    "save frequency past the run": (
        "run.frequency-beyond-run",
        (TOTAL, "trainer.save_freq=150"),
        "trainer.save_freq",
        "saves a checkpoint only at its last step",
        (TOTAL, "trainer.save_freq=100"),
    ),
    # validate likewise (:467-468)
    "test frequency past the run": (
        "run.frequency-beyond-run",
        (TOTAL, "trainer.test_freq=101"),
        "trainer.test_freq",
        "validates only at its last step",
        (TOTAL, "trainer.test_freq=25"),
    ),
    # 4096 rows at most make 4 steps an epoch, 8 in two: no multiple of 20 is reached
    "save frequency past the data": (
        "run.frequency-beyond-run",
        ("data.train_max_samples=4096", "trainer.total_epochs=2", "trainer.save_freq=20"),
        "data.train_max_samples",
        "at most 8 steps",
        ("data.train_max_samples=4096", "trainer.total_epochs=2", "trainer.save_freq=4"),
    ),
    # total_training_steps past the data's epochs: the epochs end the loop, no step is the last
    "no last step": (
        "run.frequency-beyond-run",
        (
            "data.train_max_samples=4096",
            "trainer.total_epochs=2",
            "trainer.total_training_steps=50",
            "trainer.save_freq=20",
        ),
        "trainer.save_freq",
        "saves no checkpoint",
        (
            "data.train_max_samples=4096",
            "trainer.total_epochs=2",
            "trainer.total_training_steps=50",
            "trainer.save_freq=2",
        ),
    ),
    # the actor updates once critic_warmup <= the step (trainer_base.py:582)
    "critic warm-up past the run": (
        "run.actor-never-updates",
        (TOTAL, "trainer.critic_warmup=101"),
        "trainer.critic_warmup",
        "the policy is never trained",
        (TOTAL, "trainer.critic_warmup=100"),
    ),
}


@pytest.mark.parametrize("name", list(CLASSES))
def test_each_class_of_the_runs_loop_fires_and_its_twin_stays_quiet(
    session: AuditSession, name: str
) -> None:
    rule, fires, key, words, twin = CLASSES[name]
    found = [f for f in loop_findings(session, fires) if f.check == rule]
    assert found, loop_findings(session, fires)
    assert key in found[0].path.split(", "), found[0].line()
    assert words in found[0].message, found[0].line()
    assert "verl/trainer/ppo/v1/trainer_base.py:" in (found[0].evidence or ""), found[0]
    assert [f.line() for f in loop_findings(session, twin) if f.check == rule] == []


@pytest.mark.parametrize(
    ("overrides", "base"),
    [
        # The legacy trainer's loop (ray_trainer.py:1440-1772) trains one step even then.
        (("trainer.use_v1=False", "trainer.total_training_steps=0"), None),
        # fully_async_main's trainer counts parameter versions, not trainer_base's steps.
        (("trainer.total_training_steps=0", "trainer.save_freq=5"), FULLY_ASYNC),
        # A custom data set class may ignore train_max_samples (rl_dataset.py:578-586).
        (
            (
                "data.train_max_samples=1000",
                "data.custom_cls.path=pkg://my_data",
                "data.custom_cls.name=MyDataset",
            ),
            None,
        ),
        # Without a bound the data decides the steps: nothing is claimed past step 1.
        (("trainer.save_freq=100000", "global_profiler.steps=[100000]"), None),
    ],
    ids=["legacy-trainer", "fully-async", "custom-dataset", "no-bound"],
)
def test_no_claim_where_another_loop_or_the_data_decides(
    session: AuditSession, overrides: tuple[str, ...], base: Path | None
) -> None:
    assert [f.line() for f in loop_findings(session, overrides, base)] == []


# FullyAsyncTrainer.fit ends with `current_param_version % trainer.test_freq` unguarded
# (fully_async_trainer.py:529): 0 divides by zero once training is done. main_ppo's loop and the
# one-step-off trainer's test `test_freq > 0` first (trainer_base.py:467, separation/ray_trainer.py:670).
@pytest.mark.parametrize(
    ("base", "test_freq", "fires"),
    [
        (FULLY_ASYNC, 0, True),
        (FULLY_ASYNC, -1, False),
        (None, 0, False),
        (Path(__file__).resolve().parent / "data" / "one_step_off_grpo.sh", 0, False),
    ],
    ids=["fully-async", "fully-async-twin", "main_ppo", "one-step-off"],
)
def test_a_zero_test_frequency_fails_only_where_fit_divides_by_it(
    session: AuditSession, base: Path | None, test_freq: int, fires: bool
) -> None:
    found = loop_findings(session, (f"trainer.test_freq={test_freq}",), base)
    assert [f.check for f in found] == (["run.async-test-freq-zero"] if fires else []), found
    if fires:
        assert "ZeroDivisionError" in found[0].message
        assert (found[0].evidence or "").startswith(
            "verl/experimental/fully_async_policy/fully_async_trainer.py:529"
        )


# Read only on a branch the run never takes: the checkpoint-keeping keys in _save_checkpoint
# (trainer_base.py:895-905), called only under save_freq > 0 (:457-461); continuous profiling
# chooses between two tests of a listed step (:1280-1284, :1300-1304), both false with none.
@pytest.mark.parametrize(
    "overrides",
    [
        ("trainer.save_freq=-1", "trainer.max_actor_ckpt_to_keep=2"),
        ("trainer.save_freq=0", "trainer.max_critic_ckpt_to_keep=2"),
        ("global_profiler.profile_continuous_steps=True",),
    ],
    ids=["actor-ckpts", "critic-ckpts", "continuous-profiling"],
)
def test_a_key_read_only_on_a_branch_never_taken_has_no_effect(
    session: AuditSession, overrides: tuple[str, ...]
) -> None:
    named = overrides[-1].split("=", 1)[0]
    found = [f for f in loop_findings(session, overrides) if f.check == "run.no-effect"]
    assert [f.keys[0] for f in found] == [named], found
    assert "has no effect" in found[0].message
    # the near-identical twin takes the branch: a positive save_freq, a listed step
    twin = (
        ("trainer.save_freq=10", overrides[-1])
        if named.startswith("trainer.")
        else (overrides[-1], "global_profiler.steps=[1]")
    )
    assert [f.line() for f in loop_findings(session, twin) if f.check == "run.no-effect"] == []
