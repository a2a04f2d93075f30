"""Model states exactly: the bytes of parameters, gradients and optimizer states that verl 0.9.0's
own FSDP engine (strategy fsdp and fsdp2) holds on rank 0, at several world sizes, equal the
forecast byte for byte, with LoRA, with offload, and in hybrid sharding (fsdp_size < world).

The engine runs in the sandboxed upstream process (`conformance/step/memory_states.py`, a fake
process group of each world size); this process never imports verl. Megatron is not measured:
megatron.core allocates its gradient buffers and the distributed optimizer's on
``torch.cuda.current_device()`` (distributed/param_and_grad_buffer.py, optimizer/
distrib_optimizer.py), which a CPU does not have.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from corpus_facts import PINNED_VERSION, needs_release

from pytest_verl_compat.conformance.step.memory_states import ANSWER_MARK
from pytest_verl_compat.memory.architecture import architecture_from_config
from pytest_verl_compat.memory.residency import offload_moves
from pytest_verl_compat.memory.states import EngineSpec, fsdp_states
from pytest_verl_compat.upstream.oracle.runner import release_runner

pytestmark = [pytest.mark.slow, needs_release()]

# (world, strategy, role, settings): every world size in one sandboxed process, one fake group each
CASES: list[tuple[int, str, str, dict[str, Any]]] = [
    (1, "fsdp2", "actor", {}),
    (2, "fsdp2", "actor", {}),
    (2, "fsdp2", "critic", {}),
    (2, "fsdp2", "ref", {}),
    (2, "fsdp2", "actor", {"lora_rank": 4}),
    (2, "fsdp2", "actor", {"param_offload": True, "optimizer_offload": True}),
    (2, "fsdp", "actor", {}),
    (2, "fsdp", "critic", {}),
    (2, "fsdp", "ref", {}),
    (2, "fsdp", "actor", {"lora_rank": 8}),
    (2, "fsdp", "actor", {"param_offload": True, "optimizer_offload": True}),
    (3, "fsdp2", "actor", {}),
    (3, "fsdp", "critic", {}),
    (8, "fsdp2", "actor", {"lora_rank": 4}),
    (8, "fsdp2", "actor", {"fsdp_size": 4}),
    (8, "fsdp", "actor", {"fsdp_size": 2}),
    (8, "fsdp", "actor", {}),
]


def _case_id(case: tuple[int, str, str, dict[str, Any]]) -> str:
    world, strategy, role, settings = case
    extra = ",".join(f"{k}={v}" for k, v in sorted(settings.items()))
    return f"{strategy}-{role}-world{world}" + (f"[{extra}]" if extra else "")


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """One sandboxed run of verl's engine for every case (verl imported once)."""
    from reference_trainer.tiny import (
        build_tiny_policy,
        build_tiny_tokenizer,
        build_tiny_value_model,
    )

    folder = tmp_path_factory.mktemp("tiny")
    tokenizer = build_tiny_tokenizer()
    policy = build_tiny_policy(tokenizer, 0)
    policy.config.architectures = ["Qwen2ForCausalLM"]
    policy.save_pretrained(folder / "policy")
    tokenizer.save_pretrained(folder / "policy")
    critic = build_tiny_value_model(policy.config, 2)
    critic.config.architectures = ["Qwen2ForTokenClassification"]
    critic.save_pretrained(folder / "critic")
    tokenizer.save_pretrained(folder / "critic")
    request = {
        "model_dir": str(folder / "policy"),
        "critic_dir": str(folder / "critic"),
        "vocab": len(tokenizer),
        "cases": [
            {"world": world, "strategy": strategy, "role": role, **settings}
            for world, strategy, role, settings in CASES
        ],
    }
    run = release_runner(PINNED_VERSION)(
        "pytest_verl_compat.conformance.step.memory_states", stdin=json.dumps(request), timeout=900
    )
    assert run.returncode == 0, run.stderr_tail(30)
    answer = next(
        line for line in reversed(run.stdout.splitlines()) if line.startswith(ANSWER_MARK)
    )
    results = json.loads(answer[len(ANSWER_MARK) :])
    out = {}
    for case, result in zip(CASES, results, strict=True):
        out[_case_id(case)] = {
            **result,
            "config": json.loads((folder / "policy" / "config.json").read_text()),
        }
    return out


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_model_states_equal_verl_byte_for_byte(
    case: tuple[int, str, str, dict[str, Any]], measured: dict[str, dict[str, Any]]
) -> None:
    world, strategy, role, settings = case
    got = measured[_case_id(case)]
    arch = architecture_from_config(got["config"], "tiny", "config.json")
    spec = EngineSpec(
        strategy,
        world,
        fsdp_size=int(settings.get("fsdp_size", -1)),
        forward_only=role == "ref",
        value_head=role == "critic",
        lora_rank=int(settings.get("lora_rank", 0)),
    )
    forecast = fsdp_states(arch, spec)
    expected = {
        "params": forecast.params,
        "grads": forecast.grads,
        "optimizer": forecast.optimizer,
        "accumulated": forecast.accumulated,
    }
    observed = {key: got[key] for key in expected}
    assert observed == expected, f"bytes={observed}, but should be {expected} [{_case_id(case)}]"


@pytest.mark.parametrize("case", [c for c in CASES if c[2] != "ref"], ids=lambda c: _case_id(c))
def test_offload_moves_are_what_the_forecast_keeps_off_the_gpu(
    case: tuple[int, str, str, dict[str, Any]], measured: dict[str, dict[str, Any]]
) -> None:
    """verl's engine moves exactly the states the forecast counts as off the GPU between calls
    (after init), loaded for a forward (weights only) and for an update (weights and optimizer)."""
    _, _, _, settings = case
    moves = measured[_case_id(case)]["moves"]
    seen = {(m["phase"], m["direction"]): (m["model"], m["optimizer"]) for m in moves}
    expected = offload_moves(
        bool(settings.get("param_offload")), bool(settings.get("optimizer_offload"))
    )
    assert {k: seen[k] for k in expected} == expected, f"moves={moves} [{_case_id(case)}]"


def test_every_case_ran(measured: dict[str, dict[str, Any]]) -> None:
    assert len(measured) == len(CASES) > 0
    assert Path(__file__).name  # the cases are listed above, one per engine setting
