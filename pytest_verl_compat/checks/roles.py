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


# The sections of the three trained roles and, per strategy, the key of their engine section
# (the dataclass each ``__post_init__`` makes ``self.engine``: verl/workers/config/actor.py:289,
# :325, :371, :403; verl/workers/config/critic.py:186, :217, :254).
ROLE_SECTIONS = {
    "actor": "actor_rollout_ref.actor",
    "ref": "actor_rollout_ref.ref",
    "critic": "critic",
}


def role_section(resolved: Mapping[str, Any], role: str = "actor") -> Mapping[str, Any]:
    node: Any = resolved
    for part in ROLE_SECTIONS[role].split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def role_strategy(resolved: Mapping[str, Any], role: str = "actor") -> str:
    return str(role_section(resolved, role).get("strategy") or "fsdp")


def actor_strategy(resolved: Mapping[str, Any]) -> str:
    return role_strategy(resolved, "actor")


def is_megatron(resolved: Mapping[str, Any], role: str = "actor") -> bool:
    """Megatron-engine roles (mindspeed composes the megatron engine too, under its own key)."""
    return role_strategy(resolved, role) in ("megatron", "mindspeed")


def engine_key(resolved: Mapping[str, Any], role: str = "actor") -> str:
    """The key of the role's engine section (``fsdp_config`` for actor and ref, ``fsdp`` for the critic)."""
    strategy = role_strategy(resolved, role)
    if strategy in ("fsdp", "fsdp2"):
        return "fsdp" if role == "critic" else "fsdp_config"
    return strategy


def role_engine(resolved: Mapping[str, Any], role: str = "actor") -> Mapping[str, Any]:
    section = role_section(resolved, role).get(engine_key(resolved, role))
    return section if isinstance(section, Mapping) else {}


def _size(section: Mapping[str, Any], key: str) -> int:
    value = section.get(key)
    return int(value) if value is not None else 1


def model_parallel_sizes(resolved: Mapping[str, Any], role: str = "actor") -> dict[str, int]:
    """A role's model-parallel factors by name, as the engine its strategy selects reads them.

    FSDP (verl/workers/engine/fsdp/transformer_impl.py:633: dp = world / ulysses sp); Megatron and
    MindSpeed (verl/utils/config.py:87-99, and megatron.core initialize_model_parallel called from
    verl/workers/engine/megatron/transformer_impl.py:272: dp = GPUs / (tp × pp × cp)); VeOmni
    (ulysses); TorchTitan (tp × pp × cp). Expert parallelism is carved out of the other factors
    and never changes the data-parallel size.
    """
    section = role_section(resolved, role)
    strategy = role_strategy(resolved, role)
    engine = role_engine(resolved, role)
    if strategy in ("megatron", "mindspeed"):
        return {
            "tensor parallel": _size(engine, "tensor_model_parallel_size"),
            "pipeline parallel": _size(engine, "pipeline_model_parallel_size"),
            "context parallel": _size(engine, "context_parallel_size"),
        }
    if strategy == "veomni":
        return {"sequence parallel": _size(engine, "ulysses_parallel_size")}
    if strategy == "torchtitan":
        return {
            "tensor parallel": _size(engine, "tensor_parallel_size"),
            "pipeline parallel": _size(engine, "pipeline_parallel_size"),
            "context parallel": _size(engine, "context_parallel_size"),
        }
    engine_sp = int(engine.get("ulysses_sequence_parallel_size") or 1)
    if role == "critic":
        # FSDPCriticConfig.__post_init__ (critic.py:214-221) never copies the deprecated
        # critic.ulysses_sequence_parallel_size into critic.fsdp: the engine's is the size.
        return {"sequence parallel": engine_sp}
    # verl/workers/config/actor.py:332-333: the deprecated role-level size wins only when > 1;
    # otherwise the engine's fsdp_config.ulysses_sequence_parallel_size is the one used.
    legacy = int(section.get("ulysses_sequence_parallel_size") or 1)
    return {"sequence parallel": legacy if legacy > 1 else engine_sp}


def sequence_parallel(resolved: Mapping[str, Any], role: str = "actor") -> int:
    """The factor a per-GPU token budget is multiplied by (Ulysses SP, or Megatron CP)."""
    sizes = model_parallel_sizes(resolved, role)
    return sizes.get("sequence parallel", sizes.get("context parallel", 1))


def data_parallel(resolved: Mapping[str, Any], role: str = "actor") -> tuple[int, int, int, str]:
    """(GPUs, model-parallel product, data-parallel ranks, a description of the factors)."""
    n_gpus = gpu_count(resolved)
    sizes = model_parallel_sizes(resolved, role)
    product = 1
    for size in sizes.values():
        product *= max(size, 1)
    text = " × ".join(f"{name} {size}" for name, size in sizes.items())
    return n_gpus, product, max(n_gpus // product, 1), text
