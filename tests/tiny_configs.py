"""Tiny config.json numbers shared by the forecast's tests that build models with transformers."""

from __future__ import annotations

from typing import Any

# DeepSeek V3 at test scale: multi-head latent attention (queries through a low rank, keys and
# values from one latent, a decoupled rotary part) and its MoE block (a sigmoid router over
# routed experts, a shared expert) after one leading dense layer. Each test adds the expert
# width (and a pad token where it runs the model).
DEEPSEEK_V3_MLA: dict[str, Any] = {
    "num_key_value_heads": 4,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "q_lora_rank": 16,
    "kv_lora_rank": 8,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4,
    "v_head_dim": 8,
}
