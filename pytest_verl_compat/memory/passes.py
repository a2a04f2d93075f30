"""What a role holds while it runs a pass (a forward-only log-prob pass or an update), and what the
colocated rollout servers hold, awake or asleep (free_cache_engine: vllm_async_server.py:791-800,
1075-1098)."""

from __future__ import annotations

from pytest_verl_compat.memory import activations as act
from pytest_verl_compat.memory import rollout as srv
from pytest_verl_compat.memory import states as st
from pytest_verl_compat.memory.layout import RoleLayout, RunLayout, ServerLayout
from pytest_verl_compat.memory.parts import Part
from pytest_verl_compat.memory.residency import (
    EV_MEGATRON_GRADS,
    contexts,
    forced_offload,
    gib_text,
    grad_buffer,
    megatron,
    params_evidence,
    processes,
    start_residents,
    states_of,
    stored_bytes,
    where,
)

# reshard_after_forward=False: verl builds FSDP1 with SHARD_GRAD_OP (transformer_impl.py:401,
# engine/fsdp/utils.py:72-77), whose post-forward frees nothing
# (torch/distributed/fsdp/_runtime_utils.py:486-500@torch-2.13.0), and passes it to FSDP2's
# fully_shard (:450), whose post-forward reshard returns at once in the forward
# (_fully_shard/_fsdp_param_group.py:499-502), no-grad passes included: each unit stays gathered
# until its backward, or until the pass ends.
EV_NO_RESHARD = (
    "verl/workers/engine/fsdp/transformer_impl.py:401, :450; "
    "torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py:499-502@torch-2.13.0; "
    "torch/distributed/fsdp/_runtime_utils.py:486-500@torch-2.13.0"
)


def _gathered(role: RoleLayout, s: st.ModelStates, c: int) -> Part:
    """The FSDP units a pass holds gathered in the compute dtype: two decoder layers (and
    FSDP1's root unit), or every unit when the engine does not reshard after forward."""
    if role.reshard_after_forward:
        size = 2 * s.layer_unit + s.root_unit
        what = f"2 decoder layers{' + root unit' if s.root_unit else ''}"
        evidence = st.EV_FSDP1 if role.spec.strategy == "fsdp" else st.EV_FSDP2
    else:
        size = s.total * c
        what = (
            f"every unit, gathered by its forward and kept ({role.engine_section}"
            ".reshard_after_forward=False: FSDP1's SHARD_GRAD_OP, FSDP2's units skip the "
            "post-forward reshard)"
        )
        evidence = EV_NO_RESHARD
    name = role.role
    return Part(
        f"{name}.gathered",
        f"{name} all-gathered units",
        size,
        f"{what} in {c}-byte compute dtype",
        evidence,
    )


def _checkpointing_evidence(role: RoleLayout) -> str:
    if megatron(role):
        return f"{act.EV_MEGATRON_RECOMPUTE}; {act.EV_MEGATRON_LAYER}"
    return act.EV_CHECKPOINTING


def _logits_part(role: RoleLayout, training: bool, entropy: bool) -> Part:
    """The logits of one micro-batch, as copies alive at the peak of the log-prob computation."""
    arch = role.model.architecture
    c = role.spec.param_dtype
    entropy = entropy or role.entropy_every_pass
    if megatron(role):
        cost = act.megatron_logits_cost(training, entropy, role.fused_kernels)
    else:
        cost = act.logits_cost(
            training,
            entropy,
            role.chunked_entropy,
            role.fused_kernels,
            role.compiled,
            role.temperature_copy,
            role.logprob_grad_in_place,
            fp32_loss=role.fp32_loss,
            # the old SFT trainer shifts the padded logits into a contiguous copy for the loss
            shifted=role.fp32_loss and not role.remove_padding,
        )
    tokens = role.train_tokens if training else role.infer_tokens
    vocab = arch.vocab_size // (role.spec.tp if megatron(role) else 1)
    return Part(
        f"{role.role}.logits",
        f"{role.role} logits",
        int(cost.copies * tokens * vocab * c),
        f"{tokens:,} tokens x {vocab:,} vocab x {c} B x {cost.note}",
        role.logits_evidence or act.EV_LOGITS,
    )


def _on_host(role: RoleLayout) -> str:
    """What Megatron's CPU optimizer keeps off the GPU, as fit says it."""
    share = role.spec.optimizer_on_host
    if not share:
        return ""
    what = "the master and states" if role.spec.master_on_host else "the states"
    return f", {what} of {share:.0%} of the params on the host (optimizer_cpu_offload)"


def _deferred_by(role: RoleLayout) -> str:
    """What defers the gradient sync: the key where the release's tree has it, else its engine."""
    if role.sync_key:
        return f"{role.sync_key.rsplit('.', 1)[-1]}=True"
    return "the release's engine, always: its tree has no key for it"


def _replicated(role: RoleLayout) -> int:
    """Megatron's tensor-parallel ranks that each hold the norms' tensors whole: all of them
    without sequence parallelism (``activations.megatron_layer_bytes``), else none."""
    return role.spec.tp if megatron(role) and not role.sequence_parallel else 1


def _offloads_activations(role: RoleLayout) -> bool:
    """The FSDP engine's activation offload, which verl leaves off for a model of fewer than three
    FSDP units (activation_offload.py:538-540)."""
    return role.activation_offload and role.model.architecture.num_hidden_layers >= 3


def _kept_layout_text(role: RoleLayout) -> str:
    """How the kept activations sit on the GPU, where not every layer's is split as usual."""
    if _offloads_activations(role):
        return ", activation offload: the last layer's on the GPU, two layers' in its backward"
    if _replicated(role) == 1:
        return ""
    return f", sequence_parallel off: the norms' tensors whole on each of tp {role.spec.tp}"


def _pipelined(role: RoleLayout) -> bool:
    return megatron(role) and role.spec.pp > 1


def _training_stage(role: RoleLayout, tokens: int, logits: int) -> tuple[act.Stage, int, int]:
    """The stage whose update peaks (the whole model, or under Megatron's pipeline the first
    stage, which keeps several micro-batches in flight, or the last, which holds the logits),
    with what its forward keeps and its backward through the layers peaks at (+ workspaces).
    The model states beside them are the first stage's (``states.megatron_states``)."""
    arch, c, mcore = role.model.architecture, role.spec.param_dtype, megatron(role)
    allowance = 1 + act.WORKSPACE_ALLOWANCE
    stages: tuple[act.Stage, ...] = (act.Stage.whole(arch),)
    if _pipelined(role):
        stages = act.pipeline_stages(arch, role.spec.pp, role.micro_batches, role.spec.vpp)
    whole, offloaded = _replicated(role), _offloads_activations(role)
    candidates = []
    for stage in stages:
        kept = act.kept_bytes(
            arch, tokens, role.checkpointing, c, mcore, stage, whole, offloaded=offloaded
        )
        layers = act.layers_backward_bytes(
            arch, tokens, role.checkpointing, c, mcore, stage, whole, offloaded=offloaded
        )
        kept, layers = int(kept * allowance), int(layers * allowance)
        candidates.append((max(kept + (logits if stage.last else 0), layers), stage, kept, layers))
    _, stage, kept, layers = max(candidates, key=lambda candidate: candidate[0])  # first on ties
    return stage, kept, layers


def _stage_text(role: RoleLayout, stage: act.Stage) -> str:
    """Which pipeline stage the update's parts are of, as fit prints it ("" without a pipeline)."""
    if not _pipelined(role):
        return ""
    which = "last" if stage.last else "first"
    layers = f"layers {stage.layers.start}-{stage.layers.stop - 1}"
    unit = (
        "micro-batches" if role.spec.vpp <= 1 else f"chunk micro-batches of {role.spec.vpp} chunks"
    )
    flight = (
        f"{stage.in_flight} {unit} in flight (1F1B)" if stage.in_flight > 1 else "one micro-batch"
    )
    head = ", the head and its logits" if stage.last else ""
    return f", {which} of {role.spec.pp} pipeline stages ({layers}, {flight}{head})"


# torch's FSDP2 copies the reduce-scattered gradient to the host under CPUOffloadPolicy (FSDP1's
# _offload_grad under CPUOffload(offload_params=True)); the optimizer's states follow its params
EV_HOST_STATES = "torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:711@torch-2.13.0"


def _state_parts(role: RoleLayout) -> list[Part]:
    """An update's gradients and optimizer states. Under FSDP's CPU offload policy (FSDP2's
    CPUOffloadPolicy, FSDP1's CPUOffload(offload_params=True)) each sharded gradient is copied to
    the host as its reduce-scatter ends and the optimizer steps there: one part of no GPU bytes
    says where they went (in the JSON and the evidence; the text lists parts that hold bytes)."""
    name, s = role.role, states_of(role)
    if role.offload_policy and not megatron(role):
        return [
            Part(
                f"{name}.grads",
                f"{name} gradients and optimizer states",
                0,
                "on the host (FSDP's CPU offload policy: each sharded gradient is copied there "
                "after its reduce-scatter, and the optimizer steps there)",
                EV_HOST_STATES,
            )
        ]
    return [
        Part(
            f"{name}.grads",
            f"{name} gradients",
            s.grads,
            f"{s.trainable:,} trainable params x fp32 (Megatron's grad buffer), {where(role)}"
            if megatron(role)
            else f"{s.trainable:,} trainable params x fp32, sharded",
            EV_MEGATRON_GRADS if megatron(role) else st.EV_FSDP2,
        ),
        Part(
            f"{name}.optimizer",
            f"{name} optimizer states",
            s.optimizer,
            (
                f"fp32 master + {st.optimizer_states(role.spec.optimizer)} states per trainable param, distributed optimizer"
                + _on_host(role)
                if megatron(role)
                else f"{st.optimizer_states(role.spec.optimizer)} states x fp32 per trainable param, sharded"
            ),
            st.EV_OPTIMIZER
            + (f"; {st.EV_OPTIMIZER_ON_HOST}" if role.spec.optimizer_on_host else ""),
        ),
    ]


def compute_parts(role: RoleLayout, training: bool, entropy: bool) -> list[Part]:
    """The role's own parts while it runs a pass (training: an update)."""
    arch = role.model.architecture
    s = states_of(role)
    c = role.spec.param_dtype
    name = role.role
    parts = []
    if not forced_offload(role):
        parts.append(
            Part(
                f"{name}.params",
                f"{name} weights",
                s.params,
                f"{s.total:,} params x {stored_bytes(role)} B, {where(role)}",
                params_evidence(role),
            )
        )
        if not training:
            parts.extend(grad_buffer(role, "(allocated)"))
    if not megatron(role):  # Megatron holds its layer shards; nothing is gathered per unit
        parts.append(_gathered(role, s, c))
    logits = None if role.spec.value_head else _logits_part(role, training, entropy)
    logits_bytes = logits.bytes if logits is not None else 0
    tp_cp = (
        max(role.spec.tp, 1) * max(role.spec.cp, 1)
        if role.spec.strategy in ("megatron", "mindspeed")
        else 1
    )
    if training:
        parts.extend(_state_parts(role))
        if role.micro_batches > 1 and s.accumulated:
            parts.append(
                Part(
                    f"{name}.accumulated",
                    f"{name} unsharded grads (no-sync)",
                    s.accumulated,
                    f"{role.micro_batches} micro-batches per mini-batch, gradient sync deferred to the last ({_deferred_by(role)}): every trainable param's gradient kept whole between them",
                    st.EV_NO_SYNC,
                )
            )
        stage, kept, layers = _training_stage(role, role.train_tokens // tp_cp, logits_bytes)
        if not stage.last:  # the first pipeline stage peaks; the logits are the last stage's
            logits, logits_bytes = None, 0
        # the pass peaks at max(kept + logits, layers): the logits are their own part
        beyond = max(0, layers - kept - logits_bytes)
        held = max(0, layers + s.held_head_grad - kept - logits_bytes) - beyond
        evidence = _checkpointing_evidence(role)
        if _replicated(role) > 1:
            evidence += f"; {act.EV_MEGATRON_SEQUENCE_PARALLEL}"
        if _offloads_activations(role):
            evidence += f"; {act.EV_ACTIVATION_OFFLOAD}"
        if role.tokens_evidence:
            evidence += f"; {role.tokens_evidence}"
        if _pipelined(role):
            evidence += f"; {act.EV_1F1B_INTERLEAVED if role.spec.vpp > 1 else act.EV_1F1B}"
        parts.append(
            Part(
                f"{name}.activations",
                f"{name} activations",
                kept + beyond,
                f"{role.train_tokens:,} tokens/micro-batch, {'checkpointed' if role.checkpointing else 'all layers kept'}"
                f"{_stage_text(role, stage)}{_kept_layout_text(role)}: "
                f"{gib_text(kept)} kept; backward through the layers peaks at {gib_text(layers)}, "
                "after the logits are freed (what it holds beyond kept + logits counts), "
                "+10% kernel workspaces",
                evidence,
            )
        )
        if held:
            parts.append(
                Part(
                    f"{name}.head_grad",
                    f"{name} head gradient (held)",
                    held,
                    f"the root unit's head gradient, {gib_text(s.held_head_grad)}, held through the layers' backward until the embedding's (FSDP1's split views): what it adds to that peak",
                    st.EV_FSDP1,
                )
            )
        if not megatron(role):  # Megatron reduces inside its grad buffer
            parts.append(
                Part(
                    f"{name}.reduce",
                    f"{name} gradient reduce buffers",
                    3 * s.layer_grad_unit,
                    "one unit's gradient in bf16 and its fp32 reduce-scatter copy (its trainable weights': a LoRA base has none)",
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
                role.tokens_evidence or act.EV_LOGITS,
            )
        )
    if logits is not None:
        parts.append(logits)
    if training and s.step_transient:
        parts.extend(_step_beyond(role, parts, s.step_transient))
    return parts


# The parts a training pass holds only until its last backward ends: what is left when the
# optimizer steps is the weights, the gradient shards and the optimizer's states (FSDP reshards
# each unit after its backward and reduce-scatters the deferred gradients at the last one).
BACKWARD_ONLY = (
    "gathered",
    "activations",
    "head_grad",
    "reduce",
    "logits",
    "accumulated",
)


def _step_beyond(role: RoleLayout, parts: list[Part], copy: int) -> list[Part]:
    """The optimizer step's own copy, where it outgrows what the backward held beside the
    states (the pass peaks at the larger of the two moments; the states are counted once)."""
    backward = sum(p.bytes for p in parts if p.key.rsplit(".", 1)[-1] in BACKWARD_ONLY)
    if copy <= backward:
        return []
    return [
        Part(
            f"{role.role}.step",
            f"{role.role} optimizer step",
            copy - backward,
            f"the step's square roots of every exp_avg_sq shard at once ({gib_text(copy)}, "
            f"{role.optim_section}.optimizer {role.spec.optimizer} on foreach), beyond the "
            f"{gib_text(backward)} the backward held and freed before it",
            st.EV_STEP_COPY,
        )
    ]


def server_parts(
    layout: RunLayout, memory: dict[str, srv.ServerMemory], awake: str | None
) -> list[Part]:
    """The colocated servers: the awake one claims its share, the others what sleep leaves."""
    parts = []
    for name, server in (("rollout", layout.rollout), ("reward", layout.reward)):
        if server is None or not server.colocated:
            continue
        mem = memory[name]
        if name == awake:
            parts.append(
                Part(
                    f"{name}.server",
                    f"{name} server ({server.name}, awake)",
                    mem.claimed,
                    srv.share_text(server, mem),
                    srv.share_evidence(server),
                )
            )
        elif mem.asleep:
            parts.append(
                Part(
                    f"{name}.asleep",
                    f"{name} server (asleep)",
                    mem.asleep,
                    (
                        "CUDA graphs and the base weights stay (LoRA adapters)"
                        if server.keeps_weights_asleep
                        else "CUDA graphs stay"
                    )
                    if mem.sleeps
                    else "free_cache_engine=False: weights and KV cache stay",
                    srv.EV_SLEEP,
                )
            )
    return parts


def server_memories(layout: RunLayout, capacity: int) -> dict[str, srv.ServerMemory]:
    """Each server's memory, sized against what its GPU holds when it starts (SGLang measures
    the free memory then): a colocated server finds the trainer's resident states and every
    process's context; the rollout server, started after the reward server has gone to sleep
    (ray_trainer.py init_workers builds the RewardLoopManager first; reward_model.py:49 sleeps
    its replicas), also what that server keeps asleep; a standalone server its own context."""
    out: dict[str, srv.ServerMemory] = {}
    trainer = sum(p.bytes for p in start_residents(layout)) + contexts(processes(layout)).bytes
    for name, server in (("reward", layout.reward), ("rollout", layout.rollout)):
        if not isinstance(server, ServerLayout):
            continue
        if not server.colocated:
            out[name] = standalone_memory(server, capacity)
            continue
        out[name] = srv.server_memory(server, capacity, trainer)
        trainer += out[name].asleep  # asleep on the trainer's GPUs when the next server starts
    return out


def standalone_memory(server: ServerLayout, capacity: int) -> srv.ServerMemory:
    """A server on GPUs of its own: its process's context is all they hold when it starts."""
    return srv.server_memory(server, capacity, contexts(1).bytes)
