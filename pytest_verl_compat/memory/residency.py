"""What stays on a GPU between a role's calls, and the processes that share the GPU.

A training engine keeps its sharded parameters and optimizer states between calls unless
offloaded (verl/workers/engine/base.py:312-336: train mode loads model and optimizer, eval mode
the model only; gradients are freed on leaving train mode, transformer_impl.py:1107-1112); the
reference policy's FSDP engine always keeps its shards on the host (transformer_impl.py:389-394,
415-420).
"""

from __future__ import annotations

from pytest_verl_compat.checks.roles import FSDP_STRATEGIES
from pytest_verl_compat.memory import states as st
from pytest_verl_compat.memory.layout import RoleLayout, RunLayout
from pytest_verl_compat.memory.parts import GIB, Part, gib

# One GPU process's CUDA context and communication buffers (NCCL's per-peer buffers, cuBLAS
# workspace): stated, not measured; a colocated rank runs the trainer and the rollout server.
PROCESS_OVERHEAD = int(0.75 * GIB)
EV_CONTEXT = "one CUDA context + NCCL buffers per GPU process (stated constant, 0.75 GiB)"
EV_OFFLOAD_CTX = "verl/workers/engine/base.py:312-336"
EV_ZERO_GRAD = "verl/workers/engine/fsdp/transformer_impl.py:1107-1112"
EV_MEGATRON_GRADS = "verl/utils/megatron_utils.py:663-722"


def gib_text(x: int) -> str:
    return f"{gib(x):.2f} GiB"


def states_of(role: RoleLayout) -> st.ModelStates:
    return st.model_states(role.model.architecture, role.spec)


def where(role: RoleLayout) -> str:
    spec = role.spec
    if spec.strategy in ("megatron", "mindspeed"):
        return f"Megatron tp {spec.tp} pp {spec.pp} ep {spec.ep}"
    engine = f"{spec.strategy.upper()} ({spec.label})" if spec.label else spec.strategy.upper()
    ep = f", experts over ep {spec.ep}" if spec.ep > 1 else ""
    return f"{engine} shards over {spec.shard}{ep}"


def megatron(role: RoleLayout) -> bool:
    return role.spec.strategy in ("megatron", "mindspeed")


def stored_bytes(role: RoleLayout) -> int:
    """Bytes per stored weight: Megatron keeps bf16 weights (fp32 masters live in the optimizer);
    FSDP its model dtype."""
    return role.spec.param_dtype if megatron(role) else role.spec.model_dtype


def params_evidence(role: RoleLayout) -> str:
    return st.EV_MEGATRON if megatron(role) else st.EV_FSDP2


def grad_buffer(role: RoleLayout, label: str, loaded: str = "") -> list[Part]:
    """Megatron's DistributedDataParallel keeps its fp32 gradient buffer allocated with the
    weights: it leaves the GPU only with them (offload_megatron_model_to_cpu,
    verl/utils/megatron_utils.py:663-722), and an offloaded model comes back without it for a
    forward (verl/workers/engine/base.py:319, grad=False) and for the weight sync
    (verl/workers/engine/megatron/transformer_impl.py:1022, load_grad=False). The update and the
    checkpoint save load it: ``loaded`` cites where, and the buffer is there however the model is
    kept between calls."""
    s = states_of(role)
    if not megatron(role) or role.spec.forward_only or not s.grads:
        return []
    if not loaded and not resident(role)[0]:
        return []
    return [
        Part(
            f"{role.role}.grads.buffer",
            f"{role.role} gradient buffer {label}",
            s.grads,
            f"{s.trainable:,} trainable params x fp32 (Megatron's grad buffer), {where(role)}",
            f"{loaded}; {EV_MEGATRON_GRADS}" if loaded else EV_MEGATRON_GRADS,
        )
    ]


def forced_offload(role: RoleLayout) -> bool:
    """FSDP's forward-only engine (the reference) keeps its shards on the host, always (verl's
    engine; VeOmni's keeps them on the GPU: ``EngineSpec.forward_only_on_host``)."""
    spec = role.spec
    return role.offload_policy or (
        spec.forward_only and spec.forward_only_on_host and spec.strategy in FSDP_STRATEGIES
    )


def resident(role: RoleLayout) -> tuple[bool, bool]:
    """(params, optimizer) kept on the GPU between the role's calls."""
    offloaded = forced_offload(role)
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
        s = states_of(role)
        params, optimizer = resident(role)
        name = role.role
        if params and s.params:
            parts.append(
                Part(
                    f"{name}.params.resident",
                    f"{name} weights (resident)",
                    s.params,
                    f"{s.total:,} params x {stored_bytes(role)} B, {where(role)}",
                    params_evidence(role),
                )
            )
            parts.extend(grad_buffer(role, "(resident)"))
        if optimizer and s.optimizer:
            parts.append(
                Part(
                    f"{name}.optimizer.resident",
                    f"{name} optimizer (resident)",
                    s.optimizer,
                    f"{st.optimizer_states(role.spec.optimizer)} x fp32 per trainable param, {where(role)}",
                    st.EV_OPTIMIZER,
                )
            )
    return parts


def processes(layout: RunLayout) -> int:
    """GPU processes on a trainer GPU: the trainer and each colocated server."""
    servers = [s for s in (layout.rollout, layout.reward) if s is not None and s.colocated]
    return 1 + len(servers)


def start_residents(layout: RunLayout) -> list[Part]:
    """What the trainer keeps on its GPUs when the colocated servers start: ``residents`` but
    the optimizer states, which the optimizer creates at its first step (lazily)."""
    return [p for p in residents(layout) if "optimizer" not in p.key]


def contexts(processes: int) -> Part:
    return Part(
        "overhead.context",
        f"CUDA contexts + NCCL ({processes} processes)",
        processes * PROCESS_OVERHEAD,
        f"{processes} x 0.75 GiB",
        EV_CONTEXT,
    )


def optimizer_kept(role: RoleLayout) -> list[Part]:
    s = states_of(role)
    if resident(role)[1] and s.optimizer:
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
