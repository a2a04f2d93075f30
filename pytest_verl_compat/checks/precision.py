"""The FSDP engine's dtypes: names verl's PrecisionType refuses only when the engine is built.

verl's FSDP engine turns ``model_dtype`` and ``mixed_precision``'s dtypes into torch dtypes with
``PrecisionType.to_dtype``, which knows fp32, bf16 and fp16 by a few spellings and raises
``RuntimeError: unexpected precision`` on any other, after Ray has started and the model is being
loaded. No dataclass checks them before (the Megatron engines' ``dtype`` is asserted by theirs).
The names live here once; the memory forecast reads the same ones (memory/values.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pytest_verl_compat.checks.registry import SFT, CheckInput, Example, Hit, check
from pytest_verl_compat.checks.roles import (
    FSDP_STRATEGIES,
    engine_path,
    engine_roles,
    role_engine,
    role_strategy,
)
from pytest_verl_compat.checks.sft import SFT_BASE, engine_strategy
from pytest_verl_compat.model import dotted_value

# PrecisionType's names by bytes per element (verl/utils/torch_dtypes.py:20-22, 61-69): membership
# by ==, so 16.0 is 16 as it is there.
PRECISION_NAMES: tuple[tuple[int, tuple[Any, ...]], ...] = (
    (2, (16, "16", "fp16", "float16")),
    (4, (32, "32", "fp32", "float32")),
    (2, ("bf16", "bfloat16")),
)
# The keys the FSDP engine reads with PrecisionType, under its engine section.
PRECISION_KEYS = (
    "model_dtype",
    "mixed_precision.param_dtype",
    "mixed_precision.reduce_dtype",
    "mixed_precision.buffer_dtype",
)
EVIDENCE = (
    "verl/utils/torch_dtypes.py:61-69 (PrecisionType.to_dtype raises RuntimeError on another name), "
    "called as the FSDP engine builds the model: verl/workers/engine/fsdp/transformer_impl.py:245 "
    "(model_dtype), :374-376 (mixed_precision's param, reduce and buffer dtypes)"
)
FIX = "write fp32, bf16 or fp16 (float32, bfloat16, float16, 32 or 16)"


def precision_size(value: Any) -> int | None:
    """Bytes per element of a dtype PrecisionType takes; None for a name it refuses."""
    if isinstance(value, bool):
        return None
    for size, names in PRECISION_NAMES:
        if value in names:
            return size
    return None


def _refused(engine: Mapping[str, Any], where: str, version: str) -> Iterator[Hit]:
    for key in PRECISION_KEYS:
        value = dotted_value(engine, key)
        if value is not None and precision_size(value) is None:
            yield Hit(
                f"{where}.{key}",
                f"{where}.{key}={value!r} is no name verl {version}'s PrecisionType knows: the FSDP "
                "engine raises 'unexpected precision' when it builds the model, after the workers "
                "have started",
                fix=FIX,
            )


@check(
    "fields.unknown-dtype",
    level="error",
    evidence=EVIDENCE,
    summary="An FSDP engine's model_dtype or mixed_precision dtype that verl's PrecisionType does not know (half, float, bf-16): the engine raises when it builds the model.",
    fix=FIX,
    example=Example(
        fires=("actor_rollout_ref.actor.fsdp_config.model_dtype=half",),
        twin=("actor_rollout_ref.actor.fsdp_config.model_dtype=fp16",),
    ),
)
def unknown_dtype(inp: CheckInput) -> Iterator[Hit]:
    for role in engine_roles(inp.resolved):
        if role_strategy(inp.resolved, role) in FSDP_STRATEGIES:
            yield from _refused(
                role_engine(inp.resolved, role), engine_path(inp.resolved, role), inp.version
            )


@check(
    "sft.unknown-dtype",
    level="error",
    evidence=EVIDENCE,
    summary="The SFT trainer's FSDP engine with a model_dtype or mixed_precision dtype that verl's PrecisionType does not know: the engine raises when it builds the model.",
    fix=FIX,
    example=Example(("engine.model_dtype=half",), ("engine.model_dtype=bf16",), base=SFT_BASE),
    family=SFT,
)
def sft_unknown_dtype(inp: CheckInput) -> Iterator[Hit]:
    engine = inp.resolved.get("engine")
    if isinstance(engine, Mapping) and (engine_strategy(engine) or "fsdp") in FSDP_STRATEGIES:
        yield from _refused(engine, "engine", inp.version)
