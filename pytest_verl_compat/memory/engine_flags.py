"""An engine's flags as upstream's code reads them, for a role of an RL run and for the SFT
engine: its offloads, gradient checkpointing (the model's flag, or Megatron's recompute),
sequence parallel, activation offload, resharding after forward and fused kernels; an engine read
as another strategy (VeOmni) adds its own (``veomni.role_flags``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_verl_compat.checks.roles import FSDP_STRATEGIES, MEGATRON_STRATEGIES
from pytest_verl_compat.memory import veomni
from pytest_verl_compat.memory.release_facts import ReleaseFacts
from pytest_verl_compat.memory.states import EngineSpec


def engine_flags(
    engine: Mapping[str, Any],
    model_section: Mapping[str, Any],
    strategy: str,
    facts: ReleaseFacts,
) -> dict[str, Any]:  # each a bool; Any lets it spread into RoleLayout beside its other fields
    """The offload and model flags an RL role and the SFT engine read alike."""
    return {
        "param_offload": bool(engine.get("param_offload")),
        "optimizer_offload": bool(engine.get("optimizer_offload")),
        # an offload policy only where the release's engine builds one for the strategy
        # (transformer_impl.py:440-443 for FSDP2; FSDP1's training engine takes none, :404-415)
        "offload_policy": bool(engine.get("offload_policy"))
        and strategy in facts.host_offload_strategies,
        "checkpointing": _checkpointing(engine, model_section, strategy),
        "remove_padding": bool(model_section.get("use_remove_padding")),
        "sequence_parallel": _sequence_parallel(engine, strategy),
        # the FSDP engine reads the model's flag (transformer_impl.py:458-460); Megatron's not
        "activation_offload": strategy in FSDP_STRATEGIES
        and bool(model_section.get("enable_activation_offload")),
        # FSDP1's SHARD_GRAD_OP and FSDP2's reshard_after_forward=False when false
        # (transformer_impl.py:401, :450); the tree's default is true
        "reshard_after_forward": strategy not in FSDP_STRATEGIES
        or engine.get("reshard_after_forward", True) is not False,
    }


def role_flags(
    spec: EngineSpec,
    engine: Mapping[str, Any],
    model: Mapping[str, Any],
    facts: ReleaseFacts,
    section: str,
    assumed: tuple[str, ...] = (),
) -> dict[str, Any]:
    """RoleLayout's engine flags and assumptions, for the engine section at ``section`` as read
    (``veomni.role_flags``: an engine read as another strategy adds its own)."""
    flags = engine_flags(engine, model, spec.strategy, facts)
    return veomni.role_flags(spec, engine, flags, facts, section, assumed)


def _sequence_parallel(engine: Mapping[str, Any], strategy: str) -> bool:
    """Megatron's sequence_parallel as its engine builds the model: override_transformer_config
    last (verl/workers/engine/megatron/transformer_impl.py:364-365), else the engine's key
    (:354, default True in engine/megatron.yaml:32); the legacy mbridge (vanilla_mbridge) reads
    no engine key and sets it whenever tensor parallelism is on (mbridge's
    LLMBridge._build_base_config: ``"sequence_parallel": self.mpu.tp_size > 1``). Not Megatron:
    True (nothing to split)."""
    if strategy not in MEGATRON_STRATEGIES:
        return True
    override = engine.get("override_transformer_config")
    if isinstance(override, Mapping) and override.get("sequence_parallel") is not None:
        return bool(override.get("sequence_parallel"))
    if engine.get("vanilla_mbridge"):
        return True
    value = engine.get("sequence_parallel", True)
    return True if value is None else bool(value)


def _checkpointing(
    engine: Mapping[str, Any], model_section: Mapping[str, Any], strategy: str
) -> bool:
    """Whether a training pass keeps only layer boundaries: the model's flag for the FSDP engine;
    for Megatron, full recompute in override_transformer_config (the engine hands it to the
    Megatron config and never reads enable_gradient_checkpointing; selective recompute of the
    attention core keeps the layers' other activations, null recomputes nothing)."""
    if strategy not in MEGATRON_STRATEGIES:
        return bool(model_section.get("enable_gradient_checkpointing"))
    override = engine.get("override_transformer_config")
    override = override if isinstance(override, Mapping) else {}
    return override.get("recompute_granularity") == "full"


def fused(model: Mapping[str, Any], facts: ReleaseFacts) -> bool:
    """model.use_fused_kernels takes effect for the backends the release patches."""
    options = model.get("fused_kernel_options") if isinstance(model, Mapping) else None
    backend = options.get("impl_backend", "torch") if isinstance(options, Mapping) else "torch"
    return bool(model.get("use_fused_kernels")) and str(backend) in facts.fused_backends
