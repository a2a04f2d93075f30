"""Model states exactly, on every supported release: the bytes of parameters, gradients and
optimizer states that the release's own FSDP engine (strategy fsdp and fsdp2) holds on rank 0, at
several world sizes, equal the forecast byte for byte, with LoRA, with offload, in hybrid
sharding (fsdp_size < world), and the unsharded gradients held between micro-batches with
gradient sync deferred or not; for a tiny Qwen2 and, with its stacked experts, biases and sinks,
a tiny gpt-oss.

The engine runs in the release's own environment (`conformance/step/memory_states.py`, a fake
process group of each world size), configured as Hydra composes the release's own tree (0.9.1's
tree turns use_no_sync_for_gradient_accumulation off, while its config class defaults it on);
this process never imports verl. The forecast's side reads the sections that composition gave
(returned by the oracle) with the forecast's own reader, so the test checks what the forecast
reads as well as what it counts. Megatron is not measured: megatron.core allocates its gradient
buffers and the distributed optimizer's on ``torch.cuda.current_device()``
(distributed/param_and_grad_buffer.py, optimizer/distrib_optimizer.py), which a CPU does not have.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml
from corpus_facts import release_ready, release_root
from tiny_qwen2 import save_policy_and_critic

from pytest_verl_compat.conformance.step.memory_states import ANSWER_MARK
from pytest_verl_compat.memory.architecture import architecture_from_config
from pytest_verl_compat.memory.reading import engine_spec
from pytest_verl_compat.memory.residency import offload_moves
from pytest_verl_compat.memory.states import fsdp_states
from pytest_verl_compat.releases.index import load_release_index
from pytest_verl_compat.upstream.oracle.runner import release_runner

pytestmark = pytest.mark.slow

RELEASES = load_release_index().supported_versions
NO_SYNC = "use_no_sync_for_gradient_accumulation"

# (world, strategy, role, settings): every world size in one sandboxed process, one fake group
# each; the engine keys as the release's tree gives them
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
    (8, "fsdp", "actor", {"lora_rank": 8, "fsdp_size": 4}),
    # gpt-oss: stacked experts with biases, a router with a bias, a sink per head; FSDP2 shards
    # the 4 experts' tensors by their first dimension over 8 ranks (padded), FSDP1 flattens them
    (2, "fsdp2", "actor", {"model": "gpt_oss"}),
    (8, "fsdp2", "actor", {"model": "gpt_oss"}),
    (3, "fsdp", "actor", {"model": "gpt_oss"}),
    (2, "fsdp2", "critic", {"model": "gpt_oss"}),
    # GLM-4: one fused gate_up_proj (80 rows: padded over 3 ranks by FSDP2, flattened by FSDP1,
    # adapted whole by LoRA), four norms per layer
    (3, "fsdp2", "actor", {"model": "glm4"}),
    (3, "fsdp", "actor", {"model": "glm4", "lora_rank": 4}),
    (2, "fsdp2", "critic", {"model": "glm4"}),
    # GLM-4.5: DeepSeek V3's MoE block (a leading dense layer, stacked experts, a shared expert).
    # Not LoRA: peft wraps its router, whose correction bias the MoE block then cannot find
    # (on 0.9.0: an AttributeError under FSDP2, an unallocated flat parameter under FSDP1)
    (2, "fsdp2", "actor", {"model": "glm4_moe"}),
    (3, "fsdp", "actor", {"model": "glm4_moe"}),
    # Hy3: the router built before the experts, its correction bias a buffer of the block (not
    # sharded, not trained), a shared expert; LoRA's all-linear adapts its nn.Linear modules only
    (2, "fsdp2", "actor", {"model": "hy_v3"}),
    (3, "fsdp", "actor", {"model": "hy_v3", "lora_rank": 4}),
]
# With a tree that has the no-sync key: each value set explicitly, both FSDP versions, a trained
# role each, LoRA and hybrid sharding once.
NO_SYNC_CASES: list[tuple[int, str, str, dict[str, Any]]] = [
    (world, strategy, role, {**extra, "engine": {NO_SYNC: value}})
    for value in (True, False)
    for world, strategy, role, extra in (
        (2, "fsdp2", "actor", {}),
        (2, "fsdp", "actor", {}),
        (2, "fsdp2", "critic", {}),
        (3, "fsdp", "critic", {}),
        (2, "fsdp2", "actor", {"lora_rank": 4}),
        (8, "fsdp", "actor", {"fsdp_size": 2}),
    )
]


def _tree_has(version: str, key: str) -> bool:
    """Whether the release's FSDP engine section (trainer/config/engine/fsdp.yaml) has ``key``."""
    tree = release_root(version) / "verl" / "trainer" / "config" / "engine" / "fsdp.yaml"
    return key in (yaml.safe_load(tree.read_text(encoding="utf-8")) or {})


def _cases(version: str) -> list[tuple[int, str, str, dict[str, Any]]]:
    return CASES + (NO_SYNC_CASES if release_ready(version) and _tree_has(version, NO_SYNC) else [])


def _case_id(case: tuple[int, str, str, dict[str, Any]]) -> str:
    world, strategy, role, settings = case
    flat = {**{k: v for k, v in settings.items() if k != "engine"}, **settings.get("engine", {})}
    extra = ",".join(f"{k}={v}" for k, v in sorted(flat.items()))
    return f"{strategy}-{role}-world{world}" + (f"[{extra}]" if extra else "")


PARAMS = [
    pytest.param(version, case, id=f"{version}-{_case_id(case)}")
    for version in RELEASES
    for case in _cases(version)
]


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("tiny")
    request, tokenizer = save_policy_and_critic(folder)
    # tiny models of other families of the same vocabulary, each its own critic the same body
    # with a score head
    import torch
    import transformers

    models = {}
    for family, settings in OTHER_TINY.items():
        config = transformers.AutoConfig.for_model(family, **settings, vocab_size=len(tokenizer))
        torch.manual_seed(0)
        for name, auto in (
            (family, transformers.AutoModelForCausalLM),
            (f"{family}_critic", transformers.AutoModelForTokenClassification),
        ):
            built = config if name == family else _with_labels(config)
            critics = transformers.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING
            if name != family and type(config) not in critics:
                continue  # no token-classification class (Glm4Moe): no critic verl could build
            auto.from_config(built).save_pretrained(folder / name)
            tokenizer.save_pretrained(folder / name)
        models[family] = {
            "model_dir": str(folder / family),
            "critic_dir": str(folder / f"{family}_critic"),
            "config": json.loads((folder / family / "config.json").read_text()),
        }
    return {
        **request,
        "config": json.loads((folder / "policy" / "config.json").read_text()),
        "models": models,
    }


GPT_OSS_TINY = {
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
}
GLM4_TINY = {
    "hidden_size": 32,
    "intermediate_size": 40,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "pad_token_id": 0,
}
GLM4_MOE_TINY = {
    **GLM4_TINY,
    "moe_intermediate_size": 16,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "attention_bias": True,
}
HY_V3_TINY = {
    **{key: value for key, value in GLM4_TINY.items() if key != "pad_token_id"},
    "moe_intermediate_size": 16,
    "num_experts": 4,
    "num_shared_experts": 1,
    "num_experts_per_tok": 2,
}
OTHER_TINY = {
    "gpt_oss": GPT_OSS_TINY,
    "glm4": GLM4_TINY,
    "glm4_moe": GLM4_MOE_TINY,
    "hy_v3": HY_V3_TINY,
}


def _with_labels(config: Any) -> Any:
    labelled = copy.deepcopy(config)
    labelled.num_labels = 1
    return labelled


def _model_of(tiny: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """The case's model: the tiny Qwen2, or another the case names (``model``)."""
    return tiny["models"][settings["model"]] if "model" in settings else tiny


def _asked(world: int, strategy: str, role: str, settings: dict[str, Any], tiny: Any) -> Any:
    """A case as the oracle takes it: the named model's folders in place of its name."""
    asked = {"world": world, "strategy": strategy, "role": role, **settings}
    if "model" in settings:
        model = _model_of(tiny, settings)
        del asked["model"]
        asked.update(model_dir=model["model_dir"], critic_dir=model["critic_dir"])
    return asked


_MEASURED: dict[str, dict[str, dict[str, Any]]] = {}


def _measured(version: str, tiny: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """One sandboxed run of the release's engine for every case of the release (verl imported
    once per release)."""
    if version in _MEASURED:
        return _MEASURED[version]
    if not release_ready(version):
        pytest.skip(f"the environment of verl {version} is not built")
    cases = _cases(version)
    request = {
        "model_dir": tiny["model_dir"],
        "critic_dir": tiny["critic_dir"],
        "vocab": tiny["vocab"],
        "cases": [_asked(*case, tiny) for case in cases],
    }
    run = release_runner(version)(
        "pytest_verl_compat.conformance.step.memory_states", stdin=json.dumps(request), timeout=900
    )
    assert run.returncode == 0, run.stderr_tail(30)
    answer = next(
        line for line in reversed(run.stdout.splitlines()) if line.startswith(ANSWER_MARK)
    )
    # the oracle answers world by world (one fake group each), each result naming its case
    results = {
        json.dumps(result["case"], sort_keys=True): result
        for result in json.loads(answer[len(ANSWER_MARK) :])
    }
    assert len(results) == len(cases), "the oracle answered another set of cases"
    _MEASURED[version] = {
        _case_id(case): results[json.dumps(asked, sort_keys=True)]
        for case, asked in zip(cases, request["cases"], strict=True)
    }
    return _MEASURED[version]


@pytest.mark.parametrize(("version", "case"), PARAMS)
def test_model_states_equal_verl_byte_for_byte(
    version: str, case: tuple[int, str, str, dict[str, Any]], tiny_models: dict[str, Any]
) -> None:
    world, _, role, settings = case
    got = _measured(version, tiny_models)[_case_id(case)]
    config = _model_of(tiny_models, settings)["config"]
    arch = architecture_from_config(config, "tiny", "config.json")
    # the forecast's reader on the sections the release's tree composed
    spec, _ = engine_spec(
        got["config"], role, world, forward_only=role == "ref", value_head=role == "critic"
    )
    forecast = fsdp_states(arch, spec)
    expected = {
        "params": forecast.params,
        "grads": forecast.grads,
        "optimizer": forecast.optimizer,
        "accumulated": forecast.accumulated,
    }
    observed = {key: got[key] for key in expected}
    assert observed == expected, (
        f"bytes={observed}, but should be {expected} [{version} {_case_id(case)}]"
    )


@pytest.mark.parametrize(
    ("version", "case"),
    [p for p in PARAMS if p.values[1][3].get("lora_rank")],  # type: ignore[index]
)
def test_a_lora_weight_sync_gathers_what_the_forecast_says(
    version: str, case: tuple[int, str, str, dict[str, Any]], tiny_models: dict[str, Any]
) -> None:
    """The adapters' weight sync without layered_summon, run on the release's engine: FSDP1's
    summon_full_params holds every unit unsharded at full precision at once, byte for byte the
    forecast's ``summoned``; FSDP2 gathers tensor by tensor and never unshards the model."""
    world, strategy, role, settings = case
    got = _measured(version, tiny_models)[_case_id(case)]
    config = _model_of(tiny_models, settings)["config"]
    arch = architecture_from_config(config, "tiny", "config.json")
    spec, _ = engine_spec(got["config"], role, world, forward_only=False, value_head=False)
    forecast = fsdp_states(arch, spec)
    if strategy == "fsdp":
        assert got["summoned"] == forecast.summoned, (version, _case_id(case))
        # every unit whole over its shard group (HSDP: fsdp_size), padding included
        assert forecast.summoned == forecast.params * spec.shard > forecast.params
    else:
        # summon_full_params finds no FSDP1 unit in an FSDP2 model: its parameters stay shards
        assert forecast.summoned == 0
        assert got["summoned"] == forecast.params, (version, _case_id(case))


@pytest.mark.parametrize(
    ("version", "case"),
    [p for p in PARAMS if p.values[1][2] != "ref"],  # type: ignore[index]
)
def test_offload_moves_are_what_the_forecast_keeps_off_the_gpu(
    version: str, case: tuple[int, str, str, dict[str, Any]], tiny_models: dict[str, Any]
) -> None:
    """The release's engine moves exactly the states the forecast counts as off the GPU between
    calls (after init), loaded for a forward (weights only) and for an update (weights and
    optimizer)."""
    _, _, _, settings = case
    moves = _measured(version, tiny_models)[_case_id(case)]["moves"]
    seen = {(m["phase"], m["direction"]): (m["model"], m["optimizer"]) for m in moves}
    expected = offload_moves(
        bool(settings.get("param_offload")), bool(settings.get("optimizer_offload"))
    )
    assert {k: seen[k] for k in expected} == expected, f"moves={moves} [{version}]"


@pytest.mark.parametrize("version", RELEASES)
def test_the_no_sync_setting_is_measured_both_ways_where_a_tree_has_it(
    version: str, tiny_models: dict[str, Any]
) -> None:
    """Where the release's tree has the key, deferring sync holds unsharded gradients between
    micro-batches and syncing every micro-batch holds none; a tree without it defers (its
    engine has no other way), as the forecast reads a missing key."""
    measured = _measured(version, tiny_models)
    base = measured[_case_id((2, "fsdp2", "actor", {}))]["accumulated"]
    if not _tree_has(version, NO_SYNC):
        assert base > 0
        return
    on = measured[_case_id((2, "fsdp2", "actor", {"engine": {NO_SYNC: True}}))]["accumulated"]
    off = measured[_case_id((2, "fsdp2", "actor", {"engine": {NO_SYNC: False}}))]["accumulated"]
    assert on > 0 and off == 0, (on, off)
    tree_default = yaml.safe_load(
        (release_root(version) / "verl/trainer/config/engine/fsdp.yaml").read_text()
    )[NO_SYNC]
    assert base == (on if tree_default else off), "the tree's own default was not what ran"


def test_a_lora_base_reduces_no_gradient() -> None:
    """The gradient a unit reduce-scatters after its backward is its trainable weights': a
    frozen LoRA base has none (verl wraps each adapter as its own unit, fsdp_utils.py:113-125),
    so one layer's is its adapters' A and B; full fine-tuning reduces the whole layer."""
    from pytest_verl_compat.memory.models import from_table
    from pytest_verl_compat.memory.states import EngineSpec, model_states

    choice = from_table("Qwen/Qwen2.5-7B")
    assert choice is not None
    arch = choice.architecture
    full = model_states(arch, EngineSpec("fsdp", 8))
    assert full.layer_grad_unit == full.layer_unit
    lora = model_states(arch, EngineSpec("fsdp", 8, lora_rank=32))
    h, kv, inter = (
        arch.hidden_size,
        arch.num_key_value_heads * arch.head_dim,
        arch.intermediate_size,
    )
    # (in + out) x rank per adapted linear: q, k, v, o, gate, up, down
    adapters = 32 * ((h + h) * 2 + (h + kv) * 2 + (h + inter) * 3)
    assert lora.layer_grad_unit == adapters * 2
    assert lora.layer_unit == full.layer_unit


def test_megatron_lora_adapters_stay_on_their_layers_pipeline_stage() -> None:
    """A LoRA adapter is its own unit inside its layer (``model.layers.3...lora_A``): with
    pipeline parallel, rank 0 holds the adapters of its stage's layers alone (the first stage
    of two holds half the layers' adapters), never a crash on the adapter's unit name (verl
    0.9.0's examples/tuning/lora/run_qwen3_30b_a3b_megatron.sh, pp 2)."""
    from pytest_verl_compat.memory.models import from_table
    from pytest_verl_compat.memory.states import EngineSpec, layer_index, model_states

    choice = from_table("Qwen/Qwen2.5-7B")
    assert choice is not None
    arch = choice.architecture
    one = model_states(arch, EngineSpec("megatron", 8, lora_rank=32, tp=2, pp=1))
    two = model_states(arch, EngineSpec("megatron", 8, lora_rank=32, tp=2, pp=2))
    assert two.grads * 2 == one.grads > 0 and two.trainable == one.trainable
    assert layer_index("model.layers.13.mlp.gate_proj.lora_A") == 13
    assert layer_index("layers.0") == 0
    with pytest.raises(ValueError, match="names no decoder layer"):
        layer_index("root")


def _adapter_numel(spec_targets: tuple[str, ...], exclude: tuple[str, ...] = ()) -> int:
    from pytest_verl_compat.memory.models import from_table
    from pytest_verl_compat.memory.states import EngineSpec, model_states

    choice = from_table("Qwen/Qwen2.5-7B")
    assert choice is not None
    spec = EngineSpec("megatron", 8, lora_rank=16, lora_targets=spec_targets, lora_exclude=exclude)
    return model_states(choice.architecture, spec).trainable


def test_megatron_lora_adapts_megatron_bridges_modules_not_peft_names() -> None:
    """Megatron's LoRA is Megatron-Bridge's, one adapter per megatron-core module a target names
    (module_matcher.py, lora.py@megatron-bridge-0.3.1): the fused linear_qkv and linear_fc1 take one
    A each (rank x hidden), where peft's separate q/k/v and gate/up projections take three and two;
    canonical LoRA's unfused names take one each; with no target every linear but the excluded is
    adapted, the output layer included. Transcribed per decoder layer of Qwen2.5-7B."""
    from pytest_verl_compat.memory.models import from_table
    from pytest_verl_compat.memory.states import MEGATRON_DEFAULT_TARGETS

    choice = from_table("Qwen/Qwen2.5-7B")
    assert choice is not None
    arch = choice.architecture
    h, q = arch.hidden_size, arch.num_attention_heads * arch.head_dim
    kv, inter, layers = arch.num_key_value_heads * arch.head_dim, arch.intermediate_size, 28
    fused = 16 * ((h + q + 2 * kv) + (q + h) + (h + 2 * inter) + (inter + h))
    assert _adapter_numel(MEGATRON_DEFAULT_TARGETS) == layers * fused
    assert _adapter_numel(("all-linear",)) == layers * fused, "EngineSpec's default: the same list"
    canonical = (
        "linear_q", "linear_k", "linear_v", "linear_proj",
        "linear_fc1_gate", "linear_fc1_up", "linear_fc2",
    )  # fmt: skip
    separate = 16 * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + inter) + (inter + h))
    assert _adapter_numel(canonical) == layers * separate
    assert _adapter_numel(("linear_qkv",)) == layers * 16 * (h + q + 2 * kv)
    head = 16 * (h + arch.vocab_size)
    without_fc2 = fused - 16 * (inter + h)
    assert _adapter_numel((), ("linear_fc2",)) == layers * without_fc2 + head
    # wildcards match megatron-core's full names (decoder.layers.0.self_attention.linear_qkv), as
    # Megatron-Bridge's wildcard_match does: model/hf_model.yaml's own example adapts layer 0 alone
    assert _adapter_numel(("*.layers.0.*.linear_qkv",)) == 16 * (h + q + 2 * kv)
    assert _adapter_numel(("*.linear_fc2",)) == layers * 16 * (inter + h)
    assert _adapter_numel((), ("*.layers.0.*",)) == (layers - 1) * fused + head


def test_megatron_lora_of_a_vl_model_adapts_the_towers_own_modules_on_the_first_stage() -> None:
    """A VL model's tower stays transformers' module under Megatron-Bridge, matched by its own names:
    Qwen3-VL's blocks and mergers name their MLP linear_fc1 and linear_fc2 (adapted by the default
    targets), their attention qkv and proj (not). The tower and its adapters sit on the first
    pipeline stage; the forecast of such a run had crashed on the adapters' names."""
    from pytest_verl_compat.memory.models import from_table
    from pytest_verl_compat.memory.states import (
        MEGATRON_DEFAULT_TARGETS,
        EngineSpec,
        layer_index,
        model_states,
        model_tensors,
    )
    from pytest_verl_compat.memory.vision import in_tower

    choice = from_table("Qwen/Qwen3-VL-8B-Instruct")
    assert choice is not None
    arch = choice.architecture
    spec = EngineSpec("megatron", 8, lora_rank=16, lora_targets=MEGATRON_DEFAULT_TARGETS, pp=2)
    _, adapters = model_tensors(arch, spec)
    tower = [t for t in adapters if in_tower(t.name)]
    assert tower and all(
        ".linear_fc1.lora_" in t.name or ".linear_fc2.lora_" in t.name for t in tower
    )
    assert not any(".attn." in t.name for t in tower)
    first_stage = [
        t
        for t in adapters
        if not in_tower(t.name) and layer_index(t.unit) < arch.num_hidden_layers // 2
    ]
    states = model_states(arch, spec)
    assert states.grads == 4 * sum(t.numel for t in [*tower, *first_stage])


# verl's own optimizer (build_optimizer of its FSDPOptimizerConfig, the class optim.optimizer_impl
# names) stepped once on CPU tensors of several shapes, its states made by a first step, then the
# bytes every op of a second step leaves alive beyond the parameters, gradients and states (the
# meter of tests/test_fit_activations.py). On a CPU torch defaults to the single-tensor step, so
# each switch is set as override_optimizer_config sets it on a GPU run: foreach (the GPU's
# default) and fused.
_STEP = """
from typing import Any
import torch
from verl.workers.config.optimizer import FSDPOptimizerConfig, build_optimizer

HELPERS

result = []
for override in OVERRIDES:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in SHAPES]
    config = FSDPOptimizerConfig(lr=1e-3, weight_decay=0.01, override_optimizer_config=override)
    optimizer = build_optimizer(params, config)
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer.step()
    for p in params:
        p.grad = torch.randn_like(p)
    kept = {
        t.untyped_storage().data_ptr()
        for p in params
        for t in (p, p.grad, *optimizer.state[p].values())
    }
    meter = _Live(kept)
    with meter:
        optimizer.step()
    result.append([type(optimizer).__name__, max(meter.timeline)])
"""


@pytest.mark.parametrize("version", RELEASES)
def test_an_optimizer_step_allocates_the_copies_the_forecast_counts(version: str) -> None:
    """torch's AdamW as verl builds it: on foreach its step holds one more copy of every
    trainable tensor (the square roots of exp_avg_sq, torch/optim/adam.py:762), fused none; the
    forecast's step_copies say the same of each switch."""
    import inspect

    from release_python import run_in_release
    from test_fit_activations import _Live

    from pytest_verl_compat.memory.states import EngineSpec, step_copies

    if not release_ready(version):
        pytest.skip(f"the environment of verl {version} is not built")
    shapes = [(1000, 64), (64, 1000), (300,), (2048, 32), (7, 9)]
    overrides = [{"foreach": True}, {"fused": True}]
    source = (
        _STEP.replace("HELPERS", inspect.getsource(_Live))
        .replace("OVERRIDES", repr(overrides))
        .replace("SHAPES", repr(shapes))
    )
    measured = run_in_release(source, version)
    trainable = sum(a * b for a, b in (s if len(s) == 2 else (s[0], 1) for s in shapes)) * 4
    for override, (name, transient) in zip(overrides, measured, strict=True):
        assert name == "AdamW", name
        spec = EngineSpec("fsdp2", 1, **override)
        assert transient == step_copies(spec) * trainable, (override, transient, trainable)
