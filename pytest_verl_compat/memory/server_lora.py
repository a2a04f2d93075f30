"""A rollout server's LoRA slots: what a vLLM or SGLang server serving the actor's LoRA as an
adapter allocates for it, per tensor-parallel rank, before it sizes its KV cache.

vLLM: verl starts it with ``enable_lora``, ``max_loras=1`` and ``max_lora_rank`` the smallest of
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

SGLang: verl starts it with ``enable_lora``, ``max_lora_rank`` and ``lora_target_modules``
(EV_SGLANG_ARGS; ``checks/sglang_lora.py`` says which values it refuses). Its LoRA memory pool holds
``max_loras_per_batch`` slots (8 unless the engine's kwargs say) of every targeted module, the
same shapes per slot (``A: R*slices x in``, ``B: out x R``, row-parallel inputs and column-parallel
outputs split over TP, per local expert for fused experts), the embedding's ``A: R x vocab`` and
the head's ``B: vocab/tp x R`` (EV_SGLANG_POOL). "all" (verl 0.9.1's all-linear) targets every
linear module SGLang's LoRA knows and both embeddings. It is allocated after the weights and
before the KV pool is sized from the memory then free (EV_SGLANG_ORDER): it shrinks the pool as
the weights do, and stays with them while the server sleeps.

A VL model's tower is left out: vLLM adapts the language model only unless its tower LoRA is
enabled (model_manager.py _create_lora_modules, ``_get_punica_wrapper``). Not counted: the
slices of a projection vLLM fuses that transformers keeps whole, beyond gate_up (one ``R x in``
block each), and the punica kernels' per-batch buffers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pytest_verl_compat.checks.lora import (
    ALL_LINEAR,
    lora_rank_at,
    positive_count,
    served_rank_spelling,
)
from pytest_verl_compat.checks.upstream_names import VLLM_LORA_RANKS
from pytest_verl_compat.memory.architecture import Architecture
from pytest_verl_compat.memory.layout import ServerLayout, value_at
from pytest_verl_compat.memory.tensor import Tensor
from pytest_verl_compat.releases.sglang_server import sglang_server

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
EV_SGLANG_ARGS = (
    "verl/workers/rollout/sglang_rollout/async_sglang_server.py:324-331 (:344-351 in 0.9.1)"
)
EV_SGLANG_POOL = (
    "sglang/srt/lora/mem_pool.py:303-458, :460-560@sglang-0.5.12 (get_lora_A_shape, "
    "get_lora_B_shape, init_buffers), lora_manager.py:522-524 ('all': auto_detect_lora_target_modules "
    "and both embeddings), utils.py:274-292 (_KNOWN_LORA_TARGET_MODULES); server_args.py:551 "
    "(max_loras_per_batch 8; :425@sglang-0.5.8)"
)
EV_SGLANG_ORDER = (
    "sglang/srt/model_executor/model_runner.py:655, :730, :749@sglang-0.5.12 (load_model, "
    "init_lora_manager, then init_memory_pool)"
)
EVIDENCE = f"{EV_ARGS}; {EV_LOAD}; {EV_SHAPES}"
SGLANG_EVIDENCE = f"{EV_SGLANG_ARGS}; {EV_SGLANG_POOL}; {EV_SGLANG_ORDER}"

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
# SGLang's names for the modules it adapts (sglang/srt/lora/utils.py
# get_normalized_target_modules: the projections it fuses) and those its LoRA pool knows
# (_KNOWN_LORA_TARGET_MODULES@sglang-0.5.12), which "all" targets where the model has them.
SGLANG_NAMES = {
    "q_proj": "qkv_proj",
    "k_proj": "qkv_proj",
    "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj",
    "q_a_proj": "fused_qkv_a_proj_with_mqa",
    "kv_a_proj_with_mqa": "fused_qkv_a_proj_with_mqa",
}
SGLANG_KNOWN = frozenset(
    {
        "qkv_proj",
        "o_proj",
        "out_proj",
        "in_proj",
        "in_proj_qkvz",
        "up_proj",
        "gate_up_proj",
        "down_proj",
        "fused_qkv_a_proj_with_mqa",
        "q_b_proj",
        "kv_b_proj",
    }
)
EMBEDDINGS = ("embed_tokens", "lm_head")
SGLANG_SLOTS = 8  # max_loras_per_batch's default
# Whether the pool of an SGLang release (the pin of the verl release's sglang extra, recorded in
# data/releases/<v>/sglang_server.json) holds per-expert slots for fused experts: 0.5.12's
# init_buffers allocates gate_up_proj_moe and down_proj_moe per local expert (mem_pool.py:
# 478-528@sglang-0.5.12); 0.5.8's pool has no MoE buffers (mem_pool.py:203-245@sglang-0.5.8), its
# adapters reach the experts not at all. An SGLang not listed is taken as the later one.
SGLANG_EXPERT_SLOTS = {"0.5.8": False, "0.5.12": True}
SGLANG_ALL = "all"  # what verl 0.9.1 hands SGLang for all-linear


def served_rank(model: Mapping[str, Any]) -> int:
    """The rank verl asks vLLM's LoRA slots for, from the actor's model section (0: no LoRA
    served, or merged into the weights): ``lora.rank`` first, then ``lora_rank``, raised to the
    smallest of vLLM's ranks that holds it (a rank above them all: upstream refuses it at
    validate_config, the largest is counted)."""
    if served_rank_spelling(model) is None:
        return 0
    rank = lora_rank_at(model, "lora.rank") or lora_rank_at(model, "lora_rank")
    return next((r for r in VLLM_LORA_RANKS if rank <= r), VLLM_LORA_RANKS[-1])


def fully_sharded(model: Mapping[str, Any]) -> bool:
    lora = model.get("lora")
    return isinstance(lora, Mapping) and bool(lora.get("fully_sharded_loras", False))


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


def _experts_slot(
    arch: Architecture, rank: int, tp: int, ep_ranks: int, sharded: bool, part: str
) -> int:
    """Elements of one fused-experts layer's slot on one rank (vLLM's FusedMoEWithLoRA,
    SGLang's gate_up_proj_moe and down_proj_moe), ``part`` gate_up_proj or down_proj;
    ``ep_ranks`` 0 without expert parallel."""
    h, width = arch.hidden_size, arch.moe_intermediate_size
    if ep_ranks:  # expert parallel: the experts split over its ranks, each whole
        local, per_partition = arch.num_experts // ep_ranks, width
    else:
        local, per_partition = arch.num_experts, width // tp
    # fully sharded: split over the TP world whatever expert parallel does (fused_moe.py:52)
    if part == "gate_up_proj":
        a_rows = rank // tp if sharded else rank
        return local * (2 * a_rows * h + 2 * per_partition * rank)
    hidden_out = h // tp if sharded else h
    return local * (rank * per_partition + hidden_out * rank)


def _layer_slots(
    arch: Architecture,
    rank: int,
    tp: int,
    ep_ranks: int,
    sharded: bool,
    keep: Callable[[str], bool],
    routers: bool,
    experts: bool = True,
) -> int:
    """Elements of one slot of the language model's layers whose (SGLang-normalized) module name
    ``keep`` keeps, on one rank; the routers where ``routers``."""
    tower = {t.name for t in arch.vision.tensors()} if arch.vision is not None else set()
    total = 0
    expert_parts: set[tuple[str, str]] = set()
    for t in arch.tensors():
        if t.name in tower or len(t.shape) < 2:
            continue
        if t.kind == "experts":
            part = t.name.rsplit(".", 1)[-1]
            if experts and part in ("gate_up_proj", "down_proj") and keep(part):
                expert_parts.add((t.unit, part))
        elif t.kind in ("linear", "conv"):
            name = t.name.rsplit(".", 2)[-2]
            if keep(SGLANG_NAMES.get(name, name)):
                total += _linear_slot(t, arch, rank, tp, sharded)
        elif t.kind == "router" and routers:
            total += _linear_slot(t, arch, rank, tp, sharded)
    for _, part in expert_parts:
        total += _experts_slot(arch, rank, tp, ep_ranks, sharded, part)
    return total


def slot_bytes(
    arch: Architecture, rank: int, tp: int, ep_ranks: int, dtype: int, sharded: bool = False
) -> int:
    """Bytes of vLLM's LoRA slots (one adapter, ``max_loras=1``) on one server rank; ``ep_ranks``
    the expert-parallel ranks the experts split over (0 without expert parallel)."""
    if rank <= 0:
        return 0
    routers = arch.family in ROUTER_LORA_FAMILIES
    total = _layer_slots(arch, rank, tp, ep_ranks, sharded, lambda _: True, routers)
    if arch.model_type in EMBEDDING_LORA_TYPES:
        embedding = arch.vocab_size * rank + arch.hidden_size * rank
        logits = rank * arch.hidden_size + arch.vocab_size * rank
        # a tied lm_head is the embedding module again, wrapped a second time
        total += embedding * (2 if arch.tie_word_embeddings else 1) + logits
    return total * dtype


def server_fields(
    resolved: Mapping[str, Any], section: str, name: str, release: str
) -> dict[str, Any]:
    """The rollout server's LoRA fields (``ServerLayout.lora_*``) for the actor's adapter, which
    verl's vLLM and SGLang servers read from the actor's model section (EV_ARGS,
    EV_SGLANG_ARGS); other servers and sections have none."""
    model = value_at(resolved, "actor_rollout_ref.model", {})
    if section != "actor_rollout_ref.rollout" or not isinstance(model, Mapping):
        return {}
    if name == "vllm":
        return {"lora_rank": served_rank(model), "lora_sharded": fully_sharded(model)}
    if name != "sglang" or served_rank_spelling(model) is None:
        return {}
    kwargs = value_at(resolved, f"{section}.engine_kwargs.sglang", {})
    slots = kwargs.get("max_loras_per_batch") if isinstance(kwargs, Mapping) else None
    return {
        # verl 0.9.1 hands either spelling (lora_rank_of); 0.9.0 lora_rank alone, whose 0 SGLang
        # refuses (checks/sglang_lora.py)
        "lora_rank": max(lora_rank_at(model, "lora_rank"), lora_rank_at(model, "lora.rank")),
        "lora_targets": sglang_targets(model.get("target_modules")),
        "lora_pool_slots": positive_count(slots) or SGLANG_SLOTS,
        "lora_experts": SGLANG_EXPERT_SLOTS.get(_sglang_pin(release), True),
    }


def _sglang_pin(release: str) -> str:
    """The SGLang the release's sglang extra pins ("" where it has no record)."""
    record = sglang_server(release)
    return record.sglang if record is not None else ""


def sglang_targets(value: Any) -> tuple[str, ...]:
    """What verl 0.9.1 hands SGLang as lora_target_modules for the actor's target_modules:
    ("all",) for all-linear, a list as it is (sglang_rollout/utils.py:93-102@0.9.1); a pattern or
    null stop the server (checks/sglang_lora.py): nothing is counted."""
    if value == ALL_LINEAR:
        return (SGLANG_ALL,)
    if isinstance(value, list | tuple):
        return tuple(str(v) for v in value)
    return ()


def lora_bytes(server: ServerLayout, ep_ranks: int) -> int:
    """The server's LoRA slots on one of its ranks (vLLM's or SGLang's); ``ep_ranks`` as
    ``slot_bytes`` takes it."""
    arch = server.model.architecture
    if server.name == "vllm":
        return slot_bytes(
            arch, server.lora_rank, server.tp, ep_ranks, server.dtype, server.lora_sharded
        )
    if server.name == "sglang":
        return sglang_pool_bytes(
            arch,
            server.lora_rank,
            server.tp,
            ep_ranks,
            server.dtype,
            server.lora_targets,
            server.lora_pool_slots,
            server.lora_experts,
        )
    return 0


def sglang_pool_bytes(
    arch: Architecture,
    rank: int,
    tp: int,
    ep_ranks: int,
    dtype: int,
    targets: tuple[str, ...],
    slots: int = SGLANG_SLOTS,
    experts: bool = True,
) -> int:
    """Bytes of SGLang's LoRA memory pool on one server rank: ``slots`` adapters of ``rank`` over
    ``targets`` (the names verl hands it: ``("all",)`` or module names, normalized as SGLang does),
    the fused experts' per-expert slots where its release has them (``experts``)."""
    if rank <= 0 or slots <= 0:
        return 0
    modules: set[str]
    if SGLANG_ALL in targets:
        modules = {*SGLANG_KNOWN, *EMBEDDINGS}
    else:
        modules = {SGLANG_NAMES.get(n.rsplit(".", 1)[-1], n.rsplit(".", 1)[-1]) for n in targets}
    total = _layer_slots(arch, rank, tp, ep_ranks, False, modules.__contains__, False, experts)
    if "embed_tokens" in modules:
        total += rank * arch.vocab_size + arch.hidden_size * rank
    if "lm_head" in modules:
        total += rank * arch.hidden_size + -(-arch.vocab_size // tp) * rank
    return slots * total * dtype
