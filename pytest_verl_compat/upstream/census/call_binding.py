"""What a check's condition reads, from upstream's source alone: the configuration fields it names.

The census labels a ``raise``/``assert`` by what decides it, not by the words in its condition
(issue 29: ``ppo_mini_batch_size % ppo_micro_batch_size != 0`` reads two configuration fields,
whatever its words say). A condition reads the configuration when it names, statically:

- a **field of a configuration object**: an attribute, ``.get("…")`` or item of a name or
  attribute that holds a config section (``config``, ``cfg``, ``…_config``, ``…_cfg``, a parameter
  annotated with one of verl's config classes, and ``self`` inside a config class of
  ``verl/workers/config/`` or ``verl/trainer/config/``);
- a **local** assigned in the same function from such a read (``loss_agg_mode =
  self.config.loss_agg_mode``), transitively;
- an **attribute of ``self``** that a method of the same class assigns from such a read
  (``self.loss_agg_mode = config.loss_agg_mode`` in ``__init__``);
- a **parameter its callers pass a configuration value** (one level of call sites in the census's
  files: ``get_adv_estimator_fn(config.algorithm.adv_estimator)`` makes ``name_or_enum`` a read).

Nothing here imports verl; the source is read with ``ast`` only.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field

from pytest_verl_compat.upstream.probes import statements

# Folders whose classes are verl's configuration (dataclasses built from the tree's sections).
CONFIG_FOLDERS = ("verl/workers/config/", "verl/trainer/config/")
_ROOT_NAMES = frozenset({"config", "cfg"})
_ROOT_SUFFIXES = ("_config", "_cfg")
# Attribute names on a config object that are its methods, not fields.
METHODS = frozenset({"get", "items", "keys", "values", "to_dict", "copy", "pop"})

Function = ast.FunctionDef | ast.AsyncFunctionDef


def attribute_chain(node: ast.AST) -> list[str] | None:
    """``["self", "config", "x"]`` for ``self.config.x``, else None (not a plain chain)."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _rooted(part: str) -> bool:
    return part in _ROOT_NAMES or part.endswith(_ROOT_SUFFIXES)


@dataclass
class Context:
    """What holds configuration in one function: the names and ``self`` attributes."""

    config_self: bool = False  # ``self`` is a config object (a config class's method)
    roots: set[str] = field(default_factory=set)  # names that hold a config section
    derived: dict[str, str] = field(default_factory=dict)  # name or self.attr → why


def _annotation_names(node: ast.expr | None) -> set[str]:
    if node is None:
        return set()
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
    }


# Calls whose result is still the value passed in (a number, a string, a copy of a list): a
# configuration value flows through them; any other call makes a new object (an engine, a mesh,
# a tensor) whose checks are that object's, not the configuration's.
_PASS_THROUGH = frozenset(
    {
        "int",
        "float",
        "str",
        "bool",
        "len",
        "min",
        "max",
        "sum",
        "abs",
        "round",
        "tuple",
        "list",
        "set",
        "sorted",
        "getattr",
        "get",
        "lower",
        "upper",
        "strip",
        "split",
    }
)


def _opaque(node: ast.AST) -> list[ast.AST]:
    """The parts of ``node`` whose reads do not flow into its value: an ``if`` expression's test,
    the arguments of a call that builds a new object."""
    if isinstance(node, ast.IfExp):
        return [node.test]
    if isinstance(node, ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if name not in _PASS_THROUGH:
            return [*node.args, *node.keywords]
    return []


def reads(node: ast.AST, context: Context, flow: bool = False) -> list[str]:
    """The configuration reads ``node`` makes, as source text with the reason for derived names
    (``loss_agg_mode ← self.config.loss_agg_mode``), in order, each once. ``flow``: only the
    reads whose value flows into ``node``'s (an assignment's value, an argument passed on)."""
    found: dict[str, None] = {}
    skip: set[int] = set()
    for n in ast.walk(node):
        if id(n) in skip:
            continue
        if flow:
            for part in _opaque(n):
                skip.update(id(inner) for inner in ast.walk(part))
        if isinstance(n, ast.Call) and _getattr_of_config(n, context):
            found[ast.unparse(n)] = None
            continue
        if isinstance(n, ast.Attribute | ast.Name):
            chain = attribute_chain(n)
            if chain is None:
                continue
            hit = _read_of_chain(chain, context)
            if hit is not None:
                found[hit] = None
                # The chain's own prefixes are the same read.
                inner: ast.AST = n
                while isinstance(inner, ast.Attribute):
                    inner = inner.value
                    skip.add(id(inner))
        elif isinstance(n, ast.Subscript):
            chain = attribute_chain(n.value)
            if chain is not None and holds_config(chain, context):
                found[ast.unparse(n)] = None
    return list(found)


def _getattr_of_config(call: ast.Call, context: Context) -> bool:
    """``getattr(config, name)``: a field read by a name computed at run time."""
    if not (isinstance(call.func, ast.Name) and call.func.id == "getattr" and call.args):
        return False
    name = call.args[1] if len(call.args) > 1 else None
    if isinstance(name, ast.Constant) and str(name.value).startswith("_"):
        return False  # a private attribute of the object, no field (``_mutable_fields``)
    chain = attribute_chain(call.args[0])
    return chain is not None and holds_config(chain, context)


def holds_config(chain: list[str], context: Context) -> bool:
    """The chain names a config object itself (a section), not yet a field of one."""
    if chain == ["self"]:
        return context.config_self
    if len(chain) == 1:
        return chain[0] in context.roots or _rooted(chain[0])
    return _rooted(chain[-1])


def _read_of_chain(chain: list[str], context: Context) -> str | None:
    text = ".".join(chain)
    # A derived local or self attribute, read whole.
    for length in range(len(chain), 0, -1):
        prefix = ".".join(chain[:length])
        if prefix in context.derived:
            return f"{text} ← {context.derived[prefix]}"
    # A field of a config object: some proper prefix holds config and the next part is a field.
    for length in range(1, len(chain)):
        if not holds_config(chain[:length], context):
            continue
        part = chain[length]
        # A field, or ``.get``; not a method, nor a private or dunder attribute of the object
        # (``self.__dict__`` in BaseConfig's own frozen check is no configuration value).
        if part == "get" or (part not in METHODS and not part.startswith("_")):
            return text
    return None


@dataclass
class Index:
    """The census files' functions and calls, for the one level of call-site analysis."""

    # A function's id → the parameters its callers pass configuration, with the call site.
    passed: dict[int, dict[str, str]] = field(default_factory=dict)
    # A class's id → ``self.attr`` assigned from configuration in any of its methods.
    attributes: dict[int, dict[str, str]] = field(default_factory=dict)


def _is_config_class(source: statements.Source, node: ast.ClassDef) -> bool:
    if source.relative.startswith(CONFIG_FOLDERS):
        return True
    bases = {b for base in node.bases for b in _annotation_names(base)}
    return "BaseConfig" in bases or node.name.endswith("Config")


def _enclosing_class(source: statements.Source, node: ast.AST) -> ast.ClassDef | None:
    for ancestor in source.ancestors(node):
        if isinstance(ancestor, ast.ClassDef):
            return ancestor
        if isinstance(ancestor, Function) and ancestor is not node:
            # A nested function's ``self`` is its method's.
            continue
    return None


def context_of(
    source: statements.Source,
    function: Function | None,
    index: Index,
    config_classes: frozenset[str],
) -> Context:
    """The config holders of ``function`` (a module-level statement: none but the root names)."""
    context = Context()
    if function is None:
        return context
    owner = _enclosing_class(source, function)
    if owner is not None:
        context.config_self = _is_config_class(source, owner)
        context.derived.update(index.attributes.get(id(owner), {}))
    arguments = function.args
    for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
        if _annotation_names(arg.annotation) & config_classes or _rooted(arg.arg):
            context.roots.add(arg.arg)
    context.derived.update(index.passed.get(id(function), {}))
    _derive_locals(function, context)
    return context


def _derive_locals(function: Function, context: Context) -> None:
    """Locals assigned from configuration reads, to a fixed point (chains of assignments)."""
    assignments: list[tuple[set[str], ast.AST, int]] = []
    for node in ast.walk(function):
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            value = node.value
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, ast.For | ast.AsyncFor):
            value, targets = node.iter, [node.target]
        else:
            continue
        if value is None:
            continue
        names = {
            n.id
            for target in targets
            for n in ast.walk(target)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
        }
        if names:
            assignments.append((names, value, node.lineno))
    changed = True
    while changed:
        changed = False
        for names, assigned, line in assignments:
            if all(name in context.derived or name in context.roots for name in names):
                continue
            found = reads(assigned, context, flow=True)
            if not found:
                continue
            for name in names - set(context.derived) - context.roots:
                context.derived[name] = f"line {line}: {_short(found[0])}"
                changed = True


def _short(text: str) -> str:
    return text.split(" ← ")[0]


def config_classes(sources: Iterable[statements.Source]) -> frozenset[str]:
    """Names of verl's configuration classes among ``sources``."""
    return frozenset(
        node.name
        for source in sources
        for node in source.nodes
        if isinstance(node, ast.ClassDef) and _is_config_class(source, node)
    )


# Rounds of the call-site analysis: a value passed on through this many calls is still found
# (``apply_kl_penalty(kl_penalty=…)`` → ``kl_penalty(…)`` → ``kl_penalty_forward(…)``).
MAX_ROUNDS = 4


def build_index(sources: list[statements.Source], classes: frozenset[str]) -> Index:
    """``self`` attributes assigned from configuration, and the parameters callers pass it, to a
    fixed point (at most ``MAX_ROUNDS``), each round reading call sites with the last round's."""
    callees = callees_by_name(sources)
    index = Index()
    for _ in range(MAX_ROUNDS):
        fresh = Index(
            attributes={k: dict(v) for k, v in index.attributes.items()},
            passed={k: dict(v) for k, v in index.passed.items()},
        )
        for source in sources:
            for node in source.nodes:
                if isinstance(node, ast.ClassDef):
                    fresh.attributes.setdefault(id(node), {}).update(
                        _attributes(source, node, index, classes)
                    )
        # Each function's context is the same for every call in it within a round (it reads the
        # last round's index only): built once per function, not once per call (~18,000 calls).
        contexts: dict[int, Context] = {}
        for source in sources:
            for call in source.nodes:
                if isinstance(call, ast.Call):
                    _passed(source, call, callees, index, fresh, classes, contexts)
        if fresh == index:
            break
        index = fresh
    return index


def _attributes(
    source: statements.Source, node: ast.ClassDef, index: Index, classes: frozenset[str]
) -> dict[str, str]:
    found: dict[str, str] = {}
    for method in node.body:
        if not isinstance(method, Function):
            continue
        context = context_of(source, method, index, classes)
        for statement in source.walk(method):
            if not isinstance(statement, ast.Assign | ast.AnnAssign) or statement.value is None:
                continue
            value_reads = reads(statement.value, context, flow=True)
            if not value_reads:
                continue
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for target in targets:
                chain = attribute_chain(target)
                if chain is not None and len(chain) == 2 and chain[0] == "self":
                    found.setdefault(
                        ".".join(chain),
                        f"{source.relative}:{statement.lineno}: {_short(value_reads[0])}",
                    )
    return found


Callees = dict[str, list[tuple[Function, bool]]]


def callees_by_name(sources: list[statements.Source]) -> Callees:
    """The census's functions by the names a call uses: a function by its name, a class by its
    name (its ``__init__``), a method also by ``Class.method``."""
    by_name: Callees = {}
    for source in sources:
        for node in source.nodes:
            if isinstance(node, Function):
                owner = _enclosing_class(source, node)
                by_name.setdefault(node.name, []).append((node, owner is not None))
                if owner is not None:
                    by_name.setdefault(f"{owner.name}.{node.name}", []).append((node, True))
                    if node.name == "__init__":
                        by_name.setdefault(owner.name, []).append((node, True))
    return by_name


def callee_of(call: ast.Call, callees: Callees) -> tuple[Function, bool] | None:
    """The one function a call reaches by name (``cls.new`` and ``self.m`` only when the name is
    unique among the census's functions); None when the name is ambiguous or unknown."""
    func = call.func
    if isinstance(func, ast.Name):
        found = callees.get(func.id, [])
    elif isinstance(func, ast.Attribute):
        owner = attribute_chain(func.value)
        qualified = callees.get(f"{owner[-1]}.{func.attr}", []) if owner else []
        # A dunder by its bare name is any class's (``object.__setattr__(obj, …)`` is not
        # BaseConfig's, and passes the instance itself): only ``Class.__x__`` resolves.
        bare = [] if func.attr.startswith("__") else callees.get(func.attr, [])
        found = qualified or bare
    else:
        return None
    return found[0] if len(found) == 1 else None


def arguments_bound(
    call: ast.Call, callee: Function, is_method: bool
) -> list[tuple[str, ast.expr]]:
    """(parameter, argument) of a call: positional ones by position (a method's ``self`` or
    ``cls`` skipped), then the keywords by name."""
    params = [a.arg for a in [*callee.args.posonlyargs, *callee.args.args]]
    if is_method and params and params[0] in ("self", "cls"):
        params = params[1:]
    pairs: list[tuple[str, ast.expr]] = list(zip(params, call.args, strict=False))
    return pairs + [(k.arg, k.value) for k in call.keywords if k.arg is not None]


def _passed(
    source: statements.Source,
    call: ast.Call,
    callees: Callees,
    index: Index,
    fresh: Index,
    classes: frozenset[str],
    contexts: dict[int, Context],
) -> None:
    target = callee_of(call, callees)
    if target is None:
        return
    callee, is_method = target
    function = source.function(call)
    context = contexts.get(id(function))
    if context is None:
        context = contexts[id(function)] = context_of(source, function, index, classes)
    for param, argument in arguments_bound(call, callee, is_method):
        if isinstance(argument, ast.Starred):
            continue
        found = reads(argument, context, flow=True)
        if found:
            fresh.passed.setdefault(id(callee), {}).setdefault(
                param, f"{source.relative}:{call.lineno}: {_short(found[0])}"
            )
