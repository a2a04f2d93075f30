"""The rollout server's KV cache: the block arithmetic equals vLLM's own for the same model facts
and settings, and the servers that vLLM refuses to start are the ones the forecast calls so.

vLLM's formulas, transcribed here as the independent side of the test (vllm-project/vllm, the
v1 engine verl 0.9.0 runs, vllm>=0.18): a layer's page is
``2 * block_size * num_kv_heads * head_size * get_dtype_size(dtype)`` (vllm/v1/
kv_cache_interface.py, AttentionSpec.real_page_size_bytes), multi-head latent attention one
latent of ``kv_lora_rank + qk_rope_head_dim`` (MLAAttentionSpec.real_page_size_bytes, one KV
head); a rank keeps ``max(1, total_num_kv_heads // tensor_parallel_size)`` KV heads
(ModelConfig.get_num_kv_heads); the blocks are ``int(available_memory // page_size //
num_layers)`` (vllm/v1/core/kv_cache_utils.py, get_num_blocks).
"""

from __future__ import annotations

import dataclasses

import pytest

from pytest_verl_compat.memory.architecture import Architecture
from pytest_verl_compat.memory.gpus import GIB, find_gpu
from pytest_verl_compat.memory.layout import ServerLayout
from pytest_verl_compat.memory.models import ModelChoice, from_table
from pytest_verl_compat.memory.rollout import (
    BLOCK_SIZE,
    hybrid_cache,
    page_bytes,
    profile_bytes,
    server_memory,
)


def _arch(repo: str) -> Architecture:
    choice = from_table(repo)
    assert choice is not None, repo
    return choice.architecture


def _vllm_page(arch: Architecture, tp: int, dtype_size: int, block_size: int = 16) -> int:
    if arch.kv_lora_rank:
        return block_size * 1 * (arch.kv_lora_rank + arch.qk_rope_head_dim) * dtype_size
    num_kv_heads = max(1, arch.num_key_value_heads // tp)
    return 2 * block_size * num_kv_heads * arch.head_dim * dtype_size


MODELS = [
    "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen3-8B",
    "Qwen/Qwen3-30B-A3B",
    "Qwen/Qwen3-235B-A22B",
    "meta-llama/Llama-3.1-70B-Instruct",
    "google/gemma-2-9b-it",
    "deepseek-ai/DeepSeek-V3",
    "lmsys/gpt-oss-20b-bf16",
]


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("repo", MODELS)
@pytest.mark.parametrize("dtype_size", [2, 1])
def test_page_size_is_vllms(repo: str, tp: int, dtype_size: int) -> None:
    arch = _arch(repo)
    assert page_bytes(arch, tp, dtype_size) == _vllm_page(arch, tp, dtype_size), repo


def _server(repo: str, tp: int, util: float, max_model_len: int, **extra: object) -> ServerLayout:
    choice = from_table(repo)
    assert choice is not None
    return ServerLayout(
        name="vllm", section="actor_rollout_ref.rollout", model=choice, tp=tp, dp=1, ep=1,
        gpu_memory_utilization=util, max_model_len=max_model_len, max_num_seqs=256,
        max_num_batched_tokens=8192, enforce_eager=False, free_cache_engine=True, dtype=2,
        kv_dtype=2, colocated=True, standalone_gpus=0, keeps_weights_asleep=False, **extra,  # type: ignore[arg-type]
    )  # fmt: skip


def _vllm_layers_per_group(arch: Architecture) -> int:
    """vLLM's layers per KV-cache group (kv_cache_utils.py, _get_kv_cache_groups_uniform_page_size):
    one group of every layer when they are all alike, else the fewest layers of one kind, or the
    most where that is under 1.5 times the fewest."""
    sliding = len(arch.sliding_layers)
    kinds = [n for n in (arch.num_hidden_layers - sliding, sliding) if n]
    fewest, most = min(kinds), max(kinds)
    return most if most < 1.5 * fewest else fewest


@pytest.mark.parametrize("repo", MODELS)
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_blocks_are_get_num_blocks(repo: str, tp: int) -> None:
    memory = server_memory(_server(repo, tp, 0.9, 4096), find_gpu("H200").usable_bytes)
    arch = _arch(repo)
    group = _vllm_layers_per_group(arch)
    expected = int(memory.kv_bytes // _vllm_page(arch, tp, 2) // group)
    assert memory.blocks == expected
    assert memory.kv_tokens == expected * BLOCK_SIZE


def test_a_logged_kv_cache_size() -> None:
    """vllm-project/vllm#21348: Qwen3-235B-A22B-FP8, tensor parallel 4 on H100s, logged
    "Available KV cache memory: 8.11 GiB" and "GPU KV cache size: 178,880 tokens". The same
    arithmetic on the logged memory (rounded to 0.01 GiB) gives the tokens within 2%."""
    arch = _arch("Qwen/Qwen3-235B-A22B")
    available = int(8.11 * GIB)
    blocks = available // _vllm_page(arch, 4, 2) // arch.num_hidden_layers
    assert blocks * BLOCK_SIZE == pytest.approx(178_880, rel=0.02)
    assert page_bytes(arch, 4, 2) == _vllm_page(arch, 4, 2)


def test_a_server_whose_weights_do_not_fit_cannot_start() -> None:
    """Qwen2.5-7B (15.2 GB of bf16 weights) at tp 1 with half of a 24 GB GPU."""
    memory = server_memory(
        _server("Qwen/Qwen2.5-7B-Instruct", 1, 0.5, 4096), find_gpu("RTX4090").usable_bytes
    )
    assert memory.weights + memory.overhead > memory.claimed
    assert memory.kv_bytes == 0 and memory.blocks == 0


def test_one_max_model_len_sequence_must_fit() -> None:
    """Llama 3.1 8B's 131,072-token context needs 16 GiB of KV cache per sequence at tp 1: half of
    an A100-40GB leaves less (vLLM's check_enough_kv_cache_memory refuses to start)."""
    server = _server("meta-llama/Llama-3.1-8B-Instruct", 1, 0.6, 131072)
    memory = server_memory(server, find_gpu("A100-40GB").usable_bytes)
    assert memory.one_sequence_bytes == 131072 // 16 * 32 * _vllm_page(
        _arch("meta-llama/Llama-3.1-8B-Instruct"), 1, 2
    )
    assert 0 < memory.kv_bytes < memory.one_sequence_bytes
    shorter = server_memory(
        dataclasses.replace(server, max_model_len=8192), find_gpu("A100-40GB").usable_bytes
    )
    assert shorter.kv_bytes >= shorter.one_sequence_bytes


def _vllm_sliding_max_bytes(window: int, batched: int, max_model_len: int, page: int) -> int:
    """SlidingWindowSpec.max_memory_usage_bytes (vllm/v1/kv_cache_interface.py): the window's
    last ``sliding_window - 1`` tokens and one step's new ones, capped at max_model_len, in one
    block more than they fill."""
    tokens = min(window - 1 + batched, max_model_len)
    return (-(-tokens // 16) + 1) * page


@pytest.mark.parametrize(
    ("repo", "layers", "sliding", "group"),
    [
        ("google/gemma-3-12b-it", 48, 40, 8),  # 5 local layers to 1 global: groups of 8
        ("google/gemma-2-9b-it", 42, 21, 21),  # alternating: groups of 21
        ("mistralai/Mistral-7B-Instruct-v0.1", 32, 32, 32),  # every layer slides: one group
        # vLLM's gpt-oss slides on even layers (sliding_window if layer_idx % 2 == 0, its
        # models/gpt_oss.py): alternating from the first, as the config's layer_types
        ("lmsys/gpt-oss-120b-bf16", 36, 18, 18),
    ],
)
def test_one_sequence_of_a_sliding_window_model_is_vllms(
    repo: str, layers: int, sliding: int, group: int
) -> None:
    """vLLM's start check for one max_model_len sequence (_max_memory_usage_bytes_from_groups,
    vllm 0.24.0): group size x page x the sum over groups of each group's blocks, where a
    full-attention group needs the whole sequence and a sliding-window group its window."""
    arch = _arch(repo)
    assert (arch.num_hidden_layers, len(arch.sliding_layers)) == (layers, sliding)
    max_len, batched, tp = arch.max_position_embeddings or 0, 8192, 2
    page = _vllm_page(arch, tp, 2)
    full_groups, window_groups = -(-(layers - sliding) // group), -(-sliding // group)
    window = arch.sliding_window or 0
    blocks = full_groups * -(-max_len // 16) + window_groups * (
        _vllm_sliding_max_bytes(window, batched, max_len, page) // page
    )
    mem = server_memory(_server(repo, tp, 0.9, max_len), find_gpu("H200").usable_bytes)
    assert mem.one_sequence_bytes == group * page * blocks
    assert mem.blocks == mem.kv_bytes // page // group


def test_a_long_context_sliding_window_model_starts() -> None:
    """Gemma 3 12B with its 131,072-token context at tp 2 on an A100 40GB, half the GPU: counted
    as full attention one sequence would need 24 GiB; with vLLM's sliding-window groups its 40
    local layers keep 1,024 + 8,192 tokens each and the server starts."""
    server = _server("google/gemma-3-12b-it", 2, 0.5, 131072)
    mem = server_memory(server, find_gpu("A100-40GB").usable_bytes)
    full = 131072 // 16 * 48 * _vllm_page(server.model.architecture, 2, 2)
    assert mem.one_sequence_bytes < full / 4
    assert mem.kv_bytes > mem.one_sequence_bytes


def _sglang_pool(free_before_load: int, weights: int, fraction: float) -> int:
    """SGLang's pool, transcribed (model_runner_kv_cache_mixin.py:138-140@sglang-0.5.8, :70-72
    @0.5.12): ``post_model_load_memory - pre_model_load_memory * (1 - mem_fraction_static)``, both
    the free memory torch.cuda.mem_get_info reports, before and after its weights load."""
    post = free_before_load - weights
    return int(post - free_before_load * (1 - fraction))


@pytest.mark.parametrize("held_gib", [0, 4, 23])
def test_sglang_claims_its_static_fraction_of_the_memory_free_at_its_start(held_gib: int) -> None:
    """SGLang's static fraction is of what is free when it starts (whatever the trainer holds
    shrinks its pool); vLLM's share is of the device whatever is held (it refuses to start when
    less is free). Same model, GPU and fraction: only the server differs."""
    vllm = _server("Qwen/Qwen3-8B", 2, 0.5, 4096)
    sglang = dataclasses.replace(vllm, name="sglang")
    capacity, held = find_gpu("H100").usable_bytes, held_gib * GIB
    memory = server_memory(sglang, capacity, held)
    assert memory.kv_bytes == pytest.approx(
        _sglang_pool(capacity - held, memory.weights, 0.5), abs=1
    )
    assert memory.share == int(0.5 * (capacity - held)) and memory.free_at_start == capacity - held
    assert server_memory(vllm, capacity, held).share == int(0.5 * capacity)
    assert isinstance(sglang.model, ModelChoice)


def _sglang_0_5_8_tokens(rest: int, cell_per_layer: int, layers: int, full: int) -> tuple[int, int]:
    """SGLang 0.5.8's pool, transcribed: max_total_num_tokens = rest // cell_size over every
    layer (model_runner_kv_cache_mixin.py:46-144), then, for a hybrid sliding-window model,
    full = int(tokens x layers / (0.8 x sliding + full)) and sliding = int(full x 0.8)
    (set_num_tokens_hybrid_swa, :206-246), page_size 1."""
    tokens = rest // (cell_per_layer * layers)
    if full == layers:
        return tokens, 0
    full_tokens = int(tokens * layers / (0.8 * (layers - full) + full))
    return full_tokens, int(full_tokens * 0.8)


def _sglang_0_5_12_tokens(
    rest: int, cell_per_layer: int, layers: int, full: int
) -> tuple[int, int]:
    """SGLang 0.5.12's, transcribed (pool_configurator.py:182-186, HybridSWAPoolConfigurator
    :225-281): the cell of the full layers plus 0.8 x the sliding ones', then 0.8 x that."""
    if full == layers:
        return int(rest // (cell_per_layer * layers)), 0
    cell = cell_per_layer * full + 0.8 * cell_per_layer * (layers - full)
    full_tokens = int(rest // cell)
    return full_tokens, int(full_tokens * 0.8)


@pytest.mark.parametrize(
    ("repo", "tp"),
    [("Qwen/Qwen3-8B", 2), ("lmsys/gpt-oss-20b-bf16", 2), ("lmsys/gpt-oss-120b-bf16", 8)],
)
def test_sglang_counts_its_pool_in_tokens_as_sglang_does(repo: str, tp: int) -> None:
    """SGLang's KV pool is tokens, not vLLM's blocks: what its share leaves over the bytes one
    token takes in every layer; gpt-oss (a hybrid sliding-window model to SGLang) gets a pool for
    its full-attention layers and one of 0.8 x its tokens for its sliding layers. Equal to SGLang
    0.5.12's arithmetic (verl 0.9.1's), and within a token per layer of 0.5.8's (verl 0.9.0's),
    which splits the same total."""
    server = dataclasses.replace(_server(repo, tp, 0.6, 8192), name="sglang")
    arch = server.model.architecture
    memory = server_memory(server, find_gpu("H100").usable_bytes)
    per_layer = arch.kv_bytes_per_token_layer(tp, 2)
    layers = arch.num_hidden_layers
    full = layers - (len(arch.sliding_layers) if arch.family == "gpt_oss" else 0)
    expected = _sglang_0_5_12_tokens(memory.kv_bytes, per_layer, layers, full)
    assert (memory.kv_tokens, memory.window_tokens) == expected
    older = _sglang_0_5_8_tokens(memory.kv_bytes, per_layer, layers, full)
    assert abs(older[0] - expected[0]) <= layers and abs(older[1] - expected[1]) <= layers
    assert memory.block_size == 1 and (memory.window_tokens > 0) == (full < layers)


def test_cuda_graphs_sit_outside_the_share_before_vllm_0_21() -> None:
    """vLLM 0.18 (verl 0.9.0's) captures its CUDA graphs after it has sized and allocated the KV
    cache (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS is off by default): the graphs do not shrink
    the KV cache, and the awake server holds its share plus them; eager vLLM holds its share."""
    server = _server("Qwen/Qwen2.5-7B-Instruct", 1, 0.5, 4096)
    capacity = find_gpu("H100").usable_bytes
    graphs = server_memory(server, capacity)
    eager = server_memory(dataclasses.replace(server, enforce_eager=True), capacity)
    assert graphs.kv_bytes == eager.kv_bytes
    assert eager.claimed == eager.share == int(0.5 * capacity)
    assert graphs.claimed - graphs.share == graphs.outside == graphs.graphs > 0


def test_cuda_graphs_come_out_of_the_kv_cache_from_vllm_0_21() -> None:
    """vLLM 0.24 (verl 0.9.1 pins it) subtracts the graphs' profiled estimate from the share
    before it sizes the KV cache (gpu_worker.py:467-492, the estimate applied by default from
    0.21.0): the KV cache is smaller by the graphs, the awake server holds its share alone, and
    asleep it keeps the graphs as before; eager vLLM is the same either way."""
    before = _server("Qwen/Qwen2.5-7B-Instruct", 1, 0.5, 4096)
    server = dataclasses.replace(before, graphs_in_share=True)
    capacity = find_gpu("H100").usable_bytes
    inside, outside = server_memory(server, capacity), server_memory(before, capacity)
    assert inside.claimed == inside.share == int(0.5 * capacity) and inside.outside == 0
    assert outside.kv_bytes - inside.kv_bytes == inside.graphs > 0
    assert inside.asleep == outside.asleep == inside.graphs
    eager = dataclasses.replace(server, enforce_eager=True)
    assert server_memory(eager, capacity) == server_memory(
        dataclasses.replace(eager, graphs_in_share=False), capacity
    )


def test_a_share_that_leaves_room_after_weights_and_profile_starts() -> None:
    """Qwen2.5-3B at gpu_memory_utilization 0.1 of an H100 (7.9 GiB) with max_model_len 1536:
    its weights (5.8 GiB) and profiled forward leave KV for one sequence, so vLLM starts, CUDA
    graphs or not (verl's LoRA tuning script for that model ran so); at 0.08 it cannot."""
    server = _server(
        "Qwen/Qwen2.5-3B-Instruct",
        1,
        0.1,
        1536,
    )
    capacity = find_gpu("H100").usable_bytes
    memory = server_memory(server, capacity)
    assert memory.weights + memory.overhead < memory.share
    assert memory.kv_bytes >= memory.one_sequence_bytes
    smaller = server_memory(dataclasses.replace(server, gpu_memory_utilization=0.08), capacity)
    assert smaller.kv_bytes < smaller.one_sequence_bytes


def test_a_hybrid_models_cache_is_vllms_layout() -> None:
    """Qwen3.5-35B-A3B on tp 2, by vLLM's own arithmetic (rollout.VLLM_HYBRID): one full-attention
    token on a rank is 2 x 1 kv head x 256 x 2 B = 1,024 B; a Gated DeltaNet state is the conv
    state 3 x (2 x 2,048 + 4,096) / 2 x 2 B = 24,576 B plus the recurrent 16 heads x 128 x 128 x
    fp32 (mamba_ssm_dtype) = 1,048,576 B; the attention block grows to 16 x cdiv(1,073,152,
    16 x 1,024) = 1,056 tokens, one page 1,081,344 B; 10 full and 30 linear layers make groups of
    10 layers, one attention group and three state groups; with prefix caching ('align') a
    sequence of 8,192 tokens takes cdiv(8,192, 1,056) = 8 blocks plus 2 per state group."""
    arch = _arch("Qwen/Qwen3.5-35B-A3B")
    cache = hybrid_cache(arch, tp=2, kv_dtype=2, model_dtype=2, prefix_caching=True)
    assert (cache.block_size, cache.page) == (1056, 1_081_344)
    assert (cache.group_size, cache.attention_groups, cache.state_groups) == (10, 1, 3)
    assert cache.blocks_for(8192) == 8 + 3 * 2
    without = hybrid_cache(arch, tp=2, kv_dtype=2, model_dtype=2, prefix_caching=False)
    assert without.blocks_for(8192) == 8 + 3 * 1


def test_a_hybrid_servers_blocks_share_one_pool() -> None:
    """The server's blocks are what is left after weights, cut by page x layers per group (not
    by every layer), and one max_model_len sequence needs its attention and state blocks."""
    server = _server("Qwen/Qwen3.5-35B-A3B", 2, 0.6, 32768)
    mem = server_memory(server, find_gpu("H100").usable_bytes)
    cache = hybrid_cache(server.model.architecture, 2, 2, 2, True)
    assert mem.block_size == cache.block_size
    assert mem.blocks == mem.kv_bytes // cache.page // cache.group_size
    assert mem.one_sequence_bytes == cache.blocks_for(32768) * cache.page * cache.group_size


def _vllm_profile_per_token(arch: Architecture, tp: int, ep: bool) -> int:
    """Elements per token alive at the peak of vLLM's dummy forward, read from its code (vLLM
    0.18.0, the same in 0.24.0): the decoder layer holds hidden_states and residual
    (models/qwen2.py:292-312; fused_add_rms_norm works in place, layers/layernorm.py:72-90); a
    dense MLP adds gate_up (2 x intermediate / tp) and the activation's output (intermediate / tp);
    a MoE layer its experts' output (hidden) and TritonExperts.workspace_shapes
    (fused_moe.py:1979-1994): top_k x max(activation width, hidden) and top_k x max(gate_up
    width, hidden), the widths split over tensor parallel unless expert parallel."""
    h = arch.hidden_size
    if not arch.is_moe:
        return h + h + 2 * arch.intermediate_size // tp + arch.intermediate_size // tp
    width = arch.moe_intermediate_size // (1 if ep else tp)
    k = arch.num_experts_per_tok
    return h + h + h + k * max(width, h) + k * max(2 * width, h)


@pytest.mark.parametrize(
    ("repo", "tp", "ep"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", 1, False),
        ("Qwen/Qwen3-8B", 2, False),
        ("Qwen/Qwen3-30B-A3B", 4, False),
        ("Qwen/Qwen3-30B-A3B", 4, True),
    ],
)
def test_the_profiled_forward_keeps_what_vllms_layers_hold(repo: str, tp: int, ep: bool) -> None:
    """vLLM's profiled peak: the dummy forward of max_num_batched_tokens, or the sampler's fp32
    logits for max_num_seqs (three copies) beside the forward's hidden states, whichever is
    larger (profile_run, gpu_model_runner.py:5456-5528@0.18.0)."""
    arch = _arch(repo)
    server = dataclasses.replace(_server(repo, tp, 0.5, 4096), ep=2 if ep else 1)
    for tokens, seqs in ((8192, 256), (32768, 1024), (2048, 1024)):
        sized = dataclasses.replace(server, max_num_batched_tokens=tokens, max_num_seqs=seqs)
        forward = tokens * 2 * _vllm_profile_per_token(arch, tp, ep)
        sampler = tokens * 2 * arch.hidden_size + seqs * arch.vocab_size * 4 * 3
        assert profile_bytes(arch, sized) == max(forward, sampler), (repo, tokens, seqs)


def test_a_documented_small_share_starts() -> None:
    """verl's Qwen2.5-7B LoRA tuning script for one H100 (examples/tuning/7b, 2025) ran with
    gpu_memory_utilization 0.2 and max_num_seqs 512: what the share leaves after the bf16 weights
    and vLLM's profile holds more than one 1,536-token sequence (vLLM started)."""
    server = _server("Qwen/Qwen2.5-7B-Instruct", 1, 0.2, 1536)
    server = dataclasses.replace(server, max_num_seqs=512)
    memory = server_memory(server, find_gpu("H100").usable_bytes)
    assert memory.kv_bytes > memory.one_sequence_bytes


def test_fp8_weights_are_one_byte_and_a_scale_per_block_on_linear_and_expert_tensors() -> None:
    """rollout.FP8_WEIGHTS: every linear and expert tensor at one byte and a 4-byte scale per
    128 x 128 block, every other tensor (embeddings, lm_head, norms, biases, the router) in the
    model's dtype."""
    from pytest_verl_compat.memory.architecture import architecture_from_config
    from pytest_verl_compat.memory.rollout import FP8_WEIGHTS, weights_per_rank

    config = {
        "model_type": "qwen3_moe", "hidden_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
        "moe_intermediate_size": 128, "num_experts": 4, "num_experts_per_tok": 2,
        "vocab_size": 1000, "head_dim": 64,
    }  # fmt: skip
    arch = architecture_from_config(config, "tiny", "tiny config")
    bf16 = weights_per_rank(arch, 1, 1, 2)
    fp8 = weights_per_rank(arch, 1, 1, 2, FP8_WEIGHTS)
    quantized = [t.numel for t in arch.tensors() if t.kind in ("linear", "experts")]
    assert bf16 - fp8 == sum(quantized) - sum(-(-n // (128 * 128)) * 4 for n in quantized)
    assert weights_per_rank(arch, 1, 1, 2, "torchao") == bf16
