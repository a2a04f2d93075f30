"""Reading a resolved configuration into the forecast's layout: each role's engine, the token
budgets of its micro-batches (every key cites the verl 0.9.0 line that wires it), the rollout
and reward-model servers, for the RL trainers and for the SFT trainer.

A key is read as upstream's code reads it: a key the release's tree lacks takes upstream's own
default (``use_no_sync_for_gradient_accumulation``: ``getattr(..., True)``). Where the release's
code decides what no key does, its facts (``release_facts``) say how."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pytest_verl_compat.checks.lora import ALL_LINEAR, engine_lora_rank, served_rank_spelling
from pytest_verl_compat.checks.roles import (
    FSDP_STRATEGIES,
    MEGATRON_STRATEGIES,
    ROLE_SECTIONS,
    engine_path,
    gpu_count,
    megatron_sizes,
    need_critic,
    need_reference_policy,
    ref_in_actor,
    reference_worker,
    role_engine,
    role_section,
    role_strategy,
    sequence_parallel,
)
from pytest_verl_compat.checks.sft import engine_strategy
from pytest_verl_compat.memory import server_lora, veomni
from pytest_verl_compat.memory.activations import EV_LOGITS, EV_MEGATRON_CE
from pytest_verl_compat.memory.architecture import GLM_LAYER, GPT_OSS
from pytest_verl_compat.memory.batches import role_batches
from pytest_verl_compat.memory.engine_flags import fused, role_flags
from pytest_verl_compat.memory.layout import (
    BUCKET_DEFAULT_MB,
    BUCKET_KEY,
    EV_MICRO_BATCHES,
    POOL_OWN,
    POOL_OWN_HYBRID,
    POOL_SHARED,
    RL,
    SERVE,
    SFT,
    Lengths,
    RoleLayout,
    RunLayout,
    ServerLayout,
    as_int,
    ceil_div,
    micro_batches,
    value_at,
    whole_mini_batch,
)
from pytest_verl_compat.memory.models import ModelChoice
from pytest_verl_compat.memory.release_facts import (
    DYNAMIC_MICRO_BATCHES,
    LOGPROB_BACKWARD,
    TEMPERATURE_COPY,
    ReleaseFacts,
)
from pytest_verl_compat.memory.states import (
    FORECAST_STRATEGIES,
    MEGATRON_DEFAULT_TARGETS,
    TORCH_OPTIM,
    EngineSpec,
    dtype_bytes,
)
from pytest_verl_compat.memory.values import (
    UnreadableRun,
    fraction,
    names,
    number,
    precision_bytes,
    server_dtype_bytes,
)

# The SFT trainer's log-prob temperature (verl/trainer/sft_trainer.py:348).
SFT_TEMPERATURE = 1.0
# The SFT trainer's optimizer section: top-level, beside engine (config/sft_trainer_engine.yaml:12)
SFT_OPTIM = "optim"
# Megatron's logits processor divides by the temperature in place, clones the logits for an
# entropy it computes eagerly (vocab_parallel_entropy) and takes the log-probs from megatron-core's
# vocab-parallel cross entropy, in both releases.
EV_MEGATRON_LOGITS = (
    f"verl/workers/engine/megatron/transformer_impl.py:1191, :1197, :1221; {EV_MEGATRON_CE}"
)


NO_SYNC_KEY = "use_no_sync_for_gradient_accumulation"


def defer_sync(engine: Mapping[str, Any]) -> bool:
    """Whether the engine skips gradient sync on all but a mini-batch's last micro-batch:
    ``getattr(self.engine_config, "use_no_sync_for_gradient_accumulation", True)``
    (verl/workers/engine/fsdp/transformer_impl.py:702-707@0.9.1); a release whose tree and
    config class lack the key defers always (0.9.0: transformer_impl.py:683-698)."""
    value = engine.get(NO_SYNC_KEY, True)
    return True if value is None else bool(value)


def _sync_key(engine: Mapping[str, Any], path: str) -> str:
    return f"{path}.{NO_SYNC_KEY}" if NO_SYNC_KEY in engine else ""


def copies_logits(facts: ReleaseFacts, temperature: Any, strategy: str = "fsdp") -> bool:
    """Whether the log-prob pass divides the logits by the temperature into a second tensor (the
    FSDP engine, as the release's facts say; Megatron's divides in place)."""
    if strategy in MEGATRON_STRATEGIES:
        return False
    how = facts.temperature_copy
    if how == "never":
        return False
    if how == "always":
        return True
    try:
        return float(temperature) != 1.0
    except (TypeError, ValueError):
        return True  # not a host scalar: the out-of-place division


def _tokens_evidence(dynamic: bool, facts: ReleaseFacts) -> str:
    if not dynamic:
        return EV_MICRO_BATCHES
    return f"{EV_MICRO_BATCHES}; {facts.evidence(DYNAMIC_MICRO_BATCHES)}"


def lora_modules(
    model: Any, strategy: str, where: str = "actor_rollout_ref.model"
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(targets, excluded) of the engine's LoRA: peft's model.target_modules and exclude_modules
    for FSDP (transformer_impl.py:340-349), Megatron-Bridge's model.lora.target_modules and
    exclude_modules for Megatron (megatron_peft.py:23-29; states.MEGATRON_LORA_MODULES)."""
    if not isinstance(model, Mapping):
        return (ALL_LINEAR,), ()
    if strategy in MEGATRON_STRATEGIES:
        lora = model.get("lora")
        lora = lora if isinstance(lora, Mapping) else {}
        inner = f"{where}.lora"
        return (
            names(lora, "target_modules", MEGATRON_DEFAULT_TARGETS, inner),
            names(lora, "exclude_modules", None, inner),
        )
    return (
        names(model, "target_modules", ALL_LINEAR, where),
        names(model, "exclude_modules", None, where),
    )


# The engines the forecast reads: its strategies, and VeOmni read as the FSDP2 it builds.
FORECAST_ENGINES = (*FORECAST_STRATEGIES, veomni.VEOMNI)


def _unforecast_engine(strategy: str, key: str) -> UnreadableRun:
    return UnreadableRun(
        f"{key}={strategy}: the forecast models {', '.join(FORECAST_ENGINES)} engines only", key
    )


def engine_spec(
    resolved: Mapping[str, Any], role: str, world: int, *, forward_only: bool, value_head: bool
) -> tuple[EngineSpec, Mapping[str, Any]]:
    strategy = role_strategy(resolved, role)
    if strategy not in FORECAST_ENGINES:
        raise _unforecast_engine(strategy, f"{engine_path(resolved, role)}.strategy")
    if not isinstance(value_at(resolved, engine_path(resolved, role), None), Mapping):
        # the strategy's section comes with the engine's config group (ppo_trainer.yaml's
        # defaults: ``${model_engine}_actor``); read without it, every engine key would default
        key = f"{ROLE_SECTIONS[role]}.strategy"
        raise UnreadableRun(
            f"{key}={strategy}, but the configuration has no {engine_path(resolved, role)} "
            f"section (a {strategy} engine's keys come with model_engine={strategy})",
            key,
        )
    engine = role_engine(resolved, role)
    model_key = "critic.model" if role == "critic" else "actor_rollout_ref.model"
    model = value_at(resolved, model_key, {})
    own: dict[str, Any] = {}
    if veomni.is_veomni(strategy):
        trained = model if role != "critic" else None  # the critic's model takes no LoRA
        engine, strategy, own = veomni.read_engine(
            engine, trained, world, engine_path(resolved, role), f"{ROLE_SECTIONS[role]}.strategy"
        )
    # the engine's own spelling of the rank: a rank in the other one trains the whole model
    rank = engine_lora_rank(model, strategy) if isinstance(model, Mapping) else 0
    targets_t, exclude_t = lora_modules(model, strategy, model_key)
    optim = role_section(resolved, role).get("optim") or {}
    # training engines default to fp32 weights, forward-only to bf16 (transformer_impl.py:237-242)
    model_dtype, param_dtype, reduce_dtype = _precisions(
        engine, strategy, engine_path(resolved, role), 2 if forward_only else 4
    )
    spec = EngineSpec(
        strategy=strategy,
        world=world,
        fsdp_size=as_int(engine.get("fsdp_size"), -1),
        model_dtype=model_dtype,
        param_dtype=param_dtype,
        reduce_dtype=reduce_dtype,
        forward_only=forward_only,
        value_head=value_head,
        lora_rank=0 if role == "critic" else rank,
        lora_targets=targets_t,
        lora_exclude=exclude_t,
        **optimizer_class(optim),
        distributed_optimizer=bool(engine.get("use_distributed_optimizer", True)),
        **_megatron_fields(strategy, engine, optim),
        **({"defer_sync": defer_sync(engine)} | own),
    )
    return spec, engine


def _precisions(
    engine: Mapping[str, Any], strategy: str, where: str, model_default: int
) -> tuple[int, int, int]:
    """EngineSpec's dtypes (model_dtype, param_dtype, reduce_dtype), read as the FSDP
    engine reads them (``precision_bytes``); another engine's are read as given, unread there."""
    mixed = engine.get("mixed_precision") or {}
    mixed = mixed if isinstance(mixed, Mapping) else {}
    if strategy in FSDP_STRATEGIES:
        inner = f"{where}.mixed_precision"
        return (
            precision_bytes(engine, "model_dtype", model_default, where),
            precision_bytes(mixed, "param_dtype", 2, inner),
            precision_bytes(mixed, "reduce_dtype", 4, inner),
        )
    return (
        dtype_bytes(engine.get("model_dtype"), model_default),
        dtype_bytes(mixed.get("param_dtype"), 2),
        dtype_bytes(mixed.get("reduce_dtype"), 4),
    )


def _megatron_fields(
    strategy: str, engine: Mapping[str, Any], optim: Mapping[str, Any]
) -> dict[str, Any]:
    """EngineSpec's Megatron parallel sizes (checks/roles.megatron_sizes) and CPU optimizer
    (``optimizer_on_host``); nothing for another engine, whose spec keeps the defaults."""
    if strategy not in MEGATRON_STRATEGIES:
        return {}
    sizes = megatron_sizes(engine)
    return {
        "tp": sizes.get("tp", 1),
        "pp": sizes.get("pp", 1),
        "vpp": max(sizes.get("vpp", 0), 1),
        "ep": sizes.get("ep", 1),
        "etp": sizes.get("etp", 1),
        "cp": sizes.get("cp", 1),
        **optimizer_on_host(optim),
    }


# verl hands override_optimizer_config to Megatron's OptimizerConfig as it is
# (verl/utils/megatron/optimizer.py:210-213); with optimizer_cpu_offload megatron-core builds a
# HybridDeviceOptimizer whose optimizer_offload_fraction (default 0.0) of the parameters keep
# their moments on the host (megatron/core/optimizer/__init__.py:306-346@megatron-core-0.16.1),
# and verl loads back only the GPU share for an update (verl/utils/megatron_utils.py:943-945).
# With use_precision_aware_optimizer too, the distributed optimizer makes no fp32 master shards
# of its own (distrib_optimizer.py:378, :440): the hybrid optimizer's fp32 copies are the master,
# on the host for the offloaded share.


def _switch(value: Any) -> bool | None:
    return None if value is None else bool(value)


def optimizer_class(optim: Any) -> dict[str, Any]:
    """EngineSpec's optimizer fields: the class verl builds (optim.optimizer from
    optim.optimizer_impl) and the foreach and fused switches of the arguments
    override_optimizer_config hands it (verl/workers/config/optimizer.py:326-351)."""
    optim = optim if isinstance(optim, Mapping) else {}
    override = optim.get("override_optimizer_config")
    override = override if isinstance(override, Mapping) else {}
    return {
        "optimizer": str(optim.get("optimizer") or "AdamW"),
        "optimizer_impl": str(optim.get("optimizer_impl") or TORCH_OPTIM),
        "foreach": _switch(override.get("foreach")),
        "fused": _switch(override.get("fused")),
    }


def optimizer_on_host(optim: Mapping[str, Any]) -> dict[str, Any]:
    """EngineSpec's optimizer_on_host and master_on_host for a Megatron role's optim section."""
    override = optim.get("override_optimizer_config") if isinstance(optim, Mapping) else None
    if not isinstance(override, Mapping) or not override.get("optimizer_cpu_offload"):
        return {}
    try:
        fraction = float(override.get("optimizer_offload_fraction") or 0.0)
    except (TypeError, ValueError):
        return {}
    return {
        "optimizer_on_host": min(max(fraction, 0.0), 1.0),
        "master_on_host": bool(override.get("use_precision_aware_optimizer")),
    }


def padded_tokens(engine: Mapping[str, Any], strategy: str, tokens: int, sp: int) -> int:
    """A micro-batch's tokens on one GPU with the FSDP engine's pad_to_length: the packed
    sequence (all the Ulysses group's tokens) right-padded to the next multiple of
    pad_to_length_bucket, which every layer and the logits then carry
    (verl/workers/engine/fsdp/transformer_impl.py:656-659)."""
    if strategy not in FSDP_STRATEGIES or not engine.get("pad_to_length"):
        return tokens
    bucket = max(as_int(engine.get("pad_to_length_bucket"), 1024), 1)
    sp = max(sp, 1)
    return ceil_div(ceil_div(tokens * sp, bucket) * bucket, sp)


# Families whose Megatron layer the forecast does not count (megatron_layer_bytes is Transformer
# Engine's Llama-style layer): gpt-oss is built from megatron-core's own gpt-oss layer
# (verl/models/mcore/registry.py:135), its sinks and clamped SwiGLU; GLM-4's and GLM-4.1V's
# post-attention and post-MLP norms and partial rotary are not in that layer either (and verl's
# registry, registry.py:119-136, lists neither Glm4ForCausalLM nor Glm4vForConditionalGeneration).
MEGATRON_UNMODELLED = {family: "gpt-oss" for family in GPT_OSS} | {
    family: "GLM-4" for family in GLM_LAYER
}


def _refuse_unmodelled_layer(strategy: str, model: ModelChoice, key: str) -> None:
    """A family whose Megatron layer is not counted (MEGATRON_UNMODELLED) is one line at the
    strategy's key."""
    name = MEGATRON_UNMODELLED.get(model.architecture.family)
    if strategy in MEGATRON_STRATEGIES and name:
        raise UnreadableRun(
            f"{key}={strategy}: the forecast counts {name} on the FSDP engines only "
            f"(a Megatron {name} layer is not modelled)",
            key,
        )


def role_layout(
    resolved: Mapping[str, Any],
    role: str,
    world: int,
    model: ModelChoice,
    lengths: Lengths,
    n: int,
    facts: ReleaseFacts,
) -> RoleLayout:
    section = role_section(resolved, role)
    forward_only = role == "ref"
    spec, engine = engine_spec(
        resolved, role, world, forward_only=forward_only, value_head=role == "critic"
    )
    _refuse_unmodelled_layer(spec.strategy, model, f"{engine_path(resolved, role)}.strategy")
    sp = sequence_parallel(resolved, role)
    dp = max(world // max(sp * spec.tp * spec.pp, 1), 1)
    seq = lengths.sequence
    prefix = "critic" if role == "critic" else f"actor_rollout_ref.{role}"
    batches = role_batches(resolved, role, section, engine, world // max(sp, 1), n, facts)
    dynamic, train_key, infer_key = batches.dynamic, batches.train_key, batches.infer_key
    train_budget, infer_budget = batches.train_budget, batches.infer_budget
    mbs, infer_mbs, mini = batches.mbs, batches.infer_mbs, batches.mini
    model_section = value_at(
        resolved, "critic.model" if role == "critic" else "actor_rollout_ref.model", {}
    )
    # sequences of one data-parallel rank: a mini-batch in an update, the step's batch in a
    # log-prob pass (verl/trainer/ppo/v1/trainer_base.py:1503, :1674-1675)
    batch = as_int(value_at(resolved, "data.train_batch_size"), 0) * n // dp
    per_rank = mini // dp
    if batch:  # a mini-batch larger than the step's batch is the whole batch (one split of it)
        per_rank = min(per_rank, batch)
    within = facts.partitions_within_budget
    count, train_tokens = micro_batches(dynamic, train_budget, mbs, per_rank, seq, sp, within)
    _, infer_tokens = micro_batches(dynamic, infer_budget, infer_mbs, batch, seq, sp, within)
    train_tokens, infer_tokens = (
        padded_tokens(engine, spec.strategy, tokens, sp) for tokens in (train_tokens, infer_tokens)
    )
    temperature = value_at(resolved, "actor_rollout_ref.rollout.temperature", 1.0)
    megatron = spec.strategy in MEGATRON_STRATEGIES
    return RoleLayout(
        role=role,
        section=prefix,
        engine_section=engine_path(resolved, role),
        optim_section=f"{prefix}.optim",
        spec=spec,
        model=model,
        **role_flags(
            spec, engine, model_section, facts, engine_path(resolved, role), batches.assumed
        ),
        sp=sp,
        train_tokens=train_tokens,
        infer_tokens=infer_tokens,
        micro_batches=count,
        entropy_train=bool(section.get("calculate_entropy"))
        or number(section, "entropy_coeff", 0.0, prefix) != 0.0,
        chunked_entropy=bool(engine.get("entropy_from_logits_with_chunking")),
        fused_kernels=fused(model_section, facts),
        compiled=bool(engine.get("use_torch_compile", True)) and not megatron,
        temperature_copy=copies_logits(facts, temperature, spec.strategy),
        entropy_every_pass=facts.entropy_every_pass,
        logits_evidence=EV_MEGATRON_LOGITS
        if megatron
        else f"{EV_LOGITS}; {facts.evidence(TEMPERATURE_COPY)}",
        logprob_grad_in_place=facts.logprob_grad_in_place and not megatron,
        fp32_loss=facts.logprob_loss_in_fp32 and not megatron,
        tokens_evidence=_tokens_evidence(dynamic, facts),
        sync_key=_sync_key(engine, engine_path(resolved, role)),
        whole_mini_batch=whole_mini_batch(dynamic, per_rank, seq, sp),
        train_budget_key=train_key,
        infer_budget_key=infer_key,
        dynamic=dynamic,
    )


# The separated trainers start sleeping rollout replicas on the trainer's GPUs too when either
# key is set (fully_async_policy/fully_async_main.py:170-172, fully_async_trainer.py:148-153).
HYBRID_REPLICA_KEYS = (
    "async_training.use_trainer_do_validate",
    "async_training.use_dynamic_resource_scheduling",
)


def _separate(resolved: Mapping[str, Any], pool: str) -> bool:
    """Whether the rollout has a pool of its own: the entry point's (``runs.own_rollout_pool``)
    or the V1 trainer's separate_async mode."""
    return pool != POOL_SHARED or value_at(resolved, "trainer.v1.trainer_mode") == "separate_async"


def _colocated(
    resolved: Mapping[str, Any],
    section: str,
    standalone: int,
    facts: ReleaseFacts,
    pool: str = POOL_SHARED,
) -> bool:
    """Whether the server has replicas on the trainer's GPUs: always, but for a pool of its own
    (the separate_async trainer's standalone pool, whose hybrid replicas a release may let
    hybrid_engine turn off; a separated trainer's rollout pool, unless a key asks for hybrid
    replicas)."""
    if not _separate(resolved, pool) or standalone <= 0:
        return True
    if section != "actor_rollout_ref.rollout":
        return False  # the reward model's own resource pool
    if pool == POOL_OWN:
        return False
    if pool == POOL_OWN_HYBRID:
        return any(bool(value_at(resolved, key, False)) for key in HYBRID_REPLICA_KEYS)
    hybrid = value_at(resolved, "actor_rollout_ref.hybrid_engine", True)
    return not (facts.hybrid_engine_decides_replicas and hybrid is False)


def _adapters_unmerged(resolved: Mapping[str, Any]) -> bool:
    """The actor trains LoRA adapters the weight sync sends as adapters (lora.merge false), as
    the rollout servers' own test reads them (``served_rank_spelling``)."""
    model = value_at(resolved, "actor_rollout_ref.model", {})
    return isinstance(model, Mapping) and served_rank_spelling(model) is not None


def _adapter_served(resolved: Mapping[str, Any], name: str) -> bool:
    """SGLang serving LoRA as an adapter sleeps at level 1: its base weights stay on the GPU
    (verl/workers/rollout/sglang_rollout/sglang_rollout.py:285-289; the worker sets level 1 at
    the first weight sync, engine_workers.py:775-776)."""
    return name == "sglang" and _adapters_unmerged(resolved)


def _sync_summons_whole(resolved: Mapping[str, Any], section: str) -> bool:
    """The actor's LoRA weight sync gathers the whole FSDP1 model (layered_summon off;
    states.EV_SUMMON_WHOLE)."""
    return (
        section == "actor_rollout_ref.rollout"
        and _adapters_unmerged(resolved)
        and not bool(value_at(resolved, f"{section}.layered_summon", False))
        and role_strategy(resolved, "actor") == "fsdp"
    )


def server_layout(
    resolved: Mapping[str, Any],
    section: str,
    model: ModelChoice,
    lengths: Lengths,
    world: int,
    facts: ReleaseFacts,
    pool: str = POOL_SHARED,
) -> ServerLayout | None:
    rollout = value_at(resolved, section, {})
    if not isinstance(rollout, Mapping) or not rollout.get("name"):
        return None
    name = str(rollout.get("name"))
    arch = model.architecture
    max_len = as_int(rollout.get("max_model_len")) or (
        arch.max_position_embeddings or lengths.sequence
    )  # vllm_async_server.py:954-955: max_position_embeddings when unset
    kwargs = value_at(rollout, f"engine_kwargs.{name}", {}) or {}
    kv = kwargs.get("kv_cache_dtype") if isinstance(kwargs, Mapping) else None
    standalone_gpus = as_int(rollout.get("nnodes")) * as_int(rollout.get("n_gpus_per_node"))
    if pool != POOL_SHARED and section == "actor_rollout_ref.rollout":
        # the separated trainers' main copies the top-level rollout pool's sizes here
        sizes = value_at(resolved, "rollout", {})
        sizes = sizes if isinstance(sizes, Mapping) else {}
        standalone_gpus = as_int(sizes.get("nnodes")) * as_int(sizes.get("n_gpus_per_node"))
    if not _separate(resolved, pool):
        standalone_gpus = 0
    batched = as_int(rollout.get("max_num_batched_tokens"), 8192)
    chunked = rollout.get("enable_chunked_prefill", True)
    if name == "vllm" and chunked is False and facts.raises_batched_tokens:
        batched = max(batched, max_len)
    return ServerLayout(
        name=name,
        section=section,
        model=model,
        tp=max(as_int(rollout.get("tensor_model_parallel_size"), 1), 1),
        dp=max(as_int(rollout.get("data_parallel_size"), 1), 1),
        ep=max(as_int(rollout.get("expert_parallel_size"), 1), 1),
        gpu_memory_utilization=fraction(rollout, "gpu_memory_utilization", 0.5, section),
        max_model_len=max_len,
        max_num_seqs=as_int(rollout.get("max_num_seqs"), 256),
        max_num_batched_tokens=batched,
        enforce_eager=bool(rollout.get("enforce_eager")),
        free_cache_engine=bool(rollout.get("free_cache_engine", True)),
        dtype=server_dtype_bytes(rollout, section),
        kv_dtype=1
        if isinstance(kv, str) and kv.startswith("fp8")
        else server_dtype_bytes(rollout, section),
        colocated=_colocated(resolved, section, standalone_gpus, facts, pool),
        standalone_gpus=standalone_gpus,
        keeps_weights_asleep=_adapter_served(resolved, name),
        graphs_in_share=name == "vllm" and facts.vllm_graphs_in_share,
        sync_summons_whole=_sync_summons_whole(resolved, section),
        prefix_caching=bool(rollout.get("enable_prefix_caching", True)),
        bucket_bytes=as_int(value_at(rollout, BUCKET_KEY), BUCKET_DEFAULT_MB) << 20,
        quantization=_quantization(rollout),
        **server_lora.server_fields(resolved, section, name, facts.release),
    )


def _quantization(rollout: Mapping[str, Any]) -> str | None:
    """The server's weight quantization: rollout.qat (its own config's method) wins over
    rollout.quantization (vllm_async_server.py:995-1024)."""
    qat = rollout.get("qat")
    if isinstance(qat, Mapping) and qat.get("enable"):
        return "qat"
    value = rollout.get("quantization")
    return None if value is None else str(value)


def rl_layout(
    resolved: Mapping[str, Any],
    actor: ModelChoice,
    critic: ModelChoice | None,
    reward: ModelChoice | None,
    lengths: Lengths,
    facts: ReleaseFacts,
    pool: str = POOL_SHARED,
) -> RunLayout:
    world = gpu_count(resolved)
    n = max(as_int(value_at(resolved, "actor_rollout_ref.rollout.n"), 1), 1)
    roles = [role_layout(resolved, "actor", world, actor, lengths, n, facts)]
    if reference_worker(resolved):
        roles.append(role_layout(resolved, "ref", world, actor, lengths, n, facts))
    if need_critic(resolved):
        roles.append(role_layout(resolved, "critic", world, critic or actor, lengths, n, facts))
    rollout = server_layout(
        resolved, "actor_rollout_ref.rollout", actor, lengths, world, facts, pool
    )
    reward_server = None
    if reward is not None and value_at(resolved, "reward.reward_model.enable"):
        reward_server = server_layout(
            resolved, "reward.reward_model.rollout", reward, lengths, world, facts
        )
    contents = _save_contents(resolved, "actor_rollout_ref.actor.checkpoint")
    trains = next((role for role in roles if role.role == "actor"), None)
    return RunLayout(
        kind=RL,
        world=world,
        roles=tuple(roles),
        rollout=rollout,
        reward=reward_server,
        lengths=lengths,
        n=n,
        saves_checkpoints=as_int(value_at(resolved, "trainer.save_freq"), -1) > 0,
        hf_model_in_checkpoint=saves_hf_model(resolved, contents, trains),
        reference_from_actor=need_reference_policy(resolved) and ref_in_actor(resolved),
    )


def serve_layout(
    resolved: Mapping[str, Any], model: ModelChoice, lengths: Lengths, facts: ReleaseFacts
) -> RunLayout:
    """A launch whose entry point never trains: its rollout servers on every GPU of the run
    (main_generation_server.py:45-56, init_standalone), none of them beside a trainer."""
    world = gpu_count(resolved)
    server = server_layout(resolved, "actor_rollout_ref.rollout", model, lengths, world, facts)
    if server is None:
        raise UnreadableRun(
            "actor_rollout_ref.rollout.name: a run that never trains serves nothing",
            "actor_rollout_ref.rollout.name",
        )
    return RunLayout(
        kind=SERVE,
        world=world,
        roles=(),
        rollout=dataclasses.replace(server, colocated=False, standalone_gpus=world),
        reward=None,
        lengths=lengths,
        n=max(as_int(value_at(resolved, "actor_rollout_ref.rollout.n"), 1), 1),
        saves_checkpoints=False,
        hf_model_in_checkpoint=False,
    )


def _save_contents(resolved: Mapping[str, Any], where: str) -> tuple[str, ...]:
    """What a checkpoint saves (``where.save_contents``: names); another value is one line."""
    section = value_at(resolved, where, {})
    section = section if isinstance(section, Mapping) else {}
    return names(section, "save_contents", (), where, noun="content name")


def saves_hf_model(resolved: Mapping[str, Any], contents: Any, actor: RoleLayout | None) -> bool:
    """Whether a checkpoint writes the model in Hugging Face format: ``hf_model`` in its
    contents, and for Megatron also ``model`` without use_dist_checkpointing, the engine's
    default (verl/utils/checkpoint/megatron_checkpoint_manager.py:245-249: the model's weights go
    out through Megatron-Bridge, every tensor gathered)."""
    if "hf_model" in contents:
        return True
    if actor is None or actor.spec.strategy != "megatron" or "model" not in contents:
        return False
    engine = value_at(resolved, actor.engine_section, {}) or {}
    return not (isinstance(engine, Mapping) and bool(engine.get("use_dist_checkpointing")))


def sft_layout(
    resolved: Mapping[str, Any],
    model: ModelChoice,
    lengths: Lengths,
    world: int,
    facts: ReleaseFacts,
) -> RunLayout:
    """The SFT trainer (verl/trainer/sft_trainer.py): one engine of torchrun's world."""
    engine = value_at(resolved, "engine", {})
    data = value_at(resolved, "data", {})
    model_section = value_at(resolved, "model", {})
    strategy = engine_strategy(engine) or "fsdp"
    if strategy not in FORECAST_ENGINES:
        raise _unforecast_engine(strategy, "engine.strategy")
    own: dict[str, Any] = {}
    if veomni.is_veomni(strategy):
        engine, strategy, own = veomni.read_engine(
            engine, model_section, world, "engine", "engine.strategy"
        )
    _refuse_unmodelled_layer(strategy, model, "engine.strategy")
    sp = max(
        as_int(engine.get("ulysses_sequence_parallel_size"), 1),
        as_int(engine.get("context_parallel_size"), 1),
        1,
    )
    rank = engine_lora_rank(model_section, strategy) if isinstance(model_section, Mapping) else 0
    targets, exclude = lora_modules(model_section, strategy, "model")
    model_dtype, param_dtype, reduce_dtype = _precisions(engine, strategy, "engine", 4)
    spec = EngineSpec(
        strategy=strategy,
        world=world,
        fsdp_size=as_int(engine.get("fsdp_size"), -1),
        model_dtype=model_dtype,
        param_dtype=param_dtype,
        reduce_dtype=reduce_dtype,
        lora_rank=rank,
        lora_targets=targets,
        lora_exclude=exclude,
        **optimizer_class(value_at(resolved, SFT_OPTIM, {})),
        **_megatron_fields(strategy, engine, value_at(resolved, SFT_OPTIM, {}) or {}),
        **({"defer_sync": defer_sync(engine)} | own),
    )
    dynamic = bool(data.get("use_dynamic_bsz"))
    budget = as_int(data.get("max_token_len_per_gpu"), 8192)
    mbs = as_int(data.get("micro_batch_size_per_gpu"), 1)
    dp = max(world // max(sp * spec.tp * spec.pp, 1), 1)
    per_rank = as_int(data.get("train_batch_size"), 1) // dp
    seq = lengths.sequence
    within = facts.partitions_within_budget
    count, tokens = micro_batches(dynamic, budget, mbs, per_rank, seq, sp, within)
    tokens = padded_tokens(engine, spec.strategy, tokens, sp)
    role = RoleLayout(
        role="actor",
        section="engine",
        engine_section="engine",
        optim_section=SFT_OPTIM,
        spec=spec,
        model=model,
        **role_flags(spec, engine, model_section, facts, "engine"),
        sp=sp,
        train_tokens=tokens,
        infer_tokens=tokens,
        micro_batches=count,
        entropy_train=False,
        chunked_entropy=bool(engine.get("entropy_from_logits_with_chunking")),
        fused_kernels=fused(model_section, facts),
        compiled=bool(engine.get("use_torch_compile", True)),
        temperature_copy=copies_logits(facts, SFT_TEMPERATURE, strategy),
        entropy_every_pass=False,  # the SFT engine computes no entropy
        logprob_grad_in_place=facts.logprob_grad_in_place and strategy not in MEGATRON_STRATEGIES,
        fp32_loss=facts.logprob_loss_in_fp32 and strategy not in MEGATRON_STRATEGIES,
        # the old SFT trainer's own loss, where its facts say so (not the engine's log-probs)
        logits_evidence=facts.evidence(LOGPROB_BACKWARD)
        if facts.logprob_loss_in_fp32
        else f"{EV_LOGITS}; {facts.evidence(TEMPERATURE_COPY)}",
        tokens_evidence=_tokens_evidence(dynamic, facts),
        sync_key=_sync_key(engine, "engine"),
        whole_mini_batch=whole_mini_batch(dynamic, per_rank, seq, sp),
        train_budget_key="data.max_token_len_per_gpu"
        if dynamic
        else "data.micro_batch_size_per_gpu",
        infer_budget_key="data.max_token_len_per_gpu"
        if dynamic
        else "data.micro_batch_size_per_gpu",
        dynamic=dynamic,
    )
    save_freq = as_int(value_at(resolved, "trainer.save_freq"), -1)
    return RunLayout(
        kind=SFT,
        world=world,
        roles=(role,),
        rollout=None,
        reward=None,
        lengths=lengths,
        n=1,
        saves_checkpoints=save_freq > 0 or save_freq == -1,
        hf_model_in_checkpoint=saves_hf_model(
            resolved, _save_contents(resolved, "checkpoint"), role
        ),
    )
