"""LoRA around a router the model reads through (``model.lora-router``).

The model types are a fact of each release's environment: derived there again and equal to the
shipped data, each statement at its line of that environment's peft and transformers, and the
claim run in that environment: a tiny GLM-4.5 built as verl's FSDP engine builds its adapter
fails its first forward with the release's LoRA defaults, and runs with the targets the finding
asks for; a Qwen3-MoE (whose block only calls its router) runs with the defaults. The check
matches the targets as peft does and stays quiet where the engine builds no adapter of its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from check_findings import findings, manifest_case, model_folder
from corpus_facts import environment_pins, skip_unless_built
from release_python import run_in_release

from pytest_verl_compat.checks.model_facts import Citation
from pytest_verl_compat.memory.release_facts import installed_root
from pytest_verl_compat.pipeline.audit import AuditSession
from pytest_verl_compat.releases.index import load_release_index
from pytest_verl_compat.releases.lora_routers import (
    PROBE,
    found_in,
    routers_from_mapping,
    routers_path,
    wrapped_routers,
)
from pytest_verl_compat.upstream.oracle.runner import release_runner

RELEASES = load_release_index().supported_versions
RULE = "model.lora-router"
LORA = "actor_rollout_ref.model.lora_rank=16"
# The tiny GLM-4.5 and Qwen3-MoE of the claim (two MoE layers each, four experts of eight).
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 128,
    "num_experts_per_tok": 2,
}
GLM4_MOE = {
    **TINY,
    "n_routed_experts": 8,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 0,
}
QWEN3_MOE = {**TINY, "num_experts": 8}
ATTENTION_AND_MLP = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.mark.parametrize("version", RELEASES)
def test_shipped_routers_are_derived_again_in_the_release_environment(version: str) -> None:
    skip_unless_built(version)
    run = release_runner(version)(PROBE)
    assert run.returncode == 0, run.stderr_tail(20)
    assert json.loads(run.stdout) == json.loads(routers_path(version).read_text(encoding="utf-8"))


@pytest.mark.parametrize("version", RELEASES)
def test_each_statement_is_at_its_line_of_the_release_environment(version: str) -> None:
    skip_unless_built(version)
    site = installed_root(version)
    assert site is not None
    routers = wrapped_routers(version)
    assert {"deepseek_v3", "glm4_moe"} <= set(routers), sorted(routers)
    for model_type, router in routers.items():
        for cited in (router.read, router.mapped):
            assert found_in(cited, site), f"{cited}, but should be in {site} [{model_type}]"
            file, _, line = cited.where.rpartition(":")
            moved = Citation(f"{file}:{int(line) + 1}", cited.statement)
            assert not found_in(moved, site), f"{moved} found, but is not there [{model_type}]"


@pytest.mark.parametrize("version", RELEASES)
def test_the_recorded_versions_are_the_release_environment_pins(version: str) -> None:
    pins = environment_pins(version, ("peft", "transformers"))
    for router in wrapped_routers(version).values():
        assert dict(router.versions) == pins, f"versions={router.versions}, but should be {pins}"


CLAIM = """
import json, torch, warnings
warnings.filterwarnings("ignore")
from peft import LoraConfig, TaskType, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM

def forward(model_type, config, targets):
    # verl/workers/engine/fsdp/transformer_impl.py:340-349: the adapter as the engine builds it
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config))
    lora = {"task_type": TaskType.CAUSAL_LM, "r": 16, "lora_alpha": 16,
            "target_modules": targets, "target_parameters": None, "exclude_modules": None,
            "bias": "none"}
    model = get_peft_model(model, LoraConfig(**lora))
    try:
        model(input_ids=torch.randint(0, 128, (1, 8)))
    except AttributeError as error:
        return str(error)
    return "ran"

result = {
    "glm4_moe default": forward("glm4_moe", GLM4_MOE, "all-linear"),
    "glm4_moe listed": forward("glm4_moe", GLM4_MOE, LISTED),
    "qwen3_moe default": forward("qwen3_moe", QWEN3_MOE, "all-linear"),
}
print(json.dumps(result))
"""


@pytest.mark.parametrize("version", RELEASES)
def test_the_claim_runs_in_the_release_environment(version: str) -> None:
    """The release's default target (all-linear) on a tiny GLM-4.5 fails where the data says,
    the finding's fix runs, and a MoE whose block only calls its router runs with the default."""
    skip_unless_built(version)
    source = (
        f"GLM4_MOE = {GLM4_MOE!r}\nQWEN3_MOE = {QWEN3_MOE!r}\nLISTED = {ATTENTION_AND_MLP!r}\n"
        + CLAIM
    )
    got = run_in_release(source, version)
    attribute = wrapped_routers(version)["glm4_moe"].attribute
    assert attribute in got["glm4_moe default"], got
    assert got["glm4_moe listed"] == "ran", got
    assert got["qwen3_moe default"] == "ran", got
    assert "qwen3_moe" not in wrapped_routers(version)


# --- the check --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def session(upstream_session: AuditSession) -> AuditSession:
    return upstream_session


def _fired(session: AuditSession, tmp_path: Path, model_type: str, *overrides: str) -> list[str]:
    model = model_folder(tmp_path, model_type)
    found = findings(
        session, manifest_case(session, "grpo"), f"actor_rollout_ref.model.path={model}", *overrides
    )
    return [f for f in found if RULE in f or "LoRA's targets take in" in f]


@pytest.mark.parametrize(
    "targets",
    [
        "actor_rollout_ref.model.target_modules=ALL-LINEAR",
        "actor_rollout_ref.model.target_modules='.*\\.(q_proj|gate)'",
        "actor_rollout_ref.model.target_modules=[q_proj,v_proj,gate]",
        "actor_rollout_ref.model.target_modules=[q_proj,mlp.gate]",
        "+actor_rollout_ref.model.target_parameters=[gate.weight]",
    ],
)
def test_fires_on_every_spelling_that_targets_the_router(
    session: AuditSession, tmp_path: Path, targets: str
) -> None:
    fired = _fired(session, tmp_path, "glm4_moe", LORA, targets)
    assert len(fired) == 1 and "e_score_correction_bias" in fired[0], fired


def test_names_the_key_that_targets_the_router(session: AuditSession, tmp_path: Path) -> None:
    fired = _fired(session, tmp_path, "deepseek_v3", LORA)
    assert fired and fired[0].startswith("error:actor_rollout_ref.model.target_modules:"), fired
    by_parameter = _fired(
        session,
        tmp_path,
        "deepseek_v3",
        LORA,
        "actor_rollout_ref.model.target_modules=[q_proj]",
        "+actor_rollout_ref.model.target_parameters=[gate.weight]",
    )
    assert by_parameter[0].startswith("error:actor_rollout_ref.model.target_parameters:"), fired


@pytest.mark.parametrize(
    ("model_type", "overrides"),
    [
        ("glm4_moe", ()),  # no LoRA
        ("glm4_moe", (LORA, "actor_rollout_ref.model.target_modules='.*(q_proj|v_proj)'")),
        ("glm4_moe", (LORA, "actor_rollout_ref.model.target_modules=[q_proj,gate_proj,up_proj]")),
        ("glm4_moe", (LORA, "actor_rollout_ref.model.lora_adapter_path=/adapters/glm")),
        ("glm4_moe", (LORA, "actor_rollout_ref.model.lora_adapter_path=''")),  # not null: loaded
        ("qwen3_moe", (LORA,)),  # its block only calls its router
        ("qwen2", (LORA,)),
    ],
)
def test_quiet_where_the_router_is_not_wrapped_or_not_read_through(
    session: AuditSession, tmp_path: Path, model_type: str, overrides: tuple[str, ...]
) -> None:
    assert not _fired(session, tmp_path, model_type, *overrides)


def test_quiet_on_megatron_whose_lora_is_not_peft(
    session: AuditSession, upstream_checkout: Path, tmp_path: Path
) -> None:
    """The Megatron engine builds its adapter from model.lora (megatron_peft.py), not peft."""
    case = session.case_for_script(
        upstream_checkout / "examples/grpo_trainer/run_qwen3_8b_megatron.sh"
    )
    model = model_folder(tmp_path, "glm4_moe")
    found = findings(
        session,
        case,
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.lora.rank=16",
        LORA,
    )
    assert not [f for f in found if "LoRA's targets take in" in f], found


def test_the_sft_trainer_meets_it_on_the_same_engine(session: AuditSession, tmp_path: Path) -> None:
    """verl.trainer.sft_trainer builds the FSDP engine from its own model section."""
    case = manifest_case(session, "sft_gsm8k")
    model = model_folder(tmp_path, "glm4_moe")
    base = (f"model.path={model}", "model.lora_rank=16")
    fired = findings(session, case, *base)
    fixed = findings(session, case, *base, "model.target_modules=[q_proj,k_proj,v_proj,o_proj]")
    assert [f for f in fired if f.startswith("error:model.target_modules:")], fired
    assert "SFT trainer's first forward" in next(f for f in fired if "LoRA's targets" in f)
    assert not [f for f in fixed if "LoRA's targets take in" in f], fixed


def test_no_record_no_finding() -> None:
    """A release whose environment was never asked has no routers: the check stands on nothing."""
    assert wrapped_routers("0.0.0") == {}
    assert routers_from_mapping({"versions": {}, "router_target": {}, "model_types": {}}) == {}
