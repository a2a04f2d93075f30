"""Names verl registers only when an optional package imports: valid, with a note, never an error.

verl imports some registering modules under ``try: … except ImportError`` (the checkpoint
engines, verl/checkpoint_engine/__init__.py:33-67): ``@CheckpointEngineRegistry.register("nccl")``
runs only where ``cupy`` imports (nccl_checkpoint_engine.py:23). Where the oracle runs, such a
module fails to import and its name is missing from the live registry, although a run on a
machine with the package accepts it. ``optional_names`` finds them from the installed source
(read as data, nothing imported): every ``@<registry>.register("name")`` of a module that is not
imported here, with the first module-level import whose package is not installed. The probes
register each under a stand-in that notes, when the configuration selects it, the package it
needs and both lines.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

from pytest_verl_compat.upstream.probes.recorder import note_environment

# JSON keys of a note (the answer's ``notes``): the keys, the message, the upstream line, the rule.
KEY_KEYS = "keys"
KEY_MESSAGE = "message"
KEY_WHERE = "where"
KEY_RULE = "rule"
OPTIONAL_PACKAGE = "env.optional-package"


@dataclass(frozen=True)
class Registration:
    """Where a module of verl registers a name, and the import that stops it here."""

    registered_at: str  # verl/…py:line of the decorator
    needs: str  # the top-level package that is not installed
    import_at: str  # verl/…py:line of that import

    def words(self) -> str:
        line = self.registered_at.rpartition(":")[2]
        return f"`{self.needs}` ({self.import_at}, registered at line {line})"


@dataclass(frozen=True)
class OptionalName:
    """A registry name that modules of verl register only where an optional package imports."""

    name: str
    registrations: tuple[Registration, ...]

    def message(self, registry: str) -> str:
        needs = " or ".join(r.words() for r in self.registrations)
        return (
            f"{self.name!r} is registered in {registry} only where an optional package imports: "
            f"{needs}; none is installed where the oracle runs, so the name is valid and what it "
            "builds is not evaluated here"
        )


def _module_imports(tree: ast.Module) -> list[tuple[str, int]]:
    """(top-level package, line) of every import the module runs when it is imported: module
    level, and inside module-level ``with``/``try``/``if`` blocks, not in functions or classes."""
    found: list[tuple[str, int]] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, ast.Import):
            found += [(alias.name.split(".")[0], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module.split(".")[0], node.lineno))
        elif isinstance(node, ast.With | ast.If):
            pending = [*node.body, *getattr(node, "orelse", []), *pending]
        elif isinstance(node, ast.Try):
            pending = [*node.body, *pending]
    return found


def _registered(tree: ast.Module, registry: str) -> list[tuple[str, int]]:
    """(name, line) of each ``@<registry>.register("name")`` decorator in the module."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef | ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            if (
                isinstance(decorator, ast.Call)
                and isinstance(decorator.func, ast.Attribute)
                and decorator.func.attr == "register"
                and isinstance(decorator.func.value, ast.Name)
                and decorator.func.value.id == registry
                and decorator.args
                and isinstance(decorator.args[0], ast.Constant)
                and isinstance(decorator.args[0].value, str)
            ):
                found.append((decorator.args[0].value, decorator.lineno))
    return found


def _missing_package(tree: ast.Module) -> tuple[str, int] | None:
    for package, line in _module_imports(tree):
        if package in ("verl", "__future__") or package in sys.stdlib_module_names:
            continue
        if importlib.util.find_spec(package) is None:
            return package, line
    return None


@functools.cache
def optional_names(verl_root: Path, folder: str, registry: str) -> dict[str, OptionalName]:
    """The names ``registry`` gets only from modules under ``verl/<folder>`` that are not imported
    here for want of a package, each with every module that registers it."""
    found: dict[str, list[Registration]] = {}
    for path in sorted((verl_root / folder).rglob("*.py")):
        relative = "verl/" + path.relative_to(verl_root).as_posix()
        module = relative.removesuffix(".py").replace("/", ".")
        if module in sys.modules:
            continue  # imported: its names are in the live registry
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            continue
        names = _registered(tree, registry)
        missing = _missing_package(tree) if names else None
        if missing is None:
            continue
        for name, line in names:
            found.setdefault(name, []).append(
                Registration(f"{relative}:{line}", missing[0], f"{relative}:{missing[1]}")
            )
    return {name: OptionalName(name, tuple(where)) for name, where in found.items()}


def stand_in_for(optional: OptionalName, registry: str, stand_in: type) -> type:
    """A stand-in class for ``optional`` that notes, when upstream builds it, why it is valid."""

    note = {
        KEY_MESSAGE: optional.message(registry),
        KEY_WHERE: ", ".join(r.registered_at for r in optional.registrations),
        KEY_RULE: OPTIONAL_PACKAGE,
    }

    class OptionalStandIn(stand_in):  # type: ignore[misc]
        def __init__(self, *args: object, **kwargs: object) -> None:
            note_environment(optional.name, note, KEY_KEYS)
            super().__init__(*args, **kwargs)

    return OptionalStandIn
