"""The checks of upstream's ``validate_config`` (verl/utils/config.py) and worker configs, statically.

A check of ``validate_config``'s (or of an actor config's ``validate``, which only it calls,
verl/utils/config.py:151) says nothing of a launch that never calls it (fully_async_main's,
``CheckInput.runs_validate_config``).
"""

from __future__ import annotations

from collections.abc import Iterator

from pytest_verl_compat.checks.examples import MICRO, STATIC
from pytest_verl_compat.checks.registry import CheckInput, Example, Hit, check
from pytest_verl_compat.checks.roles import data_parallel, gpu_count, need_reference_policy


@check(
    "validate.responses-over-gpus",
    level="error",
    evidence="verl/utils/config.py:87-110 (validate_config, at trainer start)",
    summary="validate_config's assertion, in static mode: a step's responses must divide over the GPUs (Megatron: data-parallel ranks × micro-batch).",
    fix="make train_batch_size × rollout.n a multiple of the GPU count",
    example=Example(
        fires=(
            *STATIC,
            *MICRO,
            "data.train_batch_size=1001",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1001",
        ),
        twin=(
            *STATIC,
            *MICRO,
            "data.train_batch_size=1000",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1000",
        ),
    ),
)
def responses_over_gpus(inp: CheckInput) -> Iterator[Hit]:
    if not inp.runs_validate_config:
        return
    rollout = inp.resolved["actor_rollout_ref"]["rollout"]
    actor = inp.resolved["actor_rollout_ref"]["actor"]
    if actor["use_dynamic_bsz"]:
        return
    n_gpus = gpu_count(inp.resolved)
    responses = int(inp.resolved["data"]["train_batch_size"]) * int(rollout["n"])
    # Megatron: the unit is the data-parallel size times the per-GPU micro-batch; else the GPUs.
    minimal, unit = n_gpus, f"{n_gpus} GPUs"
    if actor.get("strategy") == "megatron":
        _, product, dp, factors = data_parallel(inp.resolved)
        if n_gpus % product:
            return  # the layout check reports this (config.py:90 asserts it first)
        micro = actor.get("ppo_micro_batch_size_per_gpu")
        if micro is None:
            return
        minimal = dp * int(micro)
        unit = f"{dp} data-parallel ranks ({n_gpus} GPUs / ({factors})) × micro-batch {micro} = {minimal}"
    if minimal and responses % minimal:
        yield Hit(
            "data.train_batch_size, actor_rollout_ref.rollout.n, trainer.n_gpus_per_node",
            f"{responses} responses per step do not divide over {unit}; "
            "validate_config asserts this at trainer start",
        )


@check(
    "validate.no-micro-batch-size",
    level="error",
    evidence="verl/workers/config/actor.py:212",
    summary="Static mode (use_dynamic_bsz=False) with no actor micro-batch size: ActorConfig asserts one is set.",
    fix="set actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    example=Example(fires=(*STATIC, *MICRO[1:]), twin=(*STATIC, *MICRO)),
)
def no_micro_batch_size(inp: CheckInput) -> Iterator[Hit]:
    actor = inp.resolved["actor_rollout_ref"]["actor"]
    if (
        not actor["use_dynamic_bsz"]
        and actor["ppo_micro_batch_size"] is None
        and actor["ppo_micro_batch_size_per_gpu"] is None
    ):
        yield Hit(
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
            "dynamic batch size is off and no micro-batch size is set",
            fix="set actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        )


@check(
    "validate.no-log-prob-micro-batch-size",
    level="error",
    evidence="verl/utils/config.py:141",
    summary="Static mode with no log-prob micro-batch size for the rollout (or the reference): validate_config raises.",
    fix="set actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu (and the reference's)",
    example=Example(
        fires=(*STATIC, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"),
        twin=(*STATIC, *MICRO),
    ),
)
def no_log_prob_micro_batch_size(inp: CheckInput) -> Iterator[Hit]:
    if not inp.runs_validate_config:
        return
    arr = inp.resolved["actor_rollout_ref"]
    if arr["actor"]["use_dynamic_bsz"]:
        return
    sections = [("actor_rollout_ref.rollout", arr["rollout"])]
    if need_reference_policy(inp.resolved):
        sections.append(("actor_rollout_ref.ref", arr["ref"]))
    for prefix, section in sections:
        if (
            section["log_prob_micro_batch_size"] is None
            and section["log_prob_micro_batch_size_per_gpu"] is None
        ):
            yield Hit(
                f"{prefix}.log_prob_micro_batch_size_per_gpu",
                "dynamic batch size is off and no log-prob micro-batch size is set",
                fix=f"set {prefix}.log_prob_micro_batch_size_per_gpu",
            )


@check(
    "validate.sampled-validation-temperature",
    level="error",
    evidence="verl/utils/config.py:187",
    summary="Sampled validation (val_kwargs.do_sample=True) with a temperature of 0 or less: validate_config asserts a positive temperature.",
    fix="set a positive actor_rollout_ref.rollout.temperature, or val_kwargs.do_sample=False",
    example=Example(
        fires=(
            "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
            "actor_rollout_ref.rollout.temperature=0",
        ),
        twin=(
            "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
            "actor_rollout_ref.rollout.temperature=1.0",
        ),
    ),
)
def sampled_validation_temperature(inp: CheckInput) -> Iterator[Hit]:
    if not inp.runs_validate_config:
        return
    rollout = inp.resolved["actor_rollout_ref"]["rollout"]
    if rollout["val_kwargs"]["do_sample"] and rollout["temperature"] <= 0:
        yield Hit(
            "actor_rollout_ref.rollout.val_kwargs.do_sample, actor_rollout_ref.rollout.temperature",
            "sampled validation needs a positive temperature",
        )


@check(
    "validate.sequence-parallel-needs-remove-padding",
    level="error",
    evidence="verl/workers/config/actor.py:339 (FSDPActorConfig.validate)",
    summary="The actor's deprecated Ulysses sequence parallel size above 1 without use_remove_padding: FSDPActorConfig.validate raises.",
    fix="set actor_rollout_ref.model.use_remove_padding=True",
    example=Example(
        fires=(
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            "actor_rollout_ref.model.use_remove_padding=False",
        ),
        twin=(
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            "actor_rollout_ref.model.use_remove_padding=True",
        ),
    ),
)
def sequence_parallel_needs_remove_padding(inp: CheckInput) -> Iterator[Hit]:
    if not inp.runs_validate_config:
        return
    arr = inp.resolved["actor_rollout_ref"]
    if (
        int(arr["actor"].get("ulysses_sequence_parallel_size") or 1) > 1
        and not arr["model"]["use_remove_padding"]
    ):
        yield Hit(
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size, actor_rollout_ref.model.use_remove_padding",
            "sequence parallelism needs use_remove_padding=True",
        )


@check(
    "worker.dynamic-batch-disagrees",
    level="error",
    evidence="verl/workers/engine_workers.py:611 (asserted when the actor worker starts)",
    summary="actor.use_dynamic_bsz and rollout.log_prob_use_dynamic_bsz that differ: the actor worker asserts they are equal when it starts.",
    fix="set both to the same value",
    example=Example(
        fires=("actor_rollout_ref.actor.use_dynamic_bsz=False",),
        twin=(
            "actor_rollout_ref.actor.use_dynamic_bsz=False",
            "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=False",
        ),
    ),
)
def dynamic_batch_disagrees(inp: CheckInput) -> Iterator[Hit]:
    arr = inp.resolved["actor_rollout_ref"]
    actor, rollout = (
        arr["actor"].get("use_dynamic_bsz"),
        arr["rollout"].get("log_prob_use_dynamic_bsz"),
    )
    if bool(actor) != bool(rollout):
        yield Hit(
            "actor_rollout_ref.actor.use_dynamic_bsz, actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
            f"actor.use_dynamic_bsz={actor} but rollout.log_prob_use_dynamic_bsz={rollout}: verl "
            f"{inp.version} asserts they are equal when the actor worker starts",
            fix="set both to the same value",
        )
