"""Entry modules: which modules a launch may run, how a script file maps to one, and how many
processes torchrun starts. Pure functions of known text; the interpreter's ``launcher`` layer
decides which words are known.

An entry module is a dotted module under one of the packages in ``data/entry_packages.txt``
(``verl``, and ``recipe`` for older releases' recipes). ``python3 PATH/verl/trainer/main_ppo.py``
runs the file of ``verl.trainer.main_ppo``: the path is cut at its last folder named like an
entry package. Which entry modules a read accepts is the caller's choice (:data:`EntryModules`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from importlib import resources

import pytest_verl_compat.bash.paths as paths
from pytest_verl_compat.bash.state import LAUNCHER_MODULE

# What a read accepts as its launch: dotted module names, or a predicate over them. None: the
# default, `verl.trainer.main_ppo` alone (what every caller above the reader assumes).
EntryModules = Callable[[str], bool] | Collection[str] | None


def _entry_packages() -> tuple[str, ...]:
    text = resources.files("pytest_verl_compat").joinpath("data", "entry_packages.txt")
    lines = (line.strip() for line in text.read_text(encoding="utf-8").splitlines())
    return tuple(line for line in lines if line and not line.startswith("#"))


ENTRY_PACKAGES = _entry_packages()


def acceptor(entry_modules: EntryModules) -> Callable[[str], bool]:
    """The predicate a read applies to an entry module's dotted name."""
    if entry_modules is None:
        chosen: Callable[[str], bool] = lambda module: module == LAUNCHER_MODULE  # noqa: E731
    elif callable(entry_modules):
        chosen = entry_modules
    else:
        names = frozenset(entry_modules)
        chosen = names.__contains__

    def accepts(module: str) -> bool:
        return is_entry_module(module) and bool(chosen(module))

    return accepts


def entry_stems(entry_modules: EntryModules) -> frozenset[str]:
    """The file names (without ``.py``) of the accepted modules, where they can be listed."""
    if callable(entry_modules):
        return frozenset()
    names = [LAUNCHER_MODULE] if entry_modules is None else list(entry_modules)
    return frozenset(name.rsplit(".", 1)[-1] for name in names)


def is_entry_module(module: str) -> bool:
    """Whether ``module`` is a dotted module under an entry package."""
    parts = module.split(".")
    return len(parts) > 1 and parts[0] in ENTRY_PACKAGES and all(p.isidentifier() for p in parts)


def module_of_file(path: str, cwd: str | None) -> str | None:
    """The entry module a Python file runs as (``.../verl/trainer/main_ppo.py``), None when the
    path names no file under an entry package (or its folder is only known at run time)."""
    if not path.endswith(".py") or "\0" in path:
        return None
    if not path.startswith("/"):
        if not any(part in ENTRY_PACKAGES for part in path.split("/")[:-1]):
            if cwd is None or "\0" in cwd:
                return None
            path = paths.joined(cwd, path)
    parts = paths.logical(path if path.startswith("/") else "/" + path).split("/")
    starts = [i for i, part in enumerate(parts[:-1]) if part in ENTRY_PACKAGES]
    if not starts:
        return None
    module = ".".join([*parts[starts[-1] : -1], parts[-1][: -len(".py")]])
    return module if is_entry_module(module) else None


# determine_local_world_size's names for "as many as there are" (a private backend's name, such
# as npu where torch_npu is installed, is the other word it takes).
_DEVICE_COUNTS = frozenset({"cpu", "gpu", "xpu", "auto"})


@dataclass(frozen=True)
class WorldSize:
    """How many processes torchrun starts in all, or why only the running system knows."""

    size: int | None
    reason: str = ""


def torchrun_world_size(options: dict[str, str | bool], runtime: dict[str, str]) -> WorldSize:
    """``nproc_per_node`` times ``nnodes`` as torch/distributed/run.py reads them (defaults
    ``1`` and ``1:1``); ``--standalone`` rendezvous on this node alone."""
    for name in ("nproc_per_node", "nnodes"):
        if name in runtime:
            return WorldSize(None, f"--{name} is {runtime[name]}, only known at run time")
    nproc_text = str(options.get("nproc_per_node", "1"))
    nnodes_text = str(options.get("nnodes", "1:1"))
    bounds = nnodes_text.split(":")
    try:
        # parse_min_max_nnodes: int() of each side, as Python reads it.
        low, high = (int(bounds[0]), int(bounds[-1])) if len(bounds) <= 2 else (0, -1)
    except ValueError:
        return WorldSize(None, f"torchrun rejects --nnodes={nnodes_text}")
    if high < low or len(bounds) > 2:
        return WorldSize(None, f"torchrun rejects --nnodes={nnodes_text}")
    if options.get("standalone") is True:
        if low > 1:
            return WorldSize(
                None,
                f"--standalone with --nnodes={nnodes_text}: its rendezvous on this node waits "
                "for nodes that cannot join",
            )
        low = high = 1
    if low != high:
        return WorldSize(None, f"elastic --nnodes={nnodes_text}: the nodes that join decide")
    try:
        nproc = int(nproc_text)  # determine_local_world_size: int() first
    except ValueError:
        if nproc_text in _DEVICE_COUNTS:
            return WorldSize(
                None, f"--nproc_per_node={nproc_text}: the devices where it runs decide how many"
            )
        return WorldSize(
            None,
            f"--nproc_per_node={nproc_text!r} is no number; torchrun takes it only as the name "
            "of a device backend installed where it runs",
        )
    if nproc < 1 or low < 1:
        return WorldSize(None, f"--nproc_per_node={nproc_text} --nnodes={nnodes_text} start none")
    return WorldSize(nproc * low)
