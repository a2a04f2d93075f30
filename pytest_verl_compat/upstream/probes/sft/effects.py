"""Keys without effect on the SFT trainer's path (``effects``' two kinds, scoped to that path).

- **never read**: a field of a config dataclass the SFT trainer converts that no probe read and
  whose name no code of the SFT entry point's modules reads (the modules ``verl.trainer.sft_trainer``
  imports, directly or not, read from their syntax trees outside the config dataclasses): a field
  only the RL trainer's modules read is never read here.
- **overridden**: an ``optim.*`` number or flag that, perturbed, changes nothing the engine's own
  optimizer builder, schedule and clipped steps compute over the run's horizon, which
  ``_init_engine`` sets (sft_trainer.py:181-185): ``trainer.total_training_steps``, else the
  loader's length × epochs, a data set's length this probe does not know, so the schedule is
  compared at every step of each of ``effects.UNKNOWN_HORIZONS``. That horizon is the trainer's:
  ``optim.total_training_steps`` itself is overwritten there.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_verl_compat.upstream.probes import effects
from pytest_verl_compat.upstream.probes.records import Collector, verl_root

SFT_ENTRY = "verl.trainer.sft_trainer"


def _module_file(root: Path, name: str) -> Path | None:
    path = root.parent.joinpath(*name.split("."))
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _read(path: Path, name: str) -> tuple[set[str], set[str]]:
    """The verl modules (and names, which may be modules) a module imports anywhere in it, and
    every attribute name and string constant it holds: one parse for both."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return set(), set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    imported: set[str] = set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            imported.add(base)
            imported.update(f"{base}.{alias.name}" for alias in node.names)
    return {module for module in imported if module.split(".")[0] == "verl"}, names


@functools.cache
def _entry_path(root: Path, entry: str) -> tuple[tuple[Path, ...], frozenset[str]]:
    seen: dict[str, Path] = {}
    referenced: set[str] = set()
    config = root / "workers" / "config"
    pending = [entry]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        path = _module_file(root, name)
        if path is None:
            continue
        seen[name] = path
        parts = name.split(".")
        pending.extend(".".join(parts[:depth]) for depth in range(1, len(parts)))
        imported, names = _read(path, name)
        pending.extend(imported)
        if config not in path.parents:
            referenced |= names
    return tuple(sorted(set(seen.values()))), frozenset(referenced)


def entry_files(root: Path, entry: str) -> tuple[Path, ...]:
    """Every file of the installed verl that ``entry`` imports, directly or not (at module level
    or in a function), with the packages above each (their ``__init__`` runs on import)."""
    return _entry_path(root, entry)[0]


def referenced_on_path(root: Path, entry: str) -> frozenset[str]:
    """Every attribute name and string key the entry point's modules read outside the config
    dataclasses (``effects.referenced_names``, scoped to ``entry_files``)."""
    return _entry_path(root, entry)[1]


def sft_horizon(plain: Mapping[str, Any]) -> int | None:
    """``_init_engine``'s horizon (sft_trainer.py:181-185): ``trainer.total_training_steps``, else
    the loader's length × epochs (None: not known here)."""
    steps = plain["trainer"].get("total_training_steps")
    return None if steps is None else int(steps)


# optim.* is read by build_optimizer, the engine's scheduler and optimizer_step only
# (verl/workers/config/optimizer.py:298-351, fsdp/transformer_impl.py:477-517 and :760-800).
SFT_EFFECTS = (
    effects.Effect(
        "the optimizer and its schedule",
        lambda plain: True,
        effects.optimizer_effect("", sft_horizon),
        ("optim.*",),
        sections=("optim",),
    ),
)


def _unread_fields(out: Collector, keys: list[str]) -> list[str]:
    """The keys that are a field of a converted config dataclass no probe read: the only
    candidates ``effects.never_read`` can report."""
    import dataclasses

    fields: set[str] = set()
    for obj, path in out.reads.tagged():
        if dataclasses.is_dataclass(obj):
            fields.update(f"{path}.{field.name}" for field in dataclasses.fields(obj))
    read = out.reads.origins(out.reads.read)
    return [key for key in keys if key in fields and key not in read]


def without_effect(
    out: Collector, plain: Mapping[str, Any], leaves: Mapping[str, Any], explicit: list[str]
) -> list[dict[str, Any]]:
    """The explicit keys that change nothing on the SFT path."""
    keys = [key for key in explicit if key in leaves]
    if not keys:
        return []
    root = verl_root()
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = []
        if _unread_fields(out, keys):  # the scans of verl's source cost seconds: only if needed
            referenced = referenced_on_path(root, SFT_ENTRY)
            found = effects.never_read(
                out.reads, out.reads.tagged(), keys, root, leaves, referenced=referenced
            )
        skip = {record[effects.KEY_KEY] for record in found}
        rest = [key for key in keys if key not in skip]
        found += effects.overridden(plain, rest, leaves, root, effects=SFT_EFFECTS)
    return sorted(found, key=lambda record: str(record[effects.KEY_KEY]))
