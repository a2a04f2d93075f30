"""The forecast of one resolved configuration: its layout, each rank's phases, and the verdicts
against a GPU's capacity (with the fixes, re-forecast)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_verl_compat.memory import layout as lay
from pytest_verl_compat.memory import passes
from pytest_verl_compat.memory.fixes import fixes_for, phase_keys, release_remedy
from pytest_verl_compat.memory.gpus import smallest_and_largest
from pytest_verl_compat.memory.lora_build import refusals
from pytest_verl_compat.memory.parts import (
    PHASE_TITLES,
    Forecast,
    PhasePeak,
    RankKind,
    Verdict,
    gib,
)
from pytest_verl_compat.memory.rollout import engine_assumption, quantization_assumption
from pytest_verl_compat.memory.runs import (
    MARGIN,
    NotForecastable,
    Request,
    build_layout,
    own_rollout_pool,
    phase_total,
    ranks_for,
    server_cannot_start,
    trains,
    verdicts_only,
)
from pytest_verl_compat.memory.vision import vision_assumptions

__all__ = [
    "MARGIN",
    "NotForecastable",
    "Request",
    "forecast",
    "own_rollout_pool",
    "phase_total",
    "trains",
]


def _keys_of(phase: PhasePeak, layout: lay.RunLayout) -> tuple[str, ...]:
    return phase_keys(phase.phase, layout)


def verdicts(
    layout: lay.RunLayout,
    ranks: tuple[RankKind, ...],
    capacity: int,
    margin: float,
    resolved: Mapping[str, Any],
    request: Request,
) -> tuple[Verdict, ...]:
    out = server_cannot_start(layout, capacity, "")
    started = {v.phase for v in out}
    for rank in ranks:
        for phase in rank.phases:
            if phase.phase in started:
                continue
            total = phase.total
            if total > capacity:
                level = "error"
            elif total > margin * capacity:
                level = "warning"
            else:
                continue
            share = total / capacity
            message = (
                f"{PHASE_TITLES[phase.phase]} on the {rank.name} GPUs peaks at {gib(total):.2f} GiB, "
                f"{share:.0%} of {gib(capacity):.2f} GiB"
                + ("" if level == "error" else f" (above the {margin:.0%} margin)")
            )
            keys = _keys_of(phase, layout)
            fixes = fixes_for(resolved, request, rank.name, phase.phase, capacity, margin)
            remedy = release_remedy(
                resolved, request, layout, rank.name, phase.phase, total, capacity, margin
            )
            out.append(
                Verdict(
                    level, rank.name, phase.phase, total, capacity, message, keys, fixes, remedy
                )
            )
    return tuple(out)


def forecast(resolved: Mapping[str, Any], request: Request, *, with_fixes: bool = True) -> Forecast:
    """The forecast of one resolved configuration (raises UnknownModel, InputError or
    NotForecastable for input it cannot read)."""
    layout = build_layout(resolved, request)
    assumptions = [f"sequence lengths: {layout.lengths.source}"]
    model = layout.roles[0].model if layout.roles else layout.rollout_model()
    arch = model.architecture
    assumptions += vision_assumptions(arch.vision, arch.vision_uncounted)
    if arch.mtp_uncounted:
        assumptions.append(
            f"the model's {arch.mtp_uncounted} multi-token-prediction layer(s) "
            f"(num_nextn_predict_layers, about {arch.mtp_parameters / 1e6:,.0f}M parameters) "
            "are not counted, "
            "nor what Megatron's MTP loss holds when model.mtp trains them"
        )
    if arch.layer_types:
        assumptions.append(
            f"{arch.num_hidden_layers - arch.full_attention_layers} of {arch.num_hidden_layers} "
            "layers are Gated DeltaNet linear attention: what they keep for backward is stated "
            "from flash-linear-attention's GPU kernels, not measured; vLLM's cache holds their "
            "recurrent states in blocks shared with the attention layers' KV"
        )
    for role in layout.roles:
        assumptions.extend(said for said in role.assumed if said not in assumptions)
    for serving in (layout.rollout, layout.reward):
        if serving is None:
            continue
        assumptions.extend(
            said for said in (engine_assumption(serving), quantization_assumption(serving)) if said
        )
    if request.gpu is not None:
        capacity, assumed, gpu = request.gpu.usable_bytes, False, request.gpu.label()
    else:
        largest = smallest_and_largest()[1]
        capacity, assumed = largest.usable_bytes, True
        gpu = f"none given (server start judged on the largest in the table, {largest.label()})"
        assumptions.append(
            f"no GPU type: the rollout server's start is judged on {largest.name}, the largest GPU "
            f"of the table (if it cannot start there, it cannot start on any); give --gpu for the rest"
        )
    ranks = ranks_for(layout, capacity)
    if request.gpu is None:
        found = server_cannot_start(layout, capacity, f" even on {largest.name}")
    elif with_fixes:
        found = list(verdicts(layout, ranks, capacity, request.margin, resolved, request))
    else:
        found = list(verdicts_only(layout, ranks, capacity, request.margin))
    server: dict[str, int | float] = {}
    memories = passes.server_memories(layout, capacity)
    if "rollout" in memories:
        mem = memories["rollout"]
        server = {
            "weights": mem.weights, "claimed": mem.claimed, "share": mem.share, "overhead": mem.overhead,
            "outside_share": mem.outside, "cuda_graphs": mem.graphs, "kv_bytes": mem.kv_bytes,
            "blocks": mem.blocks, "block_size": mem.block_size, "page_bytes": mem.page, "kv_tokens": mem.kv_tokens,
            "one_sequence_bytes": mem.one_sequence_bytes,
        }  # fmt: skip
        if mem.window_tokens:
            server["window_tokens"] = mem.window_tokens
        if mem.lora_slots:
            server["lora_slots"] = mem.lora_slots
    return Forecast(
        script=request.script,
        kind=layout.kind,
        model=model.architecture.name,
        model_origin=f"{model.origin}: {model.where}",
        gpu=gpu,
        capacity=None if assumed else capacity,
        capacity_assumed=assumed,
        margin=request.margin,
        world=layout.world,
        ranks=ranks,
        verdicts=tuple(found),
        assumptions=tuple(assumptions),
        server=server,
        refused=refusals(resolved, layout, request.facts.release if request.facts else ""),
    )
