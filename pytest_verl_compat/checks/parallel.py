"""Parallel layouts: what must fit the GPUs, for every role that starts an engine.

LoRA serving needs no check in 0.9.0: SGLang serves the unmerged adapter
(sglang_rollout/utils.py:29 lora_served_as_adapter) and vLLM with dummy weights gets the base
model on the first sync (engine_workers.py:667, :777-785).

Megatron's layout is checked by megatron.core's ``initialize_model_parallel``, which every
Megatron engine calls when its worker starts (verl/workers/engine/megatron/transformer_impl.py:272-282,
passing tp, pp, vpp, cp, ep and etp): it raises RuntimeError unless the world size divides by
tp × pp × cp and by etp × ep × pp (etp defaults to tp), and unless pp > 1 when a virtual
pipeline size is set.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pytest_verl_compat.checks.examples import MEGATRON
from pytest_verl_compat.checks.registry import CheckInput, Example, Hit, check
from pytest_verl_compat.checks.roles import (
    FSDP_STRATEGIES,
    ROLE_NAMES,
    data_parallel,
    engine_path,
    engine_roles,
    gpu_count,
    is_megatron,
    megatron_sizes,
    role_engine,
    role_strategy,
    ulysses_path,
)

_MCORE = "megatron.core parallel_state.initialize_model_parallel, called at worker start by verl/workers/engine/megatron/transformer_impl.py:272-282"


@check(
    "parallel.rollout-replicas",
    level="error",
    evidence="verl/workers/engine_workers.py:650-655 (asserts GPUs % (tp × dp × pp) == 0 when the rollout starts); verl/workers/rollout/replica.py builds GPUs / (tp × dp × pp) replicas",
    summary="Rollout replicas (tensor × pipeline × data parallel GPUs) that do not fit the GPUs evenly: asserted when the rollout starts.",
    fix="use rollout sizes whose product divides the GPU count",
    example=Example(
        fires=("actor_rollout_ref.rollout.tensor_model_parallel_size=3",),
        twin=("actor_rollout_ref.rollout.tensor_model_parallel_size=4",),
    ),
)
def rollout_replicas(inp: CheckInput) -> Iterator[Hit]:
    rollout = inp.resolved["actor_rollout_ref"]["rollout"]
    n_gpus = gpu_count(inp.resolved)
    dp = int(rollout.get("data_parallel_size") or 1)
    tp = int(rollout["tensor_model_parallel_size"]) * int(rollout["pipeline_model_parallel_size"])
    size = tp * dp
    if n_gpus and (size > n_gpus or n_gpus % size):
        what = "tensor × pipeline parallel" + (f" × data parallel {dp}" if dp > 1 else "")
        yield Hit(
            "actor_rollout_ref.rollout.tensor_model_parallel_size, trainer.n_gpus_per_node",
            f"rollout replicas of {size} GPUs ({what}) do not fit {n_gpus} GPUs",
        )


def _layout_paths(resolved: Mapping[str, Any], role: str) -> str:
    if is_megatron(resolved, role):
        engine = engine_path(resolved, role)
        return ", ".join(
            f"{engine}.{key}"
            for key in (
                "tensor_model_parallel_size",
                "pipeline_model_parallel_size",
                "context_parallel_size",
            )
        )
    if role_strategy(resolved, role) in FSDP_STRATEGIES:
        return ulysses_path(role)
    return engine_path(resolved, role)


@check(
    "parallel.sequence-parallel-divides-gpus",
    level="error",
    evidence=f"verl/utils/config.py:90 (the actor, Megatron: GPUs % (tp × pp × cp), at trainer start); {_MCORE}; the FSDP device mesh (dp × sp = world size, fsdp/transformer_impl.py:227-229)",
    summary="A role's model-parallel layout (FSDP: Ulysses sequence parallel; Megatron: tp × pp × cp) that does not divide the GPUs: validate_config or the device mesh fails.",
    fix="use a layout whose product divides the GPU count",
    example=Example(
        fires=("actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=3",),
        twin=("actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2",),
    ),
)
def sequence_parallel_divides_gpus(inp: CheckInput) -> Iterator[Hit]:
    for role in engine_roles(inp.resolved):
        n_gpus, product, _, factors = data_parallel(inp.resolved, role)
        if n_gpus and n_gpus % product:
            yield Hit(
                _layout_paths(inp.resolved, role),
                f"the {ROLE_NAMES[role]}'s model-parallel layout ({factors} = {product} GPUs) does not divide {n_gpus} GPUs",
                fix=f"use a layout whose product divides {n_gpus}",
            )


@check(
    "parallel.expert-layout-divides-gpus",
    level="error",
    evidence=_MCORE,
    summary="A Megatron expert layout (expert tensor × expert parallel × pipeline parallel) that does not divide the GPUs: megatron.core raises when the worker starts.",
    fix="use expert sizes whose product with pipeline parallel divides the GPU count",
    example=Example(
        base=MEGATRON,
        fires=("actor_rollout_ref.actor.megatron.expert_model_parallel_size=3",),
        twin=("actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",),
    ),
)
def expert_layout_divides_gpus(inp: CheckInput) -> Iterator[Hit]:
    n_gpus = gpu_count(inp.resolved)
    for role in engine_roles(inp.resolved):
        if not is_megatron(inp.resolved, role) or not n_gpus:
            continue
        sizes = megatron_sizes(role_engine(inp.resolved, role))
        product = sizes["etp"] * sizes["ep"] * sizes["pp"]
        if n_gpus % product:
            engine = engine_path(inp.resolved, role)
            yield Hit(
                f"{engine}.expert_model_parallel_size, {engine}.expert_tensor_parallel_size",
                f"the expert layout (expert tensor parallel {sizes['etp']} × expert parallel "
                f"{sizes['ep']} × pipeline parallel {sizes['pp']} = {product} GPUs) does not divide "
                f"{n_gpus} GPUs: megatron.core raises RuntimeError when the {role} worker starts "
                f"in verl {inp.version}",
                fix=f"use expert sizes whose product with pipeline parallel divides {n_gpus}",
            )


@check(
    "parallel.virtual-pipeline-needs-pipeline",
    level="error",
    evidence=_MCORE,
    summary="A Megatron virtual pipeline size without pipeline parallelism (> 1): megatron.core raises when the worker starts.",
    fix="remove the virtual pipeline size or raise pipeline parallel above 1",
    example=Example(
        base=MEGATRON,
        fires=(
            "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1",
            "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2",
        ),
        twin=(
            "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
            "actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2",
        ),
    ),
)
def virtual_pipeline_needs_pipeline(inp: CheckInput) -> Iterator[Hit]:
    for role in engine_roles(inp.resolved):
        if not is_megatron(inp.resolved, role):
            continue
        sizes = megatron_sizes(role_engine(inp.resolved, role))
        if sizes["vpp"] and sizes["pp"] <= 1:
            engine = engine_path(inp.resolved, role)
            yield Hit(
                f"{engine}.virtual_pipeline_model_parallel_size, {engine}.pipeline_model_parallel_size",
                f"a virtual pipeline size ({sizes['vpp']}) needs pipeline parallel > 1: megatron.core "
                f"raises RuntimeError when the {role} worker starts in verl {inp.version}",
                fix=f"remove {engine}.virtual_pipeline_model_parallel_size or raise pipeline parallel",
            )
