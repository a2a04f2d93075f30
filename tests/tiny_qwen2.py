"""The tiny Qwen2 policy and its critic, saved as verl loads them (the model-state oracle's
models): a causal LM, and the same body with a one-label token-classification head."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_policy_and_critic(folder: Path) -> tuple[dict[str, Any], Any]:
    """Save both under ``folder`` (policy/, critic/, each with the tokenizer); the oracle's
    request keys for them, and the tokenizer."""
    from reference_trainer.tiny import (
        build_tiny_policy,
        build_tiny_tokenizer,
        build_tiny_value_model,
    )

    tokenizer = build_tiny_tokenizer()
    policy = build_tiny_policy(tokenizer, 0)
    policy.config.architectures = ["Qwen2ForCausalLM"]
    policy.save_pretrained(folder / "policy")
    tokenizer.save_pretrained(folder / "policy")
    critic = build_tiny_value_model(policy.config, 2)
    critic.config.architectures = ["Qwen2ForTokenClassification"]
    critic.save_pretrained(folder / "critic")
    tokenizer.save_pretrained(folder / "critic")
    request = {
        "model_dir": str(folder / "policy"),
        "critic_dir": str(folder / "critic"),
        "vocab": len(tokenizer),
    }
    return request, tokenizer
