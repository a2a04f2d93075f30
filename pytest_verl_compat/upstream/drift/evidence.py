"""Where a config key went between two releases, and the upstream evidence that says so.

A ``Move`` maps an old dotted key (or a subtree, with everything under it) to its successor.
Moves come only from evidence upstream gives, each kind one registered source:

- ``migration-function``: an upstream function that copies config keys (``config.a.b =
  config.c``), named in ``data/releases.yaml``, applied by the source release's entry point and
  not by the target's (so the target ignores the old key). Its assignments are read from the
  pinned verl's source file as a syntax tree, never run: loops over a literal list or over a
  node's keys, aliases, and the ``X is not None`` tests that guard a copy are followed, and each
  move cites the line of its assignment.
- ``deprecation-message``: a config dataclass of the pinned verl whose ``__post_init__`` warns
  "`old` is deprecated, use `new` instead" and copies ``self.new = self.old``; it moves ``old``
  to ``new`` in every node of the tree whose ``_target_`` is that class (or a subclass).
- ``moved-subtree``: a mapping of the source tree that is gone from the target tree, whose
  content (keys and resolved defaults, at least two leaves, one of them not null) is that of
  exactly one mapping new in the target tree.
- ``moved-mount``: a config file of both trees whose defaults list names the same config at
  another package (verl 0.8.0's ``critic/dp_critic.yaml`` mounts ``../engine@fsdp: fsdp`` where
  0.7.1's mounted ``../engine@model.fsdp_config: fsdp``), read from Hydra's own defaults list of
  each tree: Hydra composes the same file's keys at the new place, so every key under the old
  package is the same key under the new one. Cites the entry's line in both trees.

Nothing else is a successor: a key the target lacks without such evidence is reported as
removed, with the source tree's line that defined it.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_verl_compat.files.safe_input import InputError, read_text
from pytest_verl_compat.pipeline.defaults_mounts import Mount
from pytest_verl_compat.releases.index import Release, ReleaseIndex

WILDCARD = "*"
MIGRATION_FUNCTION = "migration-function"
DEPRECATION_MESSAGE = "deprecation-message"
MOVED_SUBTREE = "moved-subtree"
MOVED_MOUNT = "moved-mount"
# A subtree must hold this many leaves to count as moved: `{enable: false}` is everywhere.
MIN_SUBTREE_LEAVES = 2
_DEPRECATED = re.compile(r"`(?P<old>\w+)`[^`]*\bdeprecated\b[^`]*`(?P<new>\w+)`")

Path_ = tuple[str, ...]


@dataclass(frozen=True)
class Move:
    """``old`` (a key or a subtree) is ``new`` in the target release; ``evidence`` says why."""

    old: Path_
    new: Path_
    kind: str
    evidence: str
    # Keys that must be set (not null) in the source for the move to happen there (the `is not
    # None` tests guarding a copy); may hold the wildcard.
    requires: tuple[Path_, ...] = ()
    # The target release ignores `old` (it still has the key but never reads it).
    ignored_by_target: bool = False

    def _bind(self, parts: list[str]) -> list[str] | None:
        if len(parts) < len(self.old):
            return None
        bound = []
        for mine, theirs in zip(self.old, parts, strict=False):
            if mine == WILDCARD:
                bound.append(theirs)
            elif mine != theirs:
                return None
        return bound

    def successor(self, key: str) -> str | None:
        """The key ``key`` becomes, when this move covers it."""
        parts = key.split(".")
        bound = self._bind(parts)
        if bound is None:
            return None
        values = iter(bound)
        new = [next(values, WILDCARD) if part == WILDCARD else part for part in self.new]
        return ".".join(new + parts[len(self.old) :])

    def required_keys(self, key: str) -> list[str]:
        bound = self._bind(key.split(".")) or []
        keys = []
        for path in self.requires:
            values = iter(bound)
            keys.append(".".join(next(values, WILDCARD) if p == WILDCARD else p for p in path))
        return keys


@dataclass
class MoveContext:
    """What the move sources read: the two releases, their base trees and the pinned verl."""

    source: Release
    target: Release
    source_base: Mapping[str, Any]
    target_base: Mapping[str, Any]
    index: ReleaseIndex
    # The chosen release's `verl` package, unpacked from its pinned wheel and read as data: its
    # code is the evidence the function and deprecation sources read. None without it.
    verl_root: Path | None
    pinned: str
    notes: list[str] = field(default_factory=list)
    # Where each tree's defaults lists put its configs, for the launch's config-group selections
    # (Composer.config_mounts); empty where the caller did not ask Hydra.
    source_mounts: Sequence[Mount] = ()
    target_mounts: Sequence[Mount] = ()


MoveSource = Callable[[MoveContext], list[Move]]
MOVE_SOURCES: dict[str, MoveSource] = {}


def move_source(kind: str) -> Callable[[MoveSource], MoveSource]:
    def register(function: MoveSource) -> MoveSource:
        if kind in MOVE_SOURCES:
            raise ValueError(f"move source {kind!r} is registered twice")
        MOVE_SOURCES[kind] = function
        return function

    return register


def moves_between(context: MoveContext) -> list[Move]:
    """Every move with evidence, source by source in registration order."""
    return [move for source in MOVE_SOURCES.values() for move in source(context)]


def _dotted(path: Path_) -> str:
    return ".".join(path)


# --- migration functions: assignments read from the syntax tree ------------------------------


@dataclass(frozen=True)
class Assignment:
    """``config.<new> = config.<old>`` at ``line``, guarded by ``requires`` being set."""

    old: Path_
    new: Path_
    line: int
    requires: tuple[Path_, ...] = ()


class _FunctionReader:
    """Follows one function's statements, tracking what each name refers to in the config."""

    def __init__(self, parameter: str) -> None:
        self.parameter = parameter
        self.aliases: dict[str, Path_] = {}
        self.loop: dict[str, str] = {}
        self.found: list[Assignment] = []

    def path(self, node: ast.expr) -> Path_ | None:
        if isinstance(node, ast.Name):
            if node.id == self.parameter:
                return ()
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.path(node.value)
            return None if base is None else (*base, node.attr)
        if isinstance(node, ast.Subscript):
            base = self.path(node.value)
            key = self._key(node.slice)
            return None if base is None or key is None else (*base, key)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
        ):
            base = self.path(node.func.value)
            key = self._key(node.args[0])
            return None if base is None or key is None else (*base, key)
        return None

    def _key(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return self.loop.get(node.id)
        return None

    def _guard(self, test: ast.expr) -> Path_ | None:
        """The key an ``X is not None`` test requires, if that is the test."""
        if (
            isinstance(test, ast.Compare)
            and len(test.ops) == 1
            and isinstance(test.ops[0], ast.IsNot)
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value is None
        ):
            return self.path(test.left)
        return None

    def statements(self, body: Iterable[ast.stmt], guards: tuple[Path_, ...]) -> None:
        for stmt in body:
            self.statement(stmt, guards)

    def statement(self, stmt: ast.stmt, guards: tuple[Path_, ...]) -> None:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            new, old = self.path(stmt.targets[0]), self.path(stmt.value)
            if new is not None and old is not None:
                self.found.append(Assignment(old, new, stmt.lineno, guards))
            elif isinstance(stmt.targets[0], ast.Name) and old is not None:
                self.aliases[stmt.targets[0].id] = old
        elif isinstance(stmt, ast.If):
            guard = self._guard(stmt.test)
            self.statements(stmt.body, (*guards, guard) if guard is not None else guards)
            self.statements(stmt.orelse, guards)
        elif isinstance(stmt, ast.For) and isinstance(stmt.target, ast.Name):
            self._loop(stmt, stmt.target.id, guards)
        elif isinstance(stmt, ast.With):
            self.statements(stmt.body, guards)
        elif isinstance(stmt, ast.Try):
            self.statements(stmt.body, guards)

    def _loop(self, stmt: ast.For, name: str, guards: tuple[Path_, ...]) -> None:
        items = stmt.iter
        values: list[str] = []
        if isinstance(items, ast.List | ast.Tuple):
            values = [
                item.value
                for item in items.elts
                if isinstance(item, ast.Constant) and isinstance(item.value, str)
            ]
        elif (
            isinstance(items, ast.Call)
            and isinstance(items.func, ast.Attribute)
            and items.func.attr == "keys"
            and self.path(items.func.value) is not None
        ):
            values = [WILDCARD]
        for value in values:
            self.loop[name] = value
            self.statements(stmt.body, guards)
        self.loop.pop(name, None)


def function_assignments(source: str, function: str) -> list[Assignment]:
    """The key copies a function makes on its first parameter (a config), in order."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == function and node.args.args:
            reader = _FunctionReader(node.args.args[0].arg)
            reader.statements(node.body, ())
            return reader.found
    return []


@move_source(MIGRATION_FUNCTION)
def migration_function_moves(context: MoveContext) -> list[Move]:
    moves: list[Move] = []
    for function in context.index.migration_functions:
        applied = context.source.calls(function.function)
        if applied is None or context.target.calls(function.function) is not None:
            continue
        if context.verl_root is None:
            context.notes.append(
                f"{function.function} ({function.file}) is not read: the pinned verl "
                f"{context.pinned}'s files are not at hand (verl-compat release env {context.pinned})"
            )
            continue
        try:
            source = read_text(context.verl_root / function.file, what="upstream source file")
        except InputError as exc:
            context.notes.append(f"{function.function} is not read: {exc}")
            continue
        for assignment in function_assignments(source, function.function):
            moves.append(
                Move(
                    assignment.old,
                    assignment.new,
                    MIGRATION_FUNCTION,
                    f"{function.file}:{assignment.line} ({function.function}) copies "
                    f"`{_dotted(assignment.old)}` to `{_dotted(assignment.new)}`; verl "
                    f"{context.source.version}'s entry point applies it ({applied.file}:"
                    f"{applied.line} in its wheel), {context.target.version}'s does not, so "
                    f"{context.target.version} ignores `{_dotted(assignment.old)}`",
                    assignment.requires,
                    ignored_by_target=True,
                )
            )
    return moves


# --- deprecation messages of config dataclasses ------------------------------------------------


@dataclass(frozen=True)
class Rename:
    """A dataclass field that ``__post_init__`` says is deprecated and copies into another."""

    old: str
    new: str
    file: str
    line: int
    message: str
    owner: str


def _targets(node: Any, prefix: Path_ = ()) -> Iterator[tuple[Path_, str]]:
    if isinstance(node, Mapping):
        target = node.get("_target_")
        if isinstance(target, str):
            yield prefix, target
        for key, value in node.items():
            yield from _targets(value, (*prefix, str(key)))


def _module_files(verl_root: Path, module: str) -> list[Path]:
    base = verl_root.joinpath(*module.split("."))
    if base.with_suffix(".py").is_file():
        return [base.with_suffix(".py")]
    if base.is_dir():
        return sorted(base.glob("*.py"))
    return []


def _classes(files: Iterable[Path], verl_root: Path) -> dict[str, tuple[ast.ClassDef, str]]:
    classes: dict[str, tuple[ast.ClassDef, str]] = {}
    for file in files:
        try:
            tree = ast.parse(read_text(file, what="upstream source file"))
        except (InputError, SyntaxError, ValueError):
            continue
        relative = file.relative_to(verl_root).as_posix()
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, (node, relative))
    return classes


def _renames_of(cls: ast.ClassDef, file: str) -> list[Rename]:
    renames = []
    for node in cls.body:
        if not (isinstance(node, ast.FunctionDef) and node.name == "__post_init__"):
            continue
        copies = {
            (stmt.value.attr, stmt.targets[0].attr)
            for stmt in ast.walk(node)
            if isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Attribute)
            and isinstance(stmt.value, ast.Attribute)
            and isinstance(stmt.value.value, ast.Name)
            and stmt.value.value.id == "self"
        }
        for constant in ast.walk(node):
            if not (isinstance(constant, ast.Constant) and isinstance(constant.value, str)):
                continue
            match = _DEPRECATED.search(constant.value)
            if match and (match["old"], match["new"]) in copies:
                renames.append(
                    Rename(
                        match["old"], match["new"], file, constant.lineno, constant.value, cls.name
                    )
                )
    return renames


@functools.lru_cache(maxsize=64)
def _module_classes(verl_root: Path, module: str) -> dict[str, tuple[ast.ClassDef, str]]:
    # Parsed once per process: every script of a corpus asks for the same few config classes.
    return _classes(_module_files(verl_root, module), verl_root)


def deprecated_renames(verl_root: Path, target: str) -> list[Rename]:
    """The renames the class a ``_target_`` names (and its base classes) declare."""
    module, _, name = target.rpartition(".")
    classes = _module_classes(verl_root, module)
    renames: list[Rename] = []
    pending, seen = [name], set()
    while pending:
        current = pending.pop(0)
        if current in seen or current not in classes:
            continue
        seen.add(current)
        cls, file = classes[current]
        renames += _renames_of(cls, file)
        pending += [base.id for base in cls.bases if isinstance(base, ast.Name)]
    return renames


@move_source(DEPRECATION_MESSAGE)
def deprecation_moves(context: MoveContext) -> list[Move]:
    # The pinned verl's code speaks for the pinned release only.
    if context.verl_root is None or context.target.version != context.pinned:
        return []
    cache: dict[str, list[Rename]] = {}
    moves = []
    for path, target in _targets(context.target_base):
        if target not in cache:
            cache[target] = deprecated_renames(context.verl_root, target)
        for rename in cache[target]:
            moves.append(
                Move(
                    (*path, rename.old),
                    (*path, rename.new),
                    DEPRECATION_MESSAGE,
                    f"{rename.file}:{rename.line} ({rename.owner}.__post_init__, the class of "
                    f'`{_dotted(path) or "<root>"}._target_`): "{rename.message}", and it '
                    f"copies {rename.old} into {rename.new}",
                )
            )
    return moves


# --- subtrees with equal defaults --------------------------------------------------------------


def _subtrees(node: Any, prefix: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    if isinstance(node, Mapping):
        if prefix:
            yield prefix, node
        for key, value in node.items():
            yield from _subtrees(value, (*prefix, str(key)))


def _leaf_count(node: Any) -> int:
    if isinstance(node, Mapping) and node:
        return sum(_leaf_count(value) for value in node.values())
    return 1


def _informative(node: Any) -> bool:
    """Whether a subtree has a default that says something (all-null ones match by accident)."""
    if isinstance(node, Mapping):
        return any(_informative(value) for value in node.values())
    return node not in (None, "", [], {})


def _has_path(node: Any, path: Path_) -> bool:
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


@move_source(MOVED_SUBTREE)
def subtree_moves(context: MoveContext) -> list[Move]:
    def by_content(tree: Mapping[str, Any], other: Mapping[str, Any]) -> dict[str, list[Path_]]:
        found: dict[str, list[Path_]] = {}
        for path, node in _subtrees(tree):
            if (
                not _has_path(other, path)
                and _leaf_count(node) >= MIN_SUBTREE_LEAVES
                and _informative(node)
            ):
                found.setdefault(json.dumps(node, sort_keys=True), []).append(path)
        return found

    gone = by_content(context.source_base, context.target_base)
    new = by_content(context.target_base, context.source_base)
    moves = []
    source, target = context.source.version, context.target.version
    for content, old_paths in sorted(gone.items()):
        new_paths = new.get(content, [])
        if len(old_paths) != 1 or len(new_paths) != 1:
            continue
        old, successor = old_paths[0], new_paths[0]
        moves.append(
            Move(
                old,
                successor,
                MOVED_SUBTREE,
                f"`{_dotted(old)}` of verl {source}'s tree is gone from {target}'s, and "
                f"`{_dotted(successor)}`, new in {target}'s, has its keys and defaults "
                f"({_leaf_count(json.loads(content))} leaves); no other subtree of either tree has them",
            )
        )
    # A moved parent moves its children: keep the outermost move only.
    return [
        move
        for move in moves
        if not any(other is not move and move.old[: len(other.old)] == other.old for other in moves)
    ]


# --- a config mounted at another package ---------------------------------------------------------


def _cited(mount: Mount, config_dir: str, version: str) -> str:
    if mount.line is None:
        return f"verl {version}'s `{mount.parent}`"
    return f"{config_dir}/{mount.parent}.yaml:{mount.line}@{version}"


@move_source(MOVED_MOUNT)
def mount_moves(context: MoveContext) -> list[Move]:
    targets = {(mount.parent, mount.config): mount for mount in context.target_mounts}
    moves = []
    source, target = context.source.version, context.target.version
    for mount in context.source_mounts:
        now = targets.get((mount.parent, mount.config))
        if now is None or now.package == mount.package or not (mount.package and now.package):
            continue
        old, new = tuple(mount.package.split(".")), tuple(now.package.split("."))
        if not (
            _has_path(context.source_base, old)
            and not _has_path(context.target_base, old)
            and _has_path(context.target_base, new)
        ):
            continue
        moves.append(
            Move(
                old,
                new,
                MOVED_MOUNT,
                f"`{mount.parent}` mounts `{mount.config}` at `{mount.package}` in verl {source} "
                f"({_cited(mount, context.index.config_dir, source)}) and at `{now.package}` in "
                f"{target} ({_cited(now, context.index.config_dir, target)}): Hydra composes the "
                "same file's keys at the new place",
            )
        )
    return moves
