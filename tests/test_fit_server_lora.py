"""A rollout server's LoRA slots, which vLLM allocates with its weights and SGLang right after
them when verl serves the actor's adapter: the forecast's count equals each engine's own buffer
shapes, the KV cache shrinks by them, and the rank is the one verl asks for.

The independent side is vLLM's layers as its model files build them (vllm-project/vllm 0.18.0,
the same in 0.24.0), transcribed here: llama.py / qwen2.py / qwen3.py build each decoder layer
from a QKVParallelLinear (three slices), a RowParallelLinear o_proj, a MergedColumnParallelLinear
gate_up_proj (two slices) and a RowParallelLinear down_proj; qwen3_moe.py a FusedMoE and a
ReplicatedLinear gate instead of the MLP. ``create_lora_weights`` gives a slice ``A: R x in`` and
``B: out x R`` (vllm/lora/layers/base_linear.py, column_parallel_linear.py, fused_moe.py), the
embeddings and logits (vocal_parallel_embedding.py, logits_processor.py) where the class's
``embedding_modules`` names them (llama.py, qwen3.py, qwen3_moe.py; not qwen2.py nor mistral.py).
"""

from __future__ import annotations

import dataclasses

import pytest
from test_fit_kv import _server

from pytest_verl_compat.checks.upstream_names import VLLM_LORA_RANKS
from pytest_verl_compat.memory.architecture import Architecture
from pytest_verl_compat.memory.models import from_table
from pytest_verl_compat.memory.rollout import server_memory
from pytest_verl_compat.memory.server_lora import served_rank, sglang_pool_bytes, slot_bytes

GIB = 1 << 30


def _arch(repo: str) -> Architecture:
    choice = from_table(repo)
    assert choice is not None, repo
    return choice.architecture


def _vllm_slots(
    a: Architecture, rank: int, tp: int, sharded: bool, ep_ranks: int, embeddings: bool
) -> int:
    """Elements of vLLM's slots on one rank, from the layer shapes its model files build."""
    h, hd = a.hidden_size, a.head_dim
    q, kv = a.num_attention_heads * hd, max(1, a.num_key_value_heads // tp) * hd
    col_a = rank // tp if sharded else rank  # a column-parallel slice's A rows
    row_b = h // tp if sharded else h  # a row-parallel layer's B rows
    qkv = 3 * col_a * h + (q // tp + 2 * kv) * rank
    o_proj = rank * (q // tp) + row_b * rank
    if a.num_experts:
        width = a.moe_intermediate_size
        local, part = (
            (a.num_experts // ep_ranks, width) if ep_ranks else (a.num_experts, width // tp)
        )
        w13 = 2 * (col_a * h + part * rank)
        w2 = rank * part + row_b * rank
        gate = rank * h + a.num_experts * rank  # ReplicatedLinear
        mlp = local * (w13 + w2) + gate
    else:
        inter = a.intermediate_size
        mlp = 2 * col_a * h + 2 * (inter // tp) * rank + rank * (inter // tp) + row_b * rank
    total = a.num_hidden_layers * (qkv + o_proj + mlp)
    if embeddings:
        embed = a.vocab_size * rank + h * rank
        logits = rank * h + a.vocab_size * rank
        total += embed * (2 if a.tie_word_embeddings else 1) + logits
    return total


MODELS = {
    "meta-llama/Llama-3.1-8B-Instruct": True,
    "Qwen/Qwen3-8B": True,
    "Qwen/Qwen3-4B": True,  # tied: the lm_head is the embedding module, wrapped twice
    "Qwen/Qwen2.5-7B-Instruct": False,
    "mistralai/Mistral-7B-Instruct-v0.3": False,
    "Qwen/Qwen3-30B-A3B": True,
}


@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.parametrize("rank", [8, 64, 128])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("repo", sorted(MODELS))
def test_the_slots_are_vllms_layer_shapes(repo: str, tp: int, rank: int, sharded: bool) -> None:
    a = _arch(repo)
    for ep_ranks in (0, tp) if a.num_experts and tp > 1 else (0,):
        want = _vllm_slots(a, rank, tp, sharded, ep_ranks, MODELS[repo]) * 2
        assert slot_bytes(a, rank, tp, ep_ranks, 2, sharded) == want, (repo, ep_ranks)


def test_a_moe_models_slots_are_mostly_its_experts() -> None:
    """Qwen3-30B-A3B at rank 32 on one GPU: 48 layers x 128 experts x 32 x (3 x 2048 + 3 x 768)
    elements, 3.0 GiB of the 3.1 GiB (the note's figure of the stop that left it out)."""
    a = _arch("Qwen/Qwen3-30B-A3B")
    experts = 48 * 128 * 32 * (3 * 2048 + 3 * 768) * 2
    total = slot_bytes(a, 32, 1, 0, 2)
    assert experts / GIB == pytest.approx(3.09, abs=0.01)
    assert 0.95 < experts / total < 1


@pytest.mark.parametrize(
    ("model", "rank"),
    [
        ({"lora_rank": 64}, 64),
        ({"lora_rank": 48}, 64),  # the smallest of vLLM's ranks that holds it
        ({"lora_rank": 257}, 320),
        ({"lora_rank": 4096}, 512),  # refused at validate_config: the largest counted
        ({"lora_rank": 0, "lora": {"rank": 16}}, 16),
        ({"lora_rank": 8, "lora": {"rank": 32}}, 32),  # lora.rank first, as verl reads it
        ({"lora_rank": 64, "lora": {"rank": 0, "merge": True}}, 0),  # merged: no adapter served
        ({"lora_rank": 0, "lora": {"rank": 0}}, 0),
        ({"lora_rank": True}, 0),
    ],
)
def test_the_served_rank_is_the_one_verl_asks_vllm_for(model: dict[str, object], rank: int) -> None:
    assert served_rank(model) == rank
    assert rank == 0 or rank in VLLM_LORA_RANKS


def test_the_kv_cache_shrinks_by_the_slots_and_nothing_else_moves() -> None:
    base = _server("Qwen/Qwen3-8B", 1, 0.6, 8192)
    served = dataclasses.replace(base, lora_rank=64)
    plain, lora = server_memory(base, 80 * GIB), server_memory(served, 80 * GIB)
    slots = slot_bytes(base.model.architecture, 64, 1, 0, 2)
    assert lora.lora_slots == slots and plain.lora_slots == 0
    assert lora.weights == plain.weights + slots
    assert lora.kv_bytes == plain.kv_bytes - slots
    assert (lora.share, lora.claimed, lora.overhead) == (plain.share, plain.claimed, plain.overhead)
    assert lora.asleep == plain.asleep  # offloaded with the weights at sleep (their memory tag)


def test_slots_can_leave_a_server_short_of_one_sequence() -> None:
    """Qwen3-30B-A3B on an 80 GiB GPU at gpu_memory_utilization 0.9: the weights leave room for
    a 32k sequence, the rank-128 slots (~12 GiB) do not."""
    base = _server("Qwen/Qwen3-30B-A3B", 1, 0.9, 32768)
    plain = server_memory(base, 80 * GIB)
    lora = server_memory(dataclasses.replace(base, lora_rank=128), 80 * GIB)
    assert plain.kv_bytes >= plain.one_sequence_bytes
    assert lora.kv_bytes < lora.one_sequence_bytes


# --- SGLang's LoRA memory pool ------------------------------------------------------------------


def _sglang_pool(
    a: Architecture, rank: int, tp: int, modules: set[str], slots: int, experts: bool
) -> int:
    """Elements of SGLang 0.5.12's pool, transcribed from LoRAMemoryPool.get_lora_A_shape /
    get_lora_B_shape / init_buffers (sglang/srt/lora/mem_pool.py): per layer and module
    ``A: (slots, R * stacked, in)``, ``B: (slots, out, R)``, a row-parallel input and a
    column-parallel output split over TP (K/V heads replicated past their count), fused experts
    ``(slots, experts, ...)`` per expert; the embedding ``A: (slots, R, vocab)``,
    ``B: (slots, hidden, R)``, the head ``A: (slots, R, hidden)``, ``B: (slots, vocab/tp, R)``."""
    h, hd = a.hidden_size, a.head_dim
    q, kv = a.num_attention_heads * hd, max(1, a.num_key_value_heads // tp) * hd
    layer = 0
    if "qkv_proj" in modules:
        layer += 3 * rank * h + (q // tp + 2 * kv) * rank
    if "o_proj" in modules:
        layer += rank * (q // tp) + h * rank
    if a.num_experts:
        width, e = a.moe_intermediate_size // tp, a.num_experts
        if experts and "gate_up_proj" in modules:
            layer += e * (2 * rank * h + 2 * width * rank)
        if experts and "down_proj" in modules:
            layer += e * (rank * width + h * rank)
    else:
        inter = a.intermediate_size // tp
        if "gate_up_proj" in modules:
            layer += 2 * rank * h + 2 * inter * rank
        if "down_proj" in modules:
            layer += rank * inter + h * rank
    total = a.num_hidden_layers * layer
    if "embed_tokens" in modules:
        total += rank * a.vocab_size + h * rank
    if "lm_head" in modules:
        total += rank * h + -(-a.vocab_size // tp) * rank
    return slots * total


ALL_SGLANG = {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "embed_tokens", "lm_head"}
SGLANG_TARGETS = {
    ("all",): ALL_SGLANG,
    ("q_proj", "v_proj"): {"qkv_proj"},
    ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"): ALL_SGLANG
    - {"embed_tokens", "lm_head"},
    ("model.layers.0.mlp.down_proj", "lm_head"): {"down_proj", "lm_head"},
}


@pytest.mark.parametrize("experts", [True, False])
@pytest.mark.parametrize("targets", sorted(SGLANG_TARGETS))
@pytest.mark.parametrize("tp", [1, 2, 8])
@pytest.mark.parametrize(
    "repo",
    [
        "Qwen/Qwen3-8B",
        "Qwen/Qwen2.5-7B-Instruct",
        "meta-llama/Llama-3.1-8B-Instruct",
        "Qwen/Qwen3-30B-A3B",
    ],
)
def test_sglangs_pool_is_its_buffer_shapes(
    repo: str, tp: int, targets: tuple[str, ...], experts: bool
) -> None:
    a = _arch(repo)
    want = _sglang_pool(a, 16, tp, SGLANG_TARGETS[targets], 8, experts) * 2
    assert sglang_pool_bytes(a, 16, tp, 0, 2, targets, 8, experts) == want


def test_sglangs_pool_shrinks_the_kv_pool_as_its_weights_do() -> None:
    base = dataclasses.replace(_server("Qwen/Qwen3-8B", 2, 0.6, 8192), name="sglang")
    served = dataclasses.replace(base, lora_rank=64, lora_targets=("all",), lora_pool_slots=8)
    plain, lora = server_memory(base, 80 * GIB), server_memory(served, 80 * GIB)
    pool = sglang_pool_bytes(base.model.architecture, 64, 2, 0, 2, ("all",), 8)
    assert lora.lora_slots == pool > 2 * GIB  # eight slots of every module and both embeddings
    assert lora.weights == plain.weights + pool
    assert lora.kv_bytes == plain.kv_bytes - pool


@pytest.mark.parametrize(("release", "experts"), [("0.9.0", False), ("0.9.1", True)])
def test_sglangs_expert_slots_follow_the_releases_sglang(release: str, experts: bool) -> None:
    from pytest_verl_compat.memory.server_lora import SGLANG_EXPERT_SLOTS
    from pytest_verl_compat.releases.sglang_server import sglang_server

    record = sglang_server(release)
    assert record is not None and SGLANG_EXPERT_SLOTS[record.sglang] is experts
