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
from collections.abc import Callable, Iterable
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
    # Batch metadata keys some census file sets from configuration (``Index.carried``).
    carried: dict[str, str] = field(default_factory=dict)


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
        carried = _metadata_key(n)
        if carried is not None and carried in context.carried:
            found[f"{ast.unparse(n)} ← {context.carried[carried]}"] = None
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
    # A batch metadata key → where a census file sets it from configuration: the trainer hands
    # the engine its mini-batch size in the batch (``"mini_batch_size": ppo_mini_batch_size``,
    # verl/trainer/ppo/v1/trainer_base.py:1674-1697), which ``TrainingWorker.train_mini_batch``
    # pops and asserts on (verl/workers/engine_workers.py:254-266).
    carried: dict[str, str] = field(default_factory=dict)


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
    context.carried = index.carried
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


# How verl hands configuration to a worker inside the batch: ``tu.assign_non_tensor(data, k=v)``,
# ``tu.assign_non_tensor_data(data, "k", v)`` (verl/utils/tensordict_utils.py:26, :76), a
# ``meta_info``/``extra_info`` entry, or a dict of them (``batch.extra_info.update({...})``);
# and how it is read back: ``tu.get``/``tu.pop``/``tu.get_non_tensor_data(data, key="k")``
# (tensordict_utils.py:135, :662, :737) or ``…meta_info["k"]``/``.get("k")``.
_METADATA_SETTERS = frozenset({"assign_non_tensor", "assign_non_tensor_data"})
_METADATA_GETTERS = frozenset({"get", "pop", "get_non_tensor_data"})
_METADATA_HOLDERS = ("meta_info", "extra_info")
# How the census files name verl.utils.tensordict_utils (``from verl.utils import tensordict_utils
# as tu``).
_TENSORDICT_UTILS = ("tu", "tensordict_utils")


def _constant_key(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _holder(node: ast.AST) -> bool:
    chain = attribute_chain(node)
    return chain is not None and chain[-1].endswith(_METADATA_HOLDERS)


def _metadata_key(node: ast.AST) -> str | None:
    """The metadata key ``node`` reads back from a batch, or None."""
    if isinstance(node, ast.Subscript) and _holder(node.value):
        return _constant_key(node.slice)
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    name = node.func.attr
    if name == "get" and _holder(node.func.value) and node.args:
        return _constant_key(node.args[0])  # ``data.meta_info.get("k")``
    receiver = attribute_chain(node.func.value)
    if name in _METADATA_GETTERS and receiver is not None and receiver[-1] in _TENSORDICT_UTILS:
        key = next((k.value for k in node.keywords if k.arg == "key"), None)
        if key is None and len(node.args) >= 2:
            key = node.args[1]
        return _constant_key(key)
    return None


def _metadata_writes(node: ast.AST) -> list[tuple[str, ast.expr]]:
    """(key, value) of the batch metadata ``node`` writes."""
    out: list[tuple[str, ast.expr]] = []
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        name = node.func.attr
        if name == "assign_non_tensor":
            out += [(k.arg, k.value) for k in node.keywords if k.arg is not None]
        elif name == "assign_non_tensor_data" and len(node.args) >= 3:
            key = _constant_key(node.args[1])
            if key is not None:
                out.append((key, node.args[2]))
        elif name == "update" and _holder(node.func.value) and node.args:
            out += _dict_items(node.args[0])
        out += [
            item
            for k in node.keywords
            if k.arg in _METADATA_HOLDERS
            for item in _dict_items(k.value)
        ]
    elif isinstance(node, ast.Assign):
        for target in node.targets:
            if isinstance(target, ast.Subscript) and _holder(target.value):
                key = _constant_key(target.slice)
                if key is not None:
                    out.append((key, node.value))
            elif _holder(target):
                out += _dict_items(node.value)
    return out


def _dict_items(node: ast.AST) -> list[tuple[str, ast.expr]]:
    if not isinstance(node, ast.Dict):
        return []
    return [
        (key, value)
        for k, value in zip(node.keys, node.values, strict=True)
        if (key := _constant_key(k)) is not None
    ]


def _carried(
    sources: list[statements.Source],
    index: Index,
    classes: frozenset[str],
    contexts: dict[int, Context],
) -> dict[str, str]:
    """Batch metadata keys set from configuration anywhere in ``sources`` (a dict assigned to a
    local named like a holder, ``extra_info = {...}``, counts as the holder's)."""
    found: dict[str, str] = {}
    for source in sources:
        for node in source.nodes:
            writes = _metadata_writes(node)
            if not writes:
                continue
            function = source.function(node)
            context = contexts.get(id(function))
            if context is None:
                context = contexts[id(function)] = context_of(source, function, index, classes)
            for key, value in writes:
                hit = reads(value, context, flow=True)
                if hit and key not in found:
                    line = getattr(node, "lineno", 0)
                    found[key] = f"batch metadata {key!r} set at {source.relative}:{line}"
    return found


# Rounds of the call-site analysis: a value passed on through this many calls is still found
# (``apply_kl_penalty(kl_penalty=…)`` → ``kl_penalty(…)`` → ``kl_penalty_forward(…)``).
MAX_ROUNDS = 4


def build_index(
    sources: list[statements.Source],
    classes: frozenset[str],
    configured: Callable[[str, str], str] | None = None,
) -> Index:
    """``self`` attributes assigned from configuration, and the parameters callers pass it, to a
    fixed point (at most ``MAX_ROUNDS``), each round reading call sites with the last round's.
    ``configured(file, function)``: why a function's arguments are configuration where no call
    site shows it (a ``**kwargs`` dict: ``census_reasons.yaml``), else ""; its parameters count
    as passed configuration, and so do the ``self`` attributes it assigns from them."""
    callees = callees_by_name(sources)
    index = Index(passed=_configured_parameters(sources, configured) if configured else {})
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
    index.carried = _carried(sources, index, classes, {})
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


# A configuration value's types (a leaf of the tree): a parameter annotated otherwise (a callback,
# an engine) is no configuration, whatever its function's arguments are.
_SCALARS = frozenset({"int", "float", "str", "bool", "None", "Optional", "Union"})


def _configured_parameters(
    sources: list[statements.Source], configured: Callable[[str, str], str]
) -> dict[int, dict[str, str]]:
    out: dict[int, dict[str, str]] = {}
    for source in sources:
        for node in source.nodes:
            if not isinstance(node, Function):
                continue
            # ``qualname`` names the function holding a node: its own body's first statement's.
            why = configured(source.relative, source.qualname(node.body[0]))
            if not why:
                continue
            arguments = node.args
            out[id(node)] = {
                a.arg: f"{source.relative}:{node.lineno}: {why}"
                for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
                if _annotation_names(a.annotation) and _annotation_names(a.annotation) <= _SCALARS
            }
    return out


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


def callee_of(
    call: ast.Call, callees: Callees, own_classes: tuple[str, ...] = ()
) -> tuple[Function, bool] | None:
    """The one function a call reaches by name; None when the name is ambiguous or unknown.
    ``self.m``/``cls.m`` in a method of ``own_classes[0]`` (its bases after it) is that class's
    ``m`` first: ``CriticConfig.__post_init__`` calling ``self._check_mutually_exclusive`` reaches
    CriticConfig's, not ActorConfig's method of the same name (verl/workers/config/critic.py:110,
    :134; actor.py:249); otherwise ``cls.new`` and ``self.m`` only when the name is unique among
    the census's functions."""
    func = call.func
    if isinstance(func, ast.Name):
        found = callees.get(func.id, [])
    elif isinstance(func, ast.Attribute):
        owner = attribute_chain(func.value)
        if owner in (["self"], ["cls"]):
            for name in own_classes:
                own = callees.get(f"{name}.{func.attr}", [])
                if len(own) == 1:
                    return own[0]
        qualified = callees.get(f"{owner[-1]}.{func.attr}", []) if owner else []
        # A dunder by its bare name is any class's (``object.__setattr__(obj, …)`` is not
        # BaseConfig's, and passes the instance itself): only ``Class.__x__`` resolves.
        bare = [] if func.attr.startswith("__") else callees.get(func.attr, [])
        found = qualified or bare
    else:
        return None
    return found[0] if len(found) == 1 else None


def own_classes(source: statements.Source, function: Function | None) -> tuple[str, ...]:
    """The class whose method ``function`` is, then the names of its bases (no class: none)."""
    owner = _enclosing_class(source, function) if function is not None else None
    if owner is None:
        return ()
    return (owner.name, *sorted({b for base in owner.bases for b in _annotation_names(base)}))


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
    function = source.function(call)
    target = callee_of(call, callees, own_classes(source, function))
    if target is None:
        return
    callee, is_method = target
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
