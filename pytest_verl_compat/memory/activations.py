"""Activations of one micro-batch: the bytes a forward keeps for backward, per token.

The count follows what each op of transformers' decoder layer saves for its backward (norms
upcast to fp32 and keep the fp32 input and the rsqrt; a linear keeps its input; SiLU/GELU their
input; flash attention q, k, v, the output and the fp32 log-sum-exp), in the compute dtype ``c``
(2 bytes: the FSDP mixed-precision param_dtype, transformer_impl.py:358-368).
tests/test_fit_activations.py measures the same bytes with
``torch.autograd.graph.saved_tensors_hooks`` (deduplicated by storage) on tiny models of each
family and several sequence lengths, with and without gradient checkpointing.

Flash attention on a GPU keeps the same tensors as torch's CPU flash kernel (q, k, v, out,
logsumexp; grouped KV heads are not repeated); the GPU kernels' own workspaces (cuBLAS, flash
attention's scratch) are not activations and are covered by ``WORKSPACE_ALLOWANCE``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_verl_compat.memory.architecture import (
    GLM_LAYER,
    GPT_OSS,
    GROUPLESS_ROUTER,
    HYBRID,
    SANDWICH_NORM,
    SIGMOID_ROUTER,
    Architecture,
)

EV_CHECKPOINTING = "verl/workers/engine/fsdp/transformer_impl.py:299-300"
# Megatron recomputes what override_transformer_config asks (recompute_granularity, null by
# default); its engine never reads model.enable_gradient_checkpointing.
EV_1F1B = "megatron/core/pipeline_parallel/schedules.py:2093-2097@megatron-core-0.16.1 (forward_backward_pipelining_without_interleaving: num_warmup_microbatches = min(pp_size - pp_rank - 1, num_microbatches))"
EV_1F1B_INTERLEAVED = "megatron/core/pipeline_parallel/schedules.py:773-774@megatron-core-0.16.1 (with interleaving: num_warmup_microbatches = (pp_size - pp_rank - 1) * 2 + (num_model_chunks - 1) * microbatch_group_size_per_vp_stage); megatron/core/model_parallel_config.py:447-448 (the group defaults to pp)"
EV_MEGATRON_CE = "megatron/core/tensor_parallel/cross_entropy.py:28, :65, :187@megatron-core-0.16.1 (vocab_parallel_logits.float(); torch.exp in place; exp_logits saved); verl/utils/megatron/tensor_parallel.py:109-127 (_VocabParallelEntropy saves its input and its softmax), :154-169 (chunked)"
EV_MEGATRON_RECOMPUTE = "verl/trainer/config/engine/megatron.yaml:76-90; verl/workers/engine/megatron/transformer_impl.py:296, :329, :364-365"
# verl builds its Megatron models with Transformer Engine's layer spec
EV_MEGATRON_LAYER = "verl/models/mcore/model_initializer.py:105 (use_transformer_engine=True); megatron/core/models/gpt/gpt_layer_specs.py:270-291 (megatron-core 0.16.1: linear_qkv=column_parallel_layer_norm_linear, core_attention, pre_mlp_layernorm fused unless MoE)"
# sequence_parallel: the engine's key, then override_transformer_config (the legacy mbridge sets it
# whenever tensor parallelism is on)
EV_MEGATRON_SEQUENCE_PARALLEL = "verl/trainer/config/engine/megatron.yaml:32; verl/workers/engine/megatron/transformer_impl.py:354, :364-365"
# model.enable_activation_offload: each FSDP unit's saved tensors go to the host as one group, all
# but the last (get_activation_offload_context(len(layers) - 1, ...)); a double buffer keeps at most
# two groups on the GPU and brings the next back while a layer's backward runs
EV_ACTIVATION_OFFLOAD = (
    "verl/workers/engine/fsdp/transformer_impl.py:458-460; verl/utils/activation_offload.py:500-558"
)
EV_REMOVE_PADDING = "verl/workers/engine/fsdp/transformer_impl.py:1198-1262"
EV_LOGITS = "verl/workers/engine/fsdp/transformer_impl.py:1332-1371"
EV_ENTROPY = "verl/utils/torch_functional.py:231-265"
EV_LOGPROBS = "verl/utils/torch_functional.py:73-107"
# Families whose RMSNorm scales by (1 + weight) in fp32 and keeps the fp32 product (Qwen3-Next's
# and Qwen3.5's RMSNorm is Gemma's).
GEMMA_NORM = frozenset({"gemma", "gemma2", "gemma3_text"}) | HYBRID
# Families whose RMSNorm multiplies its weight into the fp32 normalised value and keeps that
# product's fp32 input (transformers' GptOssRMSNorm: (self.weight * hidden_states).to(dtype)).
FP32_NORM_PRODUCT = GEMMA_NORM | GPT_OSS
# Gated DeltaNet layers run flash-linear-attention's kernels on a GPU (transformers' fast path;
# its CPU fallback saves other tensors), so what they keep is stated from those kernels, not
# measured: the input projections' shared input; the short convolution's input and its output
# before the SiLU (torch's conv1d and silu, transformers' path without the causal-conv1d kernel,
# which would keep the input alone); v made contiguous (a view of the convolution's output,
# copied by fla's input_guard, fla/utils/decorators.py:91-128@fla-core-0.6.0); q and k
# l2-normalised by the kernel at the value heads' count (transformers repeats them to it
# first) with their fp32 scales; the decay's softplus input and output and the decay (fp32);
# beta; the chunk-local matrix, 64 per head (ChunkGatedDeltaRuleFunction.forward's
# save_for_backward, fla/ops/gated_delta_rule/chunk.py:310-326); then the fused gated
# RMSNorm's input (the kernel's output), gate and fp32 scale per head (LayerNormGatedFunction,
# fla/modules/norm/fused_norm_gate.py:667) and out_proj's input (the norm's output).
FLA_CHUNK = 64
# Families with a tanh soft cap on the final logits (transformers Gemma2ForCausalLM).
LOGIT_SOFTCAP = frozenset({"gemma2"})
# GPU kernels' scratch (cuBLAS workspaces, flash attention's, the caching allocator's rounding),
# a share of the activations: stated, not measured on a CPU.
WORKSPACE_ALLOWANCE = 0.10


def _norm(arch: Architecture, width: int, consumer: bool, c: int) -> int:
    """One RMSNorm over ``width`` per token: fp32 input and rsqrt, then the bf16 (Llama) or fp32
    (Gemma) normalised value; a following linear keeps its own bf16 input too."""
    kept = 4 * width + 4 + (4 * width if arch.family in FP32_NORM_PRODUCT else c * width)
    return kept + (c * width if consumer else 0)


def _attention(arch: Architecture, c: int) -> int:
    heads, kv = arch.num_attention_heads, arch.num_key_value_heads
    if arch.uses_mla:
        qk = arch.qk_nope_head_dim + arch.qk_rope_head_dim
        rank = arch.q_lora_rank or 0
        q_path = (_norm(arch, rank, True, c) + c * rank) if rank else 0
        latent = arch.kv_lora_rank
        kept = q_path + _norm(arch, latent, True, c) + c * (latent + arch.qk_rope_head_dim)
        # q, k (nope + rope), v padded to the qk width for flash attention, out, lse, o_proj input
        kept += c * heads * qk * 4 + 4 * heads + c * heads * arch.v_head_dim
        return kept
    hd = arch.head_dim
    kept = c * heads * hd + 2 * c * kv * hd + c * heads * hd + 4 * heads
    if arch.family in GLM_LAYER:
        # GLM's apply_rotary_pos_emb interleaves cos and sin afresh in every layer
        # (repeat_interleave of their first half), which the rotation's products keep
        kept += 2 * c * arch.rotary_dim
    if arch.qk_norm:
        per_head = 8 * hd if arch.family in GEMMA_NORM else (4 + c) * hd
        kept += (per_head + 4) * (heads + kv)
    return kept


def linear_attention_bytes(arch: Architecture, c: int = 2) -> int:
    """A Gated DeltaNet layer's attention half per token (stated from fla's kernels, above)."""
    heads, keys, values = arch.linear_num_value_heads, arch.linear_key_dim, arch.linear_value_dim
    conv = 2 * keys + values
    normalised = 2 * heads * arch.linear_key_head_dim  # the kernel's l2-normalised q and k
    kept = c * arch.hidden_size + 2 * c * conv + c * values + c * normalised  # v contiguous
    # fp32 per head: q's and k's l2 scales, softplus's input and output, the decay; beta; A
    kept += 4 * heads * 5 + c * heads + c * heads * FLA_CHUNK
    return kept + 3 * c * values + 4 * heads  # the norm's input, gate, scale; out_proj's input


def _gated_query(arch: Architecture, c: int) -> int:
    """A hybrid family's full attention gates its output: the gate's sigmoid and the product
    (o_proj's input) besides flash attention's output."""
    return 2 * c * arch.num_attention_heads * arch.head_dim if arch.family in HYBRID else 0


def _shared_expert(arch: Architecture, c: int) -> int:
    """Qwen3-Next's one shared expert (gate out, act out, up out, down's input) and its gate."""
    width = arch.shared_expert_intermediate_size
    return 4 * c * width + 2 * c if width else 0


def _router(arch: Architecture) -> int:
    """Per token, what a MoE layer's router keeps for backward: Qwen's softmax probabilities
    (fp32); DeepSeek V3's (SIGMOID_ROUTER) its linear's fp32 input, the sigmoid's output and the
    scores it picks from (fp32), the groups' mask (bool), the indices of each group's top two, of
    the picked groups and of the experts (int64), and the picked weights and their sum (fp32)."""
    experts = arch.num_experts
    if arch.family not in SIGMOID_ROUTER:
        return 4 * experts
    groups = 0 if arch.family in GROUPLESS_ROUTER else 16 * arch.n_group + 8 * arch.topk_group
    return 4 * arch.hidden_size + 9 * experts + groups + 12 * arch.num_experts_per_tok + 4


def _mlp(arch: Architecture, index: int, c: int) -> int:
    if not arch.is_moe_layer(index):
        # gate out, act out, up out, down's input (GLM's fused gate_up output holds the first
        # and the third)
        return 4 * c * arch.intermediate_size
    k, width, h = arch.num_experts_per_tok, arch.moe_intermediate_size, arch.hidden_size
    if arch.family in GPT_OSS:
        # GptOssTopKRouter's softmax over the top-k logits (its output, in the compute dtype);
        # per routed token the grouped experts' indices (one more: the biases' gather), the
        # gathered token, gate_up, the clamped gate and up, the gate's sigmoid, up + 1, the
        # gated product, its product with up + 1 (down's input) and the experts' output
        return k * (41 + 2 * c + 2 * c * h + 7 * c * width)
    # transformers 5's grouped experts: fp32 router probabilities, int64 routing indices, the
    # gathered tokens, gate_up, act, product and the experts' output per routed token
    routed = _router(arch) + k * (33 + c + 2 * c * h + 4 * c * width)
    shared = 4 * c * width * arch.n_shared_experts
    return routed + shared + _shared_expert(arch, c)


def layer_bytes(arch: Architecture, index: int, c: int = 2) -> int:
    """Bytes per token decoder layer ``index`` keeps for backward (no checkpointing)."""
    h = arch.hidden_size
    if arch.family in SANDWICH_NORM:
        norms = 2 * _norm(arch, h, True, c) + 2 * _norm(arch, h, False, c)
    else:
        norms = 2 * _norm(arch, h, True, c)
    if arch.is_linear_layer(index):
        return norms + linear_attention_bytes(arch, c) + _mlp(arch, index, c)
    return norms + _attention(arch, c) + _gated_query(arch, c) + _mlp(arch, index, c)


def megatron_layer_bytes(arch: Architecture, index: int, c: int = 2, replicated: int = 1) -> int:
    """Bytes per token decoder layer ``index`` keeps for backward in verl's Megatron engine, which
    builds megatron-core's Transformer Engine layer (``EV_MEGATRON_LAYER``): the input norm fused
    into the QKV linear (its input, its normalised output, rsigma), Qwen3's q/k norms (their
    input), flash attention's q, k, v, output and fp32 log-sum-exp (the output is the
    projection's input), the pre-MLP norm fused into fc1 (input, normalised output, rsigma), the
    fused SwiGLU's input (fc1's gate and up) and fc2's input. Nothing is upcast and kept in fp32
    as transformers' RMSNorm does, which is why the forecast does not use ``layer_bytes`` here.
    Stated from the modules, not measured: Transformer Engine does not run on a CPU.

    The caller divides a micro-batch's tokens over the tensor-parallel ranks. Under megatron-core's
    sequence parallelism every kept tensor is split over them (along the sequence, or the heads and
    widths); without it the norms' inputs and outputs (the linear layers' inputs) are held whole on
    each of the ``replicated`` ranks (Korthikanti et al.'s 10 s*b*h, dropout masks aside)."""
    h, heads = arch.hidden_size, arch.num_attention_heads
    q = heads * arch.head_dim
    kv = arch.num_key_value_heads * arch.head_dim
    norms = 2 * (2 * c * h + 4) * replicated
    attention = c * (q + 2 * kv) + c * q + 4 * heads + _gated_query(arch, c)
    if arch.qk_norm:
        attention += c * (q + kv) + 4 * (heads + arch.num_key_value_heads)
    if arch.is_linear_layer(index):
        attention = linear_attention_bytes(arch, c)
    if not arch.is_moe_layer(index):
        mlp = 3 * c * arch.intermediate_size
    else:
        k, width = arch.num_experts_per_tok, arch.moe_intermediate_size
        # fp32 router probabilities; per routed token its dispatched input, gate and up, SwiGLU
        mlp = 4 * arch.num_experts + k * c * (h + 3 * width)
        mlp += 3 * c * width * arch.n_shared_experts + _shared_expert(arch, c)
    return norms + attention + mlp


def _softcap(arch: Architecture, c: int) -> int:
    """Gemma 2's logit soft cap keeps a vocabulary-wide tensor per token until the head's backward."""
    return c * arch.vocab_size if arch.family in LOGIT_SOFTCAP else 0


def head_only_bytes(arch: Architecture, c: int = 2) -> int:
    """Per token, what the forward keeps for the model's head alone: the final norm and
    lm_head's input, Gemma 2's logit soft cap. The head's backward frees them, with the logits,
    before backward reaches the last decoder layer."""
    return _norm(arch, arch.hidden_size, True, c) + _softcap(arch, c)


def head_bytes(
    arch: Architecture, c: int = 2, checkpointing: bool = False, with_head: bool = True
) -> int:
    """Per token outside the layers: token ids (int64), the rotary cos and sin shared by every
    layer, the head's own (``head_only_bytes``; a pipeline stage without the head has none);
    under checkpointing the position ids (int64) too."""
    rotary = arch.qk_rope_head_dim if arch.uses_mla else arch.head_dim
    rotary = rotary // 4 if arch.family in HYBRID else rotary  # partial_rotary_factor 0.25
    rotary = rotary // 2 if arch.family in GPT_OSS else rotary  # GptOss's cos and sin: half
    if arch.family in GLM_LAYER:
        # the layers keep interleaved copies of their own; the model's cos and sin are kept as
        # the checkpointed layers' inputs only
        rotary = arch.rotary_dim if checkpointing else 0
    elif arch.rotary_dim:  # a partial rotary's cos and sin (GLM-4.5's half of each head)
        rotary = arch.rotary_dim
    head = head_only_bytes(arch, c) if with_head else 0
    return 8 + 2 * c * rotary + head + (8 if checkpointing else 0)


def _layer(arch: Architecture, index: int, c: int, megatron: bool, replicated: int = 1) -> int:
    if megatron:
        return megatron_layer_bytes(arch, index, c, replicated)
    return layer_bytes(arch, index, c)


@dataclass(frozen=True)
class Stage:
    """The decoder layers one rank runs, the micro-batches whose activations it keeps at once,
    and whether it holds the model's head (its final norm, lm_head and logits)."""

    layers: range
    in_flight: int = 1
    last: bool = True

    @classmethod
    def whole(cls, arch: Architecture) -> Stage:
        return cls(range(arch.num_hidden_layers))


def pipeline_stages(
    arch: Architecture, pp: int, micro_batches: int, vpp: int = 1
) -> tuple[Stage, Stage]:
    """The first and the last of ``pp`` pipeline stages under megatron-core's 1F1B schedule
    (``EV_1F1B``): stage r runs min(pp - r - 1, M) warm-up forwards, then one more before each
    backward, so the first stage keeps min(pp, M) micro-batches' activations of its layers and
    the last stage one micro-batch's, with the head and its logits.

    With ``vpp`` model chunks per rank (the interleaved schedule, ``EV_1F1B_INTERLEAVED``) a
    unit of work is one micro-batch through one chunk of L / (pp x vpp) layers; the first stage
    runs 2 (pp - 1) + (vpp - 1) x pp warm-up units (microbatch_group_size_per_vp_stage defaults
    to pp) and keeps one more, at most M x vpp: L (1 + (pp - 1) / (pp vpp)) layers' worth when M
    is large, Korthikanti et al.'s count; the last stage (vpp - 1) x pp + 1 units, one of them
    with the head's logits."""
    layers = arch.num_hidden_layers
    M = max(micro_batches, 1)
    if vpp <= 1:
        per = -(-layers // pp)
        first = Stage(range(min(per, layers)), min(pp, M), False)
        return first, Stage(range(min((pp - 1) * per, layers), layers))
    chunk = -(-layers // (pp * vpp))
    units = min(2 * (pp - 1) + (vpp - 1) * pp + 1, M * vpp)
    first = Stage(range(min(chunk, layers)), units, False)
    last_units = min((vpp - 1) * pp + 1, M * vpp)
    return first, Stage(range(min((pp * vpp - 1) * chunk, layers), layers), last_units)


def kept_bytes(
    arch: Architecture,
    tokens: int,
    checkpointing: bool,
    c: int = 2,
    megatron: bool = False,
    stage: Stage | None = None,
    replicated: int = 1,
    *,
    offloaded: bool = False,
) -> int:
    """Bytes a training forward of ``tokens`` keeps until its backward (logits aside), on the
    whole model or one pipeline ``stage`` (its layers, its micro-batches in flight).

    Under gradient checkpointing (HF's non-reentrant checkpoint per decoder layer, enabled by
    verl at transformer_impl.py:299-300; Megatron's full recompute) each layer keeps only its
    input hidden state. ``replicated``: Megatron's tensor-parallel ranks that each hold the
    hidden states whole, without sequence parallelism (``megatron_layer_bytes``). ``offloaded``:
    the FSDP engine's activation offload (``EV_ACTIVATION_OFFLOAD``) moves every layer's saved
    tensors to the host but the last layer's, which its backward takes first.
    """
    stage = stage or Stage.whole(arch)
    per_layer = _kept_per_layer(arch, stage, checkpointing, c, megatron, replicated)
    layers = sum(per_layer[-1:] if offloaded else per_layer)
    outside = head_bytes(arch, c, checkpointing, stage.last)
    return tokens * stage.in_flight * (layers + outside)


def _kept_per_layer(
    arch: Architecture, stage: Stage, checkpointing: bool, c: int, megatron: bool, replicated: int
) -> list[int]:
    """Per token, what each of the stage's layers keeps for its backward, in layer order."""
    whole = replicated if megatron else 1
    if checkpointing:
        return [c * arch.hidden_size * whole for _ in stage.layers]
    return [_layer(arch, i, c, megatron, whole) for i in stage.layers]


def _mlp_gradients(arch: Architecture, index: int, c: int) -> int:
    """Per token, the gradients in flight at the peak of an MLP's backward beyond what its
    forward saved: the product's gradient and its two factors' while the down projection's
    saved input is already freed, net two intermediate-width tensors (per routed expert and
    shared expert in a MoE layer)."""
    if not arch.is_moe_layer(index):
        return 2 * c * arch.intermediate_size
    if arch.family in GPT_OSS:
        # the clamped gate's backward: gate_up's gradient (two wide) beside the product's, and
        # the gathered token's gradient, per routed token
        k = arch.num_experts_per_tok
        return c * k * (3 * arch.moe_intermediate_size + arch.hidden_size)
    k, h, w = arch.num_experts_per_tok, arch.hidden_size, arch.moe_intermediate_size
    if arch.family in SIGMOID_ROUTER:
        # the fp32 routing weights made the weighted output fp32: at its backward three fp32
        # tensors per routed token (the gradient reaching it, its reordered copy, the product's),
        # the shared experts' backward already done and their saved tensors freed; later, at the
        # down projection's, the fp32 gradient and its compute-dtype cast (measured)
        tail = 3 * 4 * h * k - 4 * c * w * arch.n_shared_experts
        # (the shared experts' own backward first: their product's gradient and its factors')
        return max(tail, (4 + c) * h * k, 2 * c * w * arch.n_shared_experts)
    experts = k + arch.n_shared_experts
    return 2 * c * (w * experts + arch.shared_expert_intermediate_size)


def _layer_norm_backward(arch: Architecture, c: int) -> int:
    """Per token, GLM's post_mlp_layernorm backward, the first a layer's backward runs: with
    the layer's saved tensors all alive, the norm's gradient in the compute dtype, four fp32
    copies of the width and two fp32 scalars (measured, as the final norm's; the families whose
    norm leads into the next layer have none)."""
    return (16 + c) * arch.hidden_size + 8 if arch.family in GLM_LAYER else 0


def layers_backward_bytes(
    arch: Architecture,
    tokens: int,
    checkpointing: bool,
    c: int = 2,
    megatron: bool = False,
    stage: Stage | None = None,
    replicated: int = 1,
    *,
    offloaded: bool = False,
) -> int:
    """The peak while backward runs through the decoder layers: what the forward kept but the
    head's own, plus, in the layer being back-propagated, the layer recomputed under
    checkpointing (its full activations), the hidden state's gradient and the MLP's gradients
    in flight (``_mlp_gradients``); or, if larger, everything kept while the final norm's
    backward runs.

    The head's backward has finished and freed the logits and the head's tensors before the
    last layer's starts, so the two never coexist: a training pass peaks at the larger of this
    and what the forward kept plus the logits' copies (measured in
    tests/test_fit_activations.py)."""
    stage = stage or Stage.whole(arch)
    whole = replicated if megatron else 1
    in_layer = max(
        (
            (_layer(arch, i, c, megatron, whole) if checkpointing else 0)
            + c * arch.hidden_size * whole
            + max(_mlp_gradients(arch, i, c), _layer_norm_backward(arch, c))
            for i in stage.layers
        ),
        default=0,
    )
    if offloaded:
        # the activation offload's double buffer: the layer below's saved tensors come back as
        # a layer's backward starts (on_group_commit_backward), two layers' at once; the final
        # norm's backward runs before the first comes back
        in_layer += max(_kept_per_layer(arch, stage, checkpointing, c, megatron, replicated))
    if stage.last:
        # the final norm's backward, before the head's tensors are freed: its gradient in the
        # compute dtype and four fp32 copies of the width (the cast's, the normalisation's two
        # operands', the input's)
        final_norm = (16 + c) * arch.hidden_size - _softcap(arch, c)
        extra = max(final_norm, in_layer - head_only_bytes(arch, c))
    else:
        extra = in_layer
    kept = kept_bytes(
        arch, tokens, checkpointing, c, megatron, stage, replicated, offloaded=offloaded
    )
    return kept + tokens * extra


def inference_bytes(arch: Architecture, tokens: int, c: int = 2) -> int:
    """Peak of a forward under no_grad (nothing kept): one layer's transients, dominated by the
    MLP (gate, up and their product alive at once) and the residual and norm copies."""
    h = arch.hidden_size
    width = arch.intermediate_size
    if arch.family in GPT_OSS:
        # per routed token at the gate: gate_up (two wide), the clamped gate and up, the
        # sigmoid's input and output, the gated product, up + 1, their product and the grouped
        # kernel's copy (nine wide, measured), and the gathered token
        k = arch.num_experts_per_tok
        return tokens * (c * k * (9 * arch.moe_intermediate_size + h) + 9 * h)
    if arch.family in SIGMOID_ROUTER:
        # per routed token, the larger of the up projection's moment (the gathered token,
        # gate_up, the activation and the product) and the tail's: the fp32 routing weights make
        # the weighted output fp32, and its reordered copy too, beside the down projection's
        # output and the gathered token (measured)
        k, w = arch.num_experts_per_tok, arch.moe_intermediate_size
        routed = tokens * (k * max(c * h + 4 * c * w, 8 * h + 2 * c * h) + 9 * h)
        dense = tokens * (3 * c * width + 9 * h) if arch.first_k_dense_replace else 0
        # the shared experts run after the routed ones: their MLP's three intermediates beside
        # the routed output in fp32, the layer's copies and the router's scores (measured; the
        # larger moment only where the shared experts are wide against the routed ones)
        shared = tokens * (3 * c * w * arch.n_shared_experts + 13 * h + 4 * arch.num_experts)
        return max(routed, dense, shared)
    if arch.is_moe:
        k = arch.num_experts_per_tok
        width = max(width if arch.first_k_dense_replace else 0, 2 * k * arch.moe_intermediate_size)
    # GLM's fused gate_up output (two wide) beside the activation and the product: four
    wide = 4 if arch.family in GLM_LAYER else 3
    return tokens * (wide * c * width + 9 * h)


@dataclass(frozen=True)
class LogitsCost:
    """The logits of one micro-batch: tokens x vocabulary in the compute dtype, held as copies."""

    copies: float
    note: str


def logits_cost(
    training: bool,
    entropy: bool,
    chunked: bool,
    fused: bool,
    compiled: bool = True,
    temperature_copy: bool = True,
    grad_in_place: bool = False,
    fp32_loss: bool = False,
    shifted: bool = False,
) -> LogitsCost:
    """How many tokens x vocab tensors are alive at the peak of the log-prob computation.

    Forward, verl 0.9.0 (transformer_impl.py:1332-1371): the model's logits, then divided by the
    temperature (a second tensor, while the model output still holds the first); a release that
    skips the division at a temperature of 1.0, or divides in place, keeps the first only
    (``temperature_copy``, the release's facts). Entropy (torch_functional.py:231-245) keeps
    softmax(logits) and the product pd * logits unless the engine compiles it
    (use_torch_compile, the default: transformer_impl.py:160-164), when only a fused
    reduction's transient remains; chunked entropy works on fp32 chunks of 2048 rows. Log-probs
    go through flash-attn's cross entropy, which does not materialise a copy (Megatron's engine
    computes them otherwise: ``megatron_logits_cost``).

    Backward (training): the saved (scaled) logits; the cross entropy's gradient, which
    flash-attn writes into the saved logits when asked to (``dlogits = logits if
    ctx.inplace_backward else torch.empty_like(logits)``; verl asks unless the pass takes the
    entropy, transformer_impl.py:1387-1394, ``grad_in_place`` from the release's facts) and
    otherwise allocates; the entropy's gradient. The unscaled logits
    are gone by then (only the returned model output held them), and the division's backward
    runs after the saved logits are freed: the summed gradient and its divided copy. Fused
    kernels never materialise the logits.
    """
    if fused:
        return LogitsCost(0.0, "fused kernels: logits never materialised")
    if fp32_loss:
        return _fp32_loss_cost(training, shifted)
    if not entropy:
        extra = 0.0
    elif chunked:
        extra = 0.25
    else:
        extra = 0.5 if compiled else 2.0
    scaled = 1.0 if temperature_copy else 0.0
    forward = 1.0 + scaled + extra
    in_place = grad_in_place and not entropy
    at_the_head = 1.0 + (0.0 if in_place else 1.0) + (1.0 if entropy else 0.0)
    divided = 1.0 + scaled
    copies = max(forward, at_the_head, divided) if training else forward
    how = (
        ("chunked " if chunked else ("compiled " if compiled else "")) + "entropy"
        if entropy
        else "no entropy"
    )
    if not temperature_copy:
        how += ", no temperature copy"
    if training and in_place:
        how += ", log-prob gradient in place"
    return LogitsCost(copies, f"{copies:g} {'copy' if copies == 1 else 'copies'} ({how})")


def _fp32_loss_cost(training: bool, shifted: bool) -> LogitsCost:
    """torch's cross entropy under bf16 autocast (the old SFT trainer's loss,
    fsdp_sft_trainer.py:381-401@0.7.0), in units of the bf16 logits: the logits, their shifted
    contiguous copy where the samples are padded, the fp32 cast and the fp32 log_softmax it saves
    (two units each) in the forward; in the backward the saved log_softmax, its gradient and the
    input's gradient, all fp32 (measured in tests/test_fit_activations.py)."""
    kept = 1.0 + (1.0 if shifted else 0.0)
    copies = kept + (6.0 if training else 4.0)
    how = "torch's cross entropy in fp32 under autocast" + (", shifted copy" if shifted else "")
    return LogitsCost(copies, f"{copies:g} copies ({how})")


def megatron_logits_cost(training: bool, entropy: bool, fused: bool) -> LogitsCost:
    """How many tokens x vocab-shard tensors (compute dtype) Megatron's engine holds at the peak
    of its log-prob computation (``EV_MEGATRON_CE``). The logits are divided by the temperature
    in place; log-probs go through megatron-core's vocab-parallel cross entropy, which works on
    an fp32 copy (two compute-dtype units) while the bf16 logits are still held, exponentiates
    it in place and saves it; its fp32 gradient is cast back to bf16 for the logits (one more):
    3 units with or without a gradient. The entropy works on a clone of the logits; its
    normalised exponentials become the softmax it saves with its input (chunked or not, every
    chunk's softmax is saved in training; under no_grad each chunk's is freed): 5 units in an
    update (the logits, the clone, the softmax, the fp32 copy), 4 in a forward-only pass.
    Fused kernels never materialise the logits."""
    if fused:
        return LogitsCost(0.0, "fused kernels: logits never materialised")
    if not entropy:
        return LogitsCost(3.0, "3 copies (the logits and the cross entropy's fp32 copy)")
    copies = 5.0 if training else 4.0
    softmax = " and softmax" if training else ""
    return LogitsCost(
        copies,
        f"{copies:g} copies (the logits, the entropy's clone{softmax}, the cross entropy's fp32 copy)",
    )
