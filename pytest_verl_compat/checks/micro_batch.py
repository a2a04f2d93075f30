"""Per-GPU micro-batches in static mode (use_dynamic_bsz=False), and what the critic really reads.

In static mode every engine cuts the rows one rank holds into micro-batches of
``micro_batch_size_per_gpu`` rows and asserts they divide exactly
(verl/workers/engine/utils.py:124-127, prepare_micro_batches, called by the FSDP, Megatron,
VeOmni and TorchTitan engines). The rows a rank holds are the mini-batch's share for an update
(verl/workers/engine_workers.py:266-270) and the whole padded step batch's share for a log-prob
pass. The critic never runs in static mode in 0.9.0: its engine config keeps
``EngineConfig.use_dynamic_bsz=True`` (verl/workers/config/engine.py:102), because neither trainer
copies the critic's batch settings into it (verl/trainer/ppo/v1/trainer_base.py:250-252,
verl/trainer/ppo/ray_trainer.py:808-811).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

from pytest_verl_compat.checks.examples import MICRO, STATIC
from pytest_verl_compat.checks.fields import field_key
from pytest_verl_compat.checks.registry import CheckInput, Example, Hit, check
from pytest_verl_compat.checks.roles import (
    FSDP_STRATEGIES,
    data_parallel,
    model_parallel_sizes,
    need_critic,
    reference_worker,
    uses_v1,
)

_PREPARE = "verl/workers/engine/utils.py:124-127 (prepare_micro_batches asserts rows % micro_batch_size_per_gpu == 0)"


def step_rows(resolved: Mapping[str, Any], actor_updates: bool = True) -> tuple[int, int, int]:
    """(responses of one local V1 step, the multiple they are padded to, the padded count).

    trainer_base.py:515 samples train_batch_size / parameter_sync_step prompts per local step;
    :1465-1466 pads the batch up to lcm(actor DP, critic and actor mini-batch responses)
    (:1434-1448) with dummy responses; the dispatch then splits it evenly over the ranks. The
    actor's mini-batch counts only on steps that update the actor (``actor_updates``: after
    trainer.critic_warmup, :1445).
    """
    trainer = resolved["trainer"]
    rollout_n = int(resolved["actor_rollout_ref"]["rollout"]["n"])
    v1 = trainer.get("v1") if isinstance(trainer.get("v1"), Mapping) else {}
    mode = v1.get(str(v1.get("trainer_mode") or "sync"))
    sync_step = int(mode.get("parameter_sync_step") or 1) if isinstance(mode, Mapping) else 1
    rows = int(resolved["data"]["train_batch_size"]) // max(sync_step, 1) * rollout_n
    _, _, dp, _ = data_parallel(resolved)
    multiple = dp
    if need_critic(resolved):
        multiple = math.lcm(multiple, int(resolved["critic"]["ppo_mini_batch_size"]) * rollout_n)
    if actor_updates:
        actor_mini = int(resolved["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"]) * rollout_n
        multiple = math.lcm(multiple, max(actor_mini, 1))
    return rows, multiple, -(-rows // multiple) * multiple


@check(
    "batch.micro-batch-does-not-divide-mini-batch",
    level="error",
    evidence=_PREPARE,
    summary="In static mode (use_dynamic_bsz=False), the actor's per-GPU share of a mini-batch must split into micro-batches of ppo_micro_batch_size_per_gpu: prepare_micro_batches asserts it at the first update.",
    fix="use a micro-batch size that divides the mini-batch's responses per GPU",
    example=Example(
        fires=(*STATIC, *MICRO, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"),
        twin=(*STATIC, *MICRO, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"),
    ),
)
def micro_batch_does_not_divide_mini_batch(inp: CheckInput) -> Iterator[Hit]:
    actor = inp.resolved["actor_rollout_ref"]["actor"]
    micro = actor.get("ppo_micro_batch_size_per_gpu")
    if actor.get("use_dynamic_bsz") or micro is None or int(micro) <= 0:
        return
    rollout_n = int(inp.resolved["actor_rollout_ref"]["rollout"]["n"])
    mini = int(actor["ppo_mini_batch_size"]) * rollout_n
    n_gpus, _, dp, factors = data_parallel(inp.resolved)
    if mini <= 0 or mini % dp:
        return  # batch.mini-batch-over-ranks: engine_workers.py:266 asserts first
    per_gpu = mini // dp
    # trainer_base.py:582: the actor updates once critic_warmup <= global_steps (from 1).
    first_update = max(1, int(inp.resolved["trainer"].get("critic_warmup") or 0))
    if per_gpu % int(micro):
        yield Hit(
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu, actor_rollout_ref.actor.ppo_mini_batch_size",
            f"a mini-batch of {actor['ppo_mini_batch_size']} prompts × n={rollout_n} = {mini} responses "
            f"is {per_gpu} per GPU over {dp} data-parallel ranks ({n_gpus} GPUs / ({factors})), "
            f"which micro-batches of {micro} do not divide: verl {inp.version} fails an assertion "
            f"at the first actor update (step {first_update})",
            fix=f"set actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu to a divisor of {per_gpu}",
        )


def _log_prob_passes(resolved: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    arr = resolved["actor_rollout_ref"]
    passes: list[tuple[str, str, Mapping[str, Any]]] = []
    correction = resolved["algorithm"].get("rollout_correction")
    bypass = isinstance(correction, Mapping) and bool(correction.get("bypass_mode"))
    if not bypass:  # trainer_base.py:1486-1487: bypass mode takes the rollout's log-probs
        passes.append(("actor_rollout_ref.rollout", "actor", arr["rollout"]))
    if reference_worker(resolved):
        passes.append(("actor_rollout_ref.ref", "ref", arr["ref"]))
    return passes


@check(
    "batch.log-prob-micro-batch-does-not-divide-batch",
    level="error",
    evidence=f"{_PREPARE}, for the old log-probs (engine_workers.py:617-619) and the reference (:574-578); the step batch is padded by verl/trainer/ppo/v1/trainer_base.py:1434-1466",
    summary="In static mode, the (padded) step batch's share per GPU must split into log-prob micro-batches, for the old log-probs and the reference: prepare_micro_batches asserts it in the first log-prob pass.",
    fix="use a log-prob micro-batch size that divides the step's responses per GPU",
    example=Example(
        fires=(*STATIC, *MICRO, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=7"),
        twin=(*STATIC, *MICRO, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16"),
    ),
)
def log_prob_micro_batch(inp: CheckInput) -> Iterator[Hit]:
    resolved = inp.resolved
    if not uses_v1(resolved):
        return  # the legacy trainer pads differently; only the V1 batch is derived here
    # Warm-up steps (critic only, trainer_base.py:582) pad without the actor's mini-batch.
    warmup = need_critic(resolved) and int(resolved["trainer"].get("critic_warmup") or 0) > 1
    first_update = max(1, int(resolved["trainer"].get("critic_warmup") or 0))
    variants = [(1, *step_rows(resolved, actor_updates=False))] if warmup else []
    variants.append((first_update if warmup else 1, *step_rows(resolved)))
    for prefix, role, section in _log_prob_passes(resolved):
        micro = section.get("log_prob_micro_batch_size_per_gpu")
        if section.get("log_prob_use_dynamic_bsz") or micro is None or int(micro) <= 0:
            continue
        n_gpus, _, dp, factors = data_parallel(resolved, role)
        failing = [
            (step, rows, multiple, padded)
            for step, rows, multiple, padded in variants
            if not padded % dp and (padded // dp) % int(micro)
        ]
        if failing:
            step, rows, multiple, padded = failing[0]
            per_gpu = padded // dp
            pad = f" (padded from {rows} to a multiple of {multiple})" if padded != rows else ""
            yield Hit(
                f"{prefix}.log_prob_micro_batch_size_per_gpu, data.train_batch_size",
                f"each step hands the {role} log-prob pass {padded} responses{pad}, {per_gpu} per GPU "
                f"over {dp} data-parallel ranks ({n_gpus} GPUs / ({factors})), which micro-batches "
                f"of {micro} do not divide: verl {inp.version} fails an assertion in the first "
                f"{'old' if role == 'actor' else 'reference'} log-prob pass (step {step})",
                fix=f"set {prefix}.log_prob_micro_batch_size_per_gpu to a divisor of {per_gpu}",
            )


# The critic settings that never reach its engine (see the module docstring). Its deprecated
# critic.ppo_micro_batch_size is batch.deprecated-global-micro-batch's: it fails at start.
_CRITIC_UNREAD = (
    "critic.ppo_micro_batch_size_per_gpu",
    "critic.forward_micro_batch_size_per_gpu",
    "critic.forward_micro_batch_size",
    "critic.forward_max_token_len_per_gpu",
    "critic.use_dynamic_bsz",
)
CRITIC_BUDGET_DEFAULT = 32768  # verl/workers/config/critic.py:91 (not in the YAML tree)


def critic_budgets(resolved: Mapping[str, Any]) -> list[tuple[str, int]]:
    """The critic's per-GPU token budgets by the key they come from, for the selected trainer.

    V1: trainer_base.py:251-252 sets both the update and the value pass to
    ppo_infer_max_token_len_per_gpu; legacy: ray_trainer.py:810-811 uses ppo_max_token_len_per_gpu
    for the update.
    """
    critic = resolved["critic"]
    infer = critic.get("ppo_infer_max_token_len_per_gpu")
    budgets = [
        (
            "critic.ppo_infer_max_token_len_per_gpu",
            int(infer) if infer is not None else CRITIC_BUDGET_DEFAULT,
        )
    ]
    if not uses_v1(resolved) and critic.get("ppo_max_token_len_per_gpu") is not None:
        budgets.append(
            ("critic.ppo_max_token_len_per_gpu", int(critic["ppo_max_token_len_per_gpu"]))
        )
    return budgets


def _critic_settings_from_values(critic: Mapping[str, Any]) -> list[str]:
    """The settings a resolved file (which does not say what was set) shows as set: values the
    tree's defaults would not give (critic.yaml: null micro sizes, the token budget 32768, the
    forward budget following it)."""
    found = [
        f"critic.{name}={critic[name]}"
        for name in (
            "ppo_micro_batch_size_per_gpu",
            "forward_micro_batch_size_per_gpu",
            "forward_micro_batch_size",
        )
        if critic.get(name) is not None
    ]
    budget = critic.get("ppo_max_token_len_per_gpu")
    if budget is not None and budget != CRITIC_BUDGET_DEFAULT:
        found.append(f"critic.ppo_max_token_len_per_gpu={budget}")
    forward = critic.get("forward_max_token_len_per_gpu")
    if forward is not None and forward != budget:
        found.append(f"critic.forward_max_token_len_per_gpu={forward}")
    # use_dynamic_bsz is left out: its default follows the actor's, so False says nothing.
    return found


@check(
    "critic.batch-settings-ignored",
    level="warning",
    evidence="verl/workers/config/engine.py:102 (EngineConfig.use_dynamic_bsz=True), never overwritten for the critic: verl/trainer/ppo/v1/trainer_base.py:250-252, ray_trainer.py:808-811",
    summary="Explicit critic batch settings (micro-batch sizes, use_dynamic_bsz, ppo_max_token_len_per_gpu under V1) that never reach the critic's engine: it always packs micro-batches by tokens.",
    fix="bound the critic's memory with +critic.ppo_infer_max_token_len_per_gpu=N instead",
    example=Example(
        fires=("algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=4"),
        twin=("algorithm.adv_estimator=gae",),
    ),
)
def critic_batch_settings_ignored(inp: CheckInput) -> Iterator[Hit]:
    if not need_critic(inp.resolved):
        return
    (key, budget), *_ = critic_budgets(inp.resolved)
    for field in inp.explicit_fields or _critic_settings_from_values(inp.resolved["critic"]):
        name = field_key(field)
        if name == "critic.use_dynamic_bsz" and inp.resolved["critic"].get("use_dynamic_bsz"):
            continue  # asks for what the critic does anyway
        if name in _CRITIC_UNREAD or (
            name == "critic.ppo_max_token_len_per_gpu" and uses_v1(inp.resolved)
        ):
            yield Hit(
                name,
                f"`{field}` never reaches the critic's engine in verl {inp.version}: the critic always "
                f"packs micro-batches by tokens, at most {key}={budget} per GPU",
                fix=f"bound the critic's memory with +{key}=N instead",
            )


@check(
    "critic.sequence-parallel-ignored",
    level="warning",
    evidence="verl/workers/config/critic.py:214-221 (FSDPCriticConfig.__post_init__ makes critic.fsdp the engine and never copies the deprecated size into it, unlike the actor's, actor.py:332-333)",
    summary="The deprecated critic.ulysses_sequence_parallel_size, which FSDPCriticConfig never copies into critic.fsdp, the critic's engine (unlike the actor's).",
    fix="set critic.fsdp.ulysses_sequence_parallel_size instead",
    example=Example(
        fires=("algorithm.adv_estimator=gae", "critic.ulysses_sequence_parallel_size=2"),
        twin=("algorithm.adv_estimator=gae", "critic.fsdp.ulysses_sequence_parallel_size=2"),
    ),
)
def critic_sequence_parallel_ignored(inp: CheckInput) -> Iterator[Hit]:
    critic = inp.resolved["critic"]
    if not need_critic(inp.resolved) or critic.get("strategy") not in FSDP_STRATEGIES:
        return
    legacy = int(critic.get("ulysses_sequence_parallel_size") or 1)
    engine_sp = model_parallel_sizes(inp.resolved, "critic")["sequence parallel"]
    if legacy > 1 and engine_sp != legacy:
        yield Hit(
            "critic.ulysses_sequence_parallel_size",
            f"critic.ulysses_sequence_parallel_size={legacy} never reaches the critic's engine in "
            f"verl {inp.version}: the critic runs with sequence parallel {engine_sp} "
            "(critic.fsdp.ulysses_sequence_parallel_size)",
            fix=f"set critic.fsdp.ulysses_sequence_parallel_size={legacy} instead",
        )
