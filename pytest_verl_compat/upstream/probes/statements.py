"""Upstream's statements, from its installed source (ast): which lines decide a raise or an assert.

Used in the oracle process to name the configuration keys behind a failure (the keys read on the
lines of the failing statement and of the assignments it depends on) and by the census, which
lists every such statement. Reading source is data only: nothing here imports verl.
"""

from __future__ import annotations

import ast
import collections
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# How far the def-use walk follows assignments back (a name assigned from a name assigned from …).
MAX_DEPTH = 4
# ``deciding_lines`` lists the statement, then its guard (if any), then the assignments; the first
# two are the statement's own lines.
OWN_RANGES = 2

# More than the installed package's files (362 in verl 0.9.0): the census and the off-path scan
# each go through every file in turn, which evicted every entry of a smaller cache before it was
# asked again.
_PARSED_FILES = 2048


@dataclass(frozen=True, eq=False)
class Source:
    """One parsed upstream file: its tree, and each node's parent."""

    relative: str
    tree: ast.Module
    lines: list[str]

    @functools.cached_property
    def parents(self) -> dict[int, ast.AST]:
        """Each node's parent by id, from one walk made when first asked: most of a parse's
        time, which the scans that only walk the tree (``effects``) never need."""
        return {
            id(child): node for node in ast.walk(self.tree) for child in ast.iter_child_nodes(node)
        }

    @functools.cached_property
    def nodes(self) -> list[ast.AST]:
        """Every node of the file in ``ast.walk``'s order, walked once: the census's scans go
        through each file many times (the call-site index alone, once per round)."""
        return list(ast.walk(self.tree))

    # ``walk``'s and ``own_nodes``' lists by the node's id, kept for the next walk of the node.
    _walks: dict[int, list[ast.AST]] = field(default_factory=dict, init=False, repr=False)
    _own: dict[int, list[ast.AST]] = field(default_factory=dict, init=False, repr=False)

    def walk(self, node: ast.AST) -> list[ast.AST]:
        """``ast.walk(node)`` of a node of this file, as a list kept for the next walk."""
        found = self._walks.get(id(node))
        if found is None:
            found = self._walks[id(node)] = list(ast.walk(node))
        return found

    def own_nodes(self, function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.AST]:
        """The nodes of ``function`` whose innermost function is ``function`` (what
        ``self.function(node) is function`` keeps of its walk), in the walk's order: a nested
        function's own node, not what is inside it."""
        found = self._own.get(id(function))
        if found is None:
            found = []
            todo = collections.deque(ast.iter_child_nodes(function))
            while todo:
                node = todo.popleft()
                found.append(node)
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    todo.extend(ast.iter_child_nodes(node))
            self._own[id(function)] = found
        return found

    def parent(self, node: ast.AST) -> ast.AST | None:
        return self.parents.get(id(node))

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        current = self.parent(node)
        while current is not None:
            yield current
            current = self.parent(current)

    def function(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, ast.FunctionDef | ast.AsyncFunctionDef):
                return ancestor
        return None

    def qualname(self, node: ast.AST) -> str:
        names = [
            a.name
            for a in self.ancestors(node)
            if isinstance(a, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        ]
        return ".".join(reversed(names))

    def statement_at(self, line: int) -> ast.stmt | None:
        """The innermost statement whose lines hold ``line``."""
        return _statement_at(self, line)


def _statement_at(source: Source, line: int) -> ast.stmt | None:
    return _innermost_statements(source).get(line)


@functools.lru_cache(maxsize=_PARSED_FILES)
def _innermost_statements(source: Source) -> dict[int, ast.stmt]:
    """Each line's innermost statement, from one walk of the file (a walk per line asked took
    most of the census's time): the shortest span holding the line, the last met in the walk's
    breadth-first order among equals."""
    best: dict[int, ast.stmt] = {}
    for node in ast.walk(source.tree):
        if not isinstance(node, ast.stmt):
            continue
        start, end = _lines(node)
        span = end - start
        for line in range(start, end + 1):
            held = best.get(line)
            if held is None or span <= _span(held):
                best[line] = node
    return best


def _lines(node: ast.AST) -> tuple[int, int]:
    start = getattr(node, "lineno", 0)
    return start, getattr(node, "end_lineno", None) or start


def _span(node: ast.AST) -> int:
    start, end = _lines(node)
    return end - start


@functools.lru_cache(maxsize=_PARSED_FILES)
def parse(path: str, relative: str) -> Source | None:
    """The parsed file, or None when it cannot be read or parsed."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, SyntaxError, ValueError):
        return None
    return Source(relative, tree, text.splitlines())


def guard(source: Source, statement: ast.stmt) -> ast.expr | None:
    """The condition that decides a raise or an assert: the assert's test, the ``if`` test a raise
    sits under, or None (an unconditional raise, an ``except`` re-raise)."""
    if isinstance(statement, ast.Assert):
        return statement.test
    node: ast.AST = statement
    for ancestor in source.ancestors(statement):
        if isinstance(ancestor, ast.If) and node in ancestor.body + ancestor.orelse:
            return ancestor.test
        if isinstance(ancestor, ast.FunctionDef | ast.AsyncFunctionDef | ast.ExceptHandler):
            return None
        node = ancestor
    return None


def _enclosing_if(source: Source, statement: ast.stmt) -> ast.expr | None:
    """The test of the nearest ``if`` whose body holds ``statement``, within its function."""
    node: ast.AST = statement
    for ancestor in source.ancestors(statement):
        if isinstance(ancestor, ast.If) and node in ancestor.body + ancestor.orelse:
            return ancestor.test
        if isinstance(ancestor, ast.FunctionDef | ast.AsyncFunctionDef):
            return None
        node = ancestor
    return None


def deciding_lines(source: Source, line: int) -> list[tuple[int, int]]:
    """Line ranges whose configuration reads decide the statement at ``line``: the statement, its
    guard, and the assignments (in the same function, before it) of every name they use."""
    statement = source.statement_at(line)
    if statement is None:
        return [(line, line)]
    # A raise's guard is the ``if`` it sits under; an assert's, the ``if`` around it (the assert
    # is met only when that test holds: ``if do_sample: assert temperature > 0``).
    condition = (
        _enclosing_if(source, statement)
        if isinstance(statement, ast.Assert)
        else guard(source, statement)
    )
    roots: list[ast.AST] = [statement]
    # The statement's own lines first, then its guard's (the statement again when it has none).
    ranges = [_lines(statement), _lines(statement)]
    if condition is not None:
        ranges[1] = _lines(condition)
        roots.append(condition)
    function = source.function(statement)
    if function is None:
        return ranges
    seen: set[str] = set()
    names = {n for root in roots for n in _loaded_names(root)}
    for _ in range(MAX_DEPTH):
        fresh = names - seen
        if not fresh:
            break
        seen |= fresh
        names = set()
        for assignment in _assignments(function, fresh, _lines(statement)[0]):
            ranges.append(_lines(assignment))
            names |= _loaded_names(assignment)
    return ranges


def _dotted(node: ast.AST) -> str | None:
    """``self.config.actor`` for an attribute chain on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _loaded_names(node: ast.AST) -> set[str]:
    """Plain names and every prefix of each attribute chain read (``self.a.b`` gives ``self.a``
    and ``self.a.b``; ``self`` alone is not a dependency: it is never assigned)."""
    found = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            found.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load):
            chain = _dotted(n)
            if chain is not None:
                parts = chain.split(".")
                found.update(".".join(parts[:i]) for i in range(2, len(parts) + 1))
    return found - {"self"}


def _target_names(target: ast.expr) -> set[str]:
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, ast.Attribute):
        chain = _dotted(target)
        return {chain} if chain is not None else set()
    if isinstance(target, ast.Tuple | ast.List):
        return {name for element in target.elts for name in _target_names(element)}
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    return set()


def _targets(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.Assign):
        targets: list[ast.expr] = list(node.targets)
    elif isinstance(node, ast.AnnAssign | ast.AugAssign):
        targets = [node.target]
    elif isinstance(node, ast.For | ast.AsyncFor):
        targets = [node.target]
    elif isinstance(node, ast.With | ast.AsyncWith):
        targets = [item.optional_vars for item in node.items if item.optional_vars is not None]
    else:
        return set()
    return {name for target in targets for name in _target_names(target)}


def _assignments(function: ast.AST, names: set[str], before: int) -> list[ast.AST]:
    found: list[ast.AST] = []
    for node in ast.walk(function):
        if not (isinstance(node, ast.stmt) and _lines(node)[0] < before and _targets(node) & names):
            continue
        # A loop's or a with's header binds the name; its body is not the assignment.
        if isinstance(node, ast.For | ast.AsyncFor):
            found.append(node.iter)
        elif isinstance(node, ast.With | ast.AsyncWith):
            found.extend(item.context_expr for item in node.items)
        else:
            found.append(node)
    return found


def text(source: Source, ranges: list[tuple[int, int]]) -> str:
    """The source text of the given line ranges (each line once, in order)."""
    return "\n".join(
        source.lines[n - 1]
        for n in sorted({n for lo, hi in ranges for n in range(lo, hi + 1)})
        if 0 < n <= len(source.lines)
    )
