"""Guards in the off-path index's normal form: each name the configuration decides as ``L['leaf']``.

A place's guard (the ``if`` tests around it) is source text of its function. Each name in it is
resolved to a leaf of the trees (or a section, which a guard may test for ``None`` or for a key),
as ``explain`` resolves it: through the place's object (``self.engine_config.x`` on the engine's
section), the tree's root (``config.a.b``), a local the function assigns once from such a chain
(``filter_groups = self.config.algorithm.get("filter_groups")``), or an attribute of ``self`` its
class assigns once from one (``self.trainer_mode = self.config.trainer.v1.trainer_mode``,
verl/trainer/ppo/v1/trainer_base.py:133). Whatever the configuration does not decide (a call, a
leaf verl assigns to before it tests it) is ``UNKNOWN``, so a conjunct that holds or fails is
decided by the configuration alone.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pytest_verl_compat.upstream.census import static_reads
from pytest_verl_compat.upstream.census.call_binding import attribute_chain
from pytest_verl_compat.upstream.probes import statements

LEAF = "L"
UNKNOWN = "UNKNOWN"
# How many assignments a name is followed back through.
DEPTH = 3
# A call whose result is the section it is given, converted to its dataclass
# (``omega_conf_to_dataclass``, verl/utils/config.py): a field read on it is the section's.
CONVERTERS = frozenset({"omega_conf_to_dataclass"})
Resolve = Callable[[list[str]], "str | None"]
# The leaf whose value a leaf holds when verl reads it, or None when verl assigns it.
Copied = Callable[[str], "str | None"]


class Normaliser(ast.NodeTransformer):
    """A guard's test with each name the configuration decides as ``L['leaf']``, the rest
    ``UNKNOWN``; only constants, containers, ``not``, ``and``/``or`` and one comparison stay
    (``bool(x)`` is ``not not x``; ``x.get("k", d)`` reads ``x.k``)."""

    def __init__(self, resolve: Resolve) -> None:
        self.resolve = resolve
        self.leaves: set[str] = set()

    def _unknown(self) -> ast.expr:
        return ast.Name(UNKNOWN, ast.Load())

    def _leaf(self, chain: list[str] | None) -> ast.expr:
        leaf = self.resolve(chain) if chain else None
        if leaf is None:
            return self._unknown()
        self.leaves.add(leaf)
        return ast.Subscript(ast.Name(LEAF, ast.Load()), ast.Constant(leaf), ast.Load())

    def generic_visit(self, node: ast.AST) -> ast.AST:
        if isinstance(node, ast.Constant):
            return node
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            return type(node)(elts=[self.visit(e) for e in node.elts], ctx=ast.Load())  # type: ignore[call-arg]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return ast.UnaryOp(ast.Not(), self.visit(node.operand))
        if isinstance(node, ast.BoolOp):
            return ast.BoolOp(node.op, [self.visit(v) for v in node.values])
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            return ast.Compare(self.visit(node.left), node.ops, [self.visit(node.comparators[0])])
        if isinstance(node, ast.Attribute | ast.Name | ast.Subscript):
            return self._leaf(static_reads.key_chain(node))
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == "bool" and len(node.args) == 1:
                return ast.UnaryOp(ast.Not(), ast.UnaryOp(ast.Not(), self.visit(node.args[0])))
            chain = static_reads.key_chain(node)
            if chain is not None:
                return self._leaf(chain)
        return self._unknown()


def normalise(text: str, resolve: Resolve) -> tuple[list[str], int]:
    """The conjuncts of a guard's text (`` ∧ ``-joined tests) in normal form, those that name a
    leaf, and how many name none (always undecided)."""
    out, opened = [], 0
    for part in filter(None, text.split(" ∧ ")):
        try:
            tree = ast.parse(part, mode="eval")
        except SyntaxError:
            opened += 1
            continue
        normaliser = Normaliser(resolve)
        body = normaliser.visit(tree.body)
        if normaliser.leaves:
            out.append(ast.unparse(body))
        else:
            opened += 1
    return out, opened


# --- what a name of a function stands for --------------------------------------------------------


def assigned_once(function: ast.AST, name: str) -> ast.expr | None:
    """The value of the one plain assignment of ``name`` in ``function`` (a name assigned in any
    other way, or more than once, has none)."""
    values = []
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            if len(node.targets) != 1:
                return None
            values.append(node.value)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.For | ast.With) and any(
            isinstance(t, ast.Name) and t.id == name
            for t in ast.walk(node)
            if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)
        ):
            return None
    return values[0] if len(values) == 1 else None


@functools.lru_cache(maxsize=256)
def _self_attributes(path: str, relative: str, cls: str) -> dict[str, ast.expr]:
    """``self.x`` → its value, for each attribute a class assigns exactly once (in any method)."""
    source = statements.parse(path, relative)
    if source is None:
        return {}
    node = next(
        (n for n in source.tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None
    )
    if node is None:
        return {}
    found: dict[str, list[ast.expr]] = {}
    for inner in ast.walk(node):
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(inner, ast.Assign):
            targets, value = inner.targets, inner.value
        elif isinstance(inner, ast.AnnAssign | ast.AugAssign):
            targets, value = [inner.target], None
        for target in targets:
            chain = attribute_chain(target)
            if chain is not None and len(chain) == 2 and chain[0] == "self":
                found.setdefault(chain[1], []).append(value if len(targets) == 1 else None)  # type: ignore[arg-type]
    return {
        name: values[0]
        for name, values in found.items()
        if len(values) == 1 and values[0] is not None
    }


class Expander:
    """Names of one function as the chains they stand for: a local assigned once, ``self.x`` its
    class assigns once, through a converter call (``omega_conf_to_dataclass(section)``)."""

    def __init__(self, verl_parent: Path, where: str) -> None:
        relative, _, line = where.rpartition(":")
        self.path, self.relative = str(verl_parent / relative), relative
        source = statements.parse(self.path, relative)
        statement = source.statement_at(int(line)) if source and line.isdigit() else None
        self.function = source.function(statement) if source and statement else None
        owner = (
            next((a for a in source.ancestors(statement) if isinstance(a, ast.ClassDef)), None)
            if source and statement
            else None
        )
        self.cls = owner.name if owner is not None else ""

    def chain(self, node: ast.AST, depth: int = DEPTH) -> list[str] | None:
        if (
            isinstance(node, ast.Call)
            and (attribute_chain(node.func) or [""])[-1] in CONVERTERS
            and len(node.args) == 1
        ):
            node = node.args[0]
        found = static_reads.key_chain(node)
        if not found:
            return None
        return self.expand(found, depth)

    def expand(self, chain: list[str], depth: int = DEPTH) -> list[str]:
        """The chain with its head replaced by what it was assigned from, where that is known."""
        if depth <= 0:
            return chain
        value: ast.expr | None = None
        rest = chain[1:]
        if chain[0] == "self" and len(chain) > 2 and self.cls:
            value = _self_attributes(self.path, self.relative, self.cls).get(chain[1])
            rest = chain[2:]
        elif (
            chain[0] != "self"
            and self.function is not None
            and not _is_param(self.function, chain[0])
        ):
            value = assigned_once(self.function, chain[0])
        if value is None:
            return chain
        head = self.chain(value, depth - 1)
        return [*head, *rest] if head else chain


def _is_param(function: ast.AST, name: str) -> bool:
    args = getattr(function, "args", None)
    if args is None:
        return False
    return name in {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}


def resolver(
    place: static_reads.Place,
    section: str,
    known: Mapping[str, Any],
    copied: Copied,
    expander: Expander | None = None,
) -> Resolve:
    """The leaf (or section) a name of the place's guard reads, or None when the configuration
    does not decide it: through the place's object, the tree's root, or what the name was
    assigned from (``expander``); ``copied`` maps a leaf to the one whose value it holds when
    verl reads it (or None: verl assigns it)."""
    holder = place.holder.split(".") if place.holder else []
    parts = section.split(".") if section else []
    # ``self.config.trainer`` holds ``trainer``: ``self.config`` is the section above it (here the
    # root), so ``self.config.algorithm.x`` in the same guard is ``algorithm.x``.
    shared = 0
    while shared < min(len(holder) - 1, len(parts)) and holder[-1 - shared] == parts[-1 - shared]:
        shared += 1
    above, above_path = holder[: len(holder) - shared], parts[: len(parts) - shared]

    def direct(chain: list[str]) -> str | None:
        path = None
        if holder and chain[: len(holder)] == holder and len(chain) > len(holder):
            rest = chain[len(holder) :]
            path = ".".join([section, *rest]) if section else ".".join(rest)
        elif shared and chain[: len(above)] == above and len(chain) > len(above):
            path = ".".join([*above_path, *chain[len(above) :]])
        elif chain[0] in ("config", "cfg") and len(chain) > 1:
            path = ".".join(chain[1:])
        elif chain[:2] == ["self", "config"] and len(chain) > 2 and not holder:
            path = ".".join(chain[2:])
        if path is None or path not in known:
            return None
        return copied(path)

    def resolve(chain: list[str]) -> str | None:
        found = direct(chain)
        if found is None and expander is not None:
            expanded = expander.expand(chain)
            if expanded != chain:
                found = direct(expanded)
        return found

    return resolve
