"""verl's VeOmni engine in the memory forecast (memory/veomni.py): read as the FSDP2 VeOmni
builds, with what differs from verl's own FSDP2 engine, each beside its near-identical twin.

- the shard group: the data-parallel shards times Ulysses, the whole world unless fsdp_size is a
  proper divisor of the data-parallel size;
- the stored weights fp32 under mixed_precision (the default), the reference's too; bf16 without;
- experts split over expert parallel: the same bytes per rank, a layer gathering only its own;
- the root module gathered through backward; no unsharded no-sync gradients;
- the engine's own Ulysses key in the fixes, no FSDP activation offload offered;
- a LoRA rank (the engine builds no adapters) and a release without the engine are one line.
The VeOmni lines are veomni 0.1.12's (verl pins none). Against the real thing: verl's own
``VeOmniEngineWithLMHead``, built in each release's environment with that VeOmni (a wheel fetched
by its hash, tests/veomni_wheel.py) on a fake process group, holds on rank 0 exactly the
parameter bytes and dtype the forecast reads, for the whole world, experts over expert parallel,
HSDP under Ulysses and bf16 without mixed precision; without expert parallel (whose backward
needs real peers), only its root module stays gathered after a forward, and after a backward and
the optimizer's step its gradient shards and AdamW states are the forecast's bytes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from cli_in_process import run

from pytest_verl_compat.memory import veomni
from pytest_verl_compat.memory.architecture import architecture_from_config
from pytest_verl_compat.memory.release_facts import facts_from_mapping, release_facts
from pytest_verl_compat.memory.states import EngineSpec, fsdp_states, model_tensors

VL_MOE = "verl-v0.9.0/examples/grpo_trainer/run_qwen3_vl_30b_moe_veomni.sh"
OPD = "verl-v0.9.0/examples/on_policy_distillation_trainer/run_qwen3_8b_mopd_veomni.sh"
ACTOR = "actor_rollout_ref.actor"


@pytest.mark.parametrize(
    ("world", "sp", "fsdp", "group"),
    [
        (16, 1, -1, -1),  # the whole world
        (16, 2, -1, -1),  # dp 8 x Ulysses 2: still the whole world
        (16, 2, 8, -1),  # fsdp_size the whole data-parallel size: no replicas
        (16, 2, 4, 8),  # HSDP: 4 shards x Ulysses 2, replicated twice
        (16, 1, 4, 4),
        (16, 2, 3, -1),  # not a divisor: verl raises at start (fsdp2_reading says so in one line)
    ],
)
def test_the_shard_group_is_the_data_parallel_shards_times_ulysses(
    world: int, sp: int, fsdp: int, group: int
) -> None:
    engine = {"fsdp_size": fsdp, veomni.ULYSSES_KEY: sp}
    assert veomni.shard_group_size(engine, world) == group
    spec = EngineSpec(veomni.AS_STRATEGY, world, fsdp_size=group)
    assert spec.shard == (world if group < 0 else group)


@pytest.mark.parametrize(
    ("mixed", "model_dtype", "reduce_dtype"),
    [(None, "fp32", "fp32"), (True, "fp32", "fp32"), (False, "bf16", "bf16")],
)
def test_stored_weights_are_fp32_under_mixed_precision(
    mixed: bool | None, model_dtype: str, reduce_dtype: str
) -> None:
    engine = {} if mixed is None else {"mixed_precision": mixed}
    view = veomni.fsdp2_reading(engine, 8)
    assert view["model_dtype"] == model_dtype
    assert view["mixed_precision"] == {"param_dtype": "bf16", "reduce_dtype": reduce_dtype}
    # the decoder layers reshard whatever enable_full_shard says (VeOmni does not read it)
    assert veomni.fsdp2_reading({"enable_full_shard": False}, 8)["reshard_after_forward"] is True


MOE = {
    "model_type": "qwen3_moe",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 96,
    "moe_intermediate_size": 24,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 128,
}


def _experts(arch: object, spec: EngineSpec) -> list:
    _, trainable = model_tensors(arch, spec)  # type: ignore[arg-type]
    return [t for t in trainable if t.kind == "experts"]


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_experts_over_expert_parallel_keep_the_bytes_and_gather_a_ranks_own(ep: int) -> None:
    arch = architecture_from_config(MOE, "tiny", "test")
    plain = EngineSpec(veomni.AS_STRATEGY, 8, root_gathered=True)
    split = EngineSpec(veomni.AS_STRATEGY, 8, ep=ep, root_gathered=True)
    a, b = fsdp_states(arch, plain), fsdp_states(arch, split)
    experts = _experts(arch, plain)
    # rank 0 holds E/ep experts, each split on its second dimension over the other 8/ep ranks
    own = sum(
        (t.shape[0] // ep) * math.ceil(t.shape[1] / (8 // ep)) * math.prod(t.shape[2:])
        for t in experts
    )
    rest = sum(math.ceil(t.shape[0] / 8) * math.prod(t.shape[1:]) for t in experts)
    assert b.params - a.params == (own - rest) * 4
    assert own * 8 == sum(t.numel for t in experts)  # these shapes divide: no padding
    # a layer gathers its attention, router and its rank's E/ep experts, in bf16
    layer_experts = sum(t.numel for t in experts if t.unit == "layers.0")
    assert a.layer_unit - b.layer_unit == layer_experts * (1 - 1 / ep) * 2


def test_the_root_stays_gathered_only_where_the_engine_keeps_it() -> None:
    arch = architecture_from_config(MOE, "tiny", "test")
    root = sum(t.numel for t in arch.tensors() if t.unit == "root") * 2
    gathered = fsdp_states(arch, EngineSpec(veomni.AS_STRATEGY, 8, root_gathered=True))
    verl_fsdp2 = fsdp_states(arch, EngineSpec(veomni.AS_STRATEGY, 8))
    assert gathered.root_unit == root and verl_fsdp2.root_unit == 0


def _lines(out: str, word: str) -> list[str]:
    return [line for line in out.splitlines() if word in line]


def test_a_veomni_launch_is_forecast_with_its_own_reading(
    here: object, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(capsys, "fit", VL_MOE, "--gpu", "H100")
    assert status in (0, 1), err
    assert "FSDP2 (VeOmni) shards over 16" in out
    assert _lines(out, "the VeOmni engine is read as the FSDP2 it builds")
    assert "transformer_impl.py:320@0.9.0" in out
    # the reference's weights stay on the GPU in fp32 (param_offload false), no no-sync gradients
    assert any(" x 4 B" in line for line in _lines(out, "ref weights"))
    assert not _lines(out, "unsharded grads")


# One GRPO launch on a MoE model, on VeOmni and on verl's own FSDP2 engine (the same offloads).
LAUNCH = (
    "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo data.train_batch_size=64 "
    "data.max_prompt_length=1024 data.max_response_length=2048 "
    "actor_rollout_ref.model.path=Qwen/Qwen3-30B-A3B actor_rollout_ref.actor.ppo_mini_batch_size=16 "
    "actor_rollout_ref.actor.use_dynamic_bsz=True "
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=12288 "
    "actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.rollout.name=vllm "
    "actor_rollout_ref.rollout.tensor_model_parallel_size=4 actor_rollout_ref.rollout.n=4 "
    "trainer.n_gpus_per_node=8 trainer.nnodes=1 "
)
ENGINES = {
    "veomni": "model_engine=veomni actor_rollout_ref.actor.veomni.param_offload=True "
    "actor_rollout_ref.actor.veomni.optimizer_offload=True",
    "fsdp2": "actor_rollout_ref.actor.strategy=fsdp2 actor_rollout_ref.ref.strategy=fsdp2 "
    "actor_rollout_ref.actor.fsdp_config.param_offload=True "
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
}


def test_the_twin_on_verls_fsdp2_engine_differs_where_the_engines_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outs = {}
    for name, engine in ENGINES.items():
        script = tmp_path / f"{name}.sh"
        script.write_text(LAUNCH + engine + "\n", encoding="utf-8")
        status, outs[name], err = run(capsys, "fit", str(script), "--gpu", "H100")
        assert status in (0, 1), err
    ours, twin = outs["veomni"], outs["fsdp2"]
    assert "FSDP2 (VeOmni) shards over 8" in ours and "FSDP2 shards over 8" in twin
    # the reference: fp32 and on the GPU under VeOmni; bf16 shards on the host under verl's
    assert any(" x 4 B" in line for line in _lines(ours, "ref weights"))
    assert not _lines(twin, "ref weights (resident)")
    # 0.9.0's own FSDP2 engine keeps unsharded gradients between micro-batches; VeOmni syncs
    assert _lines(twin, "unsharded grads") and not _lines(ours, "unsharded grads")
    # VeOmni's root stays gathered through backward: the all-gathered units say root
    assert any("root unit" in line for line in _lines(ours, "actor all-gathered units"))


def test_mixed_precision_off_stores_bf16(here: object, capsys: pytest.CaptureFixture[str]) -> None:
    key = f"+{ACTOR}.veomni.mixed_precision=false"
    status, out, err = run(capsys, "fit", OPD, "--gpu", "H100", "--set", key)
    assert status in (0, 1), err
    assert any(" x 2 B" in line for line in _lines(out, "actor weights:")), out


def test_the_fixes_name_the_engines_own_keys(
    here: object, capsys: pytest.CaptureFixture[str]
) -> None:
    # static micro-batches: Ulysses splits a micro-batch's tokens (a dynamic budget is per GPU)
    static = (f"{ACTOR}.use_dynamic_bsz=false", f"{ACTOR}.ppo_micro_batch_size_per_gpu=8")
    sets = [word for change in static for word in ("--set", change)]
    status, out, err = run(capsys, "fit", OPD, "--gpu-memory", "30", "--brief", *sets)
    assert status == 1, err
    errors = "\n".join(_lines(out, "error[memory.actor-update]"))
    assert errors, out
    assert f"{ACTOR}.veomni.ulysses_parallel_size=" in errors
    assert f"{ACTOR}.ulysses_sequence_parallel_size" not in errors
    assert "enable_activation_offload" not in errors


def test_a_lora_rank_on_veomni_is_one_line(
    here: object, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(
        capsys, "fit", OPD, "--gpu", "H100", "--set", "actor_rollout_ref.model.lora_rank=8"
    )
    assert status == 2, out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "builds no LoRA adapters" in lines[0] and "Traceback" not in err


def test_facts_without_the_engine_are_read_and_say_so() -> None:
    facts = release_facts("0.9.0")
    assert facts.veomni_evidence == "verl/workers/engine/veomni/transformer_impl.py:320@0.9.0"
    raw = {
        "release": "class",
        "facts": {
            name: {"value": list(f.value) if isinstance(f.value, tuple) else f.value}
            for name, f in facts.facts.items()
            if name != "veomni_engine"
        },
    }
    assert facts_from_mapping(raw, "class").veomni_evidence is None


def test_veomnis_own_activation_offload_is_said_and_not_counted(
    here: object, capsys: pytest.CaptureFixture[str]
) -> None:
    offload = "actor_rollout_ref.model.enable_activation_offload=True"
    status, plain, err = run(capsys, "fit", OPD, "--gpu", "H100")
    assert status in (0, 1), err
    status, out, err = run(capsys, "fit", OPD, "--gpu", "H100", "--set", offload)
    assert status in (0, 1), err
    assert _lines(out, "activation offload") and not _lines(plain, "activation offload")
    phases = [line for line in out.splitlines() if line.startswith("  actor update")]
    assert phases == [line for line in plain.splitlines() if line.startswith("  actor update")]


def test_the_engines_async_activation_offload_is_said() -> None:
    view = veomni.fsdp2_reading({veomni.ASYNC_OFFLOAD: True}, 8)
    spec = EngineSpec(veomni.AS_STRATEGY, 8, label="VeOmni")
    flags = {"activation_offload": False}
    read = veomni.role_flags(spec, view, flags, release_facts("0.9.1"), "engine")
    assert veomni.ACTIVATION_OFFLOAD_ASSUMED in read["assumed"]
    quiet = veomni.role_flags(
        spec, veomni.fsdp2_reading({}, 8), flags, release_facts("0.9.1"), "engine"
    )
    assert veomni.ACTIVATION_OFFLOAD_ASSUMED not in quiet["assumed"]


# --- verl's own VeOmni engine, built in each release's environment --------------------------

ENGINE_CASES = {
    "whole world": (8, {}),
    "experts over ep 4": (8, {"expert_parallel_size": 4}),
    "HSDP: fsdp_size 2 x Ulysses 2": (8, {"ulysses_parallel_size": 2, "fsdp_size": 2}),
    "bf16, ep 2, Ulysses 2": (
        8,
        {"mixed_precision": False, "expert_parallel_size": 2, "ulysses_parallel_size": 2},
    ),
}
# the tree's mixed_precision default (engine/veomni.yaml; the config class's own is false) and the
# kernels a CPU run takes
CPU_KEYS = {"mixed_precision": True, "attn_implementation": "sdpa", "moe_implementation": "eager"}
_ENGINE_STATES: dict[str, dict[str, dict]] = {}


def _engine_states(version: str, cache: Path) -> dict[str, dict]:
    if version in _ENGINE_STATES:
        return _ENGINE_STATES[version]
    from corpus_facts import release_ready
    from veomni_wheel import veomni_folder

    from pytest_verl_compat.upstream.oracle.runner import release_runner
    from pytest_verl_compat.upstream.probes.veomni_states_probe import ANSWER_MARK

    if not release_ready(version):
        pytest.skip(f"the environment of verl {version} is not built")
    cases = [
        {"world": world, "engine": {**CPU_KEYS, **keys}} for world, keys in ENGINE_CASES.values()
    ]
    request = {"veomni": str(veomni_folder(cache)), "config": MOE, "cases": cases}
    run = release_runner(version)(
        "pytest_verl_compat.upstream.probes.veomni_states_probe",
        stdin=json.dumps(request),
        timeout=900,
    )
    assert run.returncode == 0, run.stderr_tail(30)
    lines = reversed(run.stdout.splitlines())
    answer = next(line for line in lines if line.startswith(ANSWER_MARK))
    results = json.loads(answer[len(ANSWER_MARK) :])
    _ENGINE_STATES[version] = dict(zip(ENGINE_CASES, results, strict=True))
    return _ENGINE_STATES[version]


@pytest.mark.parametrize("name", sorted(ENGINE_CASES))
@pytest.mark.parametrize("version", ["0.9.0", "0.9.1"])
def test_the_forecast_holds_what_verls_veomni_engine_holds(
    request: pytest.FixtureRequest, version: str, name: str
) -> None:
    from pytest_verl_compat.memory.reading import engine_spec

    measured = _engine_states(version, request.config.cache.mkdir("veomni"))[name]
    world, keys = ENGINE_CASES[name]
    resolved = {
        "actor_rollout_ref": {
            "actor": {"strategy": "veomni", "veomni": {**CPU_KEYS, **keys}},
            "model": {},
        }
    }
    spec, _ = engine_spec(resolved, "actor", world, forward_only=False, value_head=False)
    arch = architecture_from_config(MOE, "tiny", "test")
    assert fsdp_states(arch, spec).params == measured["params"]
    assert measured["dtypes"] == [{4: "float32", 2: "bfloat16"}[spec.model_dtype]]
    if "gathered_after_forward" in measured:
        # the root module alone stays gathered after a forward; the layers reshard
        assert measured["gathered_after_forward"] == ["<root>"]
        assert spec.root_gathered
        # the sharded gradients the step takes, and AdamW's two states per parameter
        states = fsdp_states(arch, spec)
        assert (measured["grads"], measured["optimizer"]) == (states.grads, states.optimizer)


def test_a_veomni_critic_is_forecast_as_the_actor_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    launch = LAUNCH.replace("algorithm.adv_estimator=grpo", "algorithm.adv_estimator=gae")
    script = tmp_path / "ppo.sh"
    script.write_text(
        launch + "critic.model.path=Qwen/Qwen3-30B-A3B " + ENGINES["veomni"] + "\n",
        encoding="utf-8",
    )
    status, out, err = run(capsys, "fit", str(script), "--gpu", "H100")
    assert status in (0, 1), err
    assert any("FSDP2 (VeOmni)" in line for line in _lines(out, "critic weights"))
    assert _lines(out, "critic update") and not _lines(out, "unsharded grads")


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("expert_parallel_size", "3", "does not divide the 8 ranks of VeOmni's shard group"),
        ("expert_parallel_size", "16", "does not divide the 8 ranks of VeOmni's shard group"),
        ("ulysses_parallel_size", "0", "expected a positive integer"),
        ("ulysses_parallel_size", "abc", "expected an integer"),
        ("fsdp_size", "3", "does not divide the data-parallel size 8"),
    ],
)
def test_an_engine_size_veomni_cannot_lay_out_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, value: str, said: str
) -> None:
    script = tmp_path / "veomni.sh"
    script.write_text(LAUNCH + ENGINES["veomni"] + "\n", encoding="utf-8")
    dotted = f"{ACTOR}.veomni.{key}"
    status, out, err = run(
        capsys, "fit", str(script), "--gpu", "H100", "--set", f"{dotted}={value}"
    )
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1, (out, err)
    assert dotted in lines[0] and said in lines[0] and "Traceback" not in err
    # its valid twin: expert parallel over 8 (the shard group) is forecast
    status, out, err = run(
        capsys, "fit", str(script), "--gpu", "H100", "--set", f"{ACTOR}.veomni.{key}=8"
    )
    assert status in (0, 1), err
