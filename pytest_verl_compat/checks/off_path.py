"""Explicit keys whose every reader lies off the path the configuration selects."""

from __future__ import annotations

import ast
import functools
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from pytest_verl_compat.checks.fields import field_key
from pytest_verl_compat.checks.registry import CheckInput, Example, Hit, check
from pytest_verl_compat.model import line_spans

# Every place verl reads each such leaf, with its guard in normal form, per verl release: built
# from the read census and a scan of the installed package by ``upstream/off_path.py``
# (``verl-compat census --reads --write``); tests/test_off_path.py fails when it is stale.
OFF_PATH_READS = "data/off_path_reads.json"
# The names a guard in normal form uses (``upstream/off_path.py`` writes them).
_LEAF = "L"
UNKNOWN_NAME = "UNKNOWN"
# A guard's value the evaluation cannot decide (shared with ``upstream/explain.py``).
UNKNOWN: Any = object()
# OmegaConf's mandatory value not given: verl fails on it before any guard.
_MISSING = "???"
# Places named in a finding (the rest counted).
PLACES_SHOWN = 2


@dataclass(frozen=True)
class Place:
    where: str  # verl/…py:line
    guard: tuple[str, ...]  # conjuncts in normal form
    traced: bool = False  # the probes ran it on one of the census's configurations


@functools.cache
def off_path_reads(version: str) -> dict[str, tuple[Place, ...]]:
    """Leaf → every place ``version`` reads it, for the leaves whose reads a configuration can
    rule out (none for a release the data does not hold)."""
    text = resources.files("pytest_verl_compat").joinpath(OFF_PATH_READS).read_text()
    raw = json.loads(text).get(version) or {}
    return {
        leaf: tuple(
            Place(str(p["where"]), tuple(p["guard"]), bool(p.get("traced"))) for p in places
        )
        for leaf, places in raw.items()
    }


@functools.lru_cache(maxsize=4096)
def _parsed(conjunct: str) -> ast.expr | None:
    try:
        return ast.parse(conjunct, mode="eval").body
    except SyntaxError:
        return None


class GuardValue:
    """A guard's three-valued evaluation on a resolved mapping, and the leaves it read: constants,
    containers, ``not``, ``and``/``or`` and one comparison are evaluated; a name is resolved by
    ``read`` (a subclass's way of naming leaves); anything else is ``UNKNOWN``. Nothing is
    executed."""

    def __init__(self, leaves: Mapping[str, Any]) -> None:
        self.leaves = leaves
        self.read_leaves: dict[str, Any] = {}

    def read(self, node: ast.Subscript | ast.Attribute | ast.Name) -> Any:
        return UNKNOWN

    def value(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            items = [self.value(e) for e in node.elts]
            return UNKNOWN if any(i is UNKNOWN for i in items) else items
        if isinstance(node, ast.Subscript | ast.Attribute | ast.Name):
            return self.read(node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            inner = self.value(node.operand)
            return UNKNOWN if inner is UNKNOWN else not inner
        if isinstance(node, ast.BoolOp):
            return self._bool(node)
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, right = self.value(node.left), self.value(node.comparators[0])
            if left is UNKNOWN or right is UNKNOWN:
                return UNKNOWN
            return _compare(node.ops[0], left, right)
        return UNKNOWN

    def _bool(self, node: ast.BoolOp) -> Any:
        values = [self.value(v) for v in node.values]
        known = [v for v in values if v is not UNKNOWN]
        if isinstance(node.op, ast.And):
            if any(not v for v in known):
                return False
            return UNKNOWN if len(known) < len(values) else True
        if any(known):
            return True
        return UNKNOWN if len(known) < len(values) else False


class _Guard(GuardValue):
    """One conjunct of the recorded normal form: a leaf is ``L['leaf']``."""

    def read(self, node: ast.Subscript | ast.Attribute | ast.Name) -> Any:
        return self._leaf(node) if isinstance(node, ast.Subscript) else UNKNOWN

    def _leaf(self, node: ast.Subscript) -> Any:
        if not (
            isinstance(node.value, ast.Name)
            and node.value.id == _LEAF
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            return UNKNOWN
        leaf = node.slice.value
        if leaf not in self.leaves:
            return UNKNOWN
        value = self.leaves[leaf]
        if isinstance(value, Mapping) or value == _MISSING:
            return UNKNOWN  # a section, or a value the script still has to give (``???``)
        self.read_leaves[leaf] = value
        return value


_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Is: lambda a, b: a is b,
    ast.IsNot: lambda a, b: a is not b,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
}


def _compare(op: ast.cmpop, left: Any, right: Any) -> Any:
    compare = _COMPARE.get(type(op))
    if compare is None:
        return UNKNOWN
    try:
        return bool(compare(left, right))
    except TypeError:
        return UNKNOWN


def ruled_out(place: Place, leaves: Mapping[str, Any]) -> dict[str, Any] | None:
    """The leaves (and their values) whose values make one of the place's conjuncts false, or
    None when none is decidedly false here (the place may run)."""
    for conjunct in place.guard:
        node = _parsed(conjunct)
        if node is None:
            continue
        guard = _Guard(leaves)
        value = guard.value(node)
        if value is not UNKNOWN and not value:
            return guard.read_leaves
    return None


def _flat(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every node of the resolved mapping by dotted path (sections too)."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        out[path] = value
        if isinstance(value, Mapping):
            out.update(_flat(value, path + "."))
    return out


def judged(
    key: str, resolved: Mapping[str, Any], version: str
) -> list[tuple[Place, dict[str, Any] | None]] | None:
    """Each place ``version`` reads ``key`` with what rules it out on ``resolved`` (None: it may
    run); None when the index does not hold the key."""
    places = off_path_reads(version).get(key)
    if places is None:
        return None
    leaves = _flat(resolved)
    return [(place, ruled_out(place, leaves)) for place in places]


def off_path_keys(
    resolved: Mapping[str, Any], explicit: Sequence[str], version: str
) -> Iterator[tuple[str, str, tuple[Place, ...], dict[str, Any]]]:
    """(field, key, places, deciding leaves) for each explicit key no place reads here."""
    index = off_path_reads(version)
    if not index:
        return
    leaves: dict[str, Any] | None = None
    seen: set[str] = set()
    for field in explicit:
        key = field_key(field)
        if field.startswith("~") or key in seen or key not in index:
            continue
        seen.add(key)
        leaves = _flat(resolved) if leaves is None else leaves
        if key not in leaves:
            continue
        deciding: dict[str, Any] = {}
        for place in index[key]:
            read = ruled_out(place, leaves)
            if read is None:
                break
            deciding.update(read)
        else:
            yield field, key, index[key], deciding


def _shown(places: tuple[Place, ...]) -> str:
    """The places by file (``trainer_base.py:805-807``), the lines the probes ran first (main_ppo's
    own path), then the others; verl/experimental/ holds the other entry points' trainers."""
    ordered = sorted(
        places, key=lambda p: (not p.traced, p.where.startswith("verl/experimental/"), p.where)
    )
    files: dict[str, list[int]] = {}
    for place in ordered:
        file, _, line = place.where.rpartition(":")
        files.setdefault(file, []).append(int(line) if line.isdigit() else 0)
    named = list(files.items())[:PLACES_SHOWN]
    more = len(places) - sum(len(lines) for _, lines in named)
    text = ", ".join(f"{file}:{line_spans(lines)}" for file, lines in named)
    return text + (f" and {more} more" if more > 0 else "")


@check(
    "effect.off-path",
    level="warning",
    evidence="every place verl {version} reads the key (the read census, docs/census/{version}/reads.md; "
    "pytest_verl_compat/data/off_path_reads.json), each under a guard its values decide, e.g. "
    "trainer.resume_from_path only under resume_mode == 'resume_path' "
    "(verl/trainer/ppo/v1/trainer_base.py:793-807); an engine class's method runs only for the "
    "backends it is registered for (verl/workers/engine_workers.py:135-137, "
    "verl/workers/engine/base.py:349-390); the finding names the lines",
    summary="An explicit key whose every reader lies off the path the configuration selects: "
    "each place verl reads it sits under an `if` (or in an engine class) that the script's own "
    "values rule out, such as a resume path under resume_mode=auto, a checkpoint path whose flag "
    "is off, or an FSDP1-only option under fsdp2. Left out where another rule already speaks of "
    "the key (fields.no-effect, the legacy reward keys, entry.forced-value, upstream's "
    "effect.never-read and effect.overridden).",
    fix="remove the key, or select the path that reads it",
    example=Example(
        fires=("trainer.resume_mode=auto", "trainer.resume_from_path=ckpt/global_step_10"),
        twin=("trainer.resume_mode=resume_path", "trainer.resume_from_path=ckpt/global_step_10"),
    ),
    yields_to=(
        "fields.no-effect",
        "fields.legacy-reward-key",
        "entry.forced-value",
        "effect.never-read",
        "effect.overridden",
    ),
)
def off_path(inp: CheckInput) -> Iterator[Hit]:
    for field, key, places, deciding in off_path_keys(
        inp.resolved, inp.explicit_fields, inp.version
    ):
        because = ", ".join(f"{leaf}={value!r}" for leaf, value in sorted(deciding.items()))
        yield Hit(
            key,
            f"`{field}` has no effect here: verl {inp.version} reads {key} only at "
            f"{_shown(places)}, and {because or 'this configuration'} rules out every one",
            "remove it, or select the path that reads it",
        )
