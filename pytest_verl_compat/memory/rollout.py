"""The rollout server on one GPU: its weights per tensor-parallel rank, the memory it claims, and
the KV-cache blocks that leaves, as vLLM (and SGLang) size them at start.

vLLM claims ``gpu_memory_utilization`` x the device's total memory (vllm/v1/worker/gpu_worker.py,
Worker.init_device: ``requested_memory = total_memory * gpu_memory_utilization``, and it refuses to
start when less than that is free); what its weights, the profiled forward and the non-torch
allocations leave of it becomes KV cache (Worker.determine_available_memory), cut into blocks of
``block_size`` tokens (vllm/v1/core/kv_cache_utils.py, get_num_blocks:
``available_memory // page_size // num_layers``; the page of one layer is
vllm/v1/kv_cache_interface.py, AttentionSpec.real_page_size_bytes, ``2 * block_size *
num_kv_heads * head_size * dtype_size``, MLA one latent). At start vLLM checks that one sequence
of ``max_model_len`` tokens fits (kv_cache_utils.py, check_enough_kv_cache_memory). SGLang's
``mem_fraction_static`` (set from gpu_memory_utilization, verl/workers/rollout/sglang_rollout/
async_sglang_server.py:298, :317 in 0.9.1) is a share for weights plus KV pool, but of the memory
free when SGLang starts, not of the device: its pool is ``post_model_load_memory -
pre_model_load_memory * (1 - mem_fraction_static)``, both measured with torch.cuda.mem_get_info
(sglang/srt/model_executor/model_runner_kv_cache_mixin.py:138-140@sglang-0.5.8, :70-72@0.5.12,
pre_model_load_memory from ModelRunner.init_torch_distributed), so whatever the trainer holds at
that moment shrinks the pool, where vLLM would refuse to start.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pytest_verl_compat.memory import server_lora
from pytest_verl_compat.memory.architecture import GPT_OSS, Architecture
from pytest_verl_compat.memory.layout import ServerLayout
from pytest_verl_compat.memory.residency import gib_text
from pytest_verl_compat.memory.vision import EMBED as VISION_EMBED
from pytest_verl_compat.pipeline.compose import MISSING  # OmegaConf's mandatory value, as composed

GIB = 1 << 30
BLOCK_SIZE = 16  # vLLM's default block size (CacheConfig.block_size) for full attention
KERNEL_BLOCK = 16  # flash attention's block alignment, to which a hybrid's block size is raised
# What vLLM holds besides weights and KV cache (stated, not measured here): the CUDA graphs it
# captures unless enforce_eager (its log: "Graph capturing finished ... took 0.5-1.5 GiB"), and
# non-torch allocations of its worker (NCCL, cuBLAS workspaces).
CUDA_GRAPHS = int(1.0 * GIB)
NON_TORCH = int(0.5 * GIB)
# vLLM captures its CUDA graphs after it has sized and allocated the KV cache. Before 0.21.0 the
# graphs sit outside the gpu_memory_utilization share (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS,
# off by default); from 0.21.0 their profiled estimate comes out of the KV cache, inside the share.
# Which vLLM a release runs with is its fact ``vllm_cuda_graphs`` (release_facts).
VLLM_GRAPHS_OUTSIDE = "vllm/envs.py:1636@vllm-0.18.0 VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS (default 0); vllm/v1/worker/gpu_worker.py compile_or_warm_up_model (graphs captured after initialize_from_config allocates the KV cache)"
VLLM_GRAPHS_INSIDE = "vllm/envs.py:1894-1896@vllm-0.24.0 VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS (default 1 from 0.21.0); vllm/v1/worker/gpu_worker.py:467-492@vllm-0.24.0 (requested_memory - non_kv_cache_memory - cudagraph_memory_estimate_applied)"
EV_VLLM_ARGS = "verl/workers/rollout/vllm_rollout/vllm_async_server.py:286-311"
EV_MAX_MODEL_LEN = "verl/workers/rollout/vllm_rollout/vllm_async_server.py:954-955"
EV_SLEEP = "verl/workers/rollout/vllm_rollout/vllm_async_server.py:791-800, :1075-1098"
EV_WAKE = "verl/workers/engine_workers.py:762-801"
EV_SGLANG = "verl/workers/rollout/sglang_rollout/async_sglang_server.py:298 (:317 in 0.9.1; mem_fraction_static = gpu_memory_utilization)"
SGLANG_SHARE = "sglang/srt/model_executor/model_runner_kv_cache_mixin.py:138-140@sglang-0.5.8, :70-72@sglang-0.5.12 (rest = post_model_load_memory - pre_model_load_memory * (1 - mem_fraction_static), free memory by torch.cuda.mem_get_info)"
VLLM_PROFILE = "vllm/v1/worker/gpu_model_runner.py:5456-5528@vllm-0.18.0, :6239-6310@0.24.0 (profile_run: the encoder outputs cached, _dummy_run, then _dummy_sampler_run beside its hidden states); vllm/model_executor/models/qwen2.py:292-312 (the decoder layer holds hidden_states and residual), layers/layernorm.py:72-90 (fused_add_rms_norm in place); layers/fused_moe/fused_moe.py:1979-1994@0.18.0 (TritonExperts.workspace_shapes)"
SGLANG_NO_POOL = "sglang/srt/model_executor/model_runner_kv_cache_mixin.py:327-329@sglang-0.5.8, pool_configurator.py:52-53@sglang-0.5.12 (max_total_num_tokens <= 0: 'Not enough memory')"
# SGLang's pool counts tokens (page_size 1 unless a backend asks more: server_args.py:1917-1919@
# sglang-0.5.8; verl asks fa3 before 0.5.12 and flashinfer from it, async_sglang_server.py:270-278
# @0.9.0, :289-297@0.9.1): the bytes one token takes in every layer with a KV cache (its cell,
# kv heads per rank x (head_dim + v_head_dim) x layers x dtype) divide what its share leaves
# (model_runner_kv_cache_mixin.py:46-144@sglang-0.5.8, pool_configurator.py:125-186@0.5.12). A
# hybrid sliding-window model (is_hybrid_swa_model: gpt-oss, model_config.py:1220-1228@0.5.8)
# gets two pools: the full-attention layers hold as many tokens as the cell of full layers plus
# swa_full_tokens_ratio (0.8) x the sliding layers allows, the sliding layers 0.8 x that
# (pool_configurator.py:196-281@0.5.12; 0.5.8 splits the same total,
# model_runner_kv_cache_mixin.py:206-246).
SGLANG_POOL = "sglang/srt/model_executor/pool_configurator.py:125-186, :196-281@sglang-0.5.12; model_runner_kv_cache_mixin.py:46-144, :206-246@sglang-0.5.8"
SGLANG_SWA_FAMILIES = GPT_OSS
SWA_FULL_TOKENS_RATIO = 0.8  # server_args.py:325@sglang-0.5.8 (swa_full_tokens_ratio)
VLLM_REQUESTED = "vllm/v1/worker/gpu_worker.py Worker.init_device (requested_memory = total_memory * gpu_memory_utilization; ValueError when less is free)"
VLLM_PAGE = "vllm/v1/kv_cache_interface.py AttentionSpec.real_page_size_bytes (2 * block_size * num_kv_heads * head_size * dtype_size); MLAAttentionSpec.real_page_size_bytes"
VLLM_BLOCKS = (
    "vllm/v1/core/kv_cache_utils.py get_num_blocks (available_memory // page_size // num_layers)"
)
VLLM_ONE_SEQUENCE = "vllm/v1/core/kv_cache_utils.py check_enough_kv_cache_memory (one max_model_len sequence must fit)"
# A hybrid model (Gated DeltaNet + full attention) shares one block pool between its attention
# layers and its linear-attention layers' recurrent states: vLLM raises the attention block size
# until one attention page holds one layer's state (16-token multiples) and pads the state to it,
# groups the layers by kind into groups of the smaller kind's count, and cuts the pool into
# available // page // layers-per-group blocks; a sequence takes cdiv(tokens, block) blocks of
# each attention group and, with prefix caching (verl's rollout default, enable_prefix_caching:
# True, vllm_async_server.py:299), two blocks of each state group ('align': Qwen3-Next and Qwen3.5
# do not support mamba prefix caching 'all'), else one.
VLLM_HYBRID = (
    "vllm/model_executor/models/config.py:103-240@vllm-0.18.0 (HybridAttentionMambaModelConfig: "
    "attention block size, state page padded), :356-414 (mamba_cache_mode align with prefix "
    "caching); vllm/v1/core/kv_cache_utils.py:956-1075@vllm-0.18.0 (groups of the smaller kind's "
    "layer count), :1078-1148 (num_blocks = available // page // group size); "
    "vllm/v1/kv_cache_interface.py:293-300@vllm-0.18.0 (a state group's blocks per sequence); "
    "vllm/model_executor/layers/mamba/mamba_utils.py:177-200@vllm-0.18.0 (Gated DeltaNet state "
    "shapes); vllm/model_executor/models/config.py:594-618@vllm-0.18.0 (Qwen3.5's ssm state dtype); "
    "the same arithmetic in vllm 0.24.0, the block size aligned in "
    "vllm/platforms/interface.py:633-800@vllm-0.24.0 (16-token kernel blocks assumed: flash "
    "attention's)"
)


# A model with sliding-window layers beside full-attention ones (Gemma 2/3) gets vLLM's hybrid KV
# cache manager: its layers grouped by kind as a hybrid's are (_get_kv_cache_groups_uniform_page_size),
# and a sliding-window layer keeps at most sliding_window - 1 + max_num_batched_tokens tokens of a
# sequence, in one block more than they fill (SlidingWindowSpec.max_memory_usage_bytes); a model
# whose every layer slides (Mistral v0.1) is one group of them all. The start check sums each
# group's blocks for one max_model_len sequence (_max_memory_usage_bytes_from_groups).
VLLM_SLIDING = (
    "vllm/v1/kv_cache_interface.py:248-270@vllm-0.18.0, :506-537@vllm-0.24.0 "
    "(SlidingWindowSpec.max_memory_usage_bytes); "
    "vllm/v1/core/kv_cache_utils.py:956-1075@vllm-0.18.0 (the layers grouped by kind), "
    "kv_cache_utils.py:1801-1861@vllm-0.24.0 (one sequence: every group's blocks)"
)


def _group_size(counts: list[int]) -> int:
    """vLLM's layers per KV-cache group for layers of several kinds: the smaller kind's count,
    the larger's where it is less than half as many again (kv_cache_utils.py:1040-1051@0.18.0)."""
    group = min(counts)
    return max(counts) if max(counts) < group * 1.5 else group


@dataclass(frozen=True)
class WindowCache:
    """How vLLM lays out the cache of a model with sliding-window layers (VLLM_SLIDING)."""

    group_size: int  # layers per KV-cache group
    full_groups: int
    window_groups: int
    window_tokens: int  # the most a sliding layer keeps of a sequence

    def blocks_for(self, tokens: int) -> int:
        window = min(self.window_tokens, tokens)
        return self.full_groups * _cdiv(tokens, BLOCK_SIZE) + self.window_groups * (
            _cdiv(window, BLOCK_SIZE) + 1
        )


def window_cache(arch: Architecture, batched_tokens: int) -> WindowCache:
    sliding = len(arch.sliding_layers)
    full = arch.num_hidden_layers - sliding
    group = _group_size([n for n in (full, sliding) if n])
    window = arch.sliding_window or 0
    return WindowCache(
        group_size=group,
        full_groups=_cdiv(full, group),
        window_groups=_cdiv(sliding, group),
        window_tokens=window - 1 + batched_tokens,
    )


@dataclass(frozen=True)
class HybridCache:
    """How vLLM lays out a hybrid model's cache on one TP rank."""

    block_size: int  # attention tokens per block (raised to hold one layer's state)
    page: int  # bytes of one block of one layer (attention and padded state alike)
    group_size: int  # layers per KV-cache group
    attention_groups: int
    state_groups: int
    state_blocks: int  # blocks one sequence takes in each state group

    def blocks_for(self, tokens: int) -> int:
        return self.attention_groups * _cdiv(tokens, self.block_size) + (
            self.state_groups * self.state_blocks
        )


@dataclass(frozen=True)
class ServerEngine:
    """How a rollout engine sizes its memory at start: what the forecast asks of a server
    instead of its engine's name (``engine_of``)."""

    share_of_free: bool  # its share is of the memory free at its start, not of the device
    profile_in_share: bool  # its profiled forward comes out of its share (else sits outside)
    refuses_short_of_one_sequence: bool  # at start, when one max_model_len sequence does not fit
    # vLLM's hybrid KV cache manager: one block pool for layers of several kinds, a hybrid's
    # KV and recurrent states (VLLM_HYBRID) or full and sliding-window attention (VLLM_SLIDING)
    hybrid_pool: bool
    evidence: str  # where its share comes from
    token_pool: bool = False  # its pool counts tokens, not blocks (SGLANG_POOL)
    no_pool_error: str = ""  # what it raises when its weights leave no cache, where not vLLM's


VLLM_ENGINE = ServerEngine(
    share_of_free=False,
    profile_in_share=True,
    refuses_short_of_one_sequence=True,
    hybrid_pool=True,
    evidence=f"{VLLM_REQUESTED}; {VLLM_PROFILE}",
)
SGLANG_ENGINE = ServerEngine(
    share_of_free=True,
    profile_in_share=False,
    refuses_short_of_one_sequence=False,  # a longer request is refused per request
    hybrid_pool=False,  # vLLM's: SGLang's own sliding-window pool is its token pool's
    evidence=f"{EV_SGLANG}; {SGLANG_SHARE}",
    token_pool=True,
    no_pool_error="SGLang raises 'Not enough memory'",  # SGLANG_NO_POOL
)
# The other engines (TRT-LLM, HF) are forecast with vLLM's share arithmetic, without its checks.
OTHER_ENGINE = dataclasses.replace(
    VLLM_ENGINE, refuses_short_of_one_sequence=False, hybrid_pool=False
)
ENGINES = {"vllm": VLLM_ENGINE, "sglang": SGLANG_ENGINE}


def engine_of(server: ServerLayout) -> ServerEngine:
    return ENGINES.get(server.name, OTHER_ENGINE)


def engine_assumption(server: ServerLayout) -> str:
    """What the forecast assumes of a server whose engine it does not model ("" for vLLM and
    SGLang); an unset name (OmegaConf's ``???``) is said as the error verl stops at."""
    if server.name in ENGINES:
        return ""
    named = (
        f"{server.section}.name is unset ('???': verl stops at worker start)"
        if server.name == MISSING
        else f"{server.section}.name is {server.name!r}"
    )
    return f"{named}: that server is forecast with vLLM's share arithmetic, without vLLM's start checks"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def hybrid_cache(
    arch: Architecture, tp: int, kv_dtype: int, model_dtype: int, prefix_caching: bool
) -> HybridCache:
    """vLLM's cache layout of a hybrid model (VLLM_HYBRID), per TP rank: the states in the model's
    dtype (mamba_cache_dtype auto), the recurrent one in the config's mamba_ssm_dtype if given."""
    conv_dim = 2 * arch.linear_key_dim + arch.linear_value_dim
    conv = (arch.linear_conv_kernel_dim - 1) * (conv_dim // tp) * model_dtype
    ssm_dtype = arch.mamba_ssm_dtype or model_dtype
    temporal = (arch.linear_num_value_heads // tp) * arch.linear_value_head_dim
    temporal *= arch.linear_key_head_dim * ssm_dtype
    state_page = conv + temporal
    one_token = arch.kv_bytes_per_token_layer(tp, kv_dtype)
    block = max(BLOCK_SIZE, KERNEL_BLOCK * _cdiv(state_page, KERNEL_BLOCK * one_token))
    full = arch.full_attention_layers
    linear = arch.num_hidden_layers - full
    group = _group_size([full, linear])
    return HybridCache(
        block_size=block,
        page=block * one_token,
        group_size=group,
        attention_groups=_cdiv(full, group),
        state_groups=_cdiv(linear, group),
        state_blocks=2 if prefix_caching else 1,
    )


# rollout.quantization "fp8": verl asks vLLM for block-wise fp8 (128 x 128 blocks, e4m3, the MoE
# router left out: vllm_async_server.py:1026-1045) and SGLang for fp8 (async_sglang_server.py:
# 283-293); both quantize the linear layers' and the experts' weights to one byte with one fp32
# scale per block, and keep embeddings, the lm_head, norms and biases in the model's dtype
# (vLLM's Fp8Config quantizes LinearBase and FusedMoE layers only).
FP8_WEIGHTS = "fp8"
FP8_BLOCK = 128 * 128
QUANTIZED_KINDS = ("linear", "experts")


def weights_per_rank(
    arch: Architecture, tp: int, ep_ranks: int, dtype: int, quantization: str | None = None
) -> int:
    """Bytes of the model one server rank loads: linear and embedding weights split over tensor
    parallel (vocabulary-parallel embedding and lm_head), norms replicated, experts split over
    the expert-parallel ranks; with fp8 the linear and expert weights at one byte and a 4-byte
    scale per block."""
    total = 0
    for t in arch.tensors():
        if t.kind == "experts":
            numel = t.numel // max(ep_ranks, 1)
        elif t.kind in ("norm", "router", VISION_EMBED):  # a VL tower's embeddings: replicated
            numel = t.numel
        else:
            numel = t.numel // max(tp, 1)
        if quantization == FP8_WEIGHTS and t.kind in QUANTIZED_KINDS:
            total += numel + _cdiv(numel, FP8_BLOCK) * 4
        else:
            total += numel * dtype
    return total


def quantization_assumption(server: ServerLayout) -> str:
    """What the forecast assumes of a quantization it does not count ("" for none and fp8)."""
    if server.quantization in (None, FP8_WEIGHTS):
        return ""
    return (
        f"{server.section}.quantization {server.quantization!r}: the server's weights are "
        "counted in the rollout dtype"
    )


def page_bytes(arch: Architecture, tp: int, kv_dtype: int, block_size: int = BLOCK_SIZE) -> int:
    """One block of one layer on one TP rank (vLLM's page_size_bytes)."""
    return block_size * arch.kv_bytes_per_token_layer(tp, kv_dtype)


def profile_bytes(arch: Architecture, server: ServerLayout) -> int:
    """vLLM's profiled peak besides weights (``VLLM_PROFILE``): its dummy forward of
    max_num_batched_tokens peaks in a decoder layer's MLP, beside the residual stream and the
    MLP's input (fused_add_rms_norm works in place; the layer holds both): a dense MLP's gate_up
    and activation outputs per TP rank, or a MoE layer's fused-experts workspaces (top_k x
    max(activation width, hidden) and top_k x max(gate_up width, hidden)) and their output, the
    experts' widths split over TP unless expert parallel keeps them whole. The sampler's fp32
    logits for max_num_seqs then run beside the forward's hidden states, and a vision model's
    encoder outputs stay cached through the language model's dummy run."""
    tokens, c, h = server.max_num_batched_tokens, server.dtype, arch.hidden_size
    layers = range(arch.num_hidden_layers)
    per_token = 0
    if any(not arch.is_moe_layer(i) for i in layers):
        per_token = 2 * h + 3 * arch.intermediate_size // server.tp
    if arch.is_moe:
        width = arch.moe_intermediate_size // (1 if server.ep > 1 else server.tp)
        k = arch.num_experts_per_tok
        shared = h if arch.shared_expert_intermediate_size or arch.n_shared_experts else 0
        moe = 3 * h + k * (max(width, h) + max(2 * width, h)) + shared
        per_token = max(per_token, moe)
    sampler = server.max_num_seqs * arch.vocab_size * 4 * 3
    encoder = tokens * c * h if arch.vision is not None else 0
    return max(tokens * c * per_token, tokens * c * h + sampler) + encoder


@dataclass(frozen=True)
class ServerMemory:
    """What one server rank claims and what its KV cache holds."""

    claimed: int  # what the awake server holds: its share and what sits outside it
    share: int  # gpu_memory_utilization x capacity (vLLM); x the free memory at start (SGLang)
    free_at_start: int  # what the GPU had free when the server measured it
    weights: int
    overhead: int  # what the share holds besides weights and KV (vLLM: profile, non-torch, graphs
    # where its release's vLLM counts them in the share)
    outside: int  # what the server holds outside its share (vLLM: CUDA graphs)
    kv_bytes: int
    blocks: int
    block_size: int
    page: int  # bytes of one block in one layer
    kv_tokens: int
    one_sequence_bytes: int  # KV of one max_model_len sequence
    asleep: int  # what stays on the GPU while the server sleeps
    sleeps: bool
    graphs: int  # its CUDA graphs (in the share or outside it), kept while it sleeps
    window_tokens: int = 0  # SGLang's sliding-window pool, beside kv_tokens (its full layers')
    lora_slots: int = 0  # the server's LoRA slots, counted in weights (server_lora)

    @property
    def concurrent_sequences(self) -> float:
        return self.kv_tokens / max(self.one_sequence_tokens, 1)

    @property
    def one_sequence_tokens(self) -> int:
        return self.one_sequence_bytes // max(self.page // self.block_size, 1) if self.page else 0


def server_memory(server: ServerLayout, capacity: int, held: int = 0) -> ServerMemory:
    """One server rank's memory on a GPU of ``capacity`` bytes that holds ``held`` bytes (other
    processes' and its own context) when the server starts: vLLM's share is of the device,
    SGLang's of what is free (``ServerEngine``)."""
    arch, engine = server.model.architecture, engine_of(server)
    ep_ranks = server.tp * server.dp if server.ep > 1 else server.tp
    # vLLM's LoRA slots load with the weights (server_lora.EV_LOAD), SGLang's pool right after
    # them (EV_SGLANG_ORDER): the share holds both as it holds the weights
    lora_slots = server_lora.lora_bytes(server, ep_ranks if server.ep > 1 else 0)
    weights = weights_per_rank(arch, server.tp, ep_ranks, server.dtype, server.quantization)
    weights += lora_slots
    free = max(capacity - held, 0)
    share = int(server.gpu_memory_utilization * (free if engine.share_of_free else capacity))
    graphs = 0 if server.enforce_eager else CUDA_GRAPHS
    profiled = profile_bytes(arch, server) + NON_TORCH
    if not engine.profile_in_share:
        # SGLang's static share holds weights and the KV pool; activations and graphs sit outside
        overhead, outside = 0, profiled + graphs
    elif server.graphs_in_share:
        overhead, outside = profiled + graphs, 0
    else:
        overhead, outside = profiled, graphs
    kv = share - weights - overhead
    block_size = BLOCK_SIZE
    page = page_bytes(arch, server.tp, server.kv_dtype)
    window_tokens = 0
    if engine.token_pool:
        blocks, block_size, page, window_tokens, one = sglang_pool(arch, server, max(kv, 0))
    elif arch.layer_types and engine.hybrid_pool:
        cache = hybrid_cache(arch, server.tp, server.kv_dtype, server.dtype, server.prefix_caching)
        block_size, page = cache.block_size, cache.page
        blocks = max(kv, 0) // page // cache.group_size
        one = cache.blocks_for(server.max_model_len) * page * cache.group_size
    elif arch.sliding_layers and engine.hybrid_pool:
        window = window_cache(arch, server.max_num_batched_tokens)
        blocks = max(kv, 0) // page // window.group_size
        one = window.blocks_for(server.max_model_len) * page * window.group_size
    else:
        # the layers with a KV cache (a hybrid's attention layers, its states not modelled)
        layers = arch.full_attention_layers
        blocks = max(kv, 0) // page // layers if page else 0
        one = _cdiv(server.max_model_len, BLOCK_SIZE) * page * layers
    sleeps = server.free_cache_engine
    kept = weights if server.keeps_weights_asleep else 0  # SGLang's level-1 sleep (adapters)
    asleep = graphs + kept if sleeps else share + outside
    return ServerMemory(
        graphs=graphs,
        claimed=share + outside,
        share=share,
        free_at_start=free,
        weights=weights,
        overhead=overhead,
        outside=outside,
        kv_bytes=max(kv, 0),
        blocks=blocks,
        block_size=block_size,
        page=page,
        kv_tokens=blocks * block_size,
        one_sequence_bytes=one,
        window_tokens=window_tokens,
        asleep=asleep,
        sleeps=sleeps,
        lora_slots=lora_slots,
    )


def sglang_pool(
    arch: Architecture, server: ServerLayout, kv: int
) -> tuple[int, int, int, int, int]:
    """SGLang's token pool (SGLANG_POOL) of ``kv`` bytes: its tokens as blocks of one token, the
    bytes of one token in one layer, the sliding-window pool's tokens (0 without one), and the
    KV of one max_model_len sequence (a sliding layer keeps its window's tokens)."""
    per_token = page_bytes(arch, server.tp, server.kv_dtype, block_size=1)
    if not per_token:
        return 0, 1, 0, 0, 0
    sliding = len(arch.sliding_layers) if arch.family in SGLANG_SWA_FAMILIES else 0
    full = arch.full_attention_layers - sliding
    cell = per_token * full + SWA_FULL_TOKENS_RATIO * per_token * sliding
    tokens = int(kv // cell) if cell else 0
    window = int(tokens * SWA_FULL_TOKENS_RATIO) if sliding else 0
    length = server.max_model_len
    in_window = min(length, arch.sliding_window or length)
    one = per_token * (full * length + sliding * in_window)
    return tokens, 1, per_token, window, one


def graphs_evidence(server: ServerLayout) -> str:
    """Where vLLM's CUDA graphs sit, as the vLLM of the server's release decides."""
    return VLLM_GRAPHS_INSIDE if server.graphs_in_share else VLLM_GRAPHS_OUTSIDE


def share_evidence(server: ServerLayout) -> str:
    """Where the server's share and its CUDA graphs come from, as its engine decides."""
    engine = engine_of(server)
    if not engine.profile_in_share:
        return engine.evidence
    return f"{engine.evidence}; {graphs_evidence(server)}"


def share_text(server: ServerLayout, mem: ServerMemory) -> str:
    """The awake server's share and what sits outside it, as fit prints it."""
    engine = engine_of(server)
    of = (
        f"the {gib_text(mem.free_at_start)} free at its start"
        if engine.share_of_free
        else "capacity"
    )
    head = f"gpu_memory_utilization {server.gpu_memory_utilization} x {of}: "
    fp8 = " (linear and expert weights in fp8)" if server.quantization == FP8_WEIGHTS else ""
    inside = f"weights {gib_text(mem.weights)}{fp8}, KV {gib_text(mem.kv_bytes)}, profile "
    if server.graphs_in_share:
        return f"{head}{inside}{gib_text(mem.overhead - mem.graphs)}, graphs {gib_text(mem.graphs)}"
    if not mem.outside:
        return f"{head}{inside}{gib_text(mem.overhead)}; no CUDA graphs (enforce_eager)"
    outside = "graphs" if engine.profile_in_share else "graphs/profile"
    return f"{head}{inside}{gib_text(mem.overhead)}; outside it, {outside} {gib_text(mem.outside)}"
