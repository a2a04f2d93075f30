"""``_target_`` values are data: only the classes the config tree itself names may appear.

Hydra composes ``+a.b.pwn._target_=os.system`` without complaint, and upstream's
``validate_config`` / ``omega_conf_to_dataclass`` instantiate what a section's ``_target_`` names
(verl/utils/config.py, ``omega_conf_to_dataclass`` → ``hydra.utils.instantiate``). So a
composition whose ``_target_`` is not one of the tree's own values is rejected before anything
upstream sees it, and the oracle process checks again against the installed verl's tree.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pytest_verl_compat.files.safe_input import InputError, load_yaml_file

TARGET_KEY = "_target_"


def _targets_in(node: Any) -> Iterator[Any]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key == TARGET_KEY:
                yield value
            else:
                yield from _targets_in(value)
    elif isinstance(node, list):
        for item in node:
            yield from _targets_in(item)


@functools.lru_cache(maxsize=8)
def tree_targets(config_dir: Path) -> frozenset[str]:
    """Every string ``_target_`` value in the tree's YAML files (the classes upstream names)."""
    found: set[str] = set()
    for file in sorted(Path(config_dir).rglob("*.yaml")):
        try:
            document = load_yaml_file(file, what="config file")
        except InputError:
            continue  # not a config file of the tree; composing the tree reports it if used
        found.update(t for t in _targets_in(document) if isinstance(t, str))
    return frozenset(found)


def foreign_targets(resolved: Mapping[str, Any], allowed: frozenset[str]) -> list[str]:
    """``path: value`` for every ``_target_`` in the mapping that the tree does not name."""
    foreign = []

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                path = f"{prefix}.{key}" if prefix else str(key)
                if key == TARGET_KEY and not (isinstance(value, str) and value in allowed):
                    foreign.append(f"{path}={value!r}")
                else:
                    walk(value, path)
        elif isinstance(node, list):
            for index, item in enumerate(node):
                walk(item, f"{prefix}[{index}]")

    walk(resolved, "")
    return foreign


def target_rejection(resolved: Mapping[str, Any], *config_dirs: Path) -> str | None:
    """The composition-rejection reason when a ``_target_`` is foreign to the tree (its folder
    and the folders its search path adds), else None."""
    allowed = frozenset().union(*(tree_targets(Path(folder)) for folder in config_dirs))
    foreign = foreign_targets(resolved, allowed)
    if not foreign:
        return None
    return (
        f"{foreign[0]}: a _target_ must be one of the classes the config tree names "
        f"(_target_ values are data, never instantiated here)"
        + (f"; {len(foreign) - 1} more" if len(foreign) > 1 else "")
    )
