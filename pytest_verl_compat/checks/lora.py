"""Which engine reads which spelling of the actor's LoRA rank, decided once for the checks and
the memory forecast. Kept out of ``roles`` on purpose: ``roles`` is part of the oracle's code,
whose digest keys every recorded answer (pipeline/answers.py ORACLE_CODE)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The key of the model section each engine builds its LoRA adapter from; the trainer takes either
# (roles.ref_in_actor), so does vLLM (vllm_async_server.py:207-210). The FSDP engine reads lora_rank only
# (verl/workers/engine/fsdp/transformer_impl.py:143, :340-349; :162@0.9.1), the Megatron engine
# model.lora only (verl/workers/engine/megatron/transformer_impl.py:422-424 ->
# verl/workers/config/megatron_peft.py:23, the same line in 0.9.1), and MindSpeed's engine is
# Megatron's subclass (verl/workers/engine/mindspeed/transformer_impl.py:62; :57@0.9.1).
ENGINE_LORA_RANK = {
    "fsdp": "lora_rank",
    "fsdp2": "lora_rank",
    "megatron": "lora.rank",
    "mindspeed": "lora.rank",
}

# peft's shorthand for every linear layer (peft/utils/constants.py INCLUDE_LINEAR_LAYERS_SHORTHAND);
# peft compares it lower-cased (tuners_utils.py:2438-2442@peft-0.21.2), and its v4-to-v5
# conversion counts the router among v4's linears (transformers_weight_conversion.py:364-372).
ALL_LINEAR = "all-linear"


def positive_count(value: Any) -> int:
    """``value`` where it is a positive integer (a bool is not), else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def lora_rank_at(model: Mapping[str, Any], spelling: str) -> int:
    """The LoRA rank a model section holds in one spelling (``lora_rank``, ``lora.rank``; 0:
    none)."""
    node: Any = model
    for part in spelling.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return positive_count(node)


def engine_lora_rank(model: Mapping[str, Any], strategy: str) -> int:
    """The LoRA rank the ``strategy`` engine trains a model section with (0: the whole model);
    a rank written in another engine's spelling is never read by this one."""
    return lora_rank_at(model, ENGINE_LORA_RANK.get(strategy, "lora_rank"))


def served_rank_spelling(model: Mapping[str, Any]) -> str | None:
    """The spelling the actor's LoRA rank is set in when a rollout server serves it as an
    adapter (verl's lora_served_as_adapter, sglang_rollout/utils.py:29-43, and vLLM's
    lora_as_adapter, vllm_async_server.py:207-210: either rank above 0 and lora.merge false),
    else None."""
    lora = model.get("lora")
    if isinstance(lora, Mapping) and bool(lora.get("merge", False)):
        return None
    return next((s for s in ("lora_rank", "lora.rank") if lora_rank_at(model, s)), None)
