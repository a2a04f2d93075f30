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
import importlib
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
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


def _fields(
    tagged: Iterator[tuple[Any, str]], leaves: Mapping[str, Any]
) -> Iterator[tuple[str, Any, Any, str]]:
    """(key, value, annotation, ``module.Class.field``) once per configuration key a tagged
    dataclass holds as a scalar field."""
    seen: set[str] = set()
    for obj, path in tagged:
        cls = type(obj)
        if not dataclasses.is_dataclass(cls):
            continue
        hints = _hints(cls)
        for field in dataclasses.fields(cls):
            key = f"{path}.{field.name}"
            if key in seen or key not in leaves or field.name not in hints:
                continue
            value = leaves[key]
            if isinstance(value, dict):
                continue
            seen.add(key)
            yield key, value, hints[field.name], f"{cls.__module__}.{cls.__qualname__}.{field.name}"


def _record(key: str, value: Any, hint: Any, field: str) -> dict[str, str]:
    return {KEY_KEY: key, KEY_VALUE: repr(value), KEY_EXPECTED: _words(hint), KEY_FIELD: field}


def wrong_types(
    tagged: Iterator[tuple[Any, str]], leaves: Mapping[str, Any]
) -> list[dict[str, str]]:
    """Every field of every tagged dataclass whose configuration value its annotation refuses."""
    found = [_record(*row) for row in _fields(tagged, leaves) if fits(row[1], row[2]) is False]
    return sorted(found, key=lambda record: record[KEY_KEY])


def _section(mapping: Mapping[str, Any], parts: list[str]) -> Any:
    node: Any = mapping
    for part in parts:
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _dataclass_of(hint: Any) -> type | None:
    """The dataclass an annotation names, through ``Optional[...]``."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        found = [cls for arg in typing.get_args(hint) if (cls := _dataclass_of(arg)) is not None]
        return found[0] if len(found) == 1 else None
    return None


def _target_class(target: Any) -> type | None:
    """The config dataclass a section's ``_target_`` names (the gate admits only the installed
    tree's own ``_target_`` values), or None."""
    if not isinstance(target, str) or not target.startswith("verl."):
        return None
    module_name, _, name = target.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError):
        return None
    return found if isinstance(found, type) and dataclasses.is_dataclass(found) else None


def _owner(mapping: Mapping[str, Any], key: str) -> tuple[type, str] | None:
    """The config dataclass holding ``key``'s field, and the field's name: from the nearest
    section above it whose ``_target_`` names a config dataclass, down through the fields'
    dataclass annotations (``algorithm`` is ``AlgoConfig``, whose ``rollout_correction`` field is
    a ``RolloutCorrectionConfig``), whether or not the selected path builds that dataclass."""
    parts = key.split(".")
    for depth in range(len(parts) - 1, -1, -1):
        section = _section(mapping, parts[:depth])
        cls = _target_class(section.get("_target_")) if isinstance(section, Mapping) else None
        if cls is None:
            continue
        for part in parts[depth:-1]:
            cls = _dataclass_of(_hints(cls).get(part))
            if cls is None:
                return None
        return cls, parts[-1]
    return None


def annotation(mapping: Mapping[str, Any], key: str) -> tuple[Any, str] | None:
    """The annotation of ``key``'s field (``_owner``) and its ``module.Class.field``."""
    owner = _owner(mapping, key)
    hint = _hints(owner[0]).get(owner[1]) if owner is not None else None
    if owner is None or hint is None:
        return None
    cls, name = owner
    return hint, f"{cls.__module__}.{cls.__qualname__}.{name}"


def field_default(mapping: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    """(True, the dataclass's own default for ``key``'s field), or (False, None) without one."""
    owner = _owner(mapping, key)
    if owner is None:
        return False, None
    found = {f.name: f for f in dataclasses.fields(owner[0])}.get(owner[1])
    if found is None or found.default is dataclasses.MISSING:
        return False, None
    return True, found.default


def string_admitting(mapping: Mapping[str, Any]) -> list[str]:
    """Every key of ``mapping`` (a tree's defaults) whose default is a number or a flag but whose
    config dataclass annotation admits a string: the keys the tree default's type misjudges."""
    found = []
    stack: list[tuple[str, Any]] = [("", mapping)]
    while stack:
        prefix, node = stack.pop()
        for name, value in node.items():
            key = f"{prefix}{name}"
            if isinstance(value, Mapping):
                stack.append((key + ".", value))
            elif isinstance(value, bool | int | float):
                hint = annotation(mapping, key)
                if hint is not None and fits("a string", hint[0]) is True:
                    found.append(key)
    return sorted(found)


def explicit_types(
    mapping: Mapping[str, Any], leaves: Mapping[str, Any], keys: Iterable[str]
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Of ``keys`` (the script's), by their dataclass annotations (``annotation``): the values
    refused, and the strings admitted. An admitted string is upstream's own typing where the tree
    default's type says otherwise, and outranks it (``rollout_is_threshold: str | float``,
    verl/trainer/config/algorithm.py:179, defaults to 2.0 and takes ``"0.5_4.0"``)."""
    refused, admitted = [], []
    for key in sorted(set(keys)):
        value = leaves.get(key)
        found = annotation(mapping, key) if key in leaves and value is not None else None
        if found is None or isinstance(value, dict | list):
            continue
        hint, field = found
        verdict = fits(value, hint)
        if verdict is False:
            refused.append(_record(key, value, hint, field))
        elif verdict and isinstance(value, str):
            admitted.append(_record(key, value, hint, field))
    return refused, admitted


def _words(hint: Any) -> str:
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "").replace("NoneType", "None")
