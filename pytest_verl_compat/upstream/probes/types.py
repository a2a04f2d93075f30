"""Types by upstream's config dataclasses: each field's annotation against the value it was given.

verl builds its config dataclasses with Hydra's ``instantiate`` (verl/utils/config.py:52), which
checks no type: ``ppo_micro_batch_size_per_gpu: Optional[int]`` takes ``"8x"`` and fails later,
or never. After the probes, every dataclass instance the recorder tagged with its configuration
path is read field by field against ``typing.get_type_hints`` of its class; a value no annotation
admits is a record (key, value, the annotation, the class and field). The caller keeps those of
keys the script set (a default is upstream's own choice).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any

KEY_KEY = "key"
KEY_VALUE = "value"
KEY_EXPECTED = "expected"
KEY_FIELD = "field"  # ``module.Class.field``


def fits(value: Any, hint: Any) -> bool | None:
    """Whether ``value`` is admitted by the annotation ``hint``; None when it cannot say."""
    if hint is Any or hint is object:
        return True
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        answers = [fits(value, arg) for arg in typing.get_args(hint)]
        return True if any(answers) else (None if None in answers else False)
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    if value is None:
        return False
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    container = origin or hint
    if container in (list, tuple, set, typing.Sequence):
        return isinstance(value, list | tuple)
    if container in (dict, typing.Mapping):
        return isinstance(value, dict)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return isinstance(value, dict)
    return None


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # a forward reference upstream leaves unresolvable: no types known
        return {}


def wrong_types(
    tagged: Iterator[tuple[Any, str]], leaves: Mapping[str, Any]
) -> list[dict[str, str]]:
    """Every field of every tagged dataclass whose configuration value its annotation refuses."""
    found: dict[str, dict[str, str]] = {}
    for obj, path in tagged:
        cls = type(obj)
        if not dataclasses.is_dataclass(cls):
            continue
        hints = _hints(cls)
        for field in dataclasses.fields(cls):
            key = f"{path}.{field.name}"
            if key in found or key not in leaves or field.name not in hints:
                continue
            value = leaves[key]
            if isinstance(value, dict):
                continue
            if fits(value, hints[field.name]) is False:
                found[key] = {
                    KEY_KEY: key,
                    KEY_VALUE: repr(value),
                    KEY_EXPECTED: _words(hints[field.name]),
                    KEY_FIELD: f"{cls.__module__}.{cls.__qualname__}.{field.name}",
                }
    return [found[key] for key in sorted(found)]


def _words(hint: Any) -> str:
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "").replace("NoneType", "None")
