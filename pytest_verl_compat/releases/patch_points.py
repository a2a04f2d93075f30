"""The probes' patch points, per release: each found by content in the release's own files.

A probe stands in for what a laptop lacks by setting a name upstream looks up (``patched``,
``upstream/probes/patching.py``). The names a run of the probes sets are recorded per release
(``data/releases/<version>/patch_points.json``, by ``verl-compat release derive``); here each is
found in a release's files by its qualified name alone, read with ``ast`` (nothing imported): the
module, then a top-level definition or import of the name, or a class and a member it defines,
assigns on ``self`` or inherits from a base class it imports. A name that is not there is a patch
point the release moved: the release is not supported until the probes follow it.
"""

from __future__ import annotations

import ast
import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_verl_compat.files.safe_input import InputError, read_bytes, read_text
from pytest_verl_compat.releases.index import RELEASE_DATA

POINTS_FILE = "patch_points.json"
# The package whose names are the release's own; another package's (ray, torch, Megatron-Core)
# are pinned by the environment's lock, not by the release.
PACKAGE = "verl"
MAX_POINTS_BYTES = 1 << 20


@dataclass(frozen=True)
class Found:
    """Where a patch point is defined in a release's files (``file:line``), or why it is not."""

    point: str
    where: str | None
    reason: str = ""


def points_path(version: str) -> Path:
    return RELEASE_DATA / version / POINTS_FILE


def recorded_points(version: str) -> tuple[str, ...]:
    """The patch points recorded for ``version`` (none when it has no record)."""
    path = points_path(version)
    if not path.is_file():
        return ()
    try:
        raw: Any = json.loads(read_bytes(path, MAX_POINTS_BYTES, "patch points"))
    except (InputError, ValueError):
        return ()
    return tuple(str(point) for point in raw.get("points", ()))


def dumps_points(points: set[str] | list[str]) -> str:
    return json.dumps({"points": sorted(points)}, indent=1) + "\n"


@functools.lru_cache(maxsize=256)
def _module(root: Path, dotted: str) -> tuple[str, ast.Module] | None:
    base = root.joinpath(*dotted.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            try:
                return path.relative_to(root).as_posix(), ast.parse(read_text(path))
            except (InputError, SyntaxError, ValueError):
                return None
    return None


def _defines(node: ast.AST, name: str) -> bool:
    """Whether a statement of a body defines ``name``: a function or class of that name, or an
    assignment to it."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name == name
    if isinstance(node, ast.Assign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(isinstance(t, ast.Name) and t.id == name for t in targets)
    return False


def _top_level(tree: ast.Module, name: str) -> ast.AST | None:
    for node in tree.body:
        if _defines(node, name):
            return node
        if isinstance(node, ast.Import | ast.ImportFrom):
            if any((alias.asname or alias.name.split(".")[0]) == name for alias in node.names):
                return node
        elif isinstance(node, ast.Try | ast.If):
            inner = ast.Module(body=[*node.body, *getattr(node, "orelse", [])], type_ignores=[])
            found = _top_level(inner, name)
            if found is not None:
                return found
    return None


def _member(tree: ast.ClassDef, name: str) -> ast.AST | None:
    for node in tree.body:
        if _defines(node, name):
            return node
    for inner in ast.walk(tree):  # an attribute its methods set: self.name = ...
        if isinstance(inner, ast.Assign | ast.AnnAssign):
            assigned = inner.targets if isinstance(inner, ast.Assign) else [inner.target]
            for target in assigned:
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr == name
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                ):
                    return inner
    return None


def _imported_from(tree: ast.Module, module: str, name: str) -> str | None:
    """The module a top-level ``from X import name`` (relative or not) takes ``name`` from."""
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    if node.level:
                        parts = module.split(".")[: -node.level]
                        return ".".join([*parts, *([node.module] if node.module else [])])
                    return node.module
    return None


def _in_class(
    root: Path, module: str, cls: str, name: str, depth: int = 0
) -> tuple[str, int] | None:
    parsed = _module(root, module)
    if parsed is None or depth > 8:
        return None
    relative, tree = parsed
    node = _top_level(tree, cls)
    if isinstance(node, ast.ImportFrom):
        source = _imported_from(tree, module, cls)
        return _in_class(root, source, cls, name, depth + 1) if source else None
    if not isinstance(node, ast.ClassDef):
        return None
    member = _member(node, name)
    if member is not None:
        return relative, getattr(member, "lineno", node.lineno)
    if hasattr(object, name):
        return relative, node.lineno  # every class has it (``__getattribute__``): the class's own
    for base in node.bases:
        base_name = base.id if isinstance(base, ast.Name) else None
        if base_name is None:
            continue
        local = _top_level(tree, base_name)
        source = (
            module if isinstance(local, ast.ClassDef) else _imported_from(tree, module, base_name)
        )
        if source and source.split(".")[0] == PACKAGE:
            found = _in_class(root, source, base_name, name, depth + 1)
            if found is not None:
                return found
    return None


def find(root: Path, point: str) -> Found:
    """Where ``point`` (``verl.module.name`` or ``verl.module.Class.name``) is defined in the
    release's files at ``root``."""
    if point.split(".")[0] != PACKAGE:
        return Found(point, "third-party", "pinned by the environment's lock")
    parts = point.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:cut])
        parsed = _module(root, module)
        if parsed is None:
            continue
        relative, tree = parsed
        rest = parts[cut:]
        if len(rest) == 1:
            node = _top_level(tree, rest[0])
            if node is not None:
                return Found(point, f"{relative}:{getattr(node, 'lineno', 1)}")
            return Found(point, None, f"{module} defines no {rest[0]}")
        found = _in_class(root, module, rest[0], rest[-1]) if len(rest) == 2 else None
        if found is not None:
            return Found(point, f"{found[0]}:{found[1]}")
        return Found(point, None, f"{module}.{'.'.join(rest[:-1])} has no {rest[-1]}")
    return Found(point, None, "no such module")


def check(root: Path, points: tuple[str, ...]) -> Iterator[Found]:
    """Each patch point as found in the release's files at ``root``."""
    for point in points:
        yield find(root, point)
