"""``verl-compat explain KEY [SCRIPT]``: where verl reads a key, and whether it acts in a script.

Where: the read census's places for the leaf (``read_census``). Whether it acts in one script's
configuration: the probes' own reads on that configuration first (a traced read of the key is a
read on the selected path); otherwise each static place's guard (the ``if`` tests around it) is
evaluated on the script's resolved values, where every name in it resolves to a leaf:

- ``acts``: the probes read the key on this configuration;
- ``no effect``: no traced read, and every static place's guard is false here;
- ``undecided``: a place whose guard holds or cannot be evaluated, on a path the probes do not run.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_verl_compat.upstream.read_census import LeafReads, Place

ACTS = "acts"
NO_EFFECT = "no effect"
UNDECIDED = "undecided"
_UNKNOWN: Any = object()


@dataclass(frozen=True)
class Judged:
    """One static place on this configuration: its guard's value and the leaves it read."""

    place: Place
    holds: bool | None  # None: not evaluated
    because: tuple[tuple[str, Any], ...]  # (leaf, value) the guard read


def _leaf_of(chain: list[str], place: Place, section: str, leaves: Mapping[str, Any]) -> str | None:
    """The leaf a name of a guard reads: on the place's own object, the key's section; on the
    tree's root (``config.a.b``), that path."""
    holder = place.holder.split(".") if place.holder else []
    if holder and chain[: len(holder)] == holder and len(chain) > len(holder):
        path = ".".join([section, *chain[len(holder) :]]) if section else ".".join(chain[1:])
        return path if path in leaves else None
    if chain[0] in ("config", "cfg") and len(chain) > 1:
        path = ".".join(chain[1:])
        return path if path in leaves else None
    return None


def _chain(node: ast.AST) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


class _Evaluator:
    def __init__(self, place: Place, section: str, leaves: Mapping[str, Any]) -> None:
        self.place, self.section, self.leaves = place, section, leaves
        self.read: dict[str, Any] = {}

    def value(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            items = [self.value(e) for e in node.elts]
            return _UNKNOWN if any(i is _UNKNOWN for i in items) else items
        if isinstance(node, ast.Attribute | ast.Name):
            chain = _chain(node)
            leaf = _leaf_of(chain, self.place, self.section, self.leaves) if chain else None
            if leaf is None:
                return _UNKNOWN
            self.read[leaf] = self.leaves[leaf]
            return self.leaves[leaf]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            inner = self.value(node.operand)
            return _UNKNOWN if inner is _UNKNOWN else not inner
        if isinstance(node, ast.BoolOp):
            values = [self.value(v) for v in node.values]
            if isinstance(node.op, ast.And):
                if any(v is not _UNKNOWN and not v for v in values):
                    return False
                return _UNKNOWN if any(v is _UNKNOWN for v in values) else True
            if any(v is not _UNKNOWN and v for v in values):
                return True
            return _UNKNOWN if any(v is _UNKNOWN for v in values) else False
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, right = self.value(node.left), self.value(node.comparators[0])
            if left is _UNKNOWN or right is _UNKNOWN:
                return _UNKNOWN
            return _compare(node.ops[0], left, right)
        return _UNKNOWN


def _compare(op: ast.cmpop, left: Any, right: Any) -> Any:
    try:
        if isinstance(op, ast.Eq):
            return left == right
        if isinstance(op, ast.NotEq):
            return left != right
        if isinstance(op, ast.Is):
            return left is right
        if isinstance(op, ast.IsNot):
            return left is not right
        if isinstance(op, ast.In):
            return left in right
        if isinstance(op, ast.NotIn):
            return left not in right
        if isinstance(op, ast.Gt):
            return left > right
        if isinstance(op, ast.GtE):
            return left >= right
        if isinstance(op, ast.Lt):
            return left < right
        if isinstance(op, ast.LtE):
            return left <= right
    except TypeError:
        return _UNKNOWN
    return _UNKNOWN


def judge(place: Place, section: str, leaves: Mapping[str, Any]) -> Judged:
    """The place's guard on these leaves (a guard of several tests holds when all hold)."""
    if not place.guard:
        return Judged(place, None, ())
    evaluator = _Evaluator(place, section, leaves)
    results = []
    for part in place.guard.split(" ∧ "):
        try:
            tree = ast.parse(part, mode="eval")
        except SyntaxError:
            results.append(_UNKNOWN)
            continue
        results.append(evaluator.value(tree.body))
    because = tuple(sorted(evaluator.read.items()))
    if any(r is not _UNKNOWN and not r for r in results):
        return Judged(place, False, because)
    if any(r is _UNKNOWN for r in results):
        return Judged(place, None, because)
    return Judged(place, True, because)


@dataclass(frozen=True)
class Explanation:
    verdict: str
    traced: tuple[str, ...]  # ``verl/…py:line`` the probes read the key at, on this configuration
    judged: tuple[Judged, ...]


def explain(entry: LeafReads, traced_here: list[str], leaves: Mapping[str, Any]) -> Explanation:
    """Whether ``entry``'s key acts on the configuration whose ``leaves`` are given, where the
    probes read it at ``traced_here``."""
    section = entry.leaf.rpartition(".")[0]
    # Every place of the key's own section not read here (traced on another configuration, or
    # static), judged by its guard; a read of the name on an object of unknown section keeps the
    # verdict undecided.
    here = set(traced_here)
    judged = tuple(judge(p, section, leaves) for p in entry.places if p.where not in here)
    if traced_here:
        verdict = ACTS
    elif entry.status == "never read" or (
        judged and not entry.unmatched and all(j.holds is False for j in judged)
    ):
        verdict = NO_EFFECT
    else:
        verdict = UNDECIDED
    return Explanation(verdict, tuple(traced_here), judged)
