"""The read census: for every leaf of main_ppo's composed tree, where verl reads it, and when.

Two sources, the first winning where it speaks:

- **traced**: the probes of ``check`` run on the census's configurations in the oracle process
  (``reads_probe``); the recorder names, for each line of verl, the dotted keys it read;
- **static**: every attribute, ``.get("…")`` or item read of a configuration object in the files
  of main_ppo's path (``census_reads``'s holders), matched to a leaf by its name and the object's
  section: ``self.config.actor_rollout_ref.actor.x`` and ``actor_config.x`` name their section,
  ``self.x`` in a config class names the sections the tree builds that class for (``_target_``).

A leaf is *decided* when a traced or a section-matched read is found, or when no file of the path
reads its name at all (never read). It is undecided when its name is read only on objects whose
section the reading cannot tell; those are listed with the places. The guard of a place is the
``if`` tests that enclose it in its function (what the configuration must select for it to run).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_verl_compat.upstream import census_reads
from pytest_verl_compat.upstream.probes import statements

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
TARGET = "_target_"
# A leaf verl reads only through a leaf the tree copies it into (``rollout.response_length:
# ${oc.select:data.max_response_length,512}``): its value acts where the copy is read.
COPIED = "through a copy"
# A key of a section verl hands on whole as keywords (``{**engine_config.override_transformer_
# config}``, verl/workers/engine/megatron/transformer_impl.py:296): every key of it is read there.
WHOLE = "passed whole"
GUARDS_SHOWN = 2


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


@dataclass
class LeafReads:
    leaf: str
    places: list[Place] = field(default_factory=list)
    unmatched: list[Place] = field(default_factory=list)  # its name, on an unknown section
    trees: tuple[str, ...] = ()  # the composed trees that hold the leaf (all when empty)
    outside: bool = False  # a key a script sets that no tree holds (``+`` into a section)

    @property
    def status(self) -> str:
        own = [p for p in self.places if not p.section and p.how != WHOLE]
        if any(p.how == "traced" for p in own):
            return "traced"
        if own:
            return "static"
        if any(p.section for p in self.places):
            return COPIED
        if self.places:
            return WHOLE
        return "undecided" if self.unmatched else "never read"


def leaves(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The tree's leaves by dotted path (``_target_`` entries are Hydra's, not settings)."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(leaves(value, path + "."))
        elif key != TARGET:
            out[path] = value
    return out


def targets(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, list[str]]:
    """Config class name → the sections whose ``_target_`` builds it."""
    out: dict[str, list[str]] = {}
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            target = value.get(TARGET)
            if isinstance(target, str):
                out.setdefault(target.rsplit(".", 1)[-1], []).append(f"{prefix}{key}")
            for name, sections in targets(value, f"{prefix}{key}.").items():
                out.setdefault(name, []).extend(sections)
    return out


def _sources(verl_parent: Path) -> list[statements.Source]:
    seen: dict[str, statements.Source] = {}
    for pattern in PATH_FILES:
        for path in sorted(verl_parent.glob(pattern)):
            relative = path.relative_to(verl_parent).as_posix()
            if path.suffix == ".py" and relative not in seen:
                source = statements.parse(str(path), relative)
                if source is not None:
                    seen[relative] = source
    return [seen[k] for k in sorted(seen)]


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


def guard(source: statements.Source, node: ast.AST) -> str:
    """The ``if`` tests around ``node`` in its function, innermost first."""
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
    return " ∧ ".join(tests[:GUARDS_SHOWN])


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
    return {name: sorted(places, key=_file_line) for name, places in found.items()}


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


def _matches(
    read: StaticRead,
    section: str,
    sections_of_class: Mapping[str, set[str]],
    class_of_section: Mapping[str, set[str]],
) -> bool:
    """Whether the read's object is ``section`` (the leaf's parent): named by itself, or by an
    object that names a section above it and then the sections below by their names
    (``self.engine_config.override_transformer_config`` on the Megatron engine's section)."""
    if _names_section(read, section, sections_of_class, class_of_section):
        return True
    parts = section.split(".") if section else []
    for k in range(1, len(read.holder)):
        head, tail = read.holder[:k], read.holder[k:]
        if head == ["self"] or not (len(tail) < len(parts) and parts[-len(tail) :] == tail):
            continue
        above = ".".join(parts[: len(parts) - len(tail)])
        shorter = dataclasses.replace(read, holder=head, config_class="")
        if _names_section(shorter, above, sections_of_class, class_of_section):
            return True
    return False


def _names_section(
    read: StaticRead,
    section: str,
    sections_of_class: Mapping[str, set[str]],
    class_of_section: Mapping[str, set[str]],
) -> bool:
    parts = section.split(".") if section else []
    holder = [p for p in read.holder if p != "self"]
    if read.config_class:
        return section in sections_of_class.get(read.config_class, set())
    if not parts:
        # A top-level leaf, read on the tree's root itself (``config.x``, ``self.config.x``).
        return holder in (["config"], ["cfg"])
    if not holder:
        return False
    last = holder[-1].lstrip("_")
    if last in (f"{parts[-1]}_config", f"{parts[-1]}_cfg"):
        return True
    # ``self.engine_config`` on the section the tree builds an ``FSDPEngineConfig`` for.
    stem = last.removesuffix("_config").removesuffix("_cfg").replace("_", "")
    named = {c.lower().removesuffix("config") for c in class_of_section.get(section, set())}
    if stem != last.replace("_", "") and stem and any(t.endswith(stem) for t in named):
        return True
    # ``config.actor_rollout_ref.actor`` / ``self.config.critic``: the trailing parts name it.
    tail = holder[1:] if holder[0] in ("config", "cfg") else holder
    return bool(tail) and parts[-len(tail) :] == tail and len(tail) <= len(parts)


def census(
    verl_parent: Path,
    trees: Mapping[str, Mapping[str, Any]],
    traced: Mapping[str, list[str]],
    copies: Mapping[str, str] | None = None,
    outside: Iterable[str] = (),
) -> list[LeafReads]:
    """Every leaf of the ``trees`` (by name: the default and each ``model_engine`` choice) with
    its reads: ``traced`` (leaf → ``verl/…py:line``) first, then the static reads of the path's
    files; a leaf with none of its own, read where a leaf that copies it is read (``copies``:
    copy → the leaf it interpolates, ``Composer.interpolation_sources``); a leaf or ``outside``
    key (one a script sets that no tree holds, marked so) with no read of its own, read where a
    section above it is handed on whole."""
    sources = _sources(verl_parent)
    by_file = {s.relative: s for s in sources}
    classes = census_reads.config_classes(sources)
    down = _subclasses(sources)
    built: dict[str, set[str]] = {}  # config class → the sections some tree builds it for
    class_of_section: dict[str, set[str]] = {}
    held: dict[str, list[str]] = {}  # leaf → the trees that hold it
    for tree_name, tree in trees.items():
        for name, found in targets(tree).items():
            built.setdefault(name, set()).update(found)
            for section in found:
                class_of_section.setdefault(section, set()).add(name)
        for leaf in leaves(tree):
            held.setdefault(leaf, []).append(tree_name)
    sections_of_class: dict[str, set[str]] = {}
    for name, where in built.items():
        for base, subs in down.items():
            if name in subs:
                sections_of_class.setdefault(base, set()).update(where)
    mentions = _mentions(sources)
    by_name: dict[str, list[StaticRead]] = {}
    for read in static_reads(sources, classes):
        by_name.setdefault(read.name, []).append(read)
    out: list[LeafReads] = []
    spreads = by_name.get(SPREAD, [])
    extra = sorted(set(outside) - set(held))
    for leaf in [*sorted(held), *extra]:
        section, _, name = leaf.rpartition(".")
        in_all = len(held.get(leaf, ())) == len(trees)
        entry = LeafReads(
            leaf, trees=() if in_all else tuple(held.get(leaf, ())), outside=leaf not in held
        )
        for spot in traced.get(leaf, []):
            entry.places.append(_traced_place(spot, by_file, verl_parent))
        traced_at = {place.where: i for i, place in enumerate(entry.places)}
        for read in by_name.get(name, []):
            if read.place.where in traced_at:
                # The probes saw this line read the leaf: the object is its section.
                i = traced_at[read.place.where]
                entry.places[i] = dataclasses.replace(entry.places[i], holder=read.place.holder)
            elif _matches(read, section, sections_of_class, class_of_section):
                entry.places.append(read.place)
            else:
                entry.unmatched.append(read.place)
        if not entry.places:
            entry.places = _passed_whole(leaf, spreads, sections_of_class, class_of_section)
        if not entry.places and not entry.unmatched:
            # Its name is used, but not as a read of a config object the reading recognises.
            entry.unmatched = [Place(w, "", "", "", "mention") for w in mentions.get(name, [])]
        entry.places = _distinct(entry.places)
        entry.unmatched = _distinct(entry.unmatched)
        out.append(entry)
    _through_copies(out, copies or {})
    _as_dict_entries(out, _dict_fields(sources, classes), class_of_section)
    return out


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


def _as_dict_entries(
    entries: list[LeafReads],
    dict_fields: Mapping[tuple[str, str], str],
    class_of_section: Mapping[str, set[str]],
) -> None:
    """A key in no tree that is an entry of such a field (``distillation.teacher_models.gsm8k.key``
    beside the tree's ``teacher_model`` entry) is read as the tree's entries are: the same class
    reads the same field of each, so it takes a decided entry's places, marked so (static: the
    probes traced the tree's entry, not this one)."""
    by_leaf = {e.leaf: e for e in entries}
    for entry in entries:
        if not entry.outside or entry.status != "undecided":
            continue
        parts = entry.leaf.split(".")
        for i in range(len(parts) - 2):
            owner, field_name = ".".join(parts[:i]), parts[i]
            where = next(
                (
                    dict_fields[(cls, field_name)]
                    for cls in sorted(class_of_section.get(owner, set()))
                    if (cls, field_name) in dict_fields
                ),
                "",
            )
            if not where:
                continue
            prefix, rest = ".".join(parts[: i + 1]), ".".join(parts[i + 2 :])
            siblings = sorted(
                (
                    e
                    for leaf, e in by_leaf.items()
                    if leaf.startswith(prefix + ".")
                    and leaf.endswith("." + rest)
                    and leaf.count(".") == entry.leaf.count(".")
                    and not e.outside
                    and e.status != "undecided"
                ),
                key=lambda e: e.leaf,
            )
            if siblings:
                sibling = siblings[0]
                via = f"as {sibling.leaf}: an entry of {field_name} ({where})"
                entry.places = [
                    dataclasses.replace(p, how="static" if p.how == "traced" else p.how, via=via)
                    for p in sibling.places
                ]
                entry.unmatched = []
                break


def _passed_whole(
    leaf: str,
    spreads: list[StaticRead],
    sections_of_class: Mapping[str, set[str]],
    class_of_section: Mapping[str, set[str]],
) -> list[Place]:
    """The places that hand on whole the nearest section above ``leaf`` that any place does."""
    parts = leaf.split(".")
    for depth in range(len(parts) - 1, 0, -1):
        above = ".".join(parts[:depth])
        found = [
            r.place for r in spreads if _matches(r, above, sections_of_class, class_of_section)
        ]
        if found:
            return found
    return []


def _through_copies(entries: list[LeafReads], copies: Mapping[str, str]) -> None:
    """A leaf with no read of its own is read where the leaves copying it are (transitively:
    a copy of a copy); their places join it, marked with the copy and its section."""
    by_leaf = {e.leaf: e for e in entries}
    copied_by: dict[str, list[str]] = {}
    for copy, source in sorted(copies.items()):
        copied_by.setdefault(source, []).append(copy)
    changed = True
    while changed:
        changed = False
        for entry in entries:
            if entry.places:
                continue
            found: list[Place] = []
            for copy in copied_by.get(entry.leaf, []):
                other = by_leaf.get(copy)
                if other is None:
                    continue
                section = copy.rpartition(".")[0]
                found += [
                    dataclasses.replace(
                        p, via=p.via or f"through its copy {copy}", section=p.section or section
                    )
                    for p in other.places
                ]
            if found:
                entry.places = _distinct(found)
                changed = True


def _distinct(places: list[Place]) -> list[Place]:
    """One place per line, a traced one before a static one."""
    best: dict[str, Place] = {}
    for place in sorted(places, key=lambda p: (p.how != "traced", p)):
        best.setdefault(place.where, place)
    return sorted(best.values(), key=lambda p: (_file_line(p.where), p.how))


def _file_line(where: str) -> tuple[str, int]:
    file, _, line = where.rpartition(":")
    return file, int(line) if line.isdigit() else 0


def _traced_place(where: str, by_file: Mapping[str, statements.Source], parent: Path) -> Place:
    file, line = _file_line(where)
    source = by_file.get(file) or statements.parse(str(parent / file), file)
    if source is None:
        return Place(where, "", "", "", "traced")
    statement = source.statement_at(line)
    if statement is None:
        return Place(where, "", "", "", "traced")
    return Place(
        where, source.qualname(statement) or "<module>", "", guard(source, statement), "traced"
    )
