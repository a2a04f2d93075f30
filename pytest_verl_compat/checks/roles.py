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


def actor_strategy(resolved: Mapping[str, Any]) -> str:
    return str(resolved["actor_rollout_ref"]["actor"].get("strategy") or "fsdp")


def is_megatron(resolved: Mapping[str, Any]) -> bool:
    """Megatron-engine actors (mindspeed composes the megatron engine too, under its own key)."""
    return actor_strategy(resolved) in ("megatron", "mindspeed")


def _engine(actor: Mapping[str, Any]) -> Mapping[str, Any]:
    strategy = str(actor.get("strategy") or "fsdp")
    section = actor.get(strategy)
    return section if isinstance(section, Mapping) else {}


def _size(section: Mapping[str, Any], key: str) -> int:
    value = section.get(key)
    return int(value) if value is not None else 1


def model_parallel_sizes(resolved: Mapping[str, Any]) -> dict[str, int]:
    """The actor's model-parallel factors by name, as the engine the strategy selects reads them.

    FSDP (verl/workers/engine/fsdp: dp × ulysses sp = world); Megatron and MindSpeed
    (verl/utils/config.py:87-99, validate_config: dp = GPUs / (tp × pp × cp)); VeOmni (ulysses);
    TorchTitan (tp × pp × cp). Expert parallelism is carved out of the other factors and never
    changes the data-parallel size.
    """
    actor = resolved["actor_rollout_ref"]["actor"]
    strategy = actor_strategy(resolved)
    engine = _engine(actor)
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
    # verl/workers/config/actor.py:332-333: the deprecated actor-level size wins only when > 1;
    # otherwise the engine's fsdp_config.ulysses_sequence_parallel_size is the one used.
    legacy = int(actor.get("ulysses_sequence_parallel_size") or 1)
    fsdp = actor.get("fsdp_config")
    engine_sp = (
        int(fsdp.get("ulysses_sequence_parallel_size") or 1) if isinstance(fsdp, Mapping) else 1
    )
    return {"sequence parallel": legacy if legacy > 1 else engine_sp}


def sequence_parallel(resolved: Mapping[str, Any]) -> int:
    """The factor a per-GPU token budget is multiplied by (Ulysses SP, or Megatron CP)."""
    sizes = model_parallel_sizes(resolved)
    return sizes.get("sequence parallel", sizes.get("context parallel", 1))


def data_parallel(resolved: Mapping[str, Any]) -> tuple[int, int, int, str]:
    """(GPUs, model-parallel product, data-parallel ranks, a description of the factors)."""
    n_gpus = gpu_count(resolved)
    sizes = model_parallel_sizes(resolved)
    product = 1
    for size in sizes.values():
        product *= max(size, 1)
    text = " × ".join(f"{name} {size}" for name, size in sizes.items())
    return n_gpus, product, max(n_gpus // product, 1), text
