"""The layout against the model: heads, KV heads and experts against the parallel sizes, the
vocabulary against the tokenizer. Fires only when the caller could read the model's config.json
(``CheckInput.model_facts``); without it these checks say nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

from pytest_verl_compat.checks.examples import MEGATRON, QWEN7B
from pytest_verl_compat.checks.model_facts import ACTOR_MODEL, CRITIC_MODEL, ModelFacts
from pytest_verl_compat.checks.registry import CheckInput, Example, Hit, check
from pytest_verl_compat.checks.roles import (
    FSDP_STRATEGIES,
    ROLE_NAMES,
    engine_path,
    engine_roles,
    is_megatron,
    megatron_sizes,
    model_parallel_sizes,
    role_engine,
    role_strategy,
    ulysses_path,
)


def _role_facts(inp: CheckInput) -> Iterator[tuple[str, ModelFacts]]:
    for role in engine_roles(inp.resolved):
        facts = inp.model_facts.get(CRITIC_MODEL if role == "critic" else ACTOR_MODEL)
        if facts is not None:
            yield role, facts


def _megatron_role_facts(inp: CheckInput) -> Iterator[tuple[str, ModelFacts, str, dict[str, int]]]:
    """(role, its model's facts, its engine section's path, its Megatron sizes) per Megatron role."""
    for role, facts in _role_facts(inp):
        if is_megatron(inp.resolved, role):
            engine = engine_path(inp.resolved, role)
            yield role, facts, engine, megatron_sizes(role_engine(inp.resolved, role))


@check(
    "model.ulysses-heads",
    level="error",
    evidence="verl/models/transformers/monkey_patch.py:340-346 (asserted while the FSDP engine builds the model, verl/workers/engine/fsdp/transformer_impl.py:305-311, at worker start)",
    summary="Ulysses sequence parallelism (FSDP) that does not divide the model's attention heads (or key-value heads): asserted when the worker builds the model. Needs the model's config.json.",
    fix="use a sequence parallel size that divides the attention and key-value heads",
    example=Example(
        fires=("actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=8",),
        twin=("actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=4",),
        model=QWEN7B,
    ),
)
def ulysses_heads(inp: CheckInput) -> Iterator[Hit]:
    for role, facts in _role_facts(inp):
        if role_strategy(inp.resolved, role) not in FSDP_STRATEGIES:
            continue
        sp = model_parallel_sizes(inp.resolved, role)["sequence parallel"]
        heads, kv = facts.num_attention_heads, facts.num_key_value_heads
        if sp <= 1 or heads is None:
            continue
        problems = []
        if heads % sp:
            problems.append(f"{heads} attention heads")
        if kv is not None and kv % sp and sp % kv:
            problems.append(f"{kv} key-value heads (nor does {sp} divide by {kv})")
        if problems:
            yield Hit(
                ulysses_path(role),
                f"Ulysses sequence parallel {sp} does not divide the {' or the '.join(problems)} of "
                f"{facts.source}: verl {inp.version} fails an assertion when the {ROLE_NAMES[role]} "
                "worker builds the model",
                fix=f"use a sequence parallel size that divides {heads}",
            )


@check(
    "model.tensor-parallel-heads",
    level="error",
    evidence="megatron.core TransformerConfig.__post_init__ (num_attention_heads and num_query_groups % tensor_model_parallel_size raise ValueError), built from the HF config when the Megatron worker starts (verl/workers/engine/megatron/transformer_impl.py:284-345, _build_tf_config)",
    summary="Megatron tensor parallelism that does not divide the model's attention heads or query groups: megatron.core's TransformerConfig raises when the worker starts. Needs the model's config.json.",
    fix="use a tensor parallel size that divides the attention heads and key-value heads",
    example=Example(
        base=MEGATRON,
        fires=(
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=8",
            "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1",
        ),
        twin=(
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
            "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1",
        ),
        model=QWEN7B,
    ),
)
def tensor_parallel_heads(inp: CheckInput) -> Iterator[Hit]:
    for role, facts, engine, sizes in _megatron_role_facts(inp):
        tp = sizes["tp"]
        for count, what in (
            (facts.num_attention_heads, "attention heads"),
            (facts.num_key_value_heads, "key-value heads (num_query_groups)"),
        ):
            if count is not None and count % tp:
                yield Hit(
                    f"{engine}.tensor_model_parallel_size",
                    f"tensor parallel {tp} does not divide the {count} {what} of {facts.source}: "
                    f"megatron.core raises ValueError when the {ROLE_NAMES[role]} worker starts in "
                    f"verl {inp.version}",
                    fix=f"use a tensor parallel size that divides {count}",
                )
                break


@check(
    "model.expert-parallel-experts",
    level="error",
    evidence="megatron.core TransformerConfig.__post_init__ (expert parallel > 1 without experts raises ValueError) and the MoE layer (asserts num_moe_experts % expert_model_parallel_size == 0), built when the Megatron worker starts",
    summary="Megatron expert parallelism on a model without routed experts, or that does not divide its experts: megatron.core fails when the worker starts. Needs the model's config.json.",
    fix="use an expert parallel size that divides the experts (1 for a dense model)",
    example=Example(
        base=MEGATRON,
        fires=("actor_rollout_ref.actor.megatron.expert_model_parallel_size=2",),
        twin=("actor_rollout_ref.actor.megatron.expert_model_parallel_size=1",),
        model=QWEN7B,
    ),
)
def expert_parallel_experts(inp: CheckInput) -> Iterator[Hit]:
    for role, facts, engine, sizes in _megatron_role_facts(inp):
        ep = sizes["ep"]
        if ep <= 1:
            continue
        experts = facts.num_experts
        if experts is None:
            message = f"expert parallel {ep} on a model without routed experts ({facts.source})"
            fix = f"set {engine}.expert_model_parallel_size=1"
        elif experts % ep:
            message = (
                f"expert parallel {ep} does not divide the {experts} experts of {facts.source}"
            )
            fix = f"use an expert parallel size that divides {experts}"
        else:
            continue
        yield Hit(
            f"{engine}.expert_model_parallel_size",
            f"{message}: megatron.core fails when the {ROLE_NAMES[role]} worker starts in verl {inp.version}",
            fix=fix,
        )


@check(
    "model.rollout-tensor-parallel-heads",
    level="error",
    evidence="vLLM ModelConfig.verify_with_parallel_config (attention heads % tensor_parallel_size raises ValueError) when verl starts the vLLM server with tensor_parallel_size = rollout TP (verl/workers/rollout/vllm_rollout/vllm_async_server.py:305)",
    summary="A vLLM rollout tensor parallel size that does not divide the model's attention heads: vLLM raises when verl starts the rollout server. Needs the model's config.json.",
    fix="use a rollout tensor parallel size that divides the attention heads",
    example=Example(
        fires=("actor_rollout_ref.rollout.tensor_model_parallel_size=8",),
        twin=("actor_rollout_ref.rollout.tensor_model_parallel_size=4",),
        model=QWEN7B,
    ),
)
def rollout_tensor_parallel_heads(inp: CheckInput) -> Iterator[Hit]:
    rollout = inp.resolved["actor_rollout_ref"]["rollout"]
    facts = inp.model_facts.get(ACTOR_MODEL)
    if rollout.get("name") != "vllm" or facts is None or facts.num_attention_heads is None:
        return
    tp = int(rollout.get("tensor_model_parallel_size") or 1)
    if facts.num_attention_heads % tp:
        yield Hit(
            "actor_rollout_ref.rollout.tensor_model_parallel_size",
            f"vLLM tensor parallel {tp} does not divide the {facts.num_attention_heads} attention "
            f"heads of {facts.source}: vLLM raises ValueError when verl {inp.version} starts the "
            "rollout server",
            fix=f"use a rollout tensor parallel size that divides {facts.num_attention_heads}",
        )


@check(
    "model.tokenizer-beyond-vocabulary",
    level="warning",
    evidence="verl {version} never resizes the embeddings (no resize_token_embeddings in verl/); vLLM masks logits from len(tokenizer) on (vllm_async_server.py:452-458, vllm_rollout/utils.py:104-119), which cannot cover ids past the embedding",
    summary="A tokenizer with token ids at or past the model's vocab_size: verl never resizes the embeddings, so a prompt or template that uses one fails the embedding lookup. Needs the model's config.json and tokenizer.json.",
    fix="use a tokenizer that matches the model, or a checkpoint with resized embeddings",
    example=Example(
        fires=(),
        twin=(),
        model={**QWEN7B, "vocab_size": 151936, "tokens_beyond_vocab": (("<|extra_0|>", 151936),)},
        twin_model={**QWEN7B, "vocab_size": 151936, "tokens_beyond_vocab": ()},
    ),
)
def tokenizer_beyond_vocabulary(inp: CheckInput) -> Iterator[Hit]:
    facts = inp.model_facts.get(ACTOR_MODEL)
    if facts is None or not facts.tokens_beyond_vocab:
        return
    shown = ", ".join(f"{token!r}={i}" for token, i in facts.tokens_beyond_vocab[:3])
    more = len(facts.tokens_beyond_vocab) - 3
    yield Hit(
        "actor_rollout_ref.model.path",
        f"the tokenizer of {facts.source} has {len(facts.tokens_beyond_vocab)} token(s) with ids at or "
        f"past the model's vocab_size {facts.vocab_size} ({shown}{f', and {more} more' if more > 0 else ''}); "
        f"verl {inp.version} does not resize the embeddings, so a prompt or chat template that "
        "uses one fails the embedding lookup",
        fix="use a tokenizer that matches the model, or a checkpoint with resized embeddings",
    )


@check(
    "model.max-model-len-above-context",
    level="error",
    evidence="verl/workers/rollout/vllm_rollout/vllm_async_server.py:957-961, sglang_rollout/async_sglang_server.py:160-163, trtllm_rollout/trtllm_async_server.py:117-120 (ValueError when the rollout server starts; rope_scaling is not considered)",
    summary="A rollout max_model_len above the model's max_position_embeddings: the rollout server (vLLM, SGLang, TensorRT-LLM) raises when it starts. Needs the model's config.json.",
    fix="set actor_rollout_ref.rollout.max_model_len to at most max_position_embeddings",
    example=Example(
        fires=("actor_rollout_ref.rollout.max_model_len=65536",),
        twin=("actor_rollout_ref.rollout.max_model_len=32768",),
        model={**QWEN7B, "max_position_embeddings": 32768},
    ),
)
def max_model_len_above_context(inp: CheckInput) -> Iterator[Hit]:
    rollout = inp.resolved["actor_rollout_ref"]["rollout"]
    facts = inp.model_facts.get(ACTOR_MODEL)
    limit = rollout.get("max_model_len")
    if facts is None or facts.max_position_embeddings is None or limit is None:
        return
    if (
        rollout.get("name") in ("vllm", "sglang", "trtllm")
        and int(limit) > facts.max_position_embeddings
    ):
        yield Hit(
            "actor_rollout_ref.rollout.max_model_len",
            f"max_model_len {limit} is above the max_position_embeddings "
            f"{facts.max_position_embeddings} of {facts.source}: verl {inp.version} raises ValueError "
            "when the rollout server starts (even when rope_scaling would stretch the context)",
            fix=f"set actor_rollout_ref.rollout.max_model_len to at most {facts.max_position_embeddings}",
        )
