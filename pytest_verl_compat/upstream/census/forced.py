"""Values a config class forces: a ``__post_init__`` that overwrites a field the user may set.

verl builds each section of its tree as a config dataclass, and some of their ``__post_init__``
overwrite one of their own fields under a condition on others: ``McoreEngineConfig`` sets
``sequence_parallel = False`` when ``tensor_model_parallel_size == 1``
(verl/workers/config/engine.py:237-239), whatever the script says. Every code that reads the
field on the dataclass then reads the forced value: the user's has no effect.

``scan`` finds, in every class of the package, the assignments ``self.<field> = <value>`` (or
``object.__setattr__(self, "<field>", <value>)``) of its ``__post_init__`` whose value does not
read the field itself (a constant, or other fields), with the ``if`` tests around them; and for
each section the trees build as that class or a subclass (whose own ``__post_init__``, if any,
calls ``super().__post_init__()``), the leaf's forced values with their guards in the off-path
index's normal form, resolved on that section.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_verl_compat.upstream.census import normal_form, static_reads
from pytest_verl_compat.upstream.census.call_binding import attribute_chain
from pytest_verl_compat.upstream.probes import statements

POST_INIT = "__post_init__"
# Names a forced value may use besides ``self``'s fields.
_CONSTANT_NAMES = frozenset({"True", "False", "None"})


@dataclass(frozen=True)
class _Assignment:
    cls: str
    field: str
    where: str
    function: str
    guard: str
    value: str


def _assigned_field(node: ast.AST) -> tuple[str, ast.expr] | None:
    """(field, value) of ``self.f = v``, ``object.__setattr__(self, "f", v)`` or
    ``setattr(self, "f", v)``."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        chain = attribute_chain(node.targets[0])
        if chain is not None and len(chain) == 2 and chain[0] == "self":
            return chain[1], node.value
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        call = node.value
        name = attribute_chain(call.func)
        if (
            name in (["object", "__setattr__"], ["setattr"])
            and len(call.args) == 3
            and attribute_chain(call.args[0]) == ["self"]
            and isinstance(call.args[1], ast.Constant)
            and isinstance(call.args[1].value, str)
        ):
            return call.args[1].value, call.args[2]
    return None


def _independent(value: ast.expr, field_name: str) -> bool:
    """A value that is not the user's own: no read of the field itself, no local (only
    constants and other fields of ``self``)."""
    for node in ast.walk(value):
        if isinstance(node, ast.Attribute):
            chain = attribute_chain(node)
            if chain is not None and chain[:2] == ["self", field_name]:
                return False
        if isinstance(node, ast.Name) and node.id not in _CONSTANT_NAMES and node.id != "self":
            return False
        if isinstance(node, ast.Call | ast.Lambda | ast.NamedExpr):
            return False
    return True


def _calls_super(function: ast.AST) -> bool:
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == POST_INIT
        and isinstance(node.func.value, ast.Call)
        and attribute_chain(node.func.value.func) == ["super"]
        for node in ast.walk(function)
    )


def _classes(
    sources: list[statements.Source],
) -> tuple[list[_Assignment], dict[str, bool | None]]:
    """The forced assignments of every class's ``__post_init__``, and for each class whether its
    own ``__post_init__`` calls its base's (None: it has none)."""
    assignments: list[_Assignment] = []
    chains: dict[str, bool | None] = {}
    for source in sources:
        for node in source.nodes:
            if not isinstance(node, ast.ClassDef):
                continue
            post_init = next(
                (
                    item
                    for item in node.body
                    if isinstance(item, ast.FunctionDef) and item.name == POST_INIT
                ),
                None,
            )
            chains[node.name] = None if post_init is None else _calls_super(post_init)
            if post_init is None:
                continue
            for statement in ast.walk(post_init):
                if not isinstance(statement, ast.stmt):
                    continue
                found = _assigned_field(statement)
                if found is None or not _independent(found[1], found[0]):
                    continue
                if source.function(statement) is not post_init:
                    continue  # a nested function's, run who knows when
                assignments.append(
                    _Assignment(
                        node.name,
                        found[0],
                        f"{source.relative}:{statement.lineno}",
                        source.qualname(statement),
                        static_reads.guard(source, statement),
                        ast.unparse(found[1]),
                    )
                )
    return assignments, chains


def _runs_for(
    built: str, owner: str, lineage: Callable[[str], set[str]], chains: Mapping[str, bool | None]
) -> bool:
    """Whether ``owner.__post_init__`` runs when ``built`` is constructed: ``owner`` is in its
    lineage and every class between them that has a ``__post_init__`` calls its base's (by
    name; a class with several bases is not followed)."""
    if built == owner:
        return True
    if owner not in lineage(built):
        return False
    # Walk down the single-base chain from ``built`` to ``owner``.
    current = built
    seen: set[str] = set()
    while current != owner and current not in seen:
        seen.add(current)
        if chains.get(current) is False:
            return False
        parents = [p for p in lineage(current) - {current} if owner in lineage(p)]
        direct = [p for p in parents if not any(p in lineage(q) - {q} for q in parents)]
        if len(direct) != 1:
            return False
        current = direct[0]
    return current == owner


def scan(
    verl_parent: Path,
    sources: list[statements.Source],
    named: Mapping[str, Any],
    classes_of: Mapping[str, set[str]],
    copied: Callable[[str], str | None],
    lineage: Callable[[str], set[str]],
) -> dict[str, list[dict[str, Any]]]:
    """Leaf → the values forced on it (``where``, ``guard`` conjuncts in normal form on the
    leaf's section, ``open``: conjuncts no leaf decides, ``value``)."""
    assignments, chains = _classes(sources)
    out: dict[str, list[dict[str, Any]]] = {}
    for section, built in sorted(classes_of.items()):
        for assignment in assignments:
            leaf = f"{section}.{assignment.field}"
            if leaf not in named or isinstance(named[leaf], Mapping):
                continue
            if not any(_runs_for(cls, assignment.cls, lineage, chains) for cls in built):
                continue
            place = static_reads.Place(
                assignment.where, assignment.function, "self", assignment.guard, "static"
            )
            expander = normal_form.Expander(verl_parent, assignment.where)
            resolve = normal_form.resolver(place, section, named, copied, expander)
            guard, opened = normal_form.normalise(assignment.guard, resolve)
            found: dict[str, Any] = {"where": assignment.where, "guard": guard}
            if opened:
                found["open"] = opened
            found["value"] = assignment.value
            out.setdefault(leaf, []).append(found)
    return out
