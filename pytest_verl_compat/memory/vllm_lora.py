"""vLLM's LoRA slots: what a vLLM server that serves the actor's LoRA as an adapter allocates for
it, per tensor-parallel rank, before it sizes its KV cache.

verl starts vLLM with ``enable_lora``, ``max_loras=1`` and ``max_lora_rank`` the smallest of
vLLM's ranks that holds the adapter's rank (``lora.rank``, else ``lora_rank``; none when
``lora.merge``), ``fully_sharded_loras`` as configured (EV_ARGS). vLLM then gives every
``LinearBase`` and ``FusedMoE`` layer of the language model, and the embeddings where its model
class lists them, one slot of A and B per adapter, in the model's dtype (``lora_dtype`` auto),
when it loads the model: under the weights' memory tag, so inside its share before the KV cache is
sized, and offloaded with the weights when it sleeps (EV_LOAD). Per layer (EV_SHAPES), with ``R``
the slot's rank and ``tp`` the tensor-parallel size:

- column-parallel (q/k/v, gate/up, the linear attention's input projections and conv):
  ``A: R x in`` per slice, ``B: out/tp x R`` (``R/tp`` rows of A when fully sharded);
- row-parallel (o_proj, down_proj, out_proj): ``A: R x in/tp``, ``B: out x R`` (``out/tp`` fully
  sharded);
- replicated (MLA's latent projections, a ReplicatedLinear router): ``A: R x in``, ``B: out x R``;
- fused experts: per local expert, ``A: R x hidden`` twice and ``R x width`` once, ``B: width x R``
  twice and ``hidden x R`` once, the width split over TP unless expert parallel keeps it whole;
- the input embeddings ``A: vocab x R``, ``B: hidden x R`` and the logits ``A: R x hidden``,
  ``B: vocab x R``, for the model classes whose ``embedding_modules`` name them.

A VL model's tower is left out: vLLM adapts the language model only unless its tower LoRA is
enabled (model_manager.py _create_lora_modules, ``_get_punica_wrapper``). Not counted: the
slices of a projection vLLM fuses that transformers keeps whole, beyond gate_up (one ``R x in``
block each), and the punica kernels' per-batch buffers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_verl_compat.checks.upstream_names import VLLM_LORA_RANKS
from pytest_verl_compat.memory.architecture import Architecture
from pytest_verl_compat.memory.tensor import Tensor

EV_ARGS = (
    "verl/workers/rollout/vllm_rollout/vllm_async_server.py:370-388 (:417-434 in 0.9.1); "
    "vllm_rollout/utils.py:81-100 (get_vllm_max_lora_rank)"
)
EV_LOAD = (
    "vllm/v1/worker/gpu_model_runner.py:4491-4503@vllm-0.18.0 (load_lora_model inside "
    "load_model's memory profile), gpu_worker.py:318-335 (load_model under the 'weights' tag)"
)
EV_SHAPES = (
    "vllm/lora/layers/base_linear.py:35-87, column_parallel_linear.py:196-231, "
    "fused_moe.py:353-411, vocal_parallel_embedding.py:23-66, logits_processor.py:84-115@"
    "vllm-0.18.0 (create_lora_weights; the same shapes in 0.24.0); vllm/lora/utils.py:205-226 "
    "(get_supported_lora_modules: every LinearBase and FusedMoE)"
)
EVIDENCE = f"{EV_ARGS}; {EV_LOAD}; {EV_SHAPES}"

# Row-parallel projections (their input split over TP), by the last part of the name.
ROW_PARALLEL = frozenset({"o_proj", "down_proj", "out_proj"})
# Projections vLLM builds replicated: MLA's latent down-projections (deepseek_v2.py's
# fused_qkv_a_proj and kv_a_proj_with_mqa) and the shared expert's one-output gate.
REPLICATED = frozenset({"q_a_proj", "kv_a_proj_with_mqa", "shared_expert_gate"})
# transformers' fused projections of two slices vLLM keeps as two (one A block each).
TWO_SLICES = frozenset({"gate_up_proj"})
# Model types whose vLLM class lists embed_tokens and lm_head in embedding_modules (llama.py,
# qwen3.py, qwen3_moe.py, and the VL language models that subclass them, qwen3_vl*.py, in vLLM
# 0.18.0 and 0.24.0; mistral.py's MistralForCausalLM empties it).
EMBEDDING_LORA_TYPES = frozenset({"llama", "qwen3", "qwen3_moe", "qwen3_vl", "qwen3_vl_moe"})
# Families whose router vLLM builds as a ReplicatedLinear, which it adapts (qwen3_moe.py:176,
# qwen3_next.py:291, gpt_oss.py:178@vllm-0.18.0); DeepSeek's and Hy3's GateLinear and GLM-4.5's
# nn.Linear are not adapted in 0.18.0 (replicated_linear.py:58, ``type(...) is ReplicatedLinear``).
ROUTER_LORA_FAMILIES = frozenset({"qwen3_moe", "qwen3_next", "qwen3_5_moe_text", "gpt_oss"})


def served_rank(model: Mapping[str, Any]) -> int:
    """The rank verl asks vLLM's LoRA slots for, from the actor's model section (0: no LoRA
    served, or merged into the weights): ``lora.rank`` first, then ``lora_rank``, raised to the
    smallest of vLLM's ranks that holds it (a rank above them all: upstream refuses it at
    validate_config, the largest is counted)."""
    lora = model.get("lora")
    lora = lora if isinstance(lora, Mapping) else {}
    if bool(lora.get("merge", False)):
        return 0
    rank = _count(lora.get("rank")) or _count(model.get("lora_rank"))
    if rank <= 0:
        return 0
    return next((r for r in VLLM_LORA_RANKS if rank <= r), VLLM_LORA_RANKS[-1])


def fully_sharded(model: Mapping[str, Any]) -> bool:
    lora = model.get("lora")
    return isinstance(lora, Mapping) and bool(lora.get("fully_sharded_loras", False))


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _linear_slot(t: Tensor, arch: Architecture, rank: int, tp: int, sharded: bool) -> int:
    """Elements of one linear layer's slot on one TP rank."""
    out, inputs = t.shape[0], t.shape[-1]  # a conv1d's (channels, 1, kernel): kernel inputs
    part = t.name.rsplit(".", 2)[-2]  # the module's own name (".weight" last)
    if part in REPLICATED or t.kind == "router":
        return rank * inputs + out * rank
    if part in ROW_PARALLEL:
        return rank * (inputs // tp) + (out // tp if sharded else out) * rank
    if part in ("k_proj", "v_proj") and not arch.uses_mla:
        out = arch.kv_heads_per_rank(tp) * arch.head_dim * tp  # replicated when TP exceeds them
    slices = 2 if part in TWO_SLICES else 1
    a_rows = rank // tp if sharded else rank
    return slices * a_rows * inputs + (out // tp) * rank


def _experts_slot(arch: Architecture, rank: int, tp: int, ep_ranks: int, sharded: bool) -> int:
    """Elements of one fused-experts layer's slot on one rank (FusedMoEWithLoRA); ``ep_ranks``
    0 without expert parallel."""
    h, width = arch.hidden_size, arch.moe_intermediate_size
    if ep_ranks:  # expert parallel: the experts split over its ranks, each whole
        local, per_partition = arch.num_experts // ep_ranks, width
    else:
        local, per_partition = arch.num_experts, width // tp
    # fully sharded: split over the TP world whatever expert parallel does (fused_moe.py:52)
    a_rows = rank // tp if sharded else rank
    hidden_out = h // tp if sharded else h
    a = 2 * a_rows * h + rank * per_partition
    b = 2 * per_partition * rank + hidden_out * rank
    return local * (a + b)


def slot_bytes(
    arch: Architecture, rank: int, tp: int, ep_ranks: int, dtype: int, sharded: bool = False
) -> int:
    """Bytes of vLLM's LoRA slots (one adapter, ``max_loras=1``) on one server rank; ``ep_ranks``
    the expert-parallel ranks the experts split over (0 without expert parallel)."""
    if rank <= 0:
        return 0
    tower = {t.name for t in arch.vision.tensors()} if arch.vision is not None else set()
    total = 0
    experts_layers: set[str] = set()
    for t in arch.tensors():
        if t.name in tower or len(t.shape) < 2:
            continue
        if t.kind == "experts":
            experts_layers.add(t.unit)
        elif t.kind in ("linear", "conv"):
            total += _linear_slot(t, arch, rank, tp, sharded)
        elif t.kind == "router" and arch.family in ROUTER_LORA_FAMILIES:
            total += _linear_slot(t, arch, rank, tp, sharded)
    total += len(experts_layers) * _experts_slot(arch, rank, tp, ep_ranks, sharded)
    if arch.model_type in EMBEDDING_LORA_TYPES:
        embedding = arch.vocab_size * rank + arch.hidden_size * rank
        logits = rank * arch.hidden_size + arch.vocab_size * rank
        # a tied lm_head is the embedding module again, wrapped a second time
        total += embedding * (2 if arch.tie_word_embeddings else 1) + logits
    return total * dtype
