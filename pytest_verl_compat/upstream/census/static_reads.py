"""What the files of main_ppo's path read, from their source alone (the read census's static part).

Every attribute, ``.get("…")`` or item read of a configuration object in the files of main_ppo's
path (``census_reads``'s holders), with the function, the object and the ``if`` tests around it;
a parameter that callers pass a configuration object is read as that object (``bindings``).
These facts depend on verl's files only, whatever trees a census matches them to, so
``source_facts`` keeps them in the user cache by the files' content.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_verl_compat.files.digests import files_sha256
from pytest_verl_compat.pipeline.memo import StageMemo
from pytest_verl_compat.upstream.census import call_binding as census_reads
from pytest_verl_compat.upstream.probes import statements

# The user cache's kind for ``source_facts``.
SOURCE_FACTS = "source-facts"
# The files of main_ppo's path whose reads the static part looks at (relative to verl's parent).
PATH_FILES = (
    "verl/trainer/main_ppo.py",
    "verl/trainer/ppo/*.py",
    "verl/trainer/ppo/v1/*.py",
    "verl/trainer/config/*.py",
    "verl/trainer/distillation/*.py",
    "verl/utils/config.py",
    "verl/utils/profiler/*.py",
    "verl/utils/checkpoint/*.py",
    "verl/utils/dataset/*.py",
    "verl/base_config.py",
    "verl/checkpoint_engine/*.py",
    "verl/experimental/**/*.py",
    "verl/workers/**/*.py",
)
# A key of a section verl hands on whole as keywords (``{**engine_config.override_transformer_
# config}``, verl/workers/engine/megatron/transformer_impl.py:296): every key of it is read there.
WHOLE = "passed whole"


@dataclass(frozen=True, order=True)
class Place:
    """One read of a leaf: where, in which function, from which object, under which guard."""

    where: str  # verl/…py:line
    function: str
    holder: str  # the object read (``self.config.actor_rollout_ref.actor``), "" when traced only
    guard: str  # the enclosing ``if`` tests, innermost first
    how: str  # "traced", "static", or "mention" (the name only, not a read the reading knows)
    # How the object is the leaf's section when the place's own code cannot say: the call that
    # passes it (``config = data_config, verl/trainer/ppo/utils.py:129``), or the copy read.
    via: str = ""
    # The section of the object read, when not the leaf's own: a copy's (``through`` a copy).
    section: str = ""


def _path_files(verl_parent: Path) -> list[tuple[str, Path]]:
    """(relative path, file) of every module of the path, sorted by relative path."""
    seen: dict[str, Path] = {}
    for pattern in PATH_FILES:
        for path in sorted(verl_parent.glob(pattern)):
            relative = path.relative_to(verl_parent).as_posix()
            if path.suffix == ".py" and path.is_file():
                seen.setdefault(relative, path)
    return sorted(seen.items())


def _sources(verl_parent: Path) -> list[statements.Source]:
    parsed = (statements.parse(str(path), relative) for relative, path in _path_files(verl_parent))
    return [source for source in parsed if source is not None]


def _subclasses(sources: Iterable[statements.Source]) -> dict[str, set[str]]:
    """Class name → itself and every class of ``sources`` that derives from it (by name)."""
    bases: dict[str, set[str]] = {}
    for source in sources:
        for node in source.nodes:
            if isinstance(node, ast.ClassDef):
                bases.setdefault(node.name, set()).update(
                    b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
                )
    down: dict[str, set[str]] = {name: {name} for name in bases}
    changed = True
    while changed:
        changed = False
        for name, parents in bases.items():
            for parent in parents:
                if parent in down and not down[name] <= down[parent]:
                    down[parent] |= down[name]
                    changed = True
    return down


def guard(source: statements.Source, node: ast.AST, shown: int | None = None) -> str:
    """The ``if`` tests around ``node`` in its function, innermost first (every one: a place
    runs only when all of them hold; ``shown`` keeps the innermost few)."""
    tests: list[str] = []
    child: ast.AST = node
    for ancestor in source.ancestors(node):
        if isinstance(ancestor, ast.FunctionDef | ast.AsyncFunctionDef):
            break
        if isinstance(ancestor, ast.If) and child is not ancestor.test:
            text = " ".join(ast.unparse(ancestor.test).split())
            if child in ancestor.body:
                tests.append(text)
            elif isinstance(ancestor.test, ast.UnaryOp) and isinstance(ancestor.test.op, ast.Not):
                tests.append(" ".join(ast.unparse(ancestor.test.operand).split()))
            else:
                tests.append(f"not ({text})")
        child = ancestor
    return " ∧ ".join(tests[:shown])


@dataclass(frozen=True)
class StaticRead:
    name: str
    holder: list[str]
    place: Place
    config_class: str  # the class when the holder is ``self`` in a config class


@dataclass(frozen=True, order=True)
class Binding:
    """A configuration object that a call passes one parameter of a function of the census."""

    chain: tuple[str, ...]  # the object as the caller names it (``data_config``)
    where: str  # the call, ``verl/…py:line``


# Function (by id) → parameter → the configuration objects its callers pass it.
Bindings = dict[int, dict[str, set[Binding]]]


def _functions(source: statements.Source) -> list[census_reads.Function]:
    return [n for n in source.nodes if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def _returned_classes(function: census_reads.Function, class_names: set[str]) -> set[str]:
    """The census's classes a factory returns, directly or through a local it assigns
    (``get_dataset_class`` returns ``RLHFDataset``, or a user's class it loads, which is no
    class of verl's and so no read the census can see)."""
    assigned: dict[str, list[ast.expr]] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    assigned.setdefault(target.id, []).append(node.value)
    found: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Name):
            values = [node.value, *assigned.get(node.value.id, [])]
            found |= {v.id for v in values if isinstance(v, ast.Name) and v.id in class_names}
    return found


def _local_factories(function: census_reads.Function) -> dict[str, list[ast.Call]]:
    """The calls whose results a function keeps in a plain local, by the local's name."""
    found: dict[str, list[ast.Call]] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found.setdefault(target.id, []).append(node.value)
    return found


def _call_targets(
    call: ast.Call,
    factories: Callable[[], dict[str, list[ast.Call]]],
    callees: census_reads.Callees,
    class_names: set[str],
) -> list[tuple[census_reads.Function, bool]]:
    """The functions a call reaches: by name (``census_reads.callee_of``), or, for a class held
    in a local (``dataset_cls = get_dataset_class(data_config)``, then ``dataset_cls(…)``,
    verl/trainer/ppo/utils.py:126-129), the ``__init__`` of each class its factory returns
    (``factories``: the function's locals assigned from calls, computed once when asked)."""
    target = census_reads.callee_of(call, callees)
    if target is not None:
        return [target]
    if not isinstance(call.func, ast.Name):
        return []
    found: list[tuple[census_reads.Function, bool]] = []
    for value in factories().get(call.func.id, []):
        factory = census_reads.callee_of(value, callees)
        if factory is None:
            continue
        for name in sorted(_returned_classes(factory[0], class_names)):
            inits = [c for c in callees.get(name, []) if c[0].name == "__init__"]
            if len(inits) == 1:
                found.append(inits[0])
    return found


Contexts = dict[int, census_reads.Context]  # function id → its config holders


def _context(
    contexts: Contexts,
    source: statements.Source,
    function: census_reads.Function,
    classes: frozenset[str],
) -> census_reads.Context:
    """A function's config holders (its derived locals count as holders), built once."""
    context = contexts.get(id(function))
    if context is None:
        context = census_reads.context_of(source, function, census_reads.Index(), classes)
        context.roots |= set(context.derived)
        contexts[id(function)] = context
    return context


def bindings(
    sources: list[statements.Source], classes: frozenset[str], contexts: Contexts | None = None
) -> Bindings:
    """What the census's call sites pass each parameter that holds configuration, one level:
    ``RLHFDataset.__init__``'s ``config`` is ``data_config`` (verl/trainer/ppo/utils.py:129), so
    its reads are reads of ``data``. Only an argument that is a configuration object or a section
    of one binds (a plain value passed on is the check census's concern, not a section)."""
    callees = census_reads.callees_by_name(sources)
    # Each class's ``__init__`` is filed under the class's name.
    class_names = {
        name for name, found in callees.items() if any(f.name == "__init__" for f, _ in found)
    }
    contexts = {} if contexts is None else contexts
    out: Bindings = {}
    for source in sources:
        for function in _functions(source):
            context: census_reads.Context | None = None
            factories = functools.cache(functools.partial(_local_factories, function))
            for call in source.own_nodes(function):
                if not isinstance(call, ast.Call):
                    continue
                targets = _call_targets(call, factories, callees, class_names)
                if not targets:
                    continue
                if context is None:
                    context = _context(contexts, source, function, classes)
                for callee, is_method in targets:
                    for param, argument in census_reads.arguments_bound(call, callee, is_method):
                        chain = census_reads.attribute_chain(argument)
                        if chain is not None and _within_config(chain, context):
                            out.setdefault(id(callee), {}).setdefault(param, set()).add(
                                Binding(tuple(chain), f"{source.relative}:{call.lineno}")
                            )
    return out


def _aliases(
    source: statements.Source, function: census_reads.Function, context: census_reads.Context
) -> dict[str, set[Binding]]:
    """Locals that name a configuration object by another name, assigned once in the function
    (``config = self.rollout_config``, verl/experimental/agent_loop/agent_loop.py:600): their
    reads are reads of that object."""
    assigned: dict[str, list[ast.Assign | ast.AugAssign | ast.AnnAssign]] = {}
    for node in source.own_nodes(function):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for named in ast.walk(target):
                    if isinstance(named, ast.Name):
                        assigned.setdefault(named.id, []).append(node)
    params = {
        a.arg for a in [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]
    }
    out: dict[str, set[Binding]] = {}
    for name, nodes in assigned.items():
        only = nodes[0]
        if name in params or len(nodes) != 1 or not isinstance(only, ast.Assign):
            continue
        if len(only.targets) != 1 or not isinstance(only.targets[0], ast.Name):
            continue
        chain = key_chain(only.value)
        if chain is not None and len(chain) > 1 and _within_config(chain, context):
            out[name] = {Binding(tuple(chain), f"{source.relative}:{only.lineno}")}
    return out


def static_reads(sources: list[statements.Source], classes: frozenset[str]) -> Iterator[StaticRead]:
    """Every read of a field on a configuration object in ``sources``; a read on a parameter
    that callers pass a configuration object (``bindings``) also as a read of that object."""
    contexts: Contexts = {}
    bound = bindings(sources, classes, contexts)
    for source in sources:
        for function in _functions(source):
            context = _context(contexts, source, function, classes)
            aliases = _aliases(source, function, context)
            owner = next(
                (a.name for a in source.ancestors(function) if isinstance(a, ast.ClassDef)), ""
            )
            # A nested function's reads are its own walk's.
            for node in source.own_nodes(function):
                spreads = _spreads(node, context, aliases)
                found = _field_read(node, context)
                if not spreads and found is None:
                    continue
                for holder in spreads:
                    line = getattr(node, "lineno", function.lineno)
                    where = f"{source.relative}:{line}"
                    text = "**" + ".".join(holder)
                    place = Place(where, source.qualname(node), text, guard(source, node), WHOLE)
                    yield StaticRead(SPREAD, holder, place, "")
                if found is None:
                    continue
                name, holder = found
                line = getattr(node, "lineno", function.lineno)
                place = Place(
                    f"{source.relative}:{line}",
                    source.qualname(node),
                    ".".join(holder),
                    guard(source, node),
                    "static",
                )
                yield StaticRead(
                    name, holder, place, owner if holder == ["self"] and context.config_self else ""
                )
                for binding in sorted(
                    bound.get(id(function), {}).get(holder[0], set())
                    | aliases.get(holder[0], set())
                ):
                    # The place's guard keeps the callee's own names: ``holder`` resolves them.
                    via = f"{holder[0]} = {'.'.join(binding.chain)}, {binding.where}"
                    yield StaticRead(
                        name,
                        [*binding.chain, *holder[1:]],
                        dataclasses.replace(place, via=via),
                        "",
                    )


# The name a spread is filed under among the static reads: no field is called so.
SPREAD = "**"


def _spreads(
    node: ast.AST, context: census_reads.Context, aliases: Mapping[str, set[Binding]]
) -> list[list[str]]:
    """The configuration sections ``node`` hands on as keywords: ``f(**section)``,
    ``{**section}``."""
    values: list[ast.expr] = []
    if isinstance(node, ast.Call):
        values = [k.value for k in node.keywords if k.arg is None]
    elif isinstance(node, ast.Dict):
        values = [v for k, v in zip(node.keys, node.values, strict=True) if k is None]
    out = []
    for value in values:
        chain = key_chain(value)
        if chain is not None and len(chain) > 1 and _within_config(chain, context):
            out.append(chain)
        elif chain is not None and len(chain) == 1 and chain[0] in aliases:
            # ``reward_kwargs = config.reward.get("reward_kwargs")``, then ``f(**reward_kwargs)``.
            out += [list(b.chain) for b in sorted(aliases[chain[0]])]
    return out


def _within_config(holder: list[str], context: census_reads.Context) -> bool:
    """The object is a config section or a section within one (``self.config.actor_rollout_ref``)."""
    return any(census_reads.holds_config(holder[:k], context) for k in range(1, len(holder) + 1))


def _mentions(sources: list[statements.Source]) -> dict[str, list[str]]:
    """Every name used as an attribute, a keyword or a string in ``sources``, with its places."""
    found: dict[str, set[str]] = {}
    for source in sources:
        for node in source.nodes:
            if isinstance(node, ast.Attribute):
                name = node.attr
            elif isinstance(node, ast.keyword) and node.arg:
                name = node.arg
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                name = node.value
            else:
                continue
            line = getattr(node, "lineno", None) or getattr(node.value, "lineno", 0)
            found.setdefault(name, set()).add(f"{source.relative}:{line}")
    return {name: sorted(places, key=file_line) for name, places in found.items()}


def key_chain(node: ast.AST) -> list[str] | None:
    """``attribute_chain``, also through keyed reads: ``config.reward.get("reward_kwargs", {})``
    is ``["config", "reward", "reward_kwargs"]``, as is ``config.reward["reward_kwargs"]``."""
    parts: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _KEYED_READS
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            parts.append(node.args[0].value)
            node = node.func.value
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ):
            parts.append(node.slice.value)
            node = node.value
        else:
            break
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


# Methods that read a key by name: ``section.get("x", d)``, and ``section.pop("x", d)``, which
# reads it before removing it (verl/workers/engine_workers.py:545 reads the ref's
# ``log_prob_use_dynamic_bsz`` so).
_KEYED_READS = frozenset({"get", "pop"})


def _field_read(node: ast.AST, context: census_reads.Context) -> tuple[str, list[str]] | None:
    """The field ``node`` reads and the object it reads it on (that object named through keyed
    reads too: ``config.reward.get("reward_kwargs", {}).get("overlong_buffer_cfg")``)."""
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
        holder = key_chain(node.value)
        if (
            holder is not None
            and _within_config(holder, context)
            and not node.attr.startswith("_")
            and node.attr not in census_reads.METHODS
        ):
            return node.attr, holder
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        holder = key_chain(node.func.value)
        if (
            node.func.attr in _KEYED_READS
            and holder is not None
            and _within_config(holder, context)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            return node.args[0].value, holder
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        holder = key_chain(node.value)
        if (
            holder is not None
            and isinstance(node.slice.value, str)
            and _within_config(holder, context)
        ):
            return node.slice.value, holder
    return None


@dataclass(frozen=True)
class SourceFacts:
    """What the census takes from the files of the path alone, whatever the trees: each config
    class's subclasses, every name's mentions, the static reads and the fields that map names to
    config classes."""

    down: dict[str, set[str]]
    mentions: dict[str, list[str]]
    reads: list[StaticRead]
    dict_fields: dict[tuple[str, str], str]

    def as_json(self) -> dict[str, Any]:
        return {
            "down": {name: sorted(subs) for name, subs in self.down.items()},
            "mentions": self.mentions,
            "reads": [
                [r.name, r.holder, list(dataclasses.astuple(r.place)), r.config_class]
                for r in self.reads
            ],
            "dict_fields": [[*key, where] for key, where in self.dict_fields.items()],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SourceFacts:
        return cls(
            {name: set(subs) for name, subs in raw["down"].items()},
            raw["mentions"],
            [StaticRead(n, h, Place(*place), c) for n, h, place, c in raw["reads"]],
            {(name, field_name): where for name, field_name, where in raw["dict_fields"]},
        )


def source_facts(verl_parent: Path) -> SourceFacts:
    """The path's facts, kept in the user cache by the files' content and our code
    (``StageMemo``): reading them is every ``explain``'s and census's largest part (~8 s: the
    bindings and reads of ~200 files), the same in every run of a release."""
    memo = StageMemo()
    files = files_sha256(_path_files(verl_parent), "verl module")
    key = memo.key(SOURCE_FACTS, files)
    kept = memo.get(SOURCE_FACTS, key)
    if kept is not None:
        try:
            return SourceFacts.from_json(kept)
        except (KeyError, TypeError, ValueError):
            pass  # not what this code writes: read the files anew, and keep that instead
    sources = _sources(verl_parent)
    classes = census_reads.config_classes(sources)
    facts = SourceFacts(
        _subclasses(sources),
        _mentions(sources),
        list(static_reads(sources, classes)),
        _dict_fields(sources, classes),
    )
    memo.put(SOURCE_FACTS, key, facts.as_json())
    return facts


def _dict_fields(
    sources: list[statements.Source], classes: frozenset[str]
) -> dict[tuple[str, str], str]:
    """(config class, field) → where it is declared, for a field that maps names to instances of
    a config class (``teacher_models: dict[str, DistillationTeacherModelConfig]``,
    verl/workers/config/distillation.py:265): each entry is built as that class."""
    found: dict[tuple[str, str], str] = {}
    for source in sources:
        for node in source.nodes:
            if not isinstance(node, ast.ClassDef) or node.name not in classes:
                continue
            for item in node.body:
                if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                    continue
                annotation = item.annotation
                if (
                    isinstance(annotation, ast.Subscript)
                    and isinstance(annotation.value, ast.Name)
                    and annotation.value.id == "dict"
                    and isinstance(annotation.slice, ast.Tuple)
                    and len(annotation.slice.elts) == 2
                    and isinstance(annotation.slice.elts[1], ast.Name)
                    and annotation.slice.elts[1].id in classes
                ):
                    where = f"{source.relative}:{item.lineno}"
                    found[(node.name, item.target.id)] = where
    return found


def file_line(where: str) -> tuple[str, int]:
    file, _, line = where.rpartition(":")
    return file, int(line) if line.isdigit() else 0
