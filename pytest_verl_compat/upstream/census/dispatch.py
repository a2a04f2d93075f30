"""Which classes a configuration can build: verl's registries, read from its source.

A method runs only on an object of its class or a subclass, and verl builds many of its classes
through a registry keyed by a configuration value: ``EngineRegistry.new(backend=engine_config.
strategy)`` (verl/workers/engine_workers.py:135-137) builds the engine registered for that backend
(verl/workers/engine/base.py:349-390), ``get_trainer_cls(config.trainer.v1.trainer_mode)``
(verl/trainer/main_ppo.py:142) the trainer registered under that mode, ``get_reward_manager_cls
(reward_manager_cfg.name)`` (verl/trainer/ppo/reward.py:93-95) the reward manager, and
``CheckpointEngineRegistry.new(backend, …)`` the checkpoint engine. This module finds, from the
release's own files:

- the registrations: a class decorated by ``X.register(…)`` (a registry class) or by a
  module-level ``register…(name)`` function that stores the class in a dict of its module, with
  the names it is registered under;
- the lookups: a call of the registry class (``X.new``, ``X.get``) or of a function of the
  registry's module that reads that dict, and the configuration leaves its key argument holds
  (a chain of the tree, a local assigned from one, an ``…_config`` object named like the config
  class built for some sections: every such section's leaf);
- the classes constructed by name anywhere (``Cls(…)``, or the name in a string, a ``_target_``):
  those are built whatever the registry says.

``conjunct`` then gives, for a method of a class, the condition in the off-path index's normal
form under which some lookup can build it (``L['a.strategy'] in ['fsdp', 'fsdp2'] or …``), or
nothing when the reading cannot bound it. A lookup under a configuration ``if`` counts only when
that ``if`` holds (``source == 'register'``, reward.py:92): otherwise another branch may build a
subclass of the user's.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pytest_verl_compat.upstream.census import normal_form, static_reads
from pytest_verl_compat.upstream.census.call_binding import attribute_chain
from pytest_verl_compat.upstream.probes import statements

# A selecting leaf in normal form: a section this configuration lacks builds nothing, so a leaf
# it lacks is None here (``L``, a guard's leaf, is not decided when absent).
SELECTOR = "D"
# How many local assignments a lookup's key is followed back through.
_DEPTH = 3


@dataclass(frozen=True)
class Registration:
    registry: str
    cls: str
    names: frozenset[str]


@dataclass
class Lookup:
    """One lookup site: the leaves its key may hold (None: not known), and its guard's normal
    form (``""``: none, or one the configuration does not decide)."""

    where: str
    leaves: tuple[str, ...] | None
    guard: str = ""


@dataclass
class Dispatch:
    registrations: list[Registration] = field(default_factory=list)
    lookups: dict[str, list[Lookup]] = field(default_factory=dict)  # registry → its lookups
    constructed: set[str] = field(default_factory=set)  # classes built by name (qualified)
    bases: dict[str, set[str]] = field(default_factory=dict)  # qualified class → its bases

    def descendants(self, cls: str) -> set[str]:
        """``cls`` and every class deriving from it (by name)."""
        found = {cls}
        changed = True
        while changed:
            changed = False
            for name, parents in self.bases.items():
                if name not in found and parents & found:
                    found.add(name)
                    changed = True
        return found


def _callee_chain(node: ast.AST) -> list[str] | None:
    return attribute_chain(node.func) if isinstance(node, ast.Call) else None


def _strings(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return {
            e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
        }
    return set()


@dataclass
class _FunctionRegistry:
    """A module-level ``register…(name)`` decorator that stores classes in a dict of its module."""

    module: str
    function: str
    store: str  # the dict's name


def _imports(source: statements.Source, module: str) -> dict[str, str]:
    """Name → ``module.name`` it is imported as, for this file's ``from … import`` statements."""
    out: dict[str, str] = {}
    package = module.rpartition(".")[0]
    for node in source.nodes:
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                out[alias.asname or alias.name] = f"{base}.{alias.name}"
    return out


def _module_of(relative: str) -> str:
    return relative.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _function_registries(sources: list[statements.Source]) -> dict[str, _FunctionRegistry]:
    """``module.function`` → the registry a decorator function of that module keeps: a function
    whose body stores its argument under ``DICT[name] = cls`` in a module-level dict."""
    found: dict[str, _FunctionRegistry] = {}
    for source in sources:
        module = _module_of(source.relative)
        globals_ = {
            t.id
            for node in source.tree.body
            if isinstance(node, ast.Assign | ast.AnnAssign)
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(t, ast.Name)
        }
        for node in source.tree.body:
            if not isinstance(node, ast.FunctionDef):
                continue
            for inner in ast.walk(node):
                if (
                    isinstance(inner, ast.Assign)
                    and len(inner.targets) == 1
                    and isinstance(inner.targets[0], ast.Subscript)
                    and isinstance(inner.targets[0].value, ast.Name)
                    and inner.targets[0].value.id in globals_
                ):
                    store = inner.targets[0].value.id
                    found[f"{module}.{node.name}"] = _FunctionRegistry(module, node.name, store)
                    break
    return found


def _lookup_functions(
    sources: list[statements.Source], registries: Mapping[str, _FunctionRegistry]
) -> dict[str, tuple[str, int]]:
    """``module.function`` → (its registry, the position of the parameter it looks up): a
    function of the registry's module that subscripts (or ``.get``s) the registry's dict with a
    parameter of its own."""
    by_module: dict[str, list[_FunctionRegistry]] = {}
    for registry in registries.values():
        by_module.setdefault(registry.module, []).append(registry)
    found: dict[str, tuple[str, int]] = {}
    for source in sources:
        module = _module_of(source.relative)
        for registry in by_module.get(module, []):
            for node in source.tree.body:
                if not isinstance(node, ast.FunctionDef) or node.name == registry.function:
                    continue
                params = [a.arg for a in node.args.args]
                for inner in ast.walk(node):
                    key: ast.AST | None = None
                    if (
                        isinstance(inner, ast.Subscript)
                        and isinstance(inner.ctx, ast.Load)
                        and isinstance(inner.value, ast.Name)
                        and inner.value.id == registry.store
                    ):
                        key = inner.slice
                    elif (
                        isinstance(inner, ast.Call)
                        and _callee_chain(inner) == [registry.store, "get"]
                        and inner.args
                    ):
                        key = inner.args[0]
                    if isinstance(key, ast.Name) and key.id in params:
                        registry_id = f"{registry.module}.{registry.function}"
                        found[f"{module}.{node.name}"] = (registry_id, params.index(key.id))
                        break
    return found


class _Resolver:
    """The leaves a lookup's key expression may hold, on the trees' ``known`` leaves."""

    def __init__(
        self,
        known: Mapping[str, object],
        classes_of: Mapping[str, set[str]],
        copied: Callable[[str], str | None],
    ) -> None:
        self.known, self.classes_of, self.copied = known, classes_of, copied

    def leaves(
        self, node: ast.AST, source: statements.Source, function: ast.AST | None
    ) -> tuple[str, ...] | None:
        chain = self._chain(node, function, _DEPTH)
        if not chain:
            return None
        found = (
            self._by_annotation(chain, function) or self._by_path(chain) or self._by_class(chain)
        )
        if not found:
            return None
        resolved = [self.copied(leaf) for leaf in sorted(found)]
        if any(leaf is None for leaf in resolved):
            return None  # a leaf verl assigns to before the lookup reads it
        return tuple(sorted({leaf for leaf in resolved if leaf is not None}))

    def _chain(self, node: ast.AST, function: ast.AST | None, depth: int) -> list[str] | None:
        if (
            isinstance(node, ast.Call)
            and (_callee_chain(node) or [""])[-1] in normal_form.CONVERTERS
            and len(node.args) == 1
        ):
            node = node.args[0]
        chain = static_reads.key_chain(node)
        if chain is None:
            return None
        if len(chain) >= 1 and function is not None and depth > 0 and chain[0] != "self":
            value = normal_form.assigned_once(function, chain[0])
            if value is not None:
                head = self._chain(value, function, depth - 1)
                return [*head, *chain[1:]] if head else None
        return chain

    def _by_path(self, chain: list[str]) -> set[str]:
        """The leaves whose path ends with the chain below its root (``self.config.a.b``:
        ``a.b``, or ``x.a.b`` where the object is a section: every leaf so ending)."""
        rest = chain[1:] if chain[0] == "self" else chain
        if rest and rest[0] in ("config", "cfg"):
            rest = rest[1:]
        elif rest and rest[0].endswith(("_config", "_cfg")):
            # ``self.rollout_config.checkpoint_engine.backend``: the object names its section.
            stem = rest[0].lstrip("_").removesuffix("_config").removesuffix("_cfg")
            rest = [stem, *rest[1:]]
        if not rest:
            return set()
        tail = ".".join(rest)
        if tail in self.known:
            return {tail}
        if len(rest) < 2:
            return set()
        return {leaf for leaf in self.known if leaf.endswith("." + tail)}

    def _by_annotation(self, chain: list[str], function: ast.AST | None) -> set[str]:
        """``config.backend`` where the function's parameter ``config`` is annotated with a
        config class (``config: CheckpointEngineConfig``): the field of every section built as
        that class."""
        args = getattr(function, "args", None)
        if args is None or len(chain) < 2:
            return set()
        param = next(
            (a for a in [*args.posonlyargs, *args.args, *args.kwonlyargs] if a.arg == chain[0]),
            None,
        )
        annotation = param.annotation if param is not None else None
        if annotation is None:
            return set()
        names = {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)}
        found = set()
        for section, classes in self.classes_of.items():
            if classes & names:
                leaf = ".".join([section, *chain[1:]])
                if leaf in self.known:
                    found.add(leaf)
        return found

    def _by_class(self, chain: list[str]) -> set[str]:
        """``engine_config.strategy``: the field of every section built as a config class that
        the object's name names (``FSDPEngineConfig`` and ``McoreEngineConfig`` for
        ``engine_config``), as the read census matches such objects."""
        rest = [p for p in chain if p != "self"]
        if len(rest) != 2:
            return set()
        holder, name = rest
        stem = holder.lstrip("_").removesuffix("_config").removesuffix("_cfg").replace("_", "")
        if not stem or stem == holder.replace("_", ""):
            return set()
        found = set()
        for section, classes in self.classes_of.items():
            if any(c.lower().removesuffix("config").endswith(stem) for c in classes):
                leaf = f"{section}.{name}"
                if leaf in self.known:
                    found.add(leaf)
        return found


def scan(
    sources: list[statements.Source],
    known: Mapping[str, object],
    classes_of: Mapping[str, set[str]],
    copied: Callable[[str], str | None],
    normalise: Callable[[str, Callable[[list[str]], str | None]], str],
) -> Dispatch:
    """The registrations, lookups and constructions of the whole package (``sources``).
    ``copied``: the leaf whose value a leaf holds when verl reads it (``off_path._copied``);
    ``normalise``: a guard's text in normal form given a chain → leaf resolver."""
    dispatch = Dispatch()
    function_registries = _function_registries(sources)
    lookup_functions = _lookup_functions(sources, function_registries)
    by_name: dict[str, set[str]] = {}  # class name → its qualified names
    class_registries: dict[str, str] = {}  # registry class → the keyword its key is passed as
    for source in sources:
        module = _module_of(source.relative)
        for node in source.tree.body:
            if isinstance(node, ast.ClassDef):
                by_name.setdefault(node.name, set()).add(f"{module}.{node.name}")
    for source in sources:
        module = _module_of(source.relative)
        imports = _imports(source, module)
        for node in source.tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            qualified = f"{module}.{node.name}"
            dispatch.bases.setdefault(qualified, set()).update(
                _class_named(b, imports, module, by_name) for b in node.bases
            )
            for decorator in node.decorator_list:
                registration = _registration(
                    decorator, qualified, imports, module, function_registries
                )
                if registration is not None:
                    dispatch.registrations.append(registration[0])
                    if registration[0].registry[:1].isupper():
                        class_registries[registration[0].registry] = registration[1] or ""
    resolver = _Resolver(known, classes_of, copied)
    for source in sources:
        module = _module_of(source.relative)
        imports = _imports(source, module)
        for item in source.nodes:
            if isinstance(item, ast.Constant) and isinstance(item.value, str):
                # A class named in a string (a ``_target_``, an import path): built by name.
                last = item.value.rpartition(".")[2]
                if last != item.value:
                    named = {q for q in by_name.get(last, set()) if q == item.value}
                    dispatch.constructed |= named or by_name.get(last, set())
                continue
            if not isinstance(item, ast.Call):
                continue
            chain = _callee_chain(item) or []
            if len(chain) == 1 and chain[0] in by_name:
                dispatch.constructed.add(_class_named(item.func, imports, module, by_name))
                continue
            target = _lookup_target(chain, imports, module, class_registries, lookup_functions)
            if target is None:
                continue
            registry, position, keyword = target
            key = next((k.value for k in item.keywords if keyword and k.arg == keyword), None)
            if key is None and position is not None and len(item.args) > position:
                key = item.args[position]
            function = source.function(item)
            where = f"{source.relative}:{item.lineno}"
            leaves = resolver.leaves(key, source, function) if key is not None else None
            guard = _lookup_guard(source, item, function, resolver, normalise)
            dispatch.lookups.setdefault(registry, []).append(Lookup(where, leaves, guard))
    return dispatch


def _class_named(
    node: ast.AST, imports: Mapping[str, str], module: str, by_name: Mapping[str, set[str]]
) -> str:
    """The qualified name of the class a name of a file means: its own module's, its import's,
    or, when neither is known, the one class of that name (else the name itself)."""
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    candidates = by_name.get(name, set())
    for qualified in (f"{module}.{name}", imports.get(name, "")):
        if qualified in candidates:
            return qualified
    imported = imports.get(name, "")
    # Imported through a package that re-exports it: the class of that name below the package.
    below = [q for q in candidates if imported and q.startswith(imported.rpartition(".")[0] + ".")]
    if len(below) == 1:
        return below[0]
    return next(iter(candidates)) if len(candidates) == 1 else name


def _registration(
    decorator: ast.AST,
    cls: str,
    imports: Mapping[str, str],
    module: str,
    function_registries: Mapping[str, _FunctionRegistry],
) -> tuple[Registration, str | None] | None:
    """The registration a class decorator makes, with the keyword a registry class's lookups
    pass the key by (None for a function registry, looked up by position)."""
    if not isinstance(decorator, ast.Call):
        return None
    chain = _callee_chain(decorator) or []
    if len(chain) == 2 and chain[1] == "register":
        for keyword in decorator.keywords:
            if keyword.arg in ("backend", "name"):
                names = _strings(keyword.value)
                if names:
                    return Registration(chain[0], cls, frozenset(names)), keyword.arg
        if decorator.args and _strings(decorator.args[0]):
            return Registration(chain[0], cls, frozenset(_strings(decorator.args[0]))), None
        return None
    if len(chain) == 1 and decorator.args:
        qualified = _qualified(chain[0], imports, module, function_registries)
        if qualified in function_registries and _strings(decorator.args[0]):
            return Registration(qualified, cls, frozenset(_strings(decorator.args[0]))), None
    return None


def _qualified(
    name: str, imports: Mapping[str, str], module: str, known: Mapping[str, object]
) -> str:
    """The qualified name a file's ``name`` refers to: its import (or its own module's), or,
    imported through the package that re-exports it (``from verl.trainer.ppo.v1 import
    get_trainer_cls``), the one known function of that name in a module of that package."""
    qualified = imports.get(name, f"{module}.{name}")
    if qualified in known or name not in imports:
        return qualified
    package = imports[name].rpartition(".")[0]
    same = [
        q
        for q in known
        if q.rpartition(".")[2] == name and q.rpartition(".")[0].rpartition(".")[0] == package
    ]
    return same[0] if len(same) == 1 else qualified


def _lookup_target(
    chain: list[str],
    imports: Mapping[str, str],
    module: str,
    class_registries: Mapping[str, str],
    lookup_functions: Mapping[str, tuple[str, int]],
) -> tuple[str, int | None, str | None] | None:
    """(registry, the key's position, the key's keyword) when a call looks a registry up."""
    if len(chain) == 2 and chain[0] in class_registries and chain[1] != "register":
        return chain[0], 0, class_registries[chain[0]]
    if len(chain) == 1:
        qualified = _qualified(chain[0], imports, module, lookup_functions)
        if qualified in lookup_functions:
            registry, position = lookup_functions[qualified]
            return registry, position, None
    return None


def _lookup_guard(
    source: statements.Source,
    node: ast.AST,
    function: ast.AST | None,
    resolver: _Resolver,
    normalise: Callable[[str, Callable[[list[str]], str | None]], str],
) -> str:
    """The lookup's guard in normal form when every name in it is a leaf; else ""."""
    text = static_reads.guard(source, node, shown=None)
    if not text:
        return ""

    def resolve(chain: list[str]) -> str | None:
        try:
            parsed = ast.parse(".".join(chain), mode="eval").body
        except SyntaxError:
            return None
        found = resolver.leaves(parsed, source, function)
        return found[0] if found and len(found) == 1 else None

    normal = normalise(text, resolve)
    return "" if "UNKNOWN" in normal else normal


def conjunct(cls: str, dispatch: Dispatch) -> str:
    """The condition (normal form) under which a method of ``cls`` (qualified) can run because
    some lookup builds it or a subclass; "" when the reading cannot bound it (built by name somewhere, not
    registered, or a lookup whose key it cannot place)."""
    family = dispatch.descendants(cls)
    if family & dispatch.constructed:
        return ""
    by_registry: dict[str, set[str]] = {}
    for registration in dispatch.registrations:
        if registration.cls in family:
            by_registry.setdefault(registration.registry, set()).update(registration.names)
    if not by_registry:
        return ""
    registered = {r.cls for r in dispatch.registrations}
    # A subclass no registry holds is built some other way (or never): not bounded here.
    concrete = {c for c in family if not dispatch.descendants(c) - {c}}
    if concrete - registered:
        return ""
    parts = []
    for registry, names in sorted(by_registry.items()):
        lookups = dispatch.lookups.get(registry, [])
        if not lookups or any(lookup.leaves is None for lookup in lookups):
            return ""
        for lookup in lookups:
            assert lookup.leaves is not None
            selects = " or ".join(
                f"{SELECTOR}[{leaf!r}] in {sorted(names)!r}" for leaf in lookup.leaves
            )
            parts.append(f"not ({lookup.guard}) or {selects}" if lookup.guard else selects)
    return " or ".join(f"({p})" if " or " in p and len(parts) > 1 else p for p in parts)


def registered_classes(dispatch: Dispatch) -> Iterable[str]:
    return sorted({r.cls for r in dispatch.registrations})


def verl_sources(verl_parent: Path) -> list[statements.Source]:
    """Every module of the package (parsed once per process: ``statements.parse`` keeps them)."""
    out = []
    for path in sorted((verl_parent / "verl").rglob("*.py")):
        relative = path.relative_to(verl_parent).as_posix()
        source = statements.parse(str(path), relative)
        if source is not None:
            out.append(source)
    return out
