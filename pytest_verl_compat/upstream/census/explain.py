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

from pytest_verl_compat.checks.off_path import UNKNOWN, GuardValue
from pytest_verl_compat.upstream.census.call_binding import attribute_chain
from pytest_verl_compat.upstream.census.reads import LeafReads
from pytest_verl_compat.upstream.census.static_reads import Place

ACTS = "acts"
NO_EFFECT = "no effect"
UNDECIDED = "undecided"


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


class _Evaluator(GuardValue):
    """A guard as the source writes it: a name is a leaf through the place's object or the
    tree's root (``_leaf_of``)."""

    def __init__(self, place: Place, section: str, leaves: Mapping[str, Any]) -> None:
        super().__init__(leaves)
        self.place, self.section = place, section

    def read(self, node: ast.Subscript | ast.Attribute | ast.Name) -> Any:
        chain = attribute_chain(node) if isinstance(node, ast.Attribute | ast.Name) else None
        leaf = _leaf_of(chain, self.place, self.section, self.leaves) if chain else None
        if leaf is None:
            return UNKNOWN
        self.read_leaves[leaf] = self.leaves[leaf]
        return self.leaves[leaf]


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
            results.append(UNKNOWN)
            continue
        results.append(evaluator.value(tree.body))
    because = tuple(sorted(evaluator.read_leaves.items()))
    if any(r is not UNKNOWN and not r for r in results):
        return Judged(place, False, because)
    if any(r is UNKNOWN for r in results):
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
    # A place read through a copy judges its guard on the copy's section.
    judged = tuple(
        judge(p, p.section or section, leaves) for p in entry.places if p.where not in here
    )
    if traced_here:
        verdict = ACTS
    elif entry.status == "never read" or (
        judged and not entry.unmatched and all(j.holds is False for j in judged)
    ):
        verdict = NO_EFFECT
    else:
        verdict = UNDECIDED
    return Explanation(verdict, tuple(traced_here), judged)
