"""How the forecast reads one configuration value: a number, a dtype, a name or a list of names.

A value it cannot read is an UnreadableRun naming the dotted key and the value, one line, never a
traceback: a quoted number, ``abc``, ``inf``, a dtype verl or the rollout server refuses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pytest_verl_compat.checks.precision import precision_size


class UnreadableRun(ValueError):
    """A configuration the forecast cannot model (one line naming the key and value); ``key``:
    that key, dotted, where one decides it."""

    def __init__(self, message: str, key: str = "") -> None:
        super().__init__(message)
        self.key = key


def number(section: Mapping[str, Any], key: str, default: float, where: str) -> float:
    """``section[key]`` as a finite number (``default`` when unset); anything else is an
    UnreadableRun naming ``where.key``, never a traceback (a quoted value, ``abc``, ``inf``)."""
    value = section.get(key)
    if value is None:
        return default
    try:
        found = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        found = math.nan
    if not math.isfinite(found):
        raise UnreadableRun(f"{where}.{key}={value!r}: expected a finite number", f"{where}.{key}")
    return found


def fraction(section: Mapping[str, Any], key: str, default: float, where: str) -> float:
    """``section[key]`` as a share of the GPU, in (0, 1] (``default`` when unset): the rollout
    server refuses another (vLLM's CacheConfig declares gpu_memory_utilization with gt=0, le=1,
    vllm/config/cache.py); anything else is an UnreadableRun naming ``where.key``."""
    found = number(section, key, default, where)
    if not 0 < found <= 1:
        raise UnreadableRun(
            f"{where}.{key}={section.get(key)!r}: expected a share of the GPU in (0, 1], which "
            "the rollout server refuses otherwise",
            f"{where}.{key}",
        )
    return found


# vLLM's and SGLang's dtype names: vLLM's _STR_DTYPE_TO_TORCH_DTYPE, and "auto" (the model's own).
SERVER_DTYPE_BYTES = {"half": 2, "float16": 2, "bfloat16": 2, "float": 4, "float32": 4}


def precision_bytes(section: Mapping[str, Any], key: str, default: int, where: str) -> int:
    """Bytes per element of a dtype verl's FSDP engine reads with PrecisionType (``default`` when
    unset; the names: checks/precision.py); a name it refuses is an UnreadableRun naming
    ``where.key``."""
    value = section.get(key)
    if value is None:
        return default
    size = precision_size(value)
    if size is None:
        raise UnreadableRun(
            f"{where}.{key}={value!r}: verl's PrecisionType takes fp32, bf16 or fp16 (or 32, 16); "
            "another name raises when the engine is built (verl/utils/torch_dtypes.py:61-69)",
            f"{where}.{key}",
        )
    return size


def server_dtype_bytes(section: Mapping[str, Any], where: str) -> int:
    """Bytes per element of the rollout server's weights and cache (``dtype``: auto, bfloat16, ...);
    a name the server refuses is an UnreadableRun naming ``where.dtype``."""
    value = section.get("dtype")
    if value is None or value == "auto":
        return 2
    if isinstance(value, str) and value in SERVER_DTYPE_BYTES:
        return SERVER_DTYPE_BYTES[value]
    raise UnreadableRun(
        f"{where}.dtype={value!r}: the rollout server takes auto, bfloat16, float16 (half) or "
        "float32 (float)",
        f"{where}.dtype",
    )


def names(
    section: Mapping[str, Any], key: str, default: Any, where: str, noun: str = "module name"
) -> tuple[str, ...]:
    """A name or a list of them (peft's and Megatron-Bridge's target modules, a checkpoint's
    contents); anything else is an UnreadableRun naming ``where.key``."""
    value = section.get(key, default)
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise UnreadableRun(
        f"{where}.{key}={value!r}: expected a {noun} or a list of them", f"{where}.{key}"
    )
