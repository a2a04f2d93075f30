"""Issue 29, classes 4 to 6, each from a new example with its near-identical valid twin.

4. A name verl registers only where an optional package imports (a checkpoint-engine backend,
   verl/checkpoint_engine/__init__.py) is valid with a note naming the package, not an error;
   a name no module registers stays an error. A reward manager's name is looked up in the
   registry only when the config loads it from there (``source=register``,
   verl/experimental/reward_loop/reward_manager/registry.py).
5. A run-time value (``$(pwd)``) in a leaf that only names a file is carried as a placeholder
   and said in a note; in a leaf whose value decides something (a size, the resume step) it is
   still refused, at its line.
6. A finding names the key the script set: a failure read through an interpolated copy
   (``actor_rollout_ref.actor.fsdp_config.strategy: ${actor_rollout_ref.actor.strategy}``) is
   named by the key the user wrote.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from pathlib import Path

import pytest
from corpus_facts import needs_release

from pytest_verl_compat import cli
from pytest_verl_compat.pipeline.audit import AuditSession
from pytest_verl_compat.pipeline.naming import may_carry
from pytest_verl_compat.upstream.oracle.client import UpstreamOracle
from pytest_verl_compat.upstream.verdict.case import CaseCheck, check_case, live_asker

_ids = itertools.count()
CKPT = "actor_rollout_ref.rollout.checkpoint_engine.backend"
needs_verl = needs_release()


def check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    status = cli.main(["check", *args])
    out, _ = capsys.readouterr()
    return status, out.splitlines()


def rules(lines: list[str], rule: str) -> list[str]:
    return [line for line in lines if f"[{rule}]" in line]


# --- 4. the sandbox's environment -------------------------------------------------------------


@pytest.fixture(scope="module")
def session(upstream_session: AuditSession) -> AuditSession:
    return upstream_session


def verdict(session: AuditSession, oracle: UpstreamOracle, overrides: Sequence[str]) -> CaseCheck:
    """check's verdict on the grpo corpus case with ``--set`` overrides, upstream answering in
    this module's oracle process."""
    assert session.manifest is not None
    case = dataclasses.replace(session.manifest.case("grpo"), id=f"grpo+{next(_ids)}")
    case = session.with_overrides(case, tuple(overrides))
    return check_case(session, case, live_asker(session, None, oracle))


@needs_verl
@pytest.mark.parametrize(
    ("backend", "valid", "rule"),
    [
        ("nccl", True, "env.optional-package"),  # registered where cupy imports
        ("naive", True, None),  # registered everywhere: clean
        ("ncll", False, "upstream.worker-start"),  # registered nowhere: verl raises
    ],
)
def test_an_optional_packages_name_is_a_note_and_an_unknown_name_an_error(
    session: AuditSession, oracle: UpstreamOracle, backend: str, valid: bool, rule: str | None
) -> None:
    result = verdict(session, oracle, [f"{CKPT}={backend}"])
    assert result.valid is valid, result.findings
    named = [f for f in result.findings if CKPT in f.path.split(", ")]
    if rule is None:
        assert not named, named
        return
    assert [f.rule for f in named] == [rule], named
    if valid:
        assert named[0].level == "info", named
        assert "cupy" in named[0].message and "verl/checkpoint_engine/" in named[0].message


@needs_verl
@pytest.mark.parametrize(
    ("settings", "valid"),
    [
        # Loaded from the user's file: the registry is never asked (the file is never imported).
        (
            (
                "reward.reward_manager.source=importlib",
                "reward.reward_manager.name=my_manager",
                "reward.reward_manager.module.path=/work/rewards/manager.py",
            ),
            True,
        ),
        # The same name from the registry: verl raises at trainer init.
        (("reward.reward_manager.name=my_manager",), False),
    ],
)
def test_a_reward_managers_name_is_checked_only_where_the_registry_loads_it(
    session: AuditSession, oracle: UpstreamOracle, settings: tuple[str, ...], valid: bool
) -> None:
    result = verdict(session, oracle, settings)
    named = [
        f
        for f in result.findings
        if "reward.reward_manager.name" in f.path.split(", ") and f.level in ("error", "warning")
    ]
    assert result.valid is valid, result.findings
    assert bool(named) is not valid, named
    if not valid:
        assert "Unknown reward manager: my_manager" in named[0].message


# --- 5. run-time values in path leaves -----------------------------------------------------------

RUN_TIME = """#!/bin/bash
set -x
HOME_DIR=$(pwd)
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_files=$HOME_DIR/data/gsm8k/train.parquet \\
    data.val_files=$HOME_DIR/data/gsm8k/test.parquet \\
    data.train_batch_size=16 \\
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \\
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 \\
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2 \\
    actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=4 \\
    trainer.n_gpus_per_node=2 trainer.nnodes=1 {extra}
"""


def _script(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "run.sh"
    path.write_text(RUN_TIME.format(extra=extra))
    return path


def test_a_run_time_value_in_a_path_leaf_is_carried_with_a_note(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, lines = check(capsys, str(_script(tmp_path)), "--no-upstream-checks")
    notes = rules(lines, "launch.run-time-value")
    assert status == 0, lines
    assert {n.split("] ")[1].split(":")[0] for n in notes} == {
        "data.train_files",
        "data.val_files",
    }, notes
    assert all("info[" in n and "$PWD (line 3)" in n and "RUNTIME_PWD" in n for n in notes), notes
    assert not rules(lines, "launch.unreadable")


@pytest.mark.parametrize(
    "extra",
    [
        "trainer.total_epochs=$(nproc)",  # a count: the value decides the run
        "trainer.resume_mode=resume_path trainer.resume_from_path=$HOME_DIR/global_step_$(nproc)",
    ],
)
def test_a_run_time_value_that_decides_something_is_refused_at_its_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: str
) -> None:
    status, lines = check(capsys, str(_script(tmp_path, extra)), "--no-upstream-checks")
    refused = rules(lines, "launch.unreadable")
    assert status != 0 and refused, lines
    assert refused[0].startswith(f"{tmp_path / 'run.sh'}:4:"), refused


def test_the_resume_folders_step_must_be_known_but_its_folder_need_not() -> None:
    key = "trainer.resume_from_path"
    assert may_carry(key, "RUNTIME_PWD/ckpt/global_step_40", ()) is None
    assert may_carry(key, "/ckpt/global_step_RUNTIME_1", ()) is not None
    assert may_carry(key, "RUNTIME_PWD/ckpt", ()) is not None
    assert (
        may_carry("actor_rollout_ref.rollout.multi_turn.tool_config_path", "RUNTIME_PWD/t.yaml", ())
        is None
    )
    assert may_carry("data.train_batch_size", "RUNTIME_1", ()) is not None


# --- 6. the key the user wrote -----------------------------------------------------------------


@needs_verl
@pytest.mark.parametrize(("strategy", "valid"), [("fsdp3", False), ("fsdp2", True)])
def test_a_failure_read_through_a_copy_names_the_key_the_script_set(
    session: AuditSession, oracle: UpstreamOracle, strategy: str, valid: bool
) -> None:
    result = verdict(session, oracle, [f"actor_rollout_ref.actor.strategy={strategy}"])
    errors = [f for f in result.findings if f.level == "error"]
    assert result.valid is valid, errors
    if valid:
        return
    paths = {key for f in errors for key in f.path.split(", ")}
    assert "actor_rollout_ref.actor.strategy" in paths, errors
    assert not any(p.startswith("actor_rollout_ref.actor.fsdp_config.") for p in paths), errors
