"""Each phase of a step on each kind of rank: what is on the GPU while it runs, part by part.

A training engine keeps its sharded parameters and optimizer states between calls unless
offloaded (verl/workers/engine/base.py:312-336: train mode loads model and optimizer, eval mode
the model only; gradients are freed on leaving train mode, transformer_impl.py:1107-1112); the
reference policy's FSDP engine always offloads its parameters (transformer_impl.py:389-394,
415-420). The hybrid engine's rollout server sleeps while the trainer runs (free_cache_engine,
vllm_async_server.py:791-800, 1075-1098) and wakes its weights, then its KV cache, around the
weight sync (engine_workers.py:762-801).
"""

from __future__ import annotations

from pytest_verl_compat.memory import activations as act
from pytest_verl_compat.memory import rollout as srv
from pytest_verl_compat.memory import states as st
from pytest_verl_compat.memory.layout import RoleLayout, RunLayout, ServerLayout
from pytest_verl_compat.memory.parts import (
    ACTOR_UPDATE,
    CHECKPOINT,
    CRITIC_UPDATE,
    GIB,
    OLD_LOG_PROB,
    REF_LOG_PROB,
    REWARD,
    ROLLOUT,
    SERVER_START,
    SFT_UPDATE,
    VALUES,
    WEIGHT_SYNC,
    Part,
    PhasePeak,
    RankKind,
    gib,
)

# One GPU process's CUDA context and communication buffers (NCCL's per-peer buffers, cuBLAS
# workspace): stated, not measured; a colocated rank runs the trainer and the rollout server.
PROCESS_OVERHEAD = int(0.75 * GIB)
EV_CONTEXT = "one CUDA context + NCCL buffers per GPU process (stated constant, 0.75 GiB)"
EV_BUCKET = (
    "verl/workers/config/rollout.py CheckpointEngineConfig.update_weights_bucket_megabytes (2048)"
)
EV_OFFLOAD_CTX = "verl/workers/engine/base.py:312-336"
EV_ZERO_GRAD = "verl/workers/engine/fsdp/transformer_impl.py:1107-1112"
EV_SAVE = "verl/workers/engine/fsdp/transformer_impl.py:839-865"
WEIGHT_BUCKET = 2048 << 20


def _gb(x: int) -> str:
    return f"{gib(x):.2f} GiB"


def _states(role: RoleLayout) -> st.ModelStates:
    return st.model_states(role.model.architecture, role.spec)


def _where(role: RoleLayout) -> str:
    spec = role.spec
    if spec.strategy in ("megatron", "mindspeed"):
        return f"Megatron tp {spec.tp} pp {spec.pp} ep {spec.ep}"
    return f"{spec.strategy.upper()} shards over {spec.shard}"


def _forced_offload(role: RoleLayout) -> bool:
    """FSDP's forward-only engine (the reference) keeps its shards on the host, always."""
    return role.offload_policy or (
        role.spec.forward_only and role.spec.strategy in ("fsdp", "fsdp2")
    )


def _resident(role: RoleLayout) -> tuple[bool, bool]:
    """(params, optimizer) kept on the GPU between the role's calls."""
    offloaded = _forced_offload(role)
    return (not (role.param_offload or offloaded), not (role.optimizer_offload or offloaded))


def offload_moves(
    param_offload: bool, optimizer_offload: bool
) -> dict[tuple[str, str], tuple[bool, bool]]:
    """The rule the phases follow, as (when, direction) -> (weights moved, optimizer moved): after
    init the offloaded states leave the GPU; a forward loads the weights only, an update the
    weights and the optimizer (base.py:312-336). tests/test_fit_states.py checks that verl's
    engine moves exactly these."""
    p, o = param_offload, optimizer_offload
    return {
        ("init", "offload"): (p, o),
        ("infer", "load"): (p, False),
        ("infer", "offload"): (p, False),
        ("train", "load"): (p, o),
        ("train", "offload"): (p, o),
    }


def residents(layout: RunLayout, but: str | None = None) -> list[Part]:
    """What every other role keeps on the GPU while ``but`` (or the rollout) runs."""
    parts = []
    for role in layout.roles:
        if role.role == but:
            continue
        s = _states(role)
        params, optimizer = _resident(role)
        name = role.role
        if params and s.params:
            parts.append(
                Part(
                    f"{name}.params.resident",
                    f"{name} weights (resident)",
                    s.params,
                    f"{s.total:,} params x {role.spec.model_dtype} B, {_where(role)}",
                    st.EV_FSDP2,
                )
            )
        if optimizer and s.optimizer:
            parts.append(
                Part(
                    f"{name}.optimizer.resident",
                    f"{name} optimizer (resident)",
                    s.optimizer,
                    f"{st.optimizer_states(role.spec.optimizer)} x fp32 per trainable param, {_where(role)}",
                    st.EV_OPTIMIZER,
                )
            )
    return parts


def _contexts(processes: int) -> Part:
    return Part(
        "overhead.context",
        f"CUDA contexts + NCCL ({processes} processes)",
        processes * PROCESS_OVERHEAD,
        f"{processes} x 0.75 GiB",
        EV_CONTEXT,
    )


def _compute_parts(role: RoleLayout, training: bool, entropy: bool) -> list[Part]:
    """The role's own parts while it runs a pass (training: an update)."""
    arch = role.model.architecture
    s = _states(role)
    c = role.spec.param_dtype
    name = role.role
    parts = []
    if not _forced_offload(role):
        parts.append(
            Part(
                f"{name}.params",
                f"{name} weights",
                s.params,
                f"{s.total:,} params x {role.spec.model_dtype} B, {_where(role)}",
                st.EV_FSDP2,
            )
        )
    gathered = 2 * s.layer_unit + s.root_unit
    parts.append(
        Part(
            f"{name}.gathered",
            f"{name} all-gathered units",
            gathered,
            f"2 decoder layers{' + root unit' if s.root_unit else ''} in {c}-byte compute dtype",
            st.EV_FSDP1 if role.spec.strategy == "fsdp" else st.EV_FSDP2,
        )
    )
    tp_cp = (
        max(role.spec.tp, 1) * max(role.spec.cp, 1)
        if role.spec.strategy in ("megatron", "mindspeed")
        else 1
    )
    if training:
        parts.append(
            Part(
                f"{name}.grads",
                f"{name} gradients",
                s.grads,
                f"{s.trainable:,} trainable params x fp32, sharded",
                st.EV_FSDP2,
            )
        )
        parts.append(
            Part(
                f"{name}.optimizer",
                f"{name} optimizer states",
                s.optimizer,
                f"{st.optimizer_states(role.spec.optimizer)} states x fp32 per trainable param, sharded",
                st.EV_OPTIMIZER,
            )
        )
        if role.micro_batches > 1 and s.accumulated:
            parts.append(
                Part(
                    f"{name}.accumulated",
                    f"{name} unsharded grads (no-sync)",
                    s.accumulated,
                    f"{role.micro_batches} micro-batches per mini-batch: every trainable param's gradient kept whole between them",
                    st.EV_NO_SYNC,
                )
            )
        tokens = role.train_tokens // tp_cp
        kept = act.kept_bytes(arch, tokens, role.checkpointing, c)
        extra = (
            act.recompute_bytes(arch, tokens, c) if role.checkpointing else 0
        ) + act.backward_transient(arch, tokens, c)
        activ = int((kept + extra) * (1 + act.WORKSPACE_ALLOWANCE))
        parts.append(
            Part(
                f"{name}.activations",
                f"{name} activations",
                activ,
                f"{role.train_tokens:,} tokens/micro-batch, {'checkpointed' if role.checkpointing else 'all layers kept'}, +10% kernel workspaces",
                act.EV_CHECKPOINTING,
            )
        )
        parts.append(
            Part(
                f"{name}.reduce",
                f"{name} gradient reduce buffers",
                3 * s.layer_unit,
                "one unit's gradient in bf16 and its fp32 reduce-scatter copy",
                st.EV_MIXED_PRECISION,
            )
        )
    else:
        tokens = role.infer_tokens // tp_cp
        parts.append(
            Part(
                f"{name}.activations",
                f"{name} forward transients",
                int(act.inference_bytes(arch, tokens, c) * (1 + act.WORKSPACE_ALLOWANCE)),
                f"{role.infer_tokens:,} tokens/micro-batch, no_grad: one layer's transients",
                act.EV_LOGITS,
            )
        )
    if not role.spec.value_head:
        cost = act.logits_cost(
            training, entropy, role.chunked_entropy, role.fused_kernels, role.compiled
        )
        tokens = role.train_tokens if training else role.infer_tokens
        vocab = arch.vocab_size // (
            role.spec.tp if role.spec.strategy in ("megatron", "mindspeed") else 1
        )
        parts.append(
            Part(
                f"{name}.logits",
                f"{name} logits",
                int(cost.copies * tokens * vocab * c),
                f"{tokens:,} tokens x {vocab:,} vocab x {c} B x {cost.note}",
                act.EV_LOGITS,
            )
        )
    return parts


def _server_parts(
    layout: RunLayout, memory: dict[str, srv.ServerMemory], awake: str | None
) -> list[Part]:
    """The colocated servers: the awake one claims its share, the others what sleep leaves."""
    parts = []
    for name, server in (("rollout", layout.rollout), ("reward", layout.reward)):
        if server is None or server.standalone:
            continue
        mem = memory[name]
        if name == awake:
            parts.append(
                Part(
                    f"{name}.server",
                    f"{name} server ({server.name}, awake)",
                    mem.claimed,
                    f"gpu_memory_utilization {server.gpu_memory_utilization} x capacity: weights {_gb(mem.weights)}, KV {_gb(mem.kv_bytes)}, graphs/profile {_gb(mem.overhead)}",
                    srv.VLLM_REQUESTED,
                )
            )
        elif mem.asleep:
            parts.append(
                Part(
                    f"{name}.asleep",
                    f"{name} server (asleep)",
                    mem.asleep,
                    "CUDA graphs stay"
                    if mem.sleeps
                    else "free_cache_engine=False: weights and KV cache stay",
                    srv.EV_SLEEP,
                )
            )
    return parts


def _processes(layout: RunLayout) -> int:
    servers = [s for s in (layout.rollout, layout.reward) if s is not None and not s.standalone]
    return 1 + len(servers)


def rl_ranks(layout: RunLayout, capacity: int) -> tuple[RankKind, ...]:
    memory = {}
    if layout.rollout is not None:
        memory["rollout"] = srv.server_memory(layout.rollout, capacity)
    if layout.reward is not None:
        memory["reward"] = srv.server_memory(layout.reward, capacity)
    ctx = _contexts(_processes(layout))
    phases: list[PhasePeak] = []
    actor = layout.role("actor")
    assert actor is not None
    if layout.rollout is not None and not layout.rollout.standalone:
        start = [
            p for p in residents(layout) if "optimizer" not in p.key
        ]  # optimizer states are lazy
        phases.append(
            PhasePeak(
                SERVER_START, "rollout", (*start, *_server_parts(layout, memory, "rollout"), ctx)
            )
        )
        s = _states(actor)
        sync = residents(layout, but="actor")
        sync.append(
            Part(
                "actor.params",
                "actor weights (loaded for the sync)",
                s.params,
                _where(actor),
                EV_OFFLOAD_CTX,
            )
        )
        if _resident(actor)[1] and s.optimizer:
            sync.append(
                Part(
                    "actor.optimizer.resident",
                    "actor optimizer (resident)",
                    s.optimizer,
                    "",
                    st.EV_OPTIMIZER,
                )
            )
        mem = memory["rollout"]
        sync.append(
            Part(
                "rollout.weights",
                "rollout weights (resumed)",
                mem.weights,
                f"tp {layout.rollout.tp}",
                srv.EV_WAKE,
            )
        )
        sync.append(
            Part(
                "sync.staging",
                "full tensor + transfer bucket",
                s.largest_tensor * 3 // 2 + WEIGHT_BUCKET,
                "largest parameter gathered whole (fp32 then bf16) + 2 GiB bucket",
                EV_BUCKET,
            )
        )
        phases.append(PhasePeak(WEIGHT_SYNC, "actor", (*sync, ctx)))
        phases.append(
            PhasePeak(
                ROLLOUT,
                "rollout",
                (*residents(layout), *_server_parts(layout, memory, "rollout"), ctx),
            )
        )
    if layout.reward is not None and not layout.reward.standalone:
        phases.append(
            PhasePeak(
                REWARD,
                "reward",
                (*residents(layout), *_server_parts(layout, memory, "reward"), ctx),
            )
        )
    asleep = _server_parts(layout, memory, None)
    phases.append(
        PhasePeak(
            OLD_LOG_PROB,
            "actor",
            (
                *residents(layout, but="actor"),
                *_optimizer_kept(actor),
                *_compute_parts(actor, training=False, entropy=True),
                *asleep,
                ctx,
            ),
        )
    )
    ref = layout.role("ref")
    if ref is not None:
        phases.append(
            PhasePeak(
                REF_LOG_PROB,
                "ref",
                (
                    *residents(layout, but="ref"),
                    *_compute_parts(ref, training=False, entropy=False),
                    *asleep,
                    ctx,
                ),
            )
        )
    elif _kl_from_actor(layout):
        phases.append(
            PhasePeak(
                REF_LOG_PROB,
                "actor",
                (
                    *residents(layout, but="actor"),
                    *_optimizer_kept(actor),
                    *_compute_parts(actor, training=False, entropy=False),
                    *asleep,
                    ctx,
                ),
            )
        )
    critic = layout.role("critic")
    if critic is not None:
        phases.append(
            PhasePeak(
                VALUES,
                "critic",
                (
                    *residents(layout, but="critic"),
                    *_optimizer_kept(critic),
                    *_compute_parts(critic, training=False, entropy=False),
                    *asleep,
                    ctx,
                ),
            )
        )
        phases.append(
            PhasePeak(
                CRITIC_UPDATE,
                "critic",
                (
                    *residents(layout, but="critic"),
                    *_compute_parts(critic, training=True, entropy=False),
                    *asleep,
                    ctx,
                ),
            )
        )
    phases.append(
        PhasePeak(
            ACTOR_UPDATE,
            "actor",
            (
                *residents(layout, but="actor"),
                *_compute_parts(actor, training=True, entropy=actor.entropy_train),
                *asleep,
                ctx,
            ),
        )
    )
    if layout.saves_checkpoints:
        phases.append(_checkpoint(layout, actor, asleep, ctx))
    kinds = [RankKind("trainer", layout.world, _describe(layout), tuple(phases))]
    if layout.rollout is not None and layout.rollout.standalone:
        mem = memory["rollout"]
        parts = (
            Part(
                "rollout.server",
                f"rollout server ({layout.rollout.name})",
                mem.claimed,
                f"gpu_memory_utilization {layout.rollout.gpu_memory_utilization} x capacity",
                srv.VLLM_REQUESTED,
            ),
            _contexts(1),
        )
        kinds.append(
            RankKind(
                "rollout",
                layout.rollout.gpus,
                "standalone rollout replica GPUs",
                (PhasePeak(ROLLOUT, "rollout", parts),),
            )
        )
    return tuple(kinds)


def _kl_from_actor(layout: RunLayout) -> bool:
    """LoRA: the actor with its adapter switched off is the reference (trainer_base.py:317-322)."""
    actor = layout.role("actor")
    return actor is not None and actor.spec.lora_rank > 0 and layout.kind == "rl"


def _optimizer_kept(role: RoleLayout) -> list[Part]:
    s = _states(role)
    if _resident(role)[1] and s.optimizer:
        return [
            Part(
                f"{role.role}.optimizer.resident",
                f"{role.role} optimizer (resident)",
                s.optimizer,
                "kept between calls (optimizer_offload=False)",
                EV_OFFLOAD_CTX,
            )
        ]
    return []


def _checkpoint(layout: RunLayout, actor: RoleLayout, asleep: list[Part], ctx: Part) -> PhasePeak:
    s = _states(actor)
    parts = residents(layout, but="actor")
    parts.append(
        Part("actor.params", "actor weights (loaded to save)", s.params, _where(actor), EV_SAVE)
    )
    parts.extend(_optimizer_kept(actor))
    staging = s.largest_tensor if layout.hf_model_in_checkpoint else 2 * s.layer_unit
    parts.append(
        Part(
            "checkpoint.staging",
            "state-dict staging",
            staging,
            "largest parameter gathered whole (hf_model)"
            if layout.hf_model_in_checkpoint
            else "per-unit copies of the sharded state dict",
            EV_SAVE,
        )
    )
    return PhasePeak(CHECKPOINT, "actor", (*parts, *asleep, ctx))


def _describe(layout: RunLayout) -> str:
    roles = ", ".join(r.role for r in layout.roles)
    server = layout.rollout
    colocated = (
        f" + {server.name} rollout (tp {server.tp})"
        if server is not None and not server.standalone
        else ""
    )
    return f"{layout.world} GPUs: {roles}{colocated}"


def sft_ranks(layout: RunLayout) -> tuple[RankKind, ...]:
    role = layout.roles[0]
    ctx = _contexts(1)
    update = PhasePeak(
        SFT_UPDATE, "actor", (*_compute_parts(role, training=True, entropy=False), ctx)
    )
    phases = [update]
    if layout.saves_checkpoints:
        phases.append(_checkpoint(layout, role, [], ctx))
    return (
        RankKind(
            "trainer", layout.world, f"{layout.world} GPUs (torchrun): SFT engine", tuple(phases)
        ),
    )


def server_memories(layout: RunLayout, capacity: int) -> dict[str, srv.ServerMemory]:
    out = {}
    for name, server in (("rollout", layout.rollout), ("reward", layout.reward)):
        if isinstance(server, ServerLayout):
            out[name] = srv.server_memory(server, capacity)
    return out
