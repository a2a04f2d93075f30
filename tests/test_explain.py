"""``verl-compat explain KEY [SCRIPT]`` (issue 29): where verl reads a key, and whether it acts in
a configuration; a key that acts, and its near-identical twin where it does not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from corpus_facts import needs_release

from pytest_verl_compat.upstream.census import explain
from pytest_verl_compat.upstream.census.reads import LeafReads
from pytest_verl_compat.upstream.census.static_reads import Place

CLI = (sys.executable, "-m", "pytest_verl_compat.cli")
KEY = "actor_rollout_ref.actor.kl_loss_coef"
READ_AT = "verl/workers/utils/losses.py:140"


def _place(guard: str, holder: str = "config") -> Place:
    return Place("verl/x.py:3", "f", holder, guard, "static")


LEAVES = {"a.flag": False, "a.mode": "fast", "a.size": 2, "a.key": 1}


@pytest.mark.parametrize(
    ("guard", "holds"),
    [
        ("config.flag", False),
        ("config.mode == 'fast'", True),
        ("config.mode == 'fast' ∧ config.flag", False),
        ("not config.flag and config.size > 1", True),
        ("config.mode in ['slow', 'medium']", False),
        ("config.unknown_field", None),
        ("self.engine.ready", None),
    ],
)
def test_a_guard_is_evaluated_on_the_leaves_of_its_section(guard: str, holds: bool | None) -> None:
    judged = explain.judge(_place(guard), "a", LEAVES)
    assert judged.holds is holds, f"holds={judged.holds}, but should be {holds} [{guard}]"


def test_the_verdict() -> None:
    entry = LeafReads("a.key", places=[_place("config.flag")])
    assert explain.explain(entry, [], LEAVES).verdict == explain.NO_EFFECT
    assert explain.explain(entry, ["verl/x.py:3"], LEAVES).verdict == explain.ACTS
    on = LeafReads("a.key", places=[_place("config.mode == 'fast'")])
    assert explain.explain(on, [], LEAVES).verdict == explain.UNDECIDED
    # A read of its name on an object of unknown section keeps it undecided.
    unknown = LeafReads("a.key", places=[_place("config.flag")], unmatched=[_place("", "cfg2")])
    assert explain.explain(unknown, [], LEAVES).verdict == explain.UNDECIDED


def _explain(upstream: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "-q", "--upstream", str(upstream), "explain", *args],
        capture_output=True,
        text=True,
        check=False,
    )


@needs_release()
def test_a_key_that_acts_and_its_twin_where_it_does_not(upstream_checkout: Path) -> None:
    acts = _explain(upstream_checkout, KEY, "grpo")
    assert acts.returncode == 0, acts.stderr[-3000:]
    assert f"{KEY} = 0.001: acts" in acts.stdout
    assert f"read here: {READ_AT}" in acts.stdout
    off = _explain(
        upstream_checkout, KEY, "grpo", "--set", "actor_rollout_ref.actor.use_kl_loss=False"
    )
    assert off.returncode == 1, off.stderr[-3000:]
    assert f"{KEY} = 0.001: no effect" in off.stdout
    assert f"off this path: {READ_AT}" in off.stdout
    assert "actor_rollout_ref.actor.use_kl_loss=False" in off.stdout


@needs_release()
def test_an_unknown_key_names_the_nearest(upstream_checkout: Path) -> None:
    run = _explain(upstream_checkout, "actor_rollout_ref.actor.kl_los_coef")
    assert run.returncode == 2, run.stderr[-2000:]
    assert KEY in run.stderr


@needs_release()
def test_a_line_read_here_is_not_also_one_that_may_run(upstream_checkout: Path) -> None:
    run = _explain(upstream_checkout, KEY, "grpo")
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"read here: {READ_AT}" in run.stdout
    assert f"may run here: {READ_AT}" not in run.stdout


def test_a_leaf_of_another_tree_is_answered_in_one_line(upstream_checkout: Path) -> None:
    """An FSDP leaf asked of a Megatron script: the script's configuration has no such key (Hydra
    would refuse it without `+`); explain says so and how to check it, never a traceback. Its
    twin, the same leaf on an FSDP script, is answered."""
    script = upstream_checkout / "examples" / "grpo_trainer" / "run_qwen3_30b_a3b_megatron.sh"
    leaf = "actor_rollout_ref.actor.fsdp_config.reshard_after_forward"
    run = _explain(upstream_checkout, "--no-upstream-checks", leaf, str(script))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    assert f"{leaf} is not a key of this script's configuration" in run.stdout
    assert f"--set +{leaf}=VALUE" in run.stdout
    twin = _explain(upstream_checkout, "--no-upstream-checks", leaf, "grpo")
    assert twin.returncode == 0, twin.stderr[-3000:]
    assert "is not a key of this script's configuration" not in twin.stdout
    assert f"{leaf} = " in twin.stdout
