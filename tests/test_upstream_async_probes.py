"""Issue 46, class 4: the asynchronous trainers' own constructors, run by the oracle.

``fully_async_main`` and ``one_step_off_policy.main_ppo`` launches were checked statically only:
their trainers' asserts (``FullyAsyncTrainer``, ``FullyAsyncRollouter``, ``OneStepOffRayTrainer``,
the resource pools, the resume) never ran, so a script that broke them passed as valid. Now each
entry point's ``main`` and its task runner run in the sandbox (``probes/asynchronous.py``); each
class of mistake their constructors catch is an error naming the key the script set, with
upstream's message and file:line, next to a near-identical valid twin that stays clean. Bases:
verl's own fully-async example and a one-step-off script of our own (``tests/data``).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from corpus_facts import needs_release

from pytest_verl_compat.model import Case
from pytest_verl_compat.pipeline.audit import AuditSession
from pytest_verl_compat.upstream.oracle.client import UpstreamOracle
from pytest_verl_compat.upstream.verdict.case import CaseCheck, check_case, live_asker

pytestmark = needs_release()

FULLY_ASYNC = "examples/mtp_trainer/run_mimo_7b_mtp_fully_async_megatron_multinode.sh"
FULLY_ASYNC_FSDP = Path(__file__).resolve().parent / "data" / "fully_async_grpo.sh"
ONE_STEP_OFF = Path(__file__).resolve().parent / "data" / "one_step_off_grpo.sh"
_ids = itertools.count()
_ROLLOUTER = "verl/experimental/fully_async_policy/fully_async_rollouter.py"
_TRAINER = "verl/experimental/fully_async_policy/fully_async_trainer.py"


class _Answers:
    """This module's answers, by question: a twin that composes to its base's mapping is asked once."""

    def __init__(self) -> None:
        self.kept: dict[str, Any] = {}

    def get(self, key: str) -> Any | None:
        return self.kept.get(key)

    def put(self, key: str, entry: Any) -> None:
        self.kept[key] = entry


@pytest.fixture(scope="module")
def session(upstream_session: AuditSession) -> AuditSession:
    return upstream_session


@pytest.fixture(scope="module")
def kept() -> _Answers:
    return _Answers()


def _case(session: AuditSession, base: str | Path, overrides: Sequence[str]) -> Case:
    assert session.upstream is not None
    script = Path(base) if Path(base).is_absolute() else session.upstream.root / base
    case = session.case_for_script(script)
    case = dataclasses.replace(case, id=f"{case.id}+async{next(_ids)}")
    case = session.with_overrides(case, tuple(overrides))
    assert session.outcome(case).composition.composed, session.outcome(case).composition.reason
    return case


def verdict(
    session: AuditSession,
    oracle: UpstreamOracle,
    kept: _Answers,
    base: str | Path,
    overrides: Sequence[str] = (),
) -> CaseCheck:
    """check's verdict on ``base`` with ``--set`` overrides, upstream answering in this module's
    oracle process."""
    return check_case(session, _case(session, base, overrides), live_asker(session, kept, oracle))


def errors(result: CaseCheck) -> list[str]:
    return [f.line() for f in result.findings if f.level == "error"]


@pytest.mark.parametrize(
    "base",
    [FULLY_ASYNC, FULLY_ASYNC_FSDP, ONE_STEP_OFF],
    ids=["fully_async", "fully_async_fsdp", "one_step_off"],
)
def test_an_async_launch_is_checked_by_its_own_trainer_and_a_valid_one_stays_clean(
    session: AuditSession, oracle: UpstreamOracle, kept: _Answers, base: str | Path
) -> None:
    """Upstream's checks ran (nothing skipped), on the launch's own runner: what was not run
    is said (the training loop, the agent loop's workers), and no error is found."""
    result = verdict(session, oracle, kept, base)
    assert result.upstream_skipped == "", result.upstream_skipped
    assert result.valid, errors(result)


# (base, the mistake, the key its finding names, words of upstream's message, the verl file:line
# that raises, the near-identical valid twin), one per class of condition the runners check.
FAILURES = {
    # FullyAsyncTrainer.__init__: the trainer never shares its GPUs with the rollout
    "fully_async: hybrid engine": (
        FULLY_ASYNC,
        ("actor_rollout_ref.hybrid_engine=True",),
        "actor_rollout_ref.hybrid_engine",
        "assert not self.hybrid_engine",
        f"{_TRAINER}:76",
        ("actor_rollout_ref.hybrid_engine=False",),
    ),
    # FullyAsyncRollouter.__init__: samples come one prompt at a time, not in train batches
    "fully_async: train batch size": (
        FULLY_ASYNC,
        ("data.train_batch_size=64",),
        "data.train_batch_size",
        "train_batch_size must be zero",
        f"{_ROLLOUTER}:351",
        ("data.train_batch_size=0",),
    ),
    "fully_async: generation batch size": (
        FULLY_ASYNC,
        ("data.gen_batch_size=2",),
        "data.gen_batch_size",
        "gen_batch_size must be one",
        f"{_ROLLOUTER}:352",
        ("data.gen_batch_size=1",),
    ),
    # the bounds of the staleness and of the sync step: each twin is the bound itself
    "fully_async: staleness": (
        FULLY_ASYNC,
        ("async_training.staleness_threshold=-0.5",),
        "async_training.staleness_threshold",
        "staleness_threshold must larger than 0",
        f"{_ROLLOUTER}:353",
        ("async_training.staleness_threshold=0",),
    ),
    "fully_async: sync step": (
        FULLY_ASYNC,
        ("async_training.trigger_parameter_sync_step=0",),
        "async_training.trigger_parameter_sync_step",
        "trigger_parameter_sync_step must larger or equal than 1",
        f"{_ROLLOUTER}:354",
        ("async_training.trigger_parameter_sync_step=1",),
    ),
    # FullyAsyncRollouter._validate_config: training uses the rollout's log probabilities
    "fully_async: rollout log probs": (
        FULLY_ASYNC,
        ("actor_rollout_ref.rollout.calculate_log_probs=False",),
        "actor_rollout_ref.rollout.calculate_log_probs",
        "must rollout calculate log_probs",
        f"{_ROLLOUTER}:733",
        ("actor_rollout_ref.rollout.calculate_log_probs=True",),
    ),
    # the generative reward model needs its own pool: the rollout never pauses for it (the
    # legacy keys are migrated by main, fully_async_main.py:237)
    "fully_async: colocated reward model": (
        FULLY_ASYNC,
        ("reward_model.enable=True",),
        "reward.reward_model.enable_resource_pool",
        "requires standalone mode",
        f"{_ROLLOUTER}:362",
        (
            "reward_model.enable=True",
            "reward_model.enable_resource_pool=True",
            "reward_model.n_gpus_per_node=4",
            "reward_model.nnodes=1",
        ),
    ),
    # FullyAsyncTrainer.load_checkpoint: a resume path names its step
    "fully_async: resume path": (
        FULLY_ASYNC,
        ("trainer.resume_mode=resume_path", "trainer.resume_from_path=/ckpt/latest"),
        "trainer.resume_from_path",
        "resume ckpt must specify the global_steps",
        f"{_TRAINER}:1001",
        ("trainer.resume_mode=resume_path", "trainer.resume_from_path=/ckpt/global_step_40"),
    ),
    # ... and cannot resume from HDFS; without resume the HDFS folder is never looked at
    "fully_async: resume from hdfs": (
        FULLY_ASYNC,
        ("trainer.default_hdfs_dir=hdfs://ckpts/run",),
        "trainer.default_hdfs_dir",
        "load from hdfs is not implemented yet",
        f"{_TRAINER}:986",
        ("trainer.default_hdfs_dir=hdfs://ckpts/run", "trainer.resume_mode=disable"),
    ),
    # the trainer's Tracking: each logger is one verl knows (verl/utils/tracking.py:63-70)
    "fully_async: logger": (
        FULLY_ASYNC,
        ("trainer.logger=[console,wandb,neptune]",),
        "trainer.logger",
        "neptune is not supported",
        "verl/utils/tracking.py:70",
        ("trainer.logger=[console,wandb,tensorboard]",),
    ),
    # OneStepOffRayTrainer.__init__
    "one_step_off: hybrid engine": (
        ONE_STEP_OFF,
        ("actor_rollout_ref.hybrid_engine=True",),
        "actor_rollout_ref.hybrid_engine",
        "assert not self.hybrid_engine",
        "verl/experimental/one_step_off_policy/ray_trainer.py:88",
        ("actor_rollout_ref.hybrid_engine=False",),
    ),
    # create_resource_pool_manager (separation/utils.py:39-40); fully_async_main calls no
    # validate_config, whose division by the GPU count one_step_off meets first
    "fully_async: trainer pool": (
        FULLY_ASYNC,
        ("trainer.n_gpus_per_node=0",),
        "trainer.n_gpus_per_node",
        "config.trainer.n_gpus_per_node must be greater than 0",
        "verl/experimental/separation/utils.py:39",
        ("trainer.n_gpus_per_node=2",),
    ),
    # RayPPOTrainer._load_checkpoint, at the start of fit (separation/ray_trainer.py:295)
    "one_step_off: resume path": (
        ONE_STEP_OFF,
        ("trainer.resume_mode=resume_path",),
        "trainer.resume_mode",
        "resume ckpt must be str type",
        "verl/trainer/ppo/ray_trainer.py:1073",
        ("trainer.resume_mode=resume_path", "trainer.resume_from_path=ckpt/global_step_10"),
    ),
}


@pytest.mark.parametrize("name", list(FAILURES))
def test_each_condition_of_the_async_runners_fails_and_its_twin_stays_clean(
    session: AuditSession, oracle: UpstreamOracle, kept: _Answers, name: str
) -> None:
    base, overrides, key, words, where, twin = FAILURES[name]
    result = verdict(session, oracle, kept, base, overrides)
    named = [f for f in result.findings if f.level == "error" and key in f.path.split(", ")]
    assert named, errors(result)
    assert named[0].rule.startswith("upstream.trainer-"), named[0].line()
    assert words in named[0].message or words in (named[0].evidence or ""), named[0].line()
    assert (named[0].evidence or "").startswith(f"{where}:"), named[0].evidence
    clean = verdict(session, oracle, kept, base, twin)
    assert clean.valid, errors(clean)


# A mini-batch larger than the batch fails in ActorConfig.validate, which only validate_config
# calls (verl/utils/config.py:151): one_step_off's runner calls it (one_step_off_policy/main_ppo.py:
# 52), fully_async_main never does, and its rollouter requires train_batch_size=0 (rollouter:351)
# with any mini-batch. The static check follows the entry point, with no oracle asked.
@pytest.mark.parametrize(
    ("base", "overrides", "fires"),
    [
        (FULLY_ASYNC_FSDP, ("actor_rollout_ref.actor.use_dynamic_bsz=False",), False),
        (ONE_STEP_OFF, ("data.train_batch_size=8",), True),
        (ONE_STEP_OFF, ("data.train_batch_size=16",), False),
    ],
    ids=["fully_async", "one_step_off", "one_step_off-twin"],
)
def test_a_validate_config_check_follows_the_entry_point_that_calls_it(
    session: AuditSession, base: Path, overrides: tuple[str, ...], fires: bool
) -> None:
    result = check_case(session, _case(session, base, overrides), None)
    found = [f for f in result.findings if f.check == "batch.mini-batch-larger-than-batch"]
    assert bool(found) is fires, found
    assert result.valid is not fires, errors(result)
