"""The adversarial test of the no-effect claims (issue 46): every ``effect.*`` warning ``check``
gives on upstream's example scripts and the corpus is verified independently of the machinery that
made it, or fails the test naming the script, the key and what changed.

- A claim by perturbation (``effect.overridden``, and ``effect.forced``: upstream overwrites the
  value) holds when upstream's own functions, run over a whole run in miniature with the value
  changed (``probes/whole_run.py``: advantages through one KL controller over several steps, the
  actor's and critic's losses, gradients and optimizer steps over several mini-batches and epochs
  with importance ratios far from 1 and a KL to the reference that is never 0, the learning rate at
  every step of many horizons; the trainer's set-up for a forced value), compute exactly the same
  thing for every other value (×0.5, ×1.5, 0.3; a flag flipped; another registered name).
- A claim from reads (``effect.never-read``, ``effect.off-path``) holds when the release's own
  source, read here (tests/no_effect_reads.py), shows every use of the key's name on the entry
  point's path ruled out, and an off-path claim's cited lines read it.

The fabricated claims below are wrong on purpose (the key acts there): the same verifier must
catch each one, and hold its near-identical twin, where the claim is right.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from corpus_facts import needs_release, release_root
from no_effect_claims import (
    NEVER_READ,
    NO_CRITIC,
    NO_REFERENCE,
    OFF_PATH,
    OVERRIDDEN,
    Claim,
    WholeRuns,
    collect,
    verify,
)
from no_effect_reads import Release

from pytest_verl_compat.upstream.probes import whole_run

pytestmark = [needs_release(), pytest.mark.slow]


@pytest.fixture(scope="module")
def runs(upstream_session: Any) -> Iterator[WholeRuns]:
    """One oracle answering the whole runs and conversions of this module's claims."""
    served = WholeRuns(upstream_session.version)
    try:
        yield served
    finally:
        served.close()


@pytest.fixture(scope="module")
def release() -> Release:
    return Release(release_root())


def test_every_no_effect_claim_holds_over_the_whole_run(
    upstream_session: Any,
    upstream_checkout: Path,
    example_answers: Path,
    runs: WholeRuns,
    release: Release,
) -> None:
    """Every effect.* warning of ``check`` on the 109 examples and on every corpus case."""
    session = upstream_session
    started = time.monotonic()
    targets = [str(upstream_checkout / "examples"), *(case.id for case in session.cases)]
    claims = collect(session, targets)
    counts = Counter(claim.rule for claim in claims)
    print(f"{len(claims)} no-effect claims: {dict(sorted(counts.items()))}")
    # Not empty (the fabricated claims below test each verifier whatever the checks give today).
    assert claims
    verdicts = verify(session, claims, release, runs)
    assert len(verdicts) == len(claims)
    print(f"verified in {time.monotonic() - started:.0f} s, {len(runs.asked)} distinct whole runs")
    wrong = [verdict.line() for verdict in verdicts if not verdict.held]
    assert not wrong, "no-effect claims that do not hold:\n" + "\n".join(wrong)


def _claim(session: Any, case_id: str, overrides: tuple[str, ...], rule: str, key: str) -> Claim:
    """A claim as ``check`` would state it, on a corpus case with ``overrides``."""
    base = session.manifest.case(case_id)
    case = session.with_overrides(base, overrides, case_id=f"{case_id}+{'+'.join(overrides)}")
    return Claim(rule, key, "", f"{case_id} with {' '.join(overrides) or 'no override'}", case)


ACTOR = "actor_rollout_ref.actor"
COSINE = (
    f"{ACTOR}.optim.lr_scheduler_type=cosine",
    f"{ACTOR}.optim.lr_warmup_steps_ratio=0.05",
    f"{ACTOR}.optim.min_lr_ratio=0.1",
)
# (case, overrides, rule, key, what the verdict must say): each claim is false, since the key acts
# on that configuration; each id's twin below is the same claim where it is true.
WRONG = {
    # The PPO loss clips with clip_ratio_low under the vanilla loss.
    "clip-low-under-vanilla": ("grpo", (), OVERRIDDEN, f"{ACTOR}.clip_ratio_low", "actor"),
    # The dual clip binds only on a ratio above it with a negative advantage: the batches have
    # both (ratios up to about 10).
    "dual-clip-under-vanilla": (
        "grpo",
        (f"{ACTOR}.policy_loss.loss_mode=vanilla", f"{ACTOR}.clip_ratio_c=3.0"),
        OVERRIDDEN,
        f"{ACTOR}.clip_ratio_c",
        "actor",
    ),
    # GAE discounts with gamma.
    "gamma-under-gae": ("ppo", (), OVERRIDDEN, "algorithm.gamma", "advantages"),
    # The KL loss is added with kl_loss_coef when use_kl_loss: the KL is never 0 here.
    "kl-loss-coef-with-kl-loss": (
        "grpo",
        (f"{ACTOR}.use_kl_loss=true", f"{ACTOR}.kl_loss_coef=0.001"),
        OVERRIDDEN,
        f"{ACTOR}.kl_loss_coef",
        "actor",
    ),
    # The in-reward KL controller's coefficient shapes the rewards of every step.
    "kl-coef-in-reward": (
        "rloo",
        ("algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0.001"),
        OVERRIDDEN,
        "algorithm.kl_ctrl.kl_coef",
        "advantages",
    ),
    # A cosine schedule reads min_lr_ratio after its warm-up (issue 46's SFT example, on the
    # actor): only the schedule's later steps show it.
    "min-lr-under-cosine": ("grpo", COSINE, OVERRIDDEN, f"{ACTOR}.optim.min_lr_ratio", "actor"),
    # The read proofs: a key the loss reads, and a resume path under resume_path.
    "never-read-clip-low": ("grpo", (), NEVER_READ, f"{ACTOR}.clip_ratio_low", "read on the path"),
    "off-path-resume-under-resume-path": (
        "grpo",
        ("trainer.resume_mode=resume_path", "trainer.resume_from_path=ckpt/global_step_10"),
        OFF_PATH,
        "trainer.resume_from_path",
        "trainer_base.py",
    ),
    # A role that starts: upstream's own decider says so (GAE trains a critic; the KL loss runs
    # the reference).
    "critic-under-gae": ("ppo", ("critic.optim.lr=2e-5",), NO_CRITIC, "critic.optim.lr", "True"),
    "reference-with-kl-loss": (
        "grpo",
        (f"{ACTOR}.use_kl_loss=true", "actor_rollout_ref.ref.fsdp_config.param_offload=true"),
        NO_REFERENCE,
        "actor_rollout_ref.ref.fsdp_config.param_offload",
        "True",
    ),
}
# The near-identical claims that hold.
TWINS = {
    # Under the vanilla loss clip_ratio_low and clip_ratio_high decide, not clip_ratio
    # (core_algos.py compute_policy_loss_vanilla).
    "clip-low-under-vanilla": (
        "grpo",
        (f"{ACTOR}.clip_ratio=0.2",),
        OVERRIDDEN,
        f"{ACTOR}.clip_ratio",
    ),
    "dual-clip-under-vanilla": (
        "grpo",
        (f"{ACTOR}.policy_loss.loss_mode=gspo", f"{ACTOR}.clip_ratio_c=3.0"),
        OVERRIDDEN,
        f"{ACTOR}.clip_ratio_c",
    ),
    "gamma-under-gae": ("grpo", (), OVERRIDDEN, "algorithm.gamma"),
    "kl-loss-coef-with-kl-loss": (
        "grpo",
        (f"{ACTOR}.use_kl_loss=false", f"{ACTOR}.kl_loss_coef=0.001"),
        OVERRIDDEN,
        f"{ACTOR}.kl_loss_coef",
    ),
    "kl-coef-in-reward": (
        "rloo",
        ("algorithm.use_kl_in_reward=false", "algorithm.kl_ctrl.kl_coef=0.001"),
        OVERRIDDEN,
        "algorithm.kl_ctrl.kl_coef",
    ),
    "min-lr-under-cosine": (
        "grpo",
        (f"{ACTOR}.optim.lr_scheduler_type=constant", *COSINE[1:]),
        OVERRIDDEN,
        f"{ACTOR}.optim.min_lr_ratio",
    ),
    "never-read-clip-low": ("grpo", (f"{ACTOR}.grad_clip=1.0",), NEVER_READ, f"{ACTOR}.grad_clip"),
    "critic-under-gae": ("grpo", ("critic.optim.lr=2e-5",), NO_CRITIC, "critic.optim.lr"),
    "reference-with-kl-loss": (
        "grpo",
        (f"{ACTOR}.use_kl_loss=false", "actor_rollout_ref.ref.fsdp_config.param_offload=true"),
        NO_REFERENCE,
        "actor_rollout_ref.ref.fsdp_config.param_offload",
    ),
    "off-path-resume-under-resume-path": (
        "grpo",
        ("trainer.resume_mode=auto", "trainer.resume_from_path=ckpt/global_step_10"),
        OFF_PATH,
        "trainer.resume_from_path",
    ),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_a_wrong_claim_fails_naming_what_changed(
    name: str, upstream_session: Any, runs: WholeRuns, release: Release
) -> None:
    case_id, overrides, rule, key, said = WRONG[name]
    claim = _claim(upstream_session, case_id, overrides, rule, key)
    (verdict,) = verify(upstream_session, [claim], release, runs)
    assert not verdict.held, verdict.how
    assert key in verdict.line() and said in verdict.why, verdict.why


@pytest.mark.parametrize("name", sorted(TWINS))
def test_its_twin_holds(
    name: str, upstream_session: Any, runs: WholeRuns, release: Release
) -> None:
    claim = _claim(upstream_session, *TWINS[name])
    (verdict,) = verify(upstream_session, [claim], release, runs)
    assert verdict.held, verdict.why


# Claims the verifier can neither run nor prove: each must fail, naming why (whether or not the
# claim is true, a test that passed it would pass it unverified).
UNVERIFIABLE = {
    # The mini-batch arithmetic is the engine's, not the run in miniature's (it splits each step
    # in two whatever the configuration says): no code it runs names the key.
    "batch-structure": (f"{ACTOR}.ppo_mini_batch_size", "outside what the run in miniature"),
    # No stage trains with the rollout's sampling settings.
    "rollout-section": ("actor_rollout_ref.rollout.temperature", "no stage of the whole run"),
}


@pytest.mark.parametrize("name", sorted(UNVERIFIABLE))
def test_a_claim_outside_the_run_fails(
    name: str, upstream_session: Any, runs: WholeRuns, release: Release
) -> None:
    key, said = UNVERIFIABLE[name]
    claim = _claim(upstream_session, "grpo", (), OVERRIDDEN, key)
    (verdict,) = verify(upstream_session, [claim], release, runs)
    assert not verdict.held and said in verdict.why, verdict.why


def test_the_runs_ratios_are_far_from_1_and_the_kl_never_0(
    upstream_session: Any, runs: WholeRuns
) -> None:
    """What the whole run's actor batches hold, so that a claim held over them means something:
    at every mini-batch of every step, importance ratios on both sides of 1 that reach past the
    dual clip's usual 3, and a KL to the reference that is not 0."""
    from no_effect_claims import _sent

    from pytest_verl_compat.upstream.verdict.case import report_mapping

    session = upstream_session
    mapping = report_mapping(session, session.manifest.case("grpo"))
    run = runs.answer(runs.question(_sent(mapping, False), None))
    batches = [
        seen[whole_run.WITNESS]
        for step in range(whole_run.STEPS)
        for seen in run[f"{whole_run.ACTOR} {step}"]
        if whole_run.WITNESS in seen
    ]
    assert len(batches) >= whole_run.STEPS * whole_run.MINI_BATCHES
    for witness in batches:
        (low,), (high,) = witness[whole_run.RATIO_RANGE]
        (kl,) = witness[whole_run.KL_TO_REFERENCE]
        assert low < 0.5 and high > 3.0 and kl > 0.05, witness


def test_the_claims_are_collected_as_check_gives_them(
    upstream_session: Any, upstream_checkout: Path
) -> None:
    """The collection is check's own: a script's findings are those ``check --format json``
    prints for it (its effect.* ones, by key)."""
    import json
    import subprocess
    import sys

    script = upstream_checkout / "examples/grpo_trainer/run_qwen3_30b_a3b_megatron.sh"
    collected = sorted((c.rule, c.key) for c in collect(upstream_session, [str(script)]))
    printed = subprocess.run(
        [sys.executable, "-m", "pytest_verl_compat.cli", "check", str(script), "--select", "effect",
         "--format", "json", "-q"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    findings = json.loads(printed.stdout)["files"][0]["findings"]
    assert collected == sorted((f["rule"], f["path"]) for f in findings)
    assert collected
