"""Parallel layouts: what must fit the GPUs.

LoRA serving needs no check in 0.9.0: SGLang serves the unmerged adapter
(sglang_rollout/utils.py:29 lora_served_as_adapter) and vLLM with dummy weights gets the base
model on the first sync (engine_workers.py:667, :777-785)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pytest_verl_compat.checks.registry import CheckInput, Hit, check
from pytest_verl_compat.checks.roles import data_parallel, gpu_count, is_megatron


@check(
    "parallel.rollout-replicas",
    level="error",
    evidence="verl/workers/rollout/replica.py builds n_gpus / (tp × pp) replicas",
)
def rollout_replicas(inp: CheckInput) -> Iterator[Hit]:
    rollout = inp.resolved["actor_rollout_ref"]["rollout"]
    n_gpus = gpu_count(inp.resolved)
    tp = int(rollout["tensor_model_parallel_size"]) * int(rollout["pipeline_model_parallel_size"])
    if n_gpus and (tp > n_gpus or n_gpus % tp):
        yield Hit(
            "actor_rollout_ref.rollout.tensor_model_parallel_size, trainer.n_gpus_per_node",
            f"rollout replicas of {tp} GPUs (tensor × pipeline parallel) do not fit {n_gpus} GPUs",
        )


def _layout_paths(resolved: Mapping[str, Any]) -> str:
    if is_megatron(resolved):
        engine = f"actor_rollout_ref.actor.{resolved['actor_rollout_ref']['actor']['strategy']}"
        return ", ".join(
            f"{engine}.{key}"
            for key in (
                "tensor_model_parallel_size",
                "pipeline_model_parallel_size",
                "context_parallel_size",
            )
        )
    return "actor_rollout_ref.actor.ulysses_sequence_parallel_size"


@check(
    "parallel.sequence-parallel-divides-gpus",
    level="error",
    evidence="verl/utils/config.py:90 (Megatron: GPUs % (tp × pp × cp)); the FSDP device mesh (dp × sp = world size)",
)
def sequence_parallel_divides_gpus(inp: CheckInput) -> Iterator[Hit]:
    n_gpus, product, _, factors = data_parallel(inp.resolved)
    if n_gpus and n_gpus % product:
        yield Hit(
            _layout_paths(inp.resolved),
            f"the actor's model-parallel layout ({factors} = {product} GPUs) does not divide {n_gpus} GPUs",
            fix=f"use a layout whose product divides {n_gpus}",
        )
