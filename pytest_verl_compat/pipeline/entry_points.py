"""The pinned release's entry points, read from the installed verl's own source (never imported).

An entry point is a module whose ``main`` carries ``@hydra.main(config_path=…, config_name=…)``:
``verl.trainer.main_ppo`` (``ppo_trainer``), ``verl.trainer.sft_trainer`` (``sft_trainer_engine``)
and the others of the release. For each, ``scan`` records from the module's syntax tree:

- the config it composes: the folder ``config_path`` names (relative to the module's file, as
  Hydra resolves it) and ``config_name``, and the search path that config's own ``hydra:``
  section adds (``pkg://verl.trainer.config``, a package folder of the installed verl);
- where its world size comes from, by what it calls: ``ray.init`` (Ray places workers by the
  configuration's ``trainer.nnodes`` and ``trainer.n_gpus_per_node``) or
  ``initialize_global_process_group`` / ``init_process_group`` (one process per rank, its
  ``WORLD_SIZE`` given by the launcher: ``torchrun --nnodes … --nproc_per_node …``);
- the launchers that reach it: ``python -m MODULE``, ``torchrun -m MODULE``, a path to its file.

A script that runs a ``verl.`` module the release does not have is an error naming the module and
the release, with the closest entry point the release does have (``closest``).
"""

from __future__ import annotations

import ast
import difflib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

# Defined with the checks (a lower layer, which reads them too); named here for the pipeline's users.
from pytest_verl_compat.checks.upstream_names import FULLY_ASYNC_MODULE as FULLY_ASYNC_MODULE
from pytest_verl_compat.checks.upstream_names import ONE_STEP_OFF_MODULE as ONE_STEP_OFF_MODULE
from pytest_verl_compat.files.safe_input import InputError, load_yaml_file, read_text

WorldSource = Literal["ray", "torchrun", "none"]
# The launcher-relative calls that start a world (the last component of the called name).
_RAY_CALLS = frozenset({"init"})
# The SFT trainer's entry point and its config, which every SFT launch composes (the RL
# trainers' is the pinned ``main_ppo``'s ``ppo_trainer``).
PINNED_ENTRY_MODULE = "verl.trainer.main_ppo"
SFT_ENTRY_MODULE = "verl.trainer.sft_trainer"
SFT_CONFIG_NAME = "sft_trainer_engine"
ASYNC_ENTRY_MODULES = (FULLY_ASYNC_MODULE, ONE_STEP_OFF_MODULE)
_PROCESS_GROUP_CALLS = frozenset({"initialize_global_process_group", "init_process_group"})
# The method every verl trainer trains in (RayPPOTrainer, SFTTrainer, the asynchronous trainers).
_FIT = "fit"
# What a search path of a verl config names: ``pkg://verl.trainer.config``, a package folder of
# the installed verl; ``file://verl/trainer/config``, a folder relative to the launcher's working
# directory, which is that package folder when the launch runs from a verl checkout's root.
_PKG = "pkg://"
_FILE = "file://"


class UnknownEntryPoint(ValueError):
    """A launch of a module the pinned release does not have, and the closest it has."""

    def __init__(self, module: str, version: str, near: str | None) -> None:
        hint = f"; the closest it has is {near}" if near else ""
        super().__init__(f"verl {version} has no entry point {module}{hint}")
        self.module = module
        self.near = near


@dataclass(frozen=True)
class EntryPoint:
    """One ``@hydra.main`` module of the installed release."""

    module: str  # verl.trainer.sft_trainer
    file: str  # verl/trainer/sft_trainer.py, relative to the installed package's parent
    line: int  # the @hydra.main line
    config_dir: str  # verl/trainer/config, relative to the installed package's parent
    config_name: str  # sft_trainer_engine
    search_path: tuple[str, ...]  # further config folders its config's hydra.searchpath adds
    # A search path relative to the launcher's working directory (``file://verl/...``): the
    # entry point composes only when launched from a verl checkout's root.
    cwd_relative: bool
    world: WorldSource  # where its world size comes from
    world_evidence: str  # the file:line of the call that decides it, "" for none
    # Keys its ``main`` overwrites before anything reads them (``config.a.b = config.c.d``):
    # (the key overwritten, the key it copies, the file:line).
    forced: tuple[tuple[str, str, str], ...] = ()
    # The file:line where it starts a trainer's ``fit`` (directly, or through a function of
    # another verl module that does: ``run_ppo``); "" when it never trains (it serves a model or
    # scores outputs), so no training check applies to its tree.
    trains_at: str = ""
    # Every function its module calls by name (``f(...)``, ``m.f(...)``: ``f``).
    calls: frozenset[str] = frozenset()

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def launchers(self) -> tuple[str, ...]:
        """How a script reaches it."""
        return (
            f"python -m {self.module}",
            f"torchrun ... -m {self.module}",
            f"python {self.file}",
            f"torchrun ... {self.file}",
        )


def _hydra_main(function: ast.FunctionDef) -> tuple[int, str, str] | None:
    """(line, config_path, config_name) of a ``@hydra.main(...)`` decorator, if any."""
    for decorator in function.decorator_list:
        if not isinstance(decorator, ast.Call):
            continue
        name = ast.unparse(decorator.func)
        if name not in ("hydra.main", "main"):
            continue
        keywords = {k.arg: k.value for k in decorator.keywords if k.arg}
        path, config = keywords.get("config_path"), keywords.get("config_name")
        if isinstance(path, ast.Constant) and isinstance(config, ast.Constant):
            return decorator.lineno, str(path.value), str(config.value)
    return None


def _dotted(node: ast.expr, root: str) -> str | None:
    """``config.a.b`` as ``a.b`` when rooted at the name ``root``, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == root and parts:
        return ".".join(reversed(parts))
    return None


def _forced(function: ast.FunctionDef, relative: str) -> tuple[tuple[str, str, str], ...]:
    """The keys ``main`` overwrites with another key's value, in its own body."""
    if not function.args.args:
        return ()
    root = function.args.args[0].arg
    found = []
    for node in function.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = _dotted(node.targets[0], root)
            source = _dotted(node.value, root)
            if target and source:
                found.append((target, source, f"{relative}:{node.lineno}"))
    return tuple(found)


@functools.lru_cache(maxsize=256)
def _world(tree: ast.Module, relative: str) -> tuple[WorldSource, str]:
    """Where the module's world size comes from, by the first deciding call in its source."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        # The called name's last part; only a name or an attribute ends in one, and unparsing
        # every call of a module is most of this scan's time.
        last = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
        if last not in _RAY_CALLS and last not in _PROCESS_GROUP_CALLS:
            continue
        called = ast.unparse(node.func)
        if called.startswith("ray.") and last in _RAY_CALLS:
            return "ray", f"{relative}:{node.lineno}"
        if last in _PROCESS_GROUP_CALLS:
            return "torchrun", f"{relative}:{node.lineno}"
    return "none", ""


def _world_of(
    site: Path, relative: str, tree: ast.Module, depth: int = 2
) -> tuple[WorldSource, str]:
    """``_world`` of the module, else of the verl modules it imports from (``run_ppo`` of
    ``main_ppo`` starts the Ray world of the asynchronous trainers)."""
    world, evidence = _world(tree, relative)
    if world != "none" or depth == 0:
        return world, evidence
    for imported, other in _verl_imports(site, tree):
        world, evidence = _world_of(site, imported, other, depth - 1)
        if world != "none":
            return world, evidence
    return "none", ""


def _verl_imports(
    site: Path, tree: ast.Module, wanted: Callable[[ast.ImportFrom], bool] = lambda _: True
) -> Iterator[tuple[str, ast.Module]]:
    """Each ``from verl.x import ...`` of a module that ``wanted`` keeps and whose source parses:
    the imported module's file (relative to ``site``) and its syntax tree."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("verl."):
            continue
        if not wanted(node):
            continue
        imported = (node.module or "").replace(".", "/") + ".py"
        other = _module_tree(site, imported)
        if other is not None:
            yield imported, other


@functools.lru_cache(maxsize=256)
def _module_tree(site: Path, relative: str) -> ast.Module | None:
    """A verl module's syntax tree, None when it is missing or does not parse: parsed once,
    since the entry points import the same modules (``_world_of`` and ``_trains_at`` follow
    them)."""
    path = site / relative
    if not path.is_file():
        return None
    try:
        return ast.parse(read_text(path, what="verl module"), filename=relative)
    except (InputError, SyntaxError):
        return None


def _called_names(tree: ast.Module) -> frozenset[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name):
                names.add(node.func.id)
            elif isinstance(node.func, ast.Attribute):
                names.add(node.func.attr)
    return frozenset(names)


def _fit_call(tree: ast.Module, relative: str) -> str:
    """The first ``<trainer>.fit(...)`` call of a module, as file:line; "" when none."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == _FIT
        ):
            return f"{relative}:{node.lineno}"
    return ""


def _trains_at(site: Path, relative: str, tree: ast.Module) -> str:
    """Where the module starts training: its own ``.fit(`` call, else a call of a function it
    imports from a verl module that calls one (fully_async_main calls main_ppo's ``run_ppo``,
    whose TaskRunner fits)."""
    own = _fit_call(tree, relative)
    if own:
        return own
    called = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }

    def calls_it(node: ast.ImportFrom) -> bool:
        return any((alias.asname or alias.name) in called for alias in node.names)

    for imported, other in _verl_imports(site, tree, calls_it):
        found = _fit_call(other, imported)
        if found:
            return found
    return ""


def _search_path(config_file: Path, site: Path) -> tuple[tuple[str, ...], bool]:
    """The folders a config's own ``hydra.searchpath`` adds (``pkg://verl.x.y`` → ``verl/x/y``;
    a relative ``file://verl/x/y`` too), and whether one was relative to the working folder."""
    try:
        document = load_yaml_file(config_file, what="config file")
    except InputError:
        return (), False
    hydra = document.get("hydra") if isinstance(document, dict) else None
    entries = hydra.get("searchpath") if isinstance(hydra, dict) else None
    found = []
    relative = False
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, str):
            continue
        if entry.startswith(_PKG):
            folder = entry[len(_PKG) :].replace(".", "/")
        elif entry.startswith(_FILE) and not entry[len(_FILE) :].startswith("/"):
            folder, relative = entry[len(_FILE) :].rstrip("/"), True
        else:
            continue
        if (site / folder).is_dir():
            found.append(folder)
    return tuple(found), relative


@functools.lru_cache(maxsize=4)
def scan(site: Path) -> tuple[EntryPoint, ...]:
    """Every ``@hydra.main`` module under ``site/verl`` (the installed package's parent)."""
    found: list[EntryPoint] = []
    for path in sorted((site / "verl").rglob("*.py")):
        try:
            text = read_text(path, what="verl module")
        except InputError:
            continue
        if "hydra.main" not in text:
            continue
        relative = path.relative_to(site).as_posix()
        tree = _module_tree(site, relative)  # the same tree another entry point's imports use
        if tree is None:
            continue
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef):
                continue
            decorated = _hydra_main(node)
            if decorated is None:
                continue
            line, config_path, config_name = decorated
            config_dir = (path.parent / config_path).resolve()
            if not config_dir.is_relative_to(site.resolve()):
                continue
            world, evidence = _world_of(site, relative, tree)
            search_path, cwd_relative = _search_path(config_dir / f"{config_name}.yaml", site)
            found.append(
                EntryPoint(
                    module=relative.removesuffix(".py").replace("/", "."),
                    file=relative,
                    line=line,
                    config_dir=config_dir.relative_to(site.resolve()).as_posix(),
                    config_name=config_name,
                    search_path=search_path,
                    cwd_relative=cwd_relative,
                    world=world,
                    world_evidence=evidence,
                    forced=_forced(node, relative),
                    trains_at=_trains_at(site, relative, tree),
                    calls=_called_names(tree),
                )
            )
    return tuple(found)


def by_module(entries: tuple[EntryPoint, ...]) -> dict[str, EntryPoint]:
    return {entry.module: entry for entry in entries}


def module_of_path(path: str, entries: tuple[EntryPoint, ...]) -> EntryPoint | None:
    """The entry point a path to a module's file names (``…/verl/trainer/sft_trainer.py``)."""
    normal = path.replace("\\", "/")
    for entry in entries:
        if normal == entry.file or normal.endswith("/" + entry.file):
            return entry
    return None


def closest(module: str, entries: tuple[EntryPoint, ...]) -> str | None:
    """The release's entry point nearest in name to ``module`` (a typo, a renamed module)."""
    names = [entry.module for entry in entries]
    match = difflib.get_close_matches(module, names, n=1, cutoff=0.6)
    return match[0] if match else None
