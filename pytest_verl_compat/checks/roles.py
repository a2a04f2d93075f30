"""Which workers a resolved verl configuration starts, decided once for every layer.

The checks, the lowering to the reference trainer and the trainer itself all ask these questions;
each answer follows the upstream 0.9.0 code named in its docstring.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Estimators that compare the responses of one prompt with each other.
GROUP_ESTIMATORS = frozenset(
    {"grpo", "rloo", "grpo_passk", "opo", "gpg", "rloo_vectorized", "grpo_vectorized", "gdpo"}
)


def get(resolved: Mapping[str, Any], dotted: str) -> Any:
    node: Any = resolved
    for part in dotted.split("."):
        node = node[part]
    return node


def need_critic(resolved: Mapping[str, Any]) -> bool:
    """As upstream's verl/trainer/ppo/utils.py need_critic: critic.enable, else GAE decides."""
    enable = resolved["critic"].get("enable")
    return bool(enable) if enable is not None else resolved["algorithm"]["adv_estimator"] == "gae"


def need_reference_policy(resolved: Mapping[str, Any]) -> bool:
    return bool(
        resolved["actor_rollout_ref"]["actor"]["use_kl_loss"]
        or resolved["algorithm"]["use_kl_in_reward"]
    )


def gpu_count(resolved: Mapping[str, Any]) -> int:
    trainer = resolved["trainer"]
    return int(trainer["n_gpus_per_node"]) * int(trainer["nnodes"])
