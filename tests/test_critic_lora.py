"""A LoRA critic on the FSDP engine (``model.critic-lora``).

The model types are a fact of each release's environment: derived there again and equal to the
shipped data, peft's statement at its line of that environment, the recorded versions its pins.
The claim runs on verl's own critic engine in each release's environment (the model-state
oracle, one fake process group): a tiny Qwen2 critic with a LoRA rank fails to start with the
AttributeError the finding names, and the same critic without one starts. The check stays quiet
where no critic trains, where the actor alone has LoRA, where the adapter is loaded, on Megatron,
and without the model's config.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from check_findings import findings, manifest_case, model_folder
from corpus_facts import environment_pins, skip_unless_built
from tiny_qwen2 import save_policy_and_critic

from pytest_verl_compat.checks.model_facts import Citation
from pytest_verl_compat.memory.release_facts import installed_root
from pytest_verl_compat.pipeline.audit import AuditSession
from pytest_verl_compat.releases.index import load_release_index
from pytest_verl_compat.releases.lora_routers import found_in
from pytest_verl_compat.releases.value_heads import (
    PROBE,
    value_heads,
    value_heads_from_mapping,
    value_heads_path,
)
from pytest_verl_compat.upstream.oracle.runner import release_runner

RELEASES = load_release_index().supported_versions
RULE = "model.critic-lora"
GAE = "algorithm.adv_estimator=gae"
CRITIC_LORA = "critic.model.lora_rank=8"


@pytest.mark.parametrize("version", RELEASES)
def test_shipped_value_heads_are_derived_again_in_the_release_environment(version: str) -> None:
    skip_unless_built(version)
    run = release_runner(version)(PROBE)
    assert run.returncode == 0, run.stderr_tail(20)
    shipped = value_heads_path(version).read_text(encoding="utf-8")
    assert json.loads(run.stdout) == json.loads(shipped)


@pytest.mark.parametrize("version", RELEASES)
def test_the_statement_is_at_its_line_of_the_release_environment(version: str) -> None:
    skip_unless_built(version)
    site = installed_root(version)
    heads = value_heads(version)
    assert site is not None and heads is not None
    # the types verl's examples train are among them
    assert {"qwen2", "qwen3", "llama", "mistral", "qwen3_moe"} <= set(heads.model_types)
    assert found_in(heads.read, site), f"{heads.read}, but should be in {site}"
    file, _, line = heads.read.where.rpartition(":")
    moved = Citation(f"{file}:{int(line) + 1}", heads.read.statement)
    assert not found_in(moved, site), f"{moved} found, but is not there"


@pytest.mark.parametrize("version", RELEASES)
def test_the_recorded_versions_are_the_release_environment_pins(version: str) -> None:
    pins = environment_pins(version, ("peft", "transformers"))
    heads = value_heads(version)
    assert heads is not None and dict(heads.versions) == pins, (heads, pins)


@pytest.fixture(scope="module")
def tiny_critic(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    request, _ = save_policy_and_critic(tmp_path_factory.mktemp("tiny-critic"))
    return request


def _critic_engine(version: str, tiny: dict[str, Any], lora_rank: int) -> Any:
    """verl's critic engine started in the release's environment (the model-state oracle, two
    ranks of a fake group, FSDP2)."""
    case = {"world": 2, "strategy": "fsdp2", "role": "critic", "lora_rank": lora_rank}
    request = {**tiny, "cases": [case]}
    return release_runner(version)(
        "pytest_verl_compat.conformance.step.memory_states",
        stdin=json.dumps(request),
        timeout=900,
    )


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_the_claim_runs_on_verls_critic_engine(version: str, tiny_critic: dict[str, Any]) -> None:
    """A LoRA rank makes verl's critic engine fail to start with the recorded AttributeError; the
    same critic trained in full starts."""
    skip_unless_built(version)
    heads = value_heads(version)
    assert heads is not None
    failed = _critic_engine(version, tiny_critic, 4)
    assert failed.returncode != 0
    said = "object has no attribute 'prepare_inputs_for_generation'"
    assert f"'{heads.model_types['qwen2']}' {said}" in failed.stderr_tail(40)
    started = _critic_engine(version, tiny_critic, 0)
    assert started.returncode == 0, started.stderr_tail(20)


# --- the check --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def session(upstream_session: AuditSession) -> AuditSession:
    return upstream_session


def _fired(
    session: AuditSession, tmp_path: Path, model_type: str | None, *overrides: str
) -> list[str]:
    """The check's findings on GRPO's case with ``overrides``, the actor and the critic reading
    one local model of ``model_type`` (none: no config.json to read)."""
    path = model_folder(tmp_path, model_type) if model_type else None
    model = (f"actor_rollout_ref.model.path={path}", f"critic.model.path={path}") if path else ()
    found = findings(session, manifest_case(session, "grpo"), *model, *overrides)
    return [f for f in found if "a LoRA critic" in f]


@pytest.mark.parametrize("model_type", ["qwen2", "llama", "qwen3_moe"])
def test_fires_on_a_lora_critic_of_a_token_classification_model(
    session: AuditSession, tmp_path: Path, model_type: str
) -> None:
    fired = _fired(session, tmp_path, model_type, GAE, CRITIC_LORA)
    assert len(fired) == 1 and fired[0].startswith("error:critic.model.lora_rank:"), fired
    assert "prepare_inputs_for_generation" in fired[0]


def test_the_critics_own_model_decides(session: AuditSession, tmp_path: Path) -> None:
    """A critic reading another model's config (its own path) is judged by that model."""
    critic = f"critic.model.path={model_folder(tmp_path, 'mistral')}"
    assert _fired(session, tmp_path, "qwen2_5_vl", GAE, CRITIC_LORA, critic)
    actor = f"critic.model.path={model_folder(tmp_path, 'qwen2_5_vl')}"
    assert not _fired(session, tmp_path, "mistral", GAE, CRITIC_LORA, actor)


@pytest.mark.parametrize(
    ("model_type", "overrides"),
    [
        ("qwen2", (GAE,)),  # no LoRA
        ("qwen2", (GAE, "actor_rollout_ref.model.lora_rank=8")),  # the actor's alone
        ("qwen2", (CRITIC_LORA,)),  # GRPO: no critic trains
        ("qwen2", (GAE, CRITIC_LORA, "critic.model.lora_adapter_path=/adapters/critic")),
        ("qwen2_5_vl", (GAE, CRITIC_LORA)),  # not a token-classification type
        (None, (GAE, CRITIC_LORA)),  # no config.json to read
    ],
)
def test_quiet_where_no_lora_critic_of_such_a_model_is_built(
    session: AuditSession, tmp_path: Path, model_type: str | None, overrides: tuple[str, ...]
) -> None:
    assert not _fired(session, tmp_path, model_type, *overrides)


def test_quiet_on_megatron_whose_lora_is_not_peft(
    session: AuditSession, upstream_checkout: Path, tmp_path: Path
) -> None:
    case = session.case_for_script(upstream_checkout / "examples/ppo_trainer/run_qwen3_8b_fsdp.sh")
    model = model_folder(tmp_path, "qwen2")
    base = (
        f"actor_rollout_ref.model.path={model}",
        f"critic.model.path={model}",
        "critic.strategy=megatron",
        CRITIC_LORA,
    )
    assert not [f for f in findings(session, case, *base) if "a LoRA critic" in f]
    on_fsdp = tuple(o for o in base if not o.startswith("critic.strategy"))
    assert [f for f in findings(session, case, *on_fsdp) if "a LoRA critic" in f]


def test_no_record_no_finding() -> None:
    """A release whose environment was never asked has no value heads: the check stands on
    nothing."""
    assert value_heads("0.0.0") is None
    raw = {"versions": {}, "peft_reads": {"where": "x.py:1", "statement": "s"}, "model_types": {}}
    assert value_heads_from_mapping(raw).model_types == {}
