"""Compose stage: Hydra 1.3.2's compose API on the pinned tree, resolved into a plain mapping."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.basecontainer import BaseContainer
from omegaconf.errors import OmegaConfBaseException

MISSING = "???"


@dataclass(frozen=True)
class Composition:
    """A composed case: its resolved mapping, or the reason Hydra rejected it."""

    outcome: str  # "composed" or "composition_rejection"
    resolved: dict[str, Any] | None = None
    reason: str = ""
    missing: tuple[str, ...] = field(default_factory=tuple)

    @property
    def composed(self) -> bool:
        return self.outcome == "composed"


def count_leaves(value: Any) -> int:
    """Leaves of a resolved mapping: list items one by one; an empty mapping or list is one leaf."""
    if isinstance(value, Mapping) and value:
        return sum(count_leaves(v) for v in value.values())
    if isinstance(value, list) and value:
        return sum(count_leaves(v) for v in value)
    return 1


def iter_leaves(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Yield (dotted path, value) for every leaf; list items are addressed as ``path[i]``."""
    if isinstance(value, Mapping) and value:
        for key, item in value.items():
            yield from iter_leaves(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            yield from iter_leaves(item, f"{prefix}[{index}]")
    else:
        yield prefix, value


def _missing_paths(node: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(node, DictConfig):
        for key in node.keys():
            path = f"{prefix}.{key}" if prefix else str(key)
            if OmegaConf.is_missing(node, key):
                yield path
            else:
                yield from _missing_paths(node._get_node(key), path)
    elif isinstance(node, ListConfig):
        for index in range(len(node)):
            if OmegaConf.is_missing(node, index):
                yield f"{prefix}[{index}]"
            else:
                yield from _missing_paths(node._get_node(index), f"{prefix}[{index}]")


@contextlib.contextmanager
def deterministic_resolvers(variables: Mapping[str, str]) -> Iterator[None]:
    """Shadow the resolvers that read the machine (``oc.env``, Hydra's ``now``) while resolving.

    ``oc.env`` answers from the manifest's bindings only, so a resolved mapping never depends on
    the machine; ``now`` is refused because it reads the clock. OmegaConf has no public way to
    save and restore a resolver, so the registry itself is saved and put back.
    """
    saved = dict(BaseContainer._resolvers)

    def env(key: str, default: Any = "__unset__") -> Any:
        if key in variables:
            return variables[key]
        if default != "__unset__":
            return default
        raise KeyError(f"environment variable {key!r} is not bound in the manifest")

    def now(*_: Any) -> Any:
        raise ValueError("the `now` resolver reads the clock; bind a literal value instead")

    OmegaConf.register_new_resolver("oc.env", env, replace=True)
    OmegaConf.register_new_resolver("now", now, replace=True)
    try:
        yield
    finally:
        BaseContainer._resolvers.clear()
        BaseContainer._resolvers.update(saved)


def _clean_message(exc: BaseException, config_dir: Path) -> str:
    """Hydra's message, without machine-specific paths, so snapshots stay byte-identical."""
    message = f"{type(exc).__name__}: {exc}".replace(str(config_dir), "<config_dir>")
    return message.strip()


class Composer:
    """Composes override lists on one config tree; keeps Hydra initialised between calls."""

    def __init__(self, config_dir: Path, config_name: str) -> None:
        self.config_dir = Path(config_dir)
        self.config_name = config_name

    @contextlib.contextmanager
    def _hydra(self) -> Iterator[None]:
        # GlobalHydra is process-wide: another tree, or another user of Hydra in the same
        # pytest process, may have initialised it.
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(self.config_dir), version_base=None):
            yield

    def compose_config(self, fields: Sequence[str]) -> DictConfig:
        """The unresolved composed config (raises Hydra's own exceptions)."""
        with self._hydra():
            return compose(config_name=self.config_name, overrides=list(fields))

    def compose(self, fields: Sequence[str], variables: Mapping[str, str]) -> Composition:
        """Compose and resolve; Hydra and OmegaConf errors become a composition rejection."""
        try:
            cfg = self.compose_config(fields)
            with deterministic_resolvers(variables):
                resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
        except (HydraException, OmegaConfBaseException, ValueError, KeyError) as exc:
            return Composition("composition_rejection", reason=_clean_message(exc, self.config_dir))
        assert isinstance(resolved, dict)
        return Composition("composed", resolved=resolved, missing=tuple(_missing_paths(cfg)))
