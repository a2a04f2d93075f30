"""Batch arithmetic: mini-batches against the batch, responses against ranks, micro-batch sizes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pytest_verl_compat.checks.examples import STATIC
from pytest_verl_compat.checks.micro_batch import critic_budgets, step_rows
from pytest_verl_compat.checks.model_facts import ACTOR_MODEL
from pytest_verl_compat.checks.registry import CheckInput, Example, Hit, check
from pytest_verl_compat.checks.roles import (
    data_parallel,
    gpu_count,
    need_critic,
    need_reference_policy,
    reference_worker,
    sequence_parallel,
    uses_v1,
)


def _mini_batch_roles(resolved: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    roles = [("actor_rollout_ref.actor", resolved["actor_rollout_ref"]["actor"])]
    if need_critic(resolved):
        roles.append(("critic", resolved["critic"]))
    return roles


def _sizes(resolved: Mapping[str, Any]) -> tuple[int, int]:
    return int(resolved["data"]["train_batch_size"]), int(
        resolved["actor_rollout_ref"]["rollout"]["n"]
    )


_CRITIC_INFER = "critic.ppo_infer_max_token_len_per_gpu"


@check(
    "batch.mini-batch-not-positive",
    level="error",
    evidence="verl/workers/engine_workers.py:266-270 (train_mini_batch: a mini-batch of 0 passes the rank assertion and leaves 0 rows per GPU to split into micro-batches)",
    summary="A mini-batch size (actor or critic ppo_mini_batch_size) of 0 or less.",
    fix="use a positive mini-batch size that divides data.train_batch_size",
    example=Example(
        fires=("actor_rollout_ref.actor.ppo_mini_batch_size=0",),
        twin=("actor_rollout_ref.actor.ppo_mini_batch_size=128",),
    ),
)
def mini_batch_not_positive(inp: CheckInput) -> Iterator[Hit]:
    for prefix, role in _mini_batch_roles(inp.resolved):
        mini = int(role["ppo_mini_batch_size"])
        if mini <= 0:
            yield Hit(f"{prefix}.ppo_mini_batch_size", f"must be positive, got {mini}")


@check(
    "batch.mini-batch-larger-than-batch",
    level="error",
    evidence="verl/workers/config/actor.py:229-233 (ActorConfig.validate, from validate_config at trainer start, verl/utils/config.py:147); with use_dynamic_bsz=True and trainer.use_v1=False verl/utils/tensordict_utils.py:588 (make_iterator, engine_workers.py:272, at the first update)",
    summary="A mini-batch larger than the batch: ActorConfig.validate raises at trainer start (static mode), make_iterator asserts at the first update (dynamic mode without V1).",
    fix="use a mini-batch size that divides data.train_batch_size",
    example=Example(
        fires=("trainer.use_v1=False", "actor_rollout_ref.actor.ppo_mini_batch_size=2048"),
        twin=("trainer.use_v1=False", "actor_rollout_ref.actor.ppo_mini_batch_size=1024"),
    ),
)
def mini_batch_larger_than_batch(inp: CheckInput) -> Iterator[Hit]:
    train, n = _sizes(inp.resolved)
    for prefix, role in _mini_batch_roles(inp.resolved):
        mini = int(role["ppo_mini_batch_size"])
        # V1 pads the step batch up to the mini-batch (batch.padded-step), so make_iterator never
        # sees a remainder; only the static-mode validate still raises.
        if role.get("use_dynamic_bsz") and uses_v1(inp.resolved):
            continue
        # Static mode fails in ActorConfig.validate, which only validate_config calls.
        if not role.get("use_dynamic_bsz") and not inp.runs_validate_config:
            continue
        if 0 < mini and mini > train:
            yield Hit(
                f"data.train_batch_size, {prefix}.ppo_mini_batch_size",
                f"the mini-batch ({mini} prompts = {mini * n} responses) is larger than the batch "
                f"({train} prompts = {train * n} responses); verl {inp.version} fails: "
                + (
                    "make_iterator asserts batch % mini-batch == 0 at the first update"
                    if role.get("use_dynamic_bsz")
                    else "ActorConfig.validate raises ValueError at trainer start"
                ),
                fix=f"set {prefix}.ppo_mini_batch_size to a divisor of {train}",
            )


@check(
    "batch.mini-batch-does-not-divide-batch",
    level="error",
    evidence="verl/trainer/ppo/ray_trainer.py _update_actor/_update_critic split the batch by ppo_mini_batch_size * rollout.n (trainer.use_v1=False; V1 pads instead, see batch.padded-step)",
    summary="Without the V1 trainer (trainer.use_v1=False), a batch that does not split into whole mini-batches.",
    fix="use a mini-batch size that divides data.train_batch_size",
    example=Example(
        fires=("trainer.use_v1=False", "actor_rollout_ref.actor.ppo_mini_batch_size=100"),
        twin=("trainer.use_v1=False", "actor_rollout_ref.actor.ppo_mini_batch_size=128"),
    ),
)
def mini_batch_does_not_divide(inp: CheckInput) -> Iterator[Hit]:
    if uses_v1(inp.resolved):
        return
    train, n = _sizes(inp.resolved)
    for prefix, role in _mini_batch_roles(inp.resolved):
        mini = int(role["ppo_mini_batch_size"])
        if 0 < mini <= train and train % mini:
            yield Hit(
                f"data.train_batch_size, {prefix}.ppo_mini_batch_size",
                f"{train} prompts × n={n} = {train * n} responses per step do not split into mini-batches "
                f"of {mini} prompts × {n} = {mini * n} responses ({train * n} / {mini * n} = {train * n / (mini * n):.2f})",
                fix=f"use a mini-batch size that divides {train}",
            )


@check(
    "batch.padded-step",
    level="warning",
    evidence="verl/trainer/ppo/v1/trainer_base.py:1434-1466 (_balance_batch pads the step batch up to lcm(actor DP, critic and actor mini-batch responses)); verl/trainer/ppo/padding_utils.py:127-170 (the padding: no-op responses with zeroed rewards)",
    summary="V1 never fails on a batch that does not split into mini-batches and ranks: it pads every step with no-op responses, so a mini-batch holds fewer real responses than configured.",
    fix="use a train_batch_size × rollout.n that is a multiple of the mini-batch responses and the data-parallel size",
    example=Example(fires=("data.train_batch_size=1000",), twin=("data.train_batch_size=2048",)),
)
def padded_step(inp: CheckInput) -> Iterator[Hit]:
    """V1 never fails on a batch that does not split into mini-batches: it pads it, silently."""
    if not uses_v1(inp.resolved):
        return
    rows, multiple, padded = step_rows(inp.resolved)
    _, _, dp, _ = data_parallel(inp.resolved)
    static = not inp.resolved["actor_rollout_ref"]["actor"].get("use_dynamic_bsz")
    if padded == rows or (static and rows % dp):  # static: validate_config fails first
        return
    yield Hit(
        "data.train_batch_size, actor_rollout_ref.actor.ppo_mini_batch_size",
        f"{rows} responses per step are not a multiple of {multiple} (the data-parallel size and "
        f"the mini-batch responses); verl {inp.version} does not fail: its V1 trainer appends "
        f"{padded - rows} no-op padding responses every step, so a mini-batch holds fewer real "
        "responses than ppo_mini_batch_size says",
        fix=f"use a train_batch_size × rollout.n that is a multiple of {multiple}",
    )


@check(
    "batch.mini-batch-over-ranks",
    level="error",
    evidence="verl/workers/engine_workers.py:266-268 (train_mini_batch asserts mini-batch responses % data-parallel size == 0, at the role's first update, whether or not use_dynamic_bsz)",
    summary="A mini-batch whose responses (ppo_mini_batch_size × rollout.n) do not split over the data-parallel ranks: train_mini_batch asserts it at the role's first update.",
    fix="use a mini-batch whose responses divide by the data-parallel size",
    example=Example(
        fires=("actor_rollout_ref.actor.ppo_mini_batch_size=1",),
        twin=("actor_rollout_ref.actor.ppo_mini_batch_size=8",),
    ),
)
def mini_batch_over_ranks(inp: CheckInput) -> Iterator[Hit]:
    train, n = _sizes(inp.resolved)
    for prefix, role in _mini_batch_roles(inp.resolved):
        mini = int(role["ppo_mini_batch_size"])
        n_gpus, _, dp, factors = data_parallel(
            inp.resolved, "critic" if prefix == "critic" else "actor"
        )
        mini_responses = mini * n
        if 0 < mini <= train and not train % mini and mini_responses % dp:
            yield Hit(
                f"{prefix}.ppo_mini_batch_size, trainer.n_gpus_per_node",
                f"a mini-batch of {mini} prompts × n={n} = {mini_responses} responses does not split over "
                f"{dp} data-parallel ranks ({n_gpus} GPUs / ({factors})): "
                f"{mini_responses} / {dp} = {mini_responses / dp:.2f} responses per GPU",
                fix=f"use a mini-batch whose responses divide by {dp}",
            )


@check(
    "batch.responses-over-ranks",
    level="error",
    evidence="verl/utils/config.py:110 (skipped when use_dynamic_bsz=True); verl #473, PR #559; trainer.use_v1=False only (V1 pads, see batch.padded-step; in static mode validate.responses-over-gpus)",
    summary="Without the V1 trainer, a step's responses (train_batch_size × rollout.n) that do not divide over the data-parallel ranks.",
    fix="make train_batch_size × rollout.n a multiple of the data-parallel size",
    example=Example(
        fires=(
            "trainer.use_v1=False",
            "data.train_batch_size=1001",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1001",
        ),
        twin=(
            "trainer.use_v1=False",
            "data.train_batch_size=1000",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1000",
        ),
    ),
)
def responses_over_ranks(inp: CheckInput) -> Iterator[Hit]:
    if uses_v1(inp.resolved):
        return
    train, n = _sizes(inp.resolved)
    _, _, dp, _ = data_parallel(inp.resolved)
    responses = train * n
    if responses % dp:
        pad = dp - responses % dp
        yield Hit(
            "data.train_batch_size, actor_rollout_ref.rollout.n, trainer.n_gpus_per_node",
            f"{train} prompts × n={n} = {responses} responses per step do not divide over {dp} "
            f"data-parallel ranks; a trainer would pad {pad} dummy responses or fail",
            fix=f"make train_batch_size × n a multiple of {dp}",
        )


@check(
    "batch.token-budget-below-sequence",
    level="error",
    evidence="verl/utils/seqlen_balancing.py:384 (rearrange_micro_batches asserts max_token_len >= the longest sequence, at the first pass that meets one; verl #571); the critic's budgets: verl/trainer/ppo/v1/trainer_base.py:251-252, ray_trainer.py:810-811",
    summary="A per-GPU token budget (dynamic batch sizes) below the longest sequence, prompt + response: rearrange_micro_batches asserts it at the first pass that meets one.",
    fix="raise the budget to at least max_prompt_length + max_response_length (over the sequence-parallel size)",
    example=Example(
        fires=("actor_rollout_ref.actor.ppo_max_token_len_per_gpu=2000",),
        twin=("actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096",),
    ),
)
def token_budget_below_sequence(inp: CheckInput) -> Iterator[Hit]:
    resolved = inp.resolved
    arr, data = resolved["actor_rollout_ref"], resolved["data"]
    longest = int(data["max_prompt_length"]) + int(data["max_response_length"])
    budgets: list[tuple[str, int, Any]] = []
    if arr["actor"].get("use_dynamic_bsz"):
        budgets.append(
            (
                "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
                sequence_parallel(resolved),
                arr["actor"].get("ppo_max_token_len_per_gpu"),
            )
        )
    if arr["rollout"].get("log_prob_use_dynamic_bsz"):
        budgets.append(
            (
                "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
                sequence_parallel(resolved),
                arr["rollout"].get("log_prob_max_token_len_per_gpu"),
            )
        )
    if need_reference_policy(resolved) and arr["ref"].get("log_prob_use_dynamic_bsz"):
        budgets.append(
            (
                "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
                sequence_parallel(resolved, "ref"),
                arr["ref"].get("log_prob_max_token_len_per_gpu"),
            )
        )
    if need_critic(resolved):
        # The critic always packs by tokens in 0.9.0 (checks/micro_batch.py), whatever its
        # use_dynamic_bsz says.
        sp = sequence_parallel(resolved, "critic")
        budgets.extend((key, sp, budget) for key, budget in critic_budgets(resolved))
    for key, sp, budget in budgets:
        if budget is not None and int(budget) * sp < longest:
            yield Hit(
                f"{key}, data.max_response_length",
                f"one sequence can be {data['max_prompt_length']} + {data['max_response_length']} = {longest} "
                f"tokens, more than the per-GPU token budget {budget} × sequence parallel {sp}",
                fix=f"raise {key} to at least {-(-longest // sp)}"
                + (
                    " (a `+` override: the key is not in the config tree)"
                    if key == _CRITIC_INFER
                    else ""
                ),
            )


@check(
    "batch.deprecated-global-micro-batch",
    level="error",
    evidence="verl/workers/engine_workers.py:630-631 assert the actor's and rollout's *_per_gpu sizes at worker start (use_dynamic_bsz=False); the reference's: :541-543 and verl/workers/engine/utils.py:124; the critic's: verl/workers/config/critic.py:154-158, :230-234; verl PR #833",
    summary="A deprecated global micro-batch size (ppo_micro_batch_size, log_prob_micro_batch_size) in static mode: the pinned release never converts it to a per-GPU size and fails at worker start or the first pass.",
    fix="set the *_per_gpu size instead (the global size over the GPUs)",
    example=Example(
        fires=(
            *STATIC,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size=64",
        ),
        twin=(
            *STATIC,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        ),
    ),
)
def deprecated_global_micro_batch(inp: CheckInput) -> Iterator[Hit]:
    """Deprecated global micro-batch sizes, which the pinned release no longer divides by the GPU count."""
    resolved = inp.resolved
    arr = resolved["actor_rollout_ref"]
    n_gpus = max(gpu_count(resolved), 1)
    sections = [
        ("actor_rollout_ref.actor", arr["actor"], "ppo_micro_batch_size", "use_dynamic_bsz"),
        (
            "actor_rollout_ref.rollout",
            arr["rollout"],
            "log_prob_micro_batch_size",
            "log_prob_use_dynamic_bsz",
        ),
    ]
    if reference_worker(resolved):
        sections.append(
            (
                "actor_rollout_ref.ref",
                arr["ref"],
                "log_prob_micro_batch_size",
                "log_prob_use_dynamic_bsz",
            )
        )
    if need_critic(resolved):
        sections.append(("critic", resolved["critic"], "ppo_micro_batch_size", "use_dynamic_bsz"))
    for prefix, section, key, dynamic in sections:
        value = section.get(key)
        if value is None or section.get(dynamic):
            continue
        # what the workers that read it made of it: the global size over the data-parallel
        # ranks, GPUs over Ulysses size (volcengine/verl@004c888 fsdp_workers.py "normalize
        # config"; the forecast reads it so, memory/reading.py _per_gpu)
        sp = sequence_parallel(resolved, "critic" if prefix == "critic" else "actor")
        ranks = max(n_gpus // max(sp, 1), 1)
        per_gpu = max(int(value) // ranks, 1)
        over = (
            f"{n_gpus} GPUs"
            if ranks == n_gpus
            else f"{ranks} data-parallel ranks ({n_gpus} GPUs, Ulysses {sp})"
        )
        if prefix == "critic":
            fails = _critic_global_micro_batch(inp, section, int(value), n_gpus)
            if fails is None:
                continue  # accepted, then never used: the critic packs by tokens
        elif prefix == "actor_rollout_ref.ref":
            # engine_workers.py:541-543 hands the ref engine only the *_per_gpu size (None here);
            # in static mode engine/utils.py:124 then divides by None.
            fails = "the reference worker's micro-batch size stays None and its first log-prob pass (step 1) fails"
        else:
            fails = f"the worker asserts {prefix}.{key}_per_gpu is set at start (engine_workers.py:630-631)"
        yield Hit(
            f"{prefix}.{key}",
            f"the global micro-batch size {value} is deprecated: verl {inp.version} never converts it to "
            f"a per-GPU size, and {fails}; over {over} it means {value} / {ranks} = {per_gpu} per GPU",
            fix=f"set {prefix}.{key}_per_gpu={per_gpu} and remove {prefix}.{key}",
        )


def _critic_global_micro_batch(
    inp: CheckInput, critic: Mapping[str, Any], value: int, n_gpus: int
) -> str | None:
    """How the critic's deprecated global size fails at trainer start (validate_config, config.py:174)."""
    if critic.get("ppo_micro_batch_size_per_gpu") is not None:
        # The tree defaults ppo_micro_batch_size_per_gpu to it: both set, critic.py:154-158 raises.
        return "critic.ppo_micro_batch_size_per_gpu is set too, so CriticConfig raises ValueError at trainer start (critic.py:154-158)"
    sp = sequence_parallel(inp.resolved, "critic")
    if value * sp < n_gpus:
        return f"{value} × sequence parallel {sp} < {n_gpus} GPUs raises ValueError at trainer start (critic.py:230-234)"
    return None


_VLLM_CONTEXT = "verl/workers/rollout/vllm_rollout/vllm_async_server.py:546-552 and :570 (max_tokens clamped to max_model_len - prompt); an unset max_model_len becomes the model's max_position_embeddings (:953-955)"


def _context_hit(inp: CheckInput, error: bool) -> Iterator[Hit]:
    rollout, data = inp.resolved["actor_rollout_ref"]["rollout"], inp.resolved["data"]
    limit = rollout.get("max_model_len")
    where = (
        "actor_rollout_ref.rollout.max_model_len, data.max_prompt_length, data.max_response_length"
    )
    what = f"max_model_len {limit}"
    facts = inp.model_facts.get(ACTOR_MODEL)
    if limit is None and facts is not None and facts.max_position_embeddings is not None:
        # vllm_async_server.py:953-955: unset, it is the model's context length.
        limit = facts.max_position_embeddings
        what = f"the context length {limit} (max_model_len unset: max_position_embeddings of {facts.source})"
        where = "actor_rollout_ref.model.path, data.max_prompt_length, data.max_response_length"
    if rollout.get("name") != "vllm" or limit is None:
        return
    prompt, response = int(data["max_prompt_length"]), int(data["max_response_length"])
    if error and int(limit) <= prompt:
        yield Hit(
            where,
            f"{what} leaves no room to generate after a prompt of {prompt} tokens: "
            f"verl {inp.version}'s vLLM server raises ValueError on such a prompt during rollout",
            fix=f"set actor_rollout_ref.rollout.max_model_len to at least {prompt + response}"
            if rollout.get("max_model_len") is not None
            else f"shorten data.max_prompt_length below {limit}",
        )
    elif not error and prompt < int(limit) < prompt + response:
        yield Hit(
            where,
            f"{what} is below prompt + response = {prompt} + {response} = "
            f"{prompt + response}: verl {inp.version} silently cuts responses to "
            f"{limit} - prompt tokens",
            fix=f"set actor_rollout_ref.rollout.max_model_len to at least {prompt + response}"
            if rollout.get("max_model_len") is not None
            else f"keep prompt + response within {limit}",
        )


@check(
    "rollout.max-model-len-below-prompt",
    level="error",
    evidence=_VLLM_CONTEXT,
    summary="A vLLM max_model_len (or, unset, the model's context length) that leaves no room to generate after the longest prompt: the server raises on such a prompt during rollout.",
    fix="set actor_rollout_ref.rollout.max_model_len to at least prompt + response",
    example=Example(
        fires=("actor_rollout_ref.rollout.max_model_len=1000",),
        twin=("actor_rollout_ref.rollout.max_model_len=4096",),
    ),
)
def max_model_len_below_prompt(inp: CheckInput) -> Iterator[Hit]:
    return _context_hit(inp, error=True)


@check(
    "rollout.max-model-len-below-sequence",
    level="warning",
    evidence=_VLLM_CONTEXT,
    summary="A vLLM max_model_len between the prompt and prompt + response: verl silently cuts responses to max_model_len - prompt tokens.",
    fix="set actor_rollout_ref.rollout.max_model_len to at least prompt + response",
    example=Example(
        fires=("actor_rollout_ref.rollout.max_model_len=2048",),
        twin=("actor_rollout_ref.rollout.max_model_len=4096",),
    ),
)
def max_model_len_below_sequence(inp: CheckInput) -> Iterator[Hit]:
    return _context_hit(inp, error=False)
