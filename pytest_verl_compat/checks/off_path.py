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
# The names a guard in normal form uses (``upstream/census/off_path.py`` writes them): a leaf,
# and a registry's selecting leaf (``upstream/census/dispatch.py``).
_LEAF = "L"
_SELECTOR = "D"
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
    open: int = 0  # conjuncts no leaf decides (the place may run or not, whatever the values)
    cls: str = ""  # the class whose method holds it (``verl.a.b.Cls``), "" for a function
    raw: bool = False  # read on the tree itself, not on a config dataclass built from it


@dataclass(frozen=True)
class Forced:
    """A value a config class's ``__post_init__`` writes over the field (``upstream/census/
    forced.py``), under a guard in normal form."""

    where: str
    guard: tuple[str, ...]
    value: str
    open: int = 0


@dataclass(frozen=True)
class LeafReads:
    """Every place a release reads one leaf; ``complete`` when the census is sure it saw every
    one (no use of the name it cannot attribute, no section handed on whole, no copy)."""

    places: tuple[Place, ...]
    complete: bool = False
    forced: tuple[Forced, ...] = ()
    # No read can take the tree's own value of a forced leaf (``census/off_path.py``
    # ``forced_reads_complete``): enough for ``effect.forced``, not for the other claims.
    forced_complete: bool = False


@dataclass(frozen=True)
class ReadIndex:
    leaves: dict[str, LeafReads]
    # Class → the condition (normal form, selectors ``D[...]``) under which a registry builds it.
    classes: dict[str, str]


@functools.cache
def read_index(version: str) -> ReadIndex:
    """The release's index (empty for a release the data does not hold)."""
    text = resources.files("pytest_verl_compat").joinpath(OFF_PATH_READS).read_text()
    raw = json.loads(text).get(version) or {}
    leaves = {
        leaf: LeafReads(
            tuple(
                Place(
                    str(p["where"]),
                    tuple(p["guard"]),
                    bool(p.get("traced")),
                    int(p.get("open", 0)),
                    str(p.get("class", "")),
                    bool(p.get("raw")),
                )
                for p in item["places"]
            ),
            bool(item.get("complete")),
            tuple(
                Forced(str(f["where"]), tuple(f["guard"]), str(f["value"]), int(f.get("open", 0)))
                for f in item.get("forced", ())
            ),
            bool(item.get("forced_complete")),
        )
        for leaf, item in (raw.get("leaves") or {}).items()
    }
    return ReadIndex(leaves, dict(raw.get("classes") or {}))


def off_path_reads(version: str) -> dict[str, tuple[Place, ...]]:
    """Leaf → every place ``version`` reads it, for the leaves whose every read the census saw
    and whose places a configuration can rule out (none for a release the data does not hold)."""
    return {
        leaf: item.places
        for leaf, item in read_index(version).leaves.items()
        if item.complete and item.places
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


class _Section:
    """A section named in a guard: it is a mapping (true when not empty), never None, and holds
    its keys; compared with anything else it is not decided."""

    def __init__(self, keys: frozenset[str], filled: bool) -> None:
        self.keys, self.filled = keys, filled

    def __bool__(self) -> bool:
        return self.filled

    def __contains__(self, key: object) -> bool:
        return key in self.keys

    def __eq__(self, other: object) -> bool:
        if other is None:
            return False
        raise TypeError("a section compared with a value")

    __hash__ = object.__hash__


class _Guard(GuardValue):
    """One conjunct of the recorded normal form: a leaf is ``L['leaf']`` (not decided when the
    configuration lacks it), a registry's selector ``D['leaf']`` (None when it lacks it: no
    such section, nothing built for it)."""

    def read(self, node: ast.Subscript | ast.Attribute | ast.Name) -> Any:
        return self._leaf(node) if isinstance(node, ast.Subscript) else UNKNOWN

    def _leaf(self, node: ast.Subscript) -> Any:
        if not (
            isinstance(node.value, ast.Name)
            and node.value.id in (_LEAF, _SELECTOR)
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            return UNKNOWN
        leaf = node.slice.value
        if leaf not in self.leaves:
            if node.value.id == _SELECTOR:
                self.read_leaves[leaf] = None
                return None
            return UNKNOWN
        value = self.leaves[leaf]
        if value == _MISSING:
            return UNKNOWN  # a value the script still has to give (``???``)
        if isinstance(value, Mapping):
            return _Section(frozenset(str(k) for k in value), bool(value))
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


def _conjuncts(place: Place, classes: Mapping[str, str]) -> tuple[str, ...]:
    """The place's conjuncts, with the condition under which a registry builds its class."""
    built = classes.get(place.cls, "") if place.cls else ""
    return (*place.guard, built) if built else place.guard


def ruled_out(
    place: Place, leaves: Mapping[str, Any], classes: Mapping[str, str] | None = None
) -> dict[str, Any] | None:
    """The leaves (and their values) whose values make one of the place's conjuncts false (its
    guard, or the registry that would build its class: ``classes``), or None when none is
    decidedly false here (the place may run)."""
    for conjunct in _conjuncts(place, classes or {}):
        node = _parsed(conjunct)
        if node is None:
            continue
        guard = _Guard(leaves)
        value = guard.value(node)
        if value is not UNKNOWN and not value:
            return guard.read_leaves
    return None


def holds(place: Place, leaves: Mapping[str, Any]) -> dict[str, Any] | None:
    """The leaves that make every conjunct of the place's guard true, or None when one is false
    or not decided (an ``open`` conjunct is never decided). Its class is not judged here: a
    registry that would build it does not say the run builds it (``verdict/keys.py`` asks the
    probes)."""
    if place.open:
        return None
    read: dict[str, Any] = {}
    for conjunct in place.guard:
        node = _parsed(conjunct)
        if node is None:
            return None
        guard = _Guard(leaves)
        value = guard.value(node)
        if value is UNKNOWN or not value:
            return None
        read.update(guard.read_leaves)
    return read


def flat(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every node of the resolved mapping by dotted path (sections too)."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        out[path] = value
        if isinstance(value, Mapping):
            out.update(flat(value, path + "."))
    return out


# What the static reading says of a key here (``StaticEffect.kind``).
OFF_PATH = "off path"  # every place's guard is false here
NOT_BUILT = "not built"  # and the class of some places is one no registry builds here
NEVER_USED = "never used"  # no code of the release uses its name at all
FORCED = "forced"  # a config class's ``__post_init__`` overwrites it here


@dataclass(frozen=True)
class StaticEffect:
    """Why an explicit key has no effect on this configuration, from the read index alone."""

    kind: str
    places: tuple[Place, ...]
    deciding: dict[str, Any]  # the leaves (and values) that decide it
    forced: Forced | None = None
    not_built: tuple[str, ...] = ()  # the classes no registry builds here


def _same_constant(forced: str, value: Any) -> bool:
    """Whether the forced value is a literal equal to the script's (``False`` and False)."""
    try:
        literal = ast.literal_eval(forced)
    except (ValueError, SyntaxError):
        return False
    return type(literal) is type(value) and literal == value


def static_effect(key: str, leaves: Mapping[str, Any], version: str) -> StaticEffect | None:
    """Why ``key`` has no effect on the configuration whose nodes (``_flat``) are ``leaves``, or
    None when the index cannot say so: the census is not sure it saw every read, or a place may
    run (its guard and the registry that builds its class are not decidedly false)."""
    index = read_index(version)
    item = index.leaves.get(key)
    if item is None or key not in leaves:
        return None
    for forced in item.forced if item.complete or item.forced_complete else ():
        # Every read is on the dataclass the ``__post_init__`` rewrote (none on the tree).
        read = holds(Place(forced.where, forced.guard, open=forced.open), leaves)
        if read is not None and not any(place.raw for place in item.places):
            if _same_constant(forced.value, leaves[key]):
                return None  # the script wrote what upstream would have set: nothing to say
            return StaticEffect(FORCED, item.places, read, forced)
    if not item.complete:
        return None
    if not item.places:
        return StaticEffect(NEVER_USED, (), {})
    deciding: dict[str, Any] = {}
    not_built: set[str] = set()
    for place in item.places:
        read = ruled_out(place, leaves)
        if read is None:
            read = ruled_out(place, leaves, index.classes)
            if read is None:
                return None
            not_built.add(place.cls)
        deciding.update(read)
    kind = NOT_BUILT if not_built else OFF_PATH
    return StaticEffect(kind, item.places, deciding, not_built=tuple(sorted(not_built)))


def judged(
    key: str, resolved: Mapping[str, Any], version: str
) -> list[tuple[Place, dict[str, Any] | None]] | None:
    """Each place ``version`` reads ``key`` with what rules it out on ``resolved`` (its guard
    or its class's registry; None: it may run); None when the index does not hold the key."""
    item = read_index(version).leaves.get(key)
    if item is None:
        return None
    leaves = flat(resolved)
    classes = read_index(version).classes
    return [(place, ruled_out(place, leaves, classes)) for place in item.places]


def static_effects(
    resolved: Mapping[str, Any], explicit: Sequence[str], version: str
) -> Iterator[tuple[str, str, StaticEffect]]:
    """(field, key, why) for each explicit key the read index says has no effect here."""
    if not read_index(version).leaves:
        return
    leaves: dict[str, Any] | None = None
    seen: set[str] = set()
    for field in explicit:
        key = field_key(field)
        if field.startswith("~") or key in seen:
            continue
        seen.add(key)
        leaves = flat(resolved) if leaves is None else leaves
        found = static_effect(key, leaves, version)
        if found is not None:
            yield field, key, found


def off_path_keys(
    resolved: Mapping[str, Any], explicit: Sequence[str], version: str
) -> Iterator[tuple[str, str, tuple[Place, ...], dict[str, Any]]]:
    """(field, key, places, deciding leaves) for each explicit key no place reads here."""
    for field, key, found in static_effects(resolved, explicit, version):
        if found.kind in (OFF_PATH, NOT_BUILT):
            yield field, key, found.places, found.deciding


def _short_class(cls: str) -> str:
    return cls.rpartition(".")[2]


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


# What the index's rules yield to on the same key: the rules that say it from the key's own field
# or from upstream's run.
_SAID_FIRST = (
    "fields.no-effect",
    "fields.legacy-reward-key",
    "entry.forced-value",
    "effect.never-read",
    "effect.overridden",
)


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
    yields_to=_SAID_FIRST,
)
def off_path(inp: CheckInput) -> Iterator[Hit]:
    for field, key, found in static_effects(inp.resolved, inp.explicit_fields, inp.version):
        yield from _off_path_hit(field, key, found, inp.version)


def _off_path_hit(field: str, key: str, found: StaticEffect, version: str) -> Iterator[Hit]:
    because = ", ".join(f"{leaf}={value!r}" for leaf, value in sorted(found.deciding.items()))
    if found.kind == OFF_PATH:
        yield Hit(
            key,
            f"`{field}` has no effect here: verl {version} reads {key} only at "
            f"{_shown(found.places)}, and {because or 'this configuration'} rules out every one",
            "remove it, or select the path that reads it",
        )
    elif found.kind == NOT_BUILT:
        classes = ", ".join(_short_class(c) for c in found.not_built)
        # A selecting leaf the configuration lacks (None: its section is absent) builds nothing
        # and says nothing to the reader; the values that do select are named.
        because = ", ".join(
            f"{leaf}={value!r}"
            for leaf, value in sorted(found.deciding.items())
            if value is not None
        )
        yield Hit(
            key,
            f"`{field}` has no effect here: verl {version} reads {key} only at "
            f"{_shown(found.places)}, and with {because or 'this configuration'}, no registry "
            f"builds {classes} (the class those reads belong to) and the other places are ruled "
            "out",
            "remove it, or select the class that reads it",
        )
    elif found.kind == NEVER_USED:
        yield Hit(
            key,
            f"`{field}` has no effect: no code of verl {version} uses the name of {key} (the "
            "read census saw every use of it)",
            "remove it",
        )


@check(
    "effect.forced",
    level="warning",
    evidence="the trainer's setup that writes the key on the tree, e.g. data.gen_batch_size = 1 "
    "when the run needs exact refills (verl/trainer/ppo/v1/trainer_base.py:677-684), or "
    "a config class's __post_init__ that overwrites the field under a condition the "
    "configuration decides, e.g. McoreEngineConfig sets sequence_parallel = False when "
    "tensor_model_parallel_size == 1 (verl/workers/config/engine.py:237-239), with every read of "
    "the key made on that dataclass (docs/census/{version}/reads.md); the finding names the line",
    summary="An explicit key whose value upstream overwrites before any code reads it: a config "
    "class's `__post_init__` (or, seen by the probes, the trainer's own setup) sets the field "
    "under a condition the script's values make true, so the value the script wrote never "
    "reaches the code that reads it.",
    fix="remove the key, or change the setting that makes upstream overwrite it",
    # The probes' example (the trainer's setup, seen by the run: ``verdict/keys.path_findings``);
    # the static side's is tests/test_key_answers.py's Megatron sequence_parallel with TP 1.
    example=Example(
        fires=(
            "data.gen_batch_size=4",
            "algorithm.filter_groups.enable=True",
            "algorithm.filter_groups.metric=acc",
        ),
        twin=("data.gen_batch_size=4", "algorithm.filter_groups.metric=acc"),
        upstream=True,
    ),
    yields_to=_SAID_FIRST,
)
def forced(inp: CheckInput) -> Iterator[Hit]:
    for field, key, found in static_effects(inp.resolved, inp.explicit_fields, inp.version):
        if found.kind != FORCED or found.forced is None:
            continue
        because = ", ".join(f"{leaf}={value!r}" for leaf, value in sorted(found.deciding.items()))
        when = f" (with {because})" if because else ""
        yield Hit(
            key,
            f"`{field}` has no effect here: verl {inp.version} sets {key} = "
            f"{found.forced.value} at {found.forced.where}{when} before any code reads it",
            "remove it, or change the setting that makes upstream overwrite it",
        )
