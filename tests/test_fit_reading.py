"""How the forecast reads an engine's keys where the engines differ.

- Megatron recomputes what ``override_transformer_config`` asks (its engine hands the mapping
  to the Megatron config, verl/workers/engine/megatron/transformer_impl.py:296, :364-365, and
  never reads ``model.enable_gradient_checkpointing``): full recompute keeps layer boundaries,
  the tree's null keeps every layer, whatever the model's flag; the FSDP engine follows the flag.
- The critic's micro-batches follow the release's ``critic_micro_batches`` fact: 0.9.0's V1
  critic runs both passes on ``ppo_infer_max_token_len_per_gpu``; a release whose critic splits
  each pass by its own keys (the legacy dp_critic) takes ``ppo_micro_batch_size_per_gpu`` for
  the update and ``forward_micro_batch_size_per_gpu`` for the values.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from fit_points import launch

from pytest_verl_compat.memory.forecast import forecast
from pytest_verl_compat.memory.gpus import custom_gpu, find_gpu
from pytest_verl_compat.memory.layout import RoleLayout
from pytest_verl_compat.memory.release_facts import (
    CRITIC_MICRO_BATCHES,
    ReleaseFacts,
    release_facts,
)
from pytest_verl_compat.memory.runs import Request, build_layout
from pytest_verl_compat.pipeline.audit import AuditSession

MODEL = "Qwen/Qwen2.5-0.5B"
RECOMPUTE = "actor_rollout_ref.actor.megatron.override_transformer_config"


def _resolved(
    session: AuditSession, folder: Path, overrides: list[str], config_name: str = ""
) -> Mapping[str, Any]:
    entry = {"id": "reading", "model": MODEL, "gpus": 8, "config_name": config_name}
    digest = hashlib.sha1("\n".join([config_name, *overrides]).encode()).hexdigest()[:10]
    script = folder / f"reading-{digest}.sh"
    script.write_text(launch(entry, overrides))
    composition = session.outcome(session.case_for_script(script)).composition
    assert composition.composed, composition.reason
    return composition.mapping


def _role(
    session: AuditSession,
    folder: Path,
    overrides: list[str],
    role: str,
    config_name: str = "",
    facts: ReleaseFacts | None = None,
) -> RoleLayout:
    resolved = _resolved(session, folder, overrides, config_name)
    request = Request(gpu=find_gpu("H100"), facts=facts or release_facts(session.version))
    found = build_layout(resolved, request).role(role)
    assert found is not None, role
    return found


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fit-reading")


MEGATRON_RUN = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=16",
    "data.max_prompt_length=512",
    "data.max_response_length=1024",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
]


@pytest.mark.parametrize("flag", [True, False])
def test_megatron_keeps_every_layer_unless_full_recompute_whatever_the_models_flag(
    upstream_session: AuditSession, folder: Path, flag: bool
) -> None:
    model_flag = f"actor_rollout_ref.model.enable_gradient_checkpointing={flag}"
    tree = _role(
        upstream_session, folder, [*MEGATRON_RUN, model_flag], "actor", "ppo_megatron_trainer"
    )
    full = _role(
        upstream_session,
        folder,
        [*MEGATRON_RUN, model_flag, f"{RECOMPUTE}.recompute_granularity=full"],
        "actor",
        "ppo_megatron_trainer",
    )
    assert tree.spec.strategy == "megatron"
    assert not tree.checkpointing, "the tree's recompute_granularity is null: nothing recomputed"
    assert full.checkpointing


@pytest.mark.parametrize("flag", [True, False])
def test_fsdp_follows_the_models_checkpointing_flag(
    upstream_session: AuditSession, folder: Path, flag: bool
) -> None:
    run = [o for o in MEGATRON_RUN if ".megatron." not in o]
    actor = _role(
        upstream_session,
        folder,
        [*run, f"actor_rollout_ref.model.enable_gradient_checkpointing={flag}"],
        "actor",
    )
    assert actor.spec.strategy in ("fsdp", "fsdp2")
    assert actor.checkpointing is flag


def test_an_oom_megatron_update_proposes_the_recompute_megatron_reads(
    upstream_session: AuditSession, folder: Path
) -> None:
    """The fix for a Megatron update without recompute sets override_transformer_config, the
    keys its engine reads, never the model flag it ignores."""
    resolved = _resolved(
        upstream_session,
        folder,
        [*MEGATRON_RUN, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16"],
        "ppo_megatron_trainer",
    )
    request = Request(gpu=custom_gpu(12.0), facts=release_facts(upstream_session.version))
    result = forecast(resolved, request)
    keys = {
        key
        for verdict in result.verdicts
        if verdict.phase == "actor-update"
        for fix in verdict.fixes
        for key, _ in fix.keys
    }
    assert f"{RECOMPUTE}.recompute_granularity" in keys, sorted(keys)
    assert "actor_rollout_ref.model.enable_gradient_checkpointing" not in keys, sorted(keys)


PPO_RUN = [
    "data.train_batch_size=64",
    "data.max_prompt_length=512",
    "data.max_response_length=512",
    "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
    f"critic.model.path={MODEL}",
    "critic.ppo_micro_batch_size_per_gpu=1",
    "critic.forward_micro_batch_size_per_gpu=4",
]


def _with_critic_fact(facts: ReleaseFacts, value: str) -> ReleaseFacts:
    fact = dataclasses.replace(facts.facts[CRITIC_MICRO_BATCHES], value=value)
    return dataclasses.replace(facts, facts={**facts.facts, CRITIC_MICRO_BATCHES: fact})


def test_a_critic_splitting_per_pass_takes_each_passs_micro_batch(
    upstream_session: AuditSession, folder: Path
) -> None:
    facts = release_facts(upstream_session.version)
    sequence = 1024
    per_pass = _role(
        upstream_session, folder, PPO_RUN, "critic", facts=_with_critic_fact(facts, "per-pass")
    )
    assert (per_pass.train_tokens, per_pass.infer_tokens) == (sequence, 4 * sequence)
    assert per_pass.train_budget_key == "critic.ppo_micro_batch_size_per_gpu"


def test_the_v1_critic_takes_its_token_budget_for_both_passes(
    upstream_session: AuditSession, folder: Path
) -> None:
    """The same run with the checked release's own fact: the per-pass keys are not read, both
    passes fill critic.ppo_infer_max_token_len_per_gpu."""
    facts = release_facts(upstream_session.version)
    assert facts.value(CRITIC_MICRO_BATCHES) == "infer-budget"
    critic = _role(upstream_session, folder, PPO_RUN, "critic", facts=facts)
    assert critic.train_budget_key == "critic.ppo_infer_max_token_len_per_gpu"
    assert critic.train_tokens > 1024 and critic.infer_tokens > 4 * 1024
