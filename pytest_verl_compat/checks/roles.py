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


def uses_v1(resolved: Mapping[str, Any]) -> bool:
    """verl/trainer/main_ppo.py:184: trainer.use_v1 selects the V1 trainer (the default)."""
    return bool(resolved["trainer"].get("use_v1", True))


def ref_in_actor(resolved: Mapping[str, Any]) -> bool:
    """trainer_base.py:317-320: with LoRA the actor (adapter off) computes the reference log-probs."""
    model = resolved["actor_rollout_ref"]["model"]
    lora = model.get("lora")
    rank = int(lora.get("rank") or 0) if isinstance(lora, Mapping) else 0
    if rank <= 0:
        rank = int(model.get("lora_rank") or 0)
    return rank > 0 or model.get("lora_adapter_path") is not None


def reference_worker(resolved: Mapping[str, Any]) -> bool:
    """Whether a reference policy runs as a worker of its own (not the actor with LoRA off)."""
    return need_reference_policy(resolved) and not ref_in_actor(resolved)


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
# How messages name each role's worker.
ROLE_NAMES = {"actor": "actor", "ref": "reference", "critic": "critic"}


def role_section(resolved: Mapping[str, Any], role: str = "actor") -> Mapping[str, Any]:
    node: Any = resolved
    for part in ROLE_SECTIONS[role].split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def role_strategy(resolved: Mapping[str, Any], role: str = "actor") -> str:
    return str(role_section(resolved, role).get("strategy") or "fsdp")


def actor_strategy(resolved: Mapping[str, Any]) -> str:
    return role_strategy(resolved, "actor")


# verl's two families of training engine: FSDP (1 and 2, its fsdp_config section) and Megatron
# (and MindSpeed, Megatron on Ascend, composed under its own key).
FSDP_STRATEGIES = ("fsdp", "fsdp2")
MEGATRON_STRATEGIES = ("megatron", "mindspeed")


def is_megatron(resolved: Mapping[str, Any], role: str = "actor") -> bool:
    """Megatron-engine roles (mindspeed composes the megatron engine too, under its own key)."""
    return role_strategy(resolved, role) in MEGATRON_STRATEGIES


def engine_key(resolved: Mapping[str, Any], role: str = "actor") -> str:
    """The key of the role's engine section (``fsdp_config`` for actor and ref, ``fsdp`` for the critic)."""
    strategy = role_strategy(resolved, role)
    if strategy in FSDP_STRATEGIES:
        return "fsdp" if role == "critic" else "fsdp_config"
    return strategy


def engine_path(resolved: Mapping[str, Any], role: str = "actor") -> str:
    """The dotted path of the role's engine section (``actor_rollout_ref.actor.megatron``)."""
    return f"{ROLE_SECTIONS[role]}.{engine_key(resolved, role)}"


def ulysses_path(role: str) -> str:
    """The key a user sets for a role's Ulysses size under FSDP (the critic's sits in its engine)."""
    if role == "critic":
        return "critic.fsdp.ulysses_sequence_parallel_size"
    return f"{ROLE_SECTIONS[role]}.ulysses_sequence_parallel_size"


def role_engine(resolved: Mapping[str, Any], role: str = "actor") -> Mapping[str, Any]:
    section = role_section(resolved, role).get(engine_key(resolved, role))
    return section if isinstance(section, Mapping) else {}


def engine_roles(resolved: Mapping[str, Any]) -> list[str]:
    """The roles that start a training engine of their own (the ref only without LoRA)."""
    roles = ["actor"]
    if reference_worker(resolved):
        roles.append("ref")
    if need_critic(resolved):
        roles.append("critic")
    return roles


def _size(section: Mapping[str, Any], key: str, default: int = 1) -> int:
    value = section.get(key)
    return int(value) if value is not None else default


def megatron_sizes(engine: Mapping[str, Any]) -> dict[str, int]:
    """tp, pp, cp, ep, etp (defaulting to tp, as initialize_model_parallel does) and vpp (0: unset)."""
    tp = _size(engine, "tensor_model_parallel_size")
    return {
        "tp": tp,
        "pp": _size(engine, "pipeline_model_parallel_size"),
        "cp": _size(engine, "context_parallel_size"),
        "ep": _size(engine, "expert_model_parallel_size"),
        "etp": _size(engine, "expert_tensor_parallel_size", tp),
        "vpp": _size(engine, "virtual_pipeline_model_parallel_size", 0),
    }


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
    if strategy in MEGATRON_STRATEGIES:
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
