"""Each phase of a step on each kind of rank: what is on the GPU while it runs, part by part.

A training engine keeps its sharded parameters and optimizer states between calls unless
offloaded (verl/workers/engine/base.py:312-336: train mode loads model and optimizer, eval mode
the model only; gradients are freed on leaving train mode, transformer_impl.py:1107-1112); the
reference policy's FSDP engine always offloads its parameters (transformer_impl.py:389-394,
415-420). The hybrid engine's rollout server sleeps while the trainer runs (free_cache_engine,
vllm_async_server.py:791-800, :1075-1098) and wakes its weights, then its KV cache, around the
weight sync (engine_workers.py:762-801).
"""

from __future__ import annotations

from pytest_verl_compat.memory import rollout as srv
from pytest_verl_compat.memory import states as st
from pytest_verl_compat.memory.layout import BUCKET_KEY, RoleLayout, RunLayout, ServerLayout
from pytest_verl_compat.memory.parts import (
    ACTOR_UPDATE,
    CHECKPOINT,
    CRITIC_UPDATE,
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
)
from pytest_verl_compat.memory.passes import (
    compute_parts,
    server_memories,
    server_parts,
    standalone_memory,
)
from pytest_verl_compat.memory.residency import (
    EV_OFFLOAD_CTX,
    contexts,
    gib_text,
    grad_buffer,
    megatron,
    optimizer_kept,
    processes,
    resident,
    residents,
    start_residents,
    states_of,
    where,
)

# The weight sync fills one GPU buffer of update_weights_bucket_megabytes and hands it to the
# server by CUDA IPC (vllm_rollout.py:228-233, bucketed_weight_transfer.py:178; host shared
# memory only where IPC is not supported, vllm_rollout.py:143).
EV_BUCKET = (
    "verl/workers/rollout/vllm_rollout/vllm_rollout.py:228-233, "
    "verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py:178"
)
EV_SAVE = "verl/workers/engine/fsdp/transformer_impl.py:839-865"
# Megatron's save loads the model with its gradient buffer (load_grad=True) when it is offloaded,
# and keeps it where it is not
EV_SAVE_MEGATRON = "verl/workers/engine/megatron/transformer_impl.py:782-790"
# ... and writes its model in Hugging Face format unless use_dist_checkpointing (reading.saves_hf_model)
EV_SAVE_HF_MEGATRON = (
    "verl/utils/checkpoint/megatron_checkpoint_manager.py:245-249, :1000-1015 "
    "(_save_model_as_hf_via_bridge: bridge.save_hf_weights, save_hf_adapter with LoRA)"
)


def rl_ranks(layout: RunLayout, capacity: int) -> tuple[RankKind, ...]:
    memory = server_memories(layout, capacity)
    ctx = contexts(processes(layout))
    phases: list[PhasePeak] = []
    actor = layout.role("actor")
    assert actor is not None
    if layout.rollout is not None and layout.rollout.colocated:
        start = start_residents(layout)
        phases.append(
            PhasePeak(
                SERVER_START, "rollout", (*start, *server_parts(layout, memory, "rollout"), ctx)
            )
        )
        s = states_of(actor)
        sync = residents(layout, but="actor")
        sync.append(
            Part(
                "actor.params",
                "actor weights (loaded for the sync)",
                s.params,
                where(actor),
                EV_OFFLOAD_CTX,
            )
        )
        if resident(actor)[1] and s.optimizer:
            sync.append(
                Part(
                    "actor.optimizer.resident",
                    "actor optimizer (resident)",
                    s.optimizer,
                    "kept between calls (optimizer_offload=False)",
                    st.EV_OPTIMIZER,
                )
            )
        sync.extend(grad_buffer(actor, "(resident)"))
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
        bucket = layout.rollout.bucket_bytes
        gathered, how, cited = _gathered_largest(actor, s.largest_tensor)
        staging = gathered + bucket
        if layout.rollout.sync_summons_whole and s.summoned > staging:
            sync.append(
                Part(
                    "sync.summoned",
                    "actor model gathered whole (LoRA sync without layered_summon)",
                    s.summoned,
                    f"{s.total:,} params x {actor.spec.model_dtype} B, padded per FSDP unit: "
                    "summon_full_params unshards every FSDP1 unit at full precision to collect "
                    "the adapters (rollout.layered_summon=True gathers one unit at a time)",
                    st.EV_SUMMON_WHOLE,
                )
            )
        else:
            sync.append(
                Part(
                    "sync.staging",
                    "full tensor + transfer bucket",
                    staging,
                    f"{how} + {gib_text(bucket)} bucket ({layout.rollout.section}.{BUCKET_KEY})",
                    f"{EV_BUCKET}{cited}",
                )
            )
        phases.append(PhasePeak(WEIGHT_SYNC, "actor", (*sync, ctx)))
        phases.append(
            PhasePeak(
                ROLLOUT,
                "rollout",
                (*residents(layout), *server_parts(layout, memory, "rollout"), ctx),
            )
        )
    if layout.reward is not None and layout.reward.colocated:
        phases.append(
            PhasePeak(
                REWARD,
                "reward",
                (*residents(layout), *server_parts(layout, memory, "reward"), ctx),
            )
        )
    asleep = server_parts(layout, memory, None)
    phases.append(
        PhasePeak(
            OLD_LOG_PROB,
            "actor",
            (
                *residents(layout, but="actor"),
                *optimizer_kept(actor),
                *compute_parts(actor, training=False, entropy=True),
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
                    *compute_parts(ref, training=False, entropy=False),
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
                    *optimizer_kept(actor),
                    *compute_parts(actor, training=False, entropy=False),
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
                    *optimizer_kept(critic),
                    *compute_parts(critic, training=False, entropy=False),
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
                    *compute_parts(critic, training=True, entropy=False),
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
                *compute_parts(actor, training=True, entropy=actor.entropy_train),
                *asleep,
                ctx,
            ),
        )
    )
    if layout.saves_checkpoints:
        phases.append(_checkpoint(layout, actor, asleep, ctx))
    kinds = [RankKind("trainer", layout.world, _describe(layout), tuple(phases))]
    if layout.rollout is not None and layout.rollout.standalone_gpus > 0:
        kinds.append(_standalone(layout.rollout, capacity, "standalone rollout replica GPUs"))
    return tuple(kinds)


def _standalone(server: ServerLayout, capacity: int, description: str) -> RankKind:
    """GPUs that hold a rollout server and nothing else: its share, what sits outside it, one
    process's context."""
    mem = standalone_memory(server, capacity)
    parts = (
        Part(
            "rollout.server",
            f"rollout server ({server.name})",
            mem.claimed,
            srv.share_text(server, mem),
            srv.share_evidence(server),
        ),
        contexts(1),
    )
    return RankKind(
        "rollout", server.standalone_gpus, description, (PhasePeak(ROLLOUT, "rollout", parts),)
    )


def serve_ranks(layout: RunLayout, capacity: int) -> tuple[RankKind, ...]:
    """A launch that never trains: its rollout servers on every GPU (reading.serve_layout)."""
    server = layout.rollout
    assert server is not None
    description = f"{layout.world} GPUs: {server.name} servers (tp {server.tp}), no trainer"
    return (_standalone(server, capacity, description),)


def _kl_from_actor(layout: RunLayout) -> bool:
    """LoRA: the actor with its adapter switched off is the reference (trainer_base.py:317-322)."""
    return layout.reference_from_actor and layout.role("actor") is not None


# Megatron's weight sync exports through Megatron-Bridge (engine/megatron.yaml:98-102: use_mbridge,
# not the vanilla mbridge; megatron/transformer_impl.py:1028-1036 export_hf_weights): each tensor
# is broadcast from its pipeline stage, its shards all-gathered into tp_size new buffers and
# concatenated on the way out (the version read: Megatron-Bridge 2afd2d3; verl 0.9.0 pins none)
EV_BRIDGE_EXPORT = (
    "megatron/bridge/models/conversion/param_mapping.py@Megatron-Bridge 2afd2d3 "
    "(MegatronParamMapping.gather_from_tp_ranks: tp_size empty_like buffers all-gathered; "
    "ColumnParallelMapping/RowParallelMapping.megatron_to_hf: torch.cat; broadcast_from_pp_rank)"
)


def _gathered_largest(actor: RoleLayout, largest: int) -> tuple[int, str, str]:
    """What the weight sync (and Megatron's Hugging Face save) gathers of the largest tensor:
    bytes, how, and the evidence to add. FSDP gathers a parameter whole at full precision and
    casts it to bf16 (1.5 x its fp32 bytes); Megatron-Bridge holds the tp_size gathered shards
    and their concatenation (2 x the bf16 tensor), the stage's broadcast copy alone at tensor
    parallel 1 across stages, nothing beyond the parameter itself on one rank."""
    if not megatron(actor):
        return largest * 3 // 2, "largest parameter gathered whole (fp32 then bf16)", ""
    tp, pp = actor.spec.tp, actor.spec.pp
    if tp > 1:
        copies, how = 2, f"largest tensor gathered over tp {tp} and concatenated (2 x bf16)"
    elif pp > 1:
        copies, how = 1, f"largest tensor broadcast across {pp} pipeline stages (bf16)"
    else:
        copies, how = 0, "tensors exported as they are (tp 1, pp 1)"
    return copies * largest, how, f"; {EV_BRIDGE_EXPORT}"


def _checkpoint(layout: RunLayout, actor: RoleLayout, asleep: list[Part], ctx: Part) -> PhasePeak:
    s = states_of(actor)
    parts = residents(layout, but="actor")
    saves = EV_SAVE_MEGATRON if megatron(actor) else EV_SAVE
    parts.append(
        Part("actor.params", "actor weights (loaded to save)", s.params, where(actor), saves)
    )
    parts.extend(grad_buffer(actor, "(loaded to save)", loaded=EV_SAVE_MEGATRON))
    parts.extend(optimizer_kept(actor))
    if layout.hf_model_in_checkpoint and megatron(actor) and actor.spec.lora_rank:
        # with LoRA the bridge writes the adapters alone (save_hf_adapter)
        staging, how = 0, "the LoRA adapters alone (Hugging Face adapter through Megatron-Bridge)"
        saves += f"; {EV_SAVE_HF_MEGATRON}"
    elif layout.hf_model_in_checkpoint and megatron(actor):
        # the model goes out in Hugging Face format through Megatron-Bridge, tensor by tensor
        staging, how, cited = _gathered_largest(actor, s.largest_tensor)
        how += " (Hugging Face weights through Megatron-Bridge)"
        saves += f"; {EV_SAVE_HF_MEGATRON}{cited}"
    elif layout.hf_model_in_checkpoint:
        staging, how = s.largest_tensor, "largest parameter gathered whole (hf_model)"
    else:
        staging, how = 2 * s.layer_unit, "per-unit copies of the sharded state dict"
    parts.append(Part("checkpoint.staging", "state-dict staging", staging, how, saves))
    return PhasePeak(CHECKPOINT, "actor", (*parts, *asleep, ctx))


def _describe(layout: RunLayout) -> str:
    roles = ", ".join(r.role for r in layout.roles)
    server = layout.rollout
    colocated = (
        f" + {server.name} rollout (tp {server.tp})"
        if server is not None and server.colocated
        else ""
    )
    return f"{layout.world} GPUs: {roles}{colocated}"


def sft_ranks(layout: RunLayout) -> tuple[RankKind, ...]:
    role = layout.roles[0]
    ctx = contexts(1)
    update = PhasePeak(
        SFT_UPDATE, "actor", (*compute_parts(role, training=True, entropy=False), ctx)
    )
    phases = [update]
    if layout.saves_checkpoints:
        phases.append(_checkpoint(layout, role, [], ctx))
    return (
        RankKind(
            "trainer", layout.world, f"{layout.world} GPUs (torchrun): SFT engine", tuple(phases)
        ),
    )
