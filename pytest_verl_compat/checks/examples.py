"""The pieces the rules' examples share (``Example`` in registry.py): each rule's example is the
embedded manifest's ``grpo`` case (8 GPUs, 1024 prompts × n=5, mini-batches of 256 prompts,
dynamic batch sizes) plus a few overrides, and its twin differs in one value.
"""

from __future__ import annotations

# Static batch sizes: every role's dynamic batching off.
STATIC = (
    "actor_rollout_ref.actor.use_dynamic_bsz=False",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=False",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=False",
)
# The per-GPU micro-batch sizes static mode needs (each divides what its pass hands one GPU).
MICRO = (
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
)
FILTER = ("algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc")
# A Megatron launch script of the pinned release (8 GPUs, tp 2 × pp 2), for the Megatron rules.
MEGATRON = "examples/grpo_trainer/run_qwen3_8b_megatron.sh"
# A Qwen2.5-7B-shaped config.json: 28 attention heads, 4 key-value heads.
QWEN7B = {"num_attention_heads": 28, "num_key_value_heads": 4}
