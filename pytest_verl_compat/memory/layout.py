"""What a resolved verl configuration asks of each GPU: the roles, their engines, the token
budgets of their micro-batches, and the rollout servers. Read from the mapping only.

Each number cites the verl 0.9.0 line that decides it; ``checks/roles.py`` answers which roles
run, the sizes of their parallelism, and the world.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pytest_verl_compat.checks.roles import (
    engine_path,
    gpu_count,
    megatron_sizes,
    need_critic,
    reference_worker,
    role_engine,
    role_section,
    role_strategy,
    sequence_parallel,
)
from pytest_verl_compat.memory.models import ModelChoice
from pytest_verl_compat.memory.states import EngineSpec, dtype_bytes

RL = "rl"
SFT = "sft"
# Where the micro-batch budgets are wired (verl/workers/engine_workers.py)
EV_ACTOR_BUDGETS = "verl/workers/engine_workers.py:606-624"
EV_REF_BUDGETS = "verl/workers/engine_workers.py:537-578"
EV_CRITIC_BUDGETS = "verl/trainer/ppo/v1/trainer_base.py:249-252"
EV_MICRO_BATCHES = "verl/workers/engine/utils.py:92-130"
EV_ENTROPY_PASSES = "verl/trainer/ppo/v1/trainer_base.py:1495-1500,1676-1693"
CRITIC_DEFAULT_BUDGET = 32768  # CriticConfig.ppo_infer_max_token_len_per_gpu, critic.py:91


@dataclass(frozen=True)
class Lengths:
    """Tokens per sequence: the prompt and the response, and where the numbers come from."""

    prompt: int
    response: int
    source: str

    @property
    def sequence(self) -> int:
        return self.prompt + self.response


@dataclass(frozen=True)
class RoleLayout:
    """One role's engine on one rank and the micro-batches it runs."""

    role: str  # actor, ref, critic (SFT: actor)
    section: str  # dotted path of the role's section
    engine_section: str  # dotted path of its engine section
    spec: EngineSpec
    model: ModelChoice
    param_offload: bool
    optimizer_offload: bool
    offload_policy: bool  # FSDP2 CPUOffloadPolicy: the engine never holds its shards
    checkpointing: bool
    remove_padding: bool
    sp: int  # Ulysses (FSDP) or context parallel (Megatron)
    train_tokens: int  # tokens of one training micro-batch on one GPU
    infer_tokens: int  # tokens of one forward-only micro-batch on one GPU
    micro_batches: int  # micro-batches of one mini-batch on one GPU
    entropy_train: bool
    chunked_entropy: bool
    fused_kernels: bool
    compiled: bool  # the engine's use_torch_compile (entropy compiled)
    train_budget_key: str  # the key that sets train_tokens (for fixes)
    infer_budget_key: str
    dynamic: bool


@dataclass(frozen=True)
class ServerLayout:
    """A rollout (or reward-model) server: its engine, parallel sizes and memory share."""

    name: str  # vllm, sglang, trtllm, hf
    section: str
    model: ModelChoice
    tp: int
    dp: int
    ep: int
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enforce_eager: bool
    free_cache_engine: bool
    dtype: int
    kv_dtype: int
    standalone: bool  # on GPUs of its own (not colocated with the trainer)
    gpus: int  # GPUs the servers span


@dataclass(frozen=True)
class RunLayout:
    kind: str  # rl or sft
    world: int  # trainer GPUs
    roles: tuple[RoleLayout, ...]
    rollout: ServerLayout | None
    reward: ServerLayout | None
    lengths: Lengths
    n: int  # responses per prompt
    saves_checkpoints: bool
    hf_model_in_checkpoint: bool
    notes: tuple[str, ...] = ()

    def role(self, name: str) -> RoleLayout | None:
        return next((r for r in self.roles if r.role == name), None)


def _get(mapping: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    node: Any = mapping
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _ceil(a: int, b: int) -> int:
    return -(-a // max(b, 1))


def _tokens(dynamic: bool, budget: int, mbs: int, sequence: int, sp: int) -> int:
    """Tokens of one micro-batch on one GPU (engine/utils.py:92-130): the token budget (one
    sequence longer than it goes alone), or micro-batch size x sequence length; Ulysses or
    context parallelism splits each micro-batch's tokens over its ranks."""
    if dynamic:
        return max(budget, _ceil(sequence, sp))
    return _ceil(max(mbs, 1) * sequence, sp)


def _micro_batches(
    dynamic: bool, budget: int, mbs: int, per_rank: int, sequence: int, sp: int
) -> int:
    if per_rank <= 0:
        return 1
    if dynamic:
        return max(1, _ceil(per_rank * sequence, max(budget, 1) * sp))
    return max(1, _ceil(per_rank, max(mbs, 1)))


def _spec(
    resolved: Mapping[str, Any], role: str, world: int, *, forward_only: bool, value_head: bool
) -> tuple[EngineSpec, Mapping[str, Any]]:
    strategy = role_strategy(resolved, role)
    engine = role_engine(resolved, role)
    model = _get(resolved, "critic.model" if role == "critic" else "actor_rollout_ref.model", {})
    lora = model.get("lora") if isinstance(model, Mapping) else None
    rank = _int(model.get("lora_rank")) if isinstance(model, Mapping) else 0
    if isinstance(lora, Mapping) and _int(lora.get("rank")) > 0:
        rank = _int(lora.get("rank"))
    targets = (
        model.get("target_modules", "all-linear") if isinstance(model, Mapping) else "all-linear"
    )
    targets_t = (targets,) if isinstance(targets, str) else tuple(str(t) for t in targets or ())
    exclude = model.get("exclude_modules") if isinstance(model, Mapping) else None
    exclude_t = (exclude,) if isinstance(exclude, str) else tuple(str(t) for t in exclude or ())
    mixed = engine.get("mixed_precision") or {}
    optim = role_section(resolved, role).get("optim") or {}
    sizes = megatron_sizes(engine) if strategy in ("megatron", "mindspeed") else {}
    spec = EngineSpec(
        strategy=strategy,
        world=world,
        fsdp_size=_int(engine.get("fsdp_size"), -1),
        # training engines default to fp32 weights, forward-only to bf16 (transformer_impl.py:237-242)
        model_dtype=dtype_bytes(engine.get("model_dtype"), 2 if forward_only else 4),
        param_dtype=dtype_bytes(
            mixed.get("param_dtype") if isinstance(mixed, Mapping) else None, 2
        ),
        reduce_dtype=dtype_bytes(
            mixed.get("reduce_dtype") if isinstance(mixed, Mapping) else None, 4
        ),
        forward_only=forward_only,
        value_head=value_head,
        lora_rank=0 if role == "critic" else rank,
        lora_targets=targets_t,
        lora_exclude=exclude_t,
        optimizer=str(optim.get("optimizer") or "AdamW"),
        tp=sizes.get("tp", 1),
        pp=sizes.get("pp", 1),
        ep=sizes.get("ep", 1),
        etp=sizes.get("etp", 1),
        cp=sizes.get("cp", 1),
        distributed_optimizer=bool(engine.get("use_distributed_optimizer", True)),
    )
    return spec, engine


def _role(
    resolved: Mapping[str, Any],
    role: str,
    world: int,
    model: ModelChoice,
    lengths: Lengths,
    n: int,
) -> RoleLayout:
    section = role_section(resolved, role)
    forward_only = role == "ref"
    spec, engine = _spec(
        resolved, role, world, forward_only=forward_only, value_head=role == "critic"
    )
    sp = sequence_parallel(resolved, role)
    dp = max(world // max(sp * spec.tp * spec.pp, 1), 1)
    seq = lengths.sequence
    prefix = "critic" if role == "critic" else f"actor_rollout_ref.{role}"
    rollout = "actor_rollout_ref.rollout"
    if role == "actor":
        dynamic = bool(section.get("use_dynamic_bsz"))
        train_key = (
            f"{prefix}.ppo_max_token_len_per_gpu"
            if dynamic
            else f"{prefix}.ppo_micro_batch_size_per_gpu"
        )
        infer_key = (
            f"{rollout}.log_prob_max_token_len_per_gpu"
            if dynamic
            else f"{rollout}.log_prob_micro_batch_size_per_gpu"
        )
        train_budget = _int(section.get("ppo_max_token_len_per_gpu"), 16384)
        infer_budget = _int(
            _get(resolved, f"{rollout}.log_prob_max_token_len_per_gpu"), train_budget
        )
        mbs = _int(section.get("ppo_micro_batch_size_per_gpu"), 1)
        infer_mbs = _int(_get(resolved, f"{rollout}.log_prob_micro_batch_size_per_gpu"), mbs)
        mini = _int(section.get("ppo_mini_batch_size"), 1) * n
    elif role == "ref":
        dynamic = bool(section.get("log_prob_use_dynamic_bsz"))
        train_key = infer_key = (
            f"{prefix}.log_prob_max_token_len_per_gpu"
            if dynamic
            else f"{prefix}.log_prob_micro_batch_size_per_gpu"
        )
        train_budget = infer_budget = _int(section.get("log_prob_max_token_len_per_gpu"), 16384)
        mbs = infer_mbs = _int(section.get("log_prob_micro_batch_size_per_gpu"), 1)
        mini = 0
    else:  # the V1 critic runs both passes on ppo_infer_max_token_len_per_gpu (trainer_base.py:251-252)
        engine_dynamic = engine.get("use_dynamic_bsz")
        dynamic = True if engine_dynamic is None else bool(engine_dynamic)
        train_key = infer_key = "critic.ppo_infer_max_token_len_per_gpu"
        train_budget = infer_budget = _int(
            section.get("ppo_infer_max_token_len_per_gpu"), CRITIC_DEFAULT_BUDGET
        )
        mbs = infer_mbs = _int(section.get("ppo_micro_batch_size_per_gpu"), 1)
        mini = _int(section.get("ppo_mini_batch_size"), 1) * n
    model_section = _get(
        resolved, "critic.model" if role == "critic" else "actor_rollout_ref.model", {}
    )
    per_rank = mini // dp if mini else 0
    return RoleLayout(
        role=role,
        section=prefix,
        engine_section=engine_path(resolved, role),
        spec=spec,
        model=model,
        param_offload=bool(engine.get("param_offload")),
        optimizer_offload=bool(engine.get("optimizer_offload")),
        offload_policy=bool(engine.get("offload_policy")),
        checkpointing=bool(model_section.get("enable_gradient_checkpointing")),
        remove_padding=bool(model_section.get("use_remove_padding")),
        sp=sp,
        train_tokens=_tokens(dynamic, train_budget, mbs, seq, sp),
        infer_tokens=_tokens(dynamic, infer_budget, infer_mbs, seq, sp),
        micro_batches=_micro_batches(dynamic, train_budget, mbs, per_rank, seq, sp),
        entropy_train=bool(section.get("calculate_entropy"))
        or float(section.get("entropy_coeff") or 0) != 0.0,
        chunked_entropy=bool(engine.get("entropy_from_logits_with_chunking")),
        fused_kernels=bool(model_section.get("use_fused_kernels")),
        compiled=bool(engine.get("use_torch_compile", True)),
        train_budget_key=train_key,
        infer_budget_key=infer_key,
        dynamic=dynamic,
    )


def _server(
    resolved: Mapping[str, Any], section: str, model: ModelChoice, lengths: Lengths, world: int
) -> ServerLayout | None:
    rollout = _get(resolved, section, {})
    if not isinstance(rollout, Mapping) or not rollout.get("name"):
        return None
    name = str(rollout.get("name"))
    arch = model.architecture
    max_len = _int(rollout.get("max_model_len")) or (
        arch.max_position_embeddings or lengths.sequence
    )  # vllm_async_server.py:954-955: max_position_embeddings when unset
    kwargs = _get(rollout, f"engine_kwargs.{name}", {}) or {}
    kv = kwargs.get("kv_cache_dtype") if isinstance(kwargs, Mapping) else None
    standalone_gpus = _int(rollout.get("nnodes")) * _int(rollout.get("n_gpus_per_node"))
    standalone = (
        standalone_gpus > 0 and _get(resolved, "trainer.v1.trainer_mode") == "separate_async"
    )
    return ServerLayout(
        name=name,
        section=section,
        model=model,
        tp=max(_int(rollout.get("tensor_model_parallel_size"), 1), 1),
        dp=max(_int(rollout.get("data_parallel_size"), 1), 1),
        ep=max(_int(rollout.get("expert_parallel_size"), 1), 1),
        gpu_memory_utilization=float(rollout.get("gpu_memory_utilization") or 0.5),
        max_model_len=max_len,
        max_num_seqs=_int(rollout.get("max_num_seqs"), 256),
        max_num_batched_tokens=_int(rollout.get("max_num_batched_tokens"), 8192),
        enforce_eager=bool(rollout.get("enforce_eager")),
        free_cache_engine=bool(rollout.get("free_cache_engine", True)),
        dtype=dtype_bytes(rollout.get("dtype"), 2),
        kv_dtype=1
        if isinstance(kv, str) and kv.startswith("fp8")
        else dtype_bytes(rollout.get("dtype"), 2),
        standalone=standalone,
        gpus=standalone_gpus if standalone else world,
    )


def rl_layout(
    resolved: Mapping[str, Any],
    actor: ModelChoice,
    critic: ModelChoice | None,
    reward: ModelChoice | None,
    lengths: Lengths,
) -> RunLayout:
    world = gpu_count(resolved)
    n = max(_int(_get(resolved, "actor_rollout_ref.rollout.n"), 1), 1)
    roles = [_role(resolved, "actor", world, actor, lengths, n)]
    if reference_worker(resolved):
        roles.append(_role(resolved, "ref", world, actor, lengths, n))
    if need_critic(resolved):
        roles.append(_role(resolved, "critic", world, critic or actor, lengths, n))
    rollout = _server(resolved, "actor_rollout_ref.rollout", actor, lengths, world)
    reward_server = None
    if reward is not None and _get(resolved, "reward.reward_model.enable"):
        reward_server = _server(resolved, "reward.reward_model.rollout", reward, lengths, world)
    contents = _get(resolved, "actor_rollout_ref.actor.checkpoint.save_contents", []) or []
    return RunLayout(
        kind=RL,
        world=world,
        roles=tuple(roles),
        rollout=rollout,
        reward=reward_server,
        lengths=lengths,
        n=n,
        saves_checkpoints=_int(_get(resolved, "trainer.save_freq"), -1) > 0,
        hf_model_in_checkpoint="hf_model" in contents,
    )


def sft_layout(
    resolved: Mapping[str, Any], model: ModelChoice, lengths: Lengths, world: int
) -> RunLayout:
    """The SFT trainer (verl/trainer/sft_trainer.py): one engine of torchrun's world."""
    engine = _get(resolved, "engine", {})
    data = _get(resolved, "data", {})
    model_section = _get(resolved, "model", {})
    strategy = str(engine.get("strategy") or "fsdp")
    sp = max(
        _int(engine.get("ulysses_sequence_parallel_size"), 1),
        _int(engine.get("context_parallel_size"), 1),
        1,
    )
    lora = model_section.get("lora") if isinstance(model_section, Mapping) else None
    rank = _int(model_section.get("lora_rank"))
    if isinstance(lora, Mapping) and _int(lora.get("rank")) > 0:
        rank = _int(lora.get("rank"))
    targets = model_section.get("target_modules", "all-linear")
    mixed = engine.get("mixed_precision") or {}
    sizes = megatron_sizes(engine) if strategy in ("megatron", "mindspeed") else {}
    spec = EngineSpec(
        strategy=strategy,
        world=world,
        fsdp_size=_int(engine.get("fsdp_size"), -1),
        model_dtype=dtype_bytes(engine.get("model_dtype"), 4),
        param_dtype=dtype_bytes(
            mixed.get("param_dtype") if isinstance(mixed, Mapping) else None, 2
        ),
        lora_rank=rank,
        lora_targets=(targets,) if isinstance(targets, str) else tuple(targets or ()),
        optimizer=str(_get(resolved, "optim.optimizer", "AdamW")),
        tp=sizes.get("tp", 1),
        pp=sizes.get("pp", 1),
        ep=sizes.get("ep", 1),
        cp=sizes.get("cp", 1),
    )
    dynamic = bool(data.get("use_dynamic_bsz"))
    budget = _int(data.get("max_token_len_per_gpu"), 8192)
    mbs = _int(data.get("micro_batch_size_per_gpu"), 1)
    dp = max(world // max(sp * spec.tp * spec.pp, 1), 1)
    per_rank = _int(data.get("train_batch_size"), 1) // dp
    seq = lengths.sequence
    role = RoleLayout(
        role="actor",
        section="engine",
        engine_section="engine",
        spec=spec,
        model=model,
        param_offload=bool(engine.get("param_offload")),
        optimizer_offload=bool(engine.get("optimizer_offload")),
        offload_policy=bool(engine.get("offload_policy")),
        checkpointing=bool(model_section.get("enable_gradient_checkpointing")),
        remove_padding=bool(model_section.get("use_remove_padding")),
        sp=sp,
        train_tokens=_tokens(dynamic, budget, mbs, seq, sp),
        infer_tokens=_tokens(dynamic, budget, mbs, seq, sp),
        micro_batches=_micro_batches(dynamic, budget, mbs, per_rank, seq, sp),
        entropy_train=False,
        chunked_entropy=bool(engine.get("entropy_from_logits_with_chunking")),
        fused_kernels=bool(model_section.get("use_fused_kernels")),
        compiled=bool(engine.get("use_torch_compile", True)),
        train_budget_key="data.max_token_len_per_gpu"
        if dynamic
        else "data.micro_batch_size_per_gpu",
        infer_budget_key="data.max_token_len_per_gpu"
        if dynamic
        else "data.micro_batch_size_per_gpu",
        dynamic=dynamic,
    )
    save_freq = _int(_get(resolved, "trainer.save_freq"), -1)
    return RunLayout(
        kind=SFT,
        world=world,
        roles=(role,),
        rollout=None,
        reward=None,
        lengths=lengths,
        n=1,
        saves_checkpoints=save_freq > 0 or save_freq == -1,
        hf_model_in_checkpoint="hf_model" in (_get(resolved, "checkpoint.save_contents", []) or []),
    )


def rl_lengths(resolved: Mapping[str, Any], given: tuple[int, int] | None) -> Lengths:
    if given is not None:
        return Lengths(given[0], given[1], "given with --lengths")
    prompt = _int(_get(resolved, "data.max_prompt_length"), 512)
    response = _int(_get(resolved, "data.max_response_length"), 512)
    return Lengths(
        prompt,
        response,
        "data.max_prompt_length + data.max_response_length (every response at its limit)",
    )


def sft_lengths(resolved: Mapping[str, Any], given: tuple[int, int] | None) -> Lengths:
    if given is not None:
        return Lengths(given[0], given[1], "given with --lengths")
    return Lengths(
        _int(_get(resolved, "data.max_length"), 1024),
        0,
        "data.max_length (every sample at its limit)",
    )


def with_tokens(role: RoleLayout, train: int | None = None, infer: int | None = None) -> RoleLayout:
    """The role with other micro-batch token counts (a fix's re-forecast)."""
    return replace(
        role,
        train_tokens=role.train_tokens if train is None else train,
        infer_tokens=role.infer_tokens if infer is None else infer,
    )
