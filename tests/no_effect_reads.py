"""A proof from the release's own source that nothing on a run's path reads a key: the test's own
reading, independent of the read census and of the probes (tests/test_no_effect_adversarial.py).

Every use of the key's name in the release's modules the entry point can import (an attribute
``x.name`` read, or the string ``"name"``: ``get``, ``getattr``, a subscript) must be shown off the
path by one of:

- **not imported**: its module is outside the entry point's import closure (every ``import`` of
  every module reached, in any function, with every ``verl.…`` string and the configuration's
  ``_target_`` modules as roots too);
- **another object's**: ``self.name`` in a class outside the lineage of the key's config class:
  the config class of another section (its own field of that name), or a class that sets the
  attribute itself and that nothing on the path builds from a whole section (``C(**section)``);
  a value copied in by name is a read of the name, itself one of the uses checked;
- **a guard**: an enclosing ``if`` (or conditional expression) whose test the values decide against
  the branch, each attribute chain in it standing for every value of that name in the key's role
  section (else its top-level section), as upstream's config classes hold it after their own
  conversion (a ``__post_init__`` may rewrite it), and a local name for the chain it was assigned
  from;
- **a class no registry builds**: a method of a class registered (``@…register(backend=…)``) only
  for backends none of those ``strategy`` values names, that no module constructs itself (the
  registry's lookups pass a ``.strategy``, verl/workers/engine_workers.py:135-137).

Anything else is reported as a place the proof cannot rule out. Nothing is executed: the files are
parsed as data.
"""

from __future__ import annotations

import ast
import functools
import itertools
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_verl_compat.upstream.probes import statements

# A value the reading cannot decide.
UNKNOWN: Any = object()
_VERL_MODULE = re.compile(r"^verl(\.[A-Za-z_][A-Za-z0-9_]*)+$")
# Assignments of a guard's names: at most this many combinations are evaluated.
_MAX_COMBINATIONS = 64
STRATEGY = "strategy"


@dataclass(frozen=True)
class Use:
    """One use of a name: where, and the nodes from the module down to it."""

    module: str
    file: str  # verl/…py
    line: int
    node: ast.AST
    ancestors: tuple[ast.AST, ...]

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def cls(self) -> ast.ClassDef | None:
        classes = [a for a in self.ancestors if isinstance(a, ast.ClassDef)]
        return classes[-1] if classes else None

    @property
    def function(self) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        functions = [
            a for a in self.ancestors if isinstance(a, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        return functions[-1] if functions else None


class Release:
    """A release's ``verl`` package, parsed once per module."""

    def __init__(self, root: Path) -> None:
        self.root = root  # the folder holding ``verl``
        self.files = {
            _module_name(path.relative_to(root)): path
            for path in sorted(root.rglob("verl/**/*.py"))
        }

    @functools.cache  # noqa: B019 - one Release per test session
    def tree(self, module: str) -> ast.Module | None:
        path = self.files.get(module)
        if path is None:
            return None
        try:
            return ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            return None

    def file(self, module: str) -> str:
        return self.files[module].relative_to(self.root).as_posix()

    @functools.cache  # noqa: B019
    def classes(self) -> dict[str, list[tuple[str, ast.ClassDef]]]:
        """Class name → (module, definition) for every class of the release."""
        found: dict[str, list[tuple[str, ast.ClassDef]]] = {}
        for module in self.files:
            tree = self.tree(module)
            for node in ast.walk(tree) if tree is not None else ():
                if isinstance(node, ast.ClassDef):
                    found.setdefault(node.name, []).append((module, node))
        return found

    @functools.cache  # noqa: B019
    def ancestry(self, name: str) -> frozenset[str]:
        """The class and every base, by name, through every class of that name."""
        seen: set[str] = set()
        todo = [name]
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            for _, node in self.classes().get(current, []):
                todo.extend(b for b in map(_last_name, node.bases) if b)
        return frozenset(seen)

    @functools.cache  # noqa: B019
    def subclasses(self, name: str) -> frozenset[str]:
        """The class and every class deriving from it, by name."""
        return frozenset(other for other in self.classes() if name in self.ancestry(other))

    @functools.cache  # noqa: B019
    def closure(self, roots: frozenset[str]) -> frozenset[str]:
        """The modules the roots can import: every import statement anywhere in each module
        reached (its packages' ``__init__`` too), and every ``verl.…`` string as a root."""
        seen: set[str] = set()
        todo = list(roots)
        while todo:
            name = todo.pop()
            module = self._existing(name)
            if module is None or module in seen:
                continue
            seen.add(module)
            parts = module.split(".")
            todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
            tree = self.tree(module)
            package = (
                module if self.files[module].name == "__init__.py" else module.rpartition(".")[0]
            )
            for node in ast.walk(tree) if tree is not None else ():
                todo.extend(_imported(node, package))
        return frozenset(seen)

    @functools.cache  # noqa: B019
    def calls(self, modules: frozenset[str]) -> dict[str, list[tuple[str, bool]]]:
        """Callee's last name → (place, whether it unpacks arguments) of every call in
        ``modules``."""
        found: dict[str, list[tuple[str, bool]]] = {}
        for module in sorted(modules):
            for node in ast.walk(self.tree(module) or ast.Module(body=[], type_ignores=[])):
                if isinstance(node, ast.Call):
                    unpacks = any(k.arg is None for k in node.keywords) or any(
                        isinstance(a, ast.Starred) for a in node.args
                    )
                    place = f"{self.file(module)}:{node.lineno}"
                    found.setdefault(_last_name(node.func), []).append((place, unpacks))
        return found

    def _existing(self, name: str) -> str | None:
        while name:
            if name in self.files:
                return name
            name = name.rpartition(".")[0]  # ``from a.b import c``: c may be a name in a.b
        return None

    def uses(self, name: str, modules: Iterable[str]) -> list[Use]:
        """Every read of ``name`` in ``modules``: ``x.name`` loaded, or the string ``"name"``."""
        return [use for module in sorted(modules) for use in self._uses(name, module)]

    def constructed(self, name: str, modules: frozenset[str], *, splat: bool = False) -> list[str]:
        """Where ``modules`` call the class ``name`` or a class deriving from it (with
        ``splat``, only calls that unpack arguments: ``C(**section)``)."""
        calls = self.calls(modules)
        return sorted(
            place
            for each in self.subclasses(name)
            for place, unpacks in calls.get(each, [])
            if unpacks or not splat
        )

    def splatted(self, name: str, modules: frozenset[str]) -> list[str]:
        return self.constructed(name, modules, splat=True)

    @functools.cache  # noqa: B019
    def registered(self) -> dict[str, tuple[str, ...]]:
        """Class name → the backends a ``@Registry.register(…, backend=…)`` decorator names."""
        out: dict[str, tuple[str, ...]] = {}
        for name, definitions in self.classes().items():
            for _, node in definitions:
                for decorator in node.decorator_list:
                    backends = _backends(decorator)
                    if backends is not None:
                        out[name] = out.get(name, ()) + backends
        return out

    @functools.cache  # noqa: B019
    def registry_lookups_by_strategy(self, modules: frozenset[str]) -> bool:
        """Whether every ``….new(…, backend=…)`` call of a registry whose classes are registered
        by backend passes a ``.strategy`` (the value the proof compares)."""
        for module in modules:
            for node in ast.walk(self.tree(module) or ast.Module(body=[], type_ignores=[])):
                if not (isinstance(node, ast.Call) and _last_name(node.func) == "new"):
                    continue
                for keyword in node.keywords:
                    if keyword.arg == "backend" and _last_name(keyword.value) != STRATEGY:
                        return False
        return True

    @functools.cache  # noqa: B019
    def _uses(self, name: str, module: str) -> tuple[Use, ...]:
        tree = self.tree(module)
        if tree is None:
            return ()
        found = []
        for node, ancestors in _walk(tree):
            attribute = (
                isinstance(node, ast.Attribute)
                and node.attr == name
                and isinstance(node.ctx, ast.Load)
            )
            string = isinstance(node, ast.Constant) and node.value == name
            if attribute or string:
                found.append(Use(module, self.file(module), node.lineno, node, ancestors))
        return tuple(found)


def _module_name(relative: Path) -> str:
    parts = list(relative.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(node: ast.AST, package: str) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
            module = ".".join([*base, *([node.module] if node.module else [])])
        else:
            module = node.module or ""
        yield module
        yield from (f"{module}.{alias.name}" for alias in node.names)
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        if _VERL_MODULE.match(node.value):
            yield node.value


def _walk(tree: ast.AST) -> Iterator[tuple[ast.AST, tuple[ast.AST, ...]]]:
    stack: list[tuple[ast.AST, tuple[ast.AST, ...]]] = [(tree, ())]
    while stack:
        node, ancestors = stack.pop()
        yield node, ancestors
        below = (*ancestors, node)
        stack.extend((child, below) for child in ast.iter_child_nodes(node))


def _last_name(node: ast.AST) -> str:
    """The last name of a chain: ``a.b.c`` → c, ``x["c"]`` → c, ``x.get("c", …)`` → c."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)
    if isinstance(node, ast.Call) and _last_name(node.func) in ("get", "select"):
        if node.args and isinstance(node.args[0], ast.Constant):
            return str(node.args[0].value).rpartition(".")[2]
    if isinstance(node, ast.Call):
        return _last_name(node.func)
    return ""


def _backends(decorator: ast.AST) -> tuple[str, ...] | None:
    if not (isinstance(decorator, ast.Call) and _last_name(decorator.func) == "register"):
        return None
    for keyword in decorator.keywords:
        if keyword.arg == "backend":
            value = keyword.value
            items = value.elts if isinstance(value, ast.List | ast.Tuple) else [value]
            names = [i.value for i in items if isinstance(i, ast.Constant)]
            return tuple(str(n) for n in names) if len(names) == len(items) else None
    return None


# --- the configuration's side ------------------------------------------------------------


def flat(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat(value, path + "."))
        else:
            out[path] = value
    return out


def section_classes(leaves: Mapping[str, Any]) -> dict[str, str]:
    """Section → the class name its ``_target_`` builds."""
    return {
        key.rpartition("._target_")[0]: str(value).rpartition(".")[2]
        for key, value in leaves.items()
        if key.endswith("._target_") and isinstance(value, str)
    }


def role_of(key: str, leaves: Mapping[str, Any]) -> str:
    """The key's role section: its nearest ancestor a config class is built from (``_target_``),
    at most two deep (``actor_rollout_ref.actor``, ``critic``), else its top-level section."""
    parts = key.split(".")
    for depth in (2, 1):
        section = ".".join(parts[:depth])
        if depth < len(parts) and f"{section}._target_" in leaves:
            return section
    return parts[0]


def candidates(name: str, key: str, leaves: Mapping[str, Any]) -> list[Any]:
    """The values a chain ending in ``name`` may hold when code on ``key``'s path reads it: every
    leaf of that name in the key's role section, else in its top-level section, else anywhere."""
    for scope in (role_of(key, leaves), key.split(".")[0]):
        found = [
            v
            for k, v in leaves.items()
            if k.startswith(scope + ".") and k.rpartition(".")[2] == name
        ]
        if found:
            return found
    return [v for k, v in leaves.items() if k.rpartition(".")[2] == name]


def role_sections(leaves: Mapping[str, Any]) -> list[str]:
    """The sections upstream converts into role config classes: those a ``_target_`` builds, at
    most two deep, but the model's (its class reads the model's files)."""
    return sorted(
        section
        for section in {k.rpartition("._target_")[0] for k in leaves if k.endswith("._target_")}
        if section.count(".") <= 1 and section.rpartition(".")[2] != "model"
    )


class Guard:
    """A test's three-valued value, each chain standing for its candidates' values."""

    def __init__(self, key: str, leaves: Mapping[str, Any], local: Mapping[str, ast.AST]) -> None:
        self.key, self.leaves, self.local = key, leaves, local

    def decide(self, test: ast.AST) -> Any:
        """True or False when every assignment of the test's chains agrees, else UNKNOWN."""
        chains = sorted({n for n in self._chains(test)})
        if not chains:
            return self._value(test, {})
        choices = [_distinct(candidates(name, self.key, self.leaves)) for name in chains]
        if any(not c for c in choices):
            return UNKNOWN
        results = set()
        for assignment in itertools.islice(itertools.product(*choices), _MAX_COMBINATIONS + 1):
            value = self._value(test, dict(zip(chains, assignment, strict=True)))
            if value is UNKNOWN:
                return UNKNOWN
            results.add(bool(value))
        if len(results) != 1 or _count(choices) > _MAX_COMBINATIONS:
            return UNKNOWN
        return results.pop()

    def _chain(self, node: ast.AST) -> str:
        if isinstance(node, ast.Name) and node.id in self.local:
            return self._chain(self.local[node.id])
        if isinstance(node, ast.Attribute | ast.Subscript) or (
            isinstance(node, ast.Call) and _last_name(node.func) in ("get", "select")
        ):
            return _last_name(node)
        return ""

    def _chains(self, node: ast.AST) -> Iterator[str]:
        chain = self._chain(node)
        if chain:
            yield chain
            return
        for child in ast.iter_child_nodes(node):
            yield from self._chains(child)

    def _value(self, node: ast.AST, values: Mapping[str, Any]) -> Any:
        chain = self._chain(node)
        if chain:
            return values.get(chain, UNKNOWN)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            items = [self._value(e, values) for e in node.elts]
            return UNKNOWN if any(i is UNKNOWN for i in items) else items
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            inner = self._value(node.operand, values)
            return UNKNOWN if inner is UNKNOWN else not inner
        if isinstance(node, ast.BoolOp):
            items = [self._value(v, values) for v in node.values]
            if any(i is UNKNOWN for i in items):
                return UNKNOWN
            return all(items) if isinstance(node.op, ast.And) else any(items)
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, right = self._value(node.left, values), self._value(node.comparators[0], values)
            if left is UNKNOWN or right is UNKNOWN:
                return UNKNOWN
            return _compare(node.ops[0], left, right)
        return UNKNOWN


def _distinct(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for value in values:
        if value not in out:
            out.append(value)
    return out


def _count(choices: list[list[Any]]) -> int:
    total = 1
    for choice in choices:
        total *= len(choice)
    return total


def _compare(op: ast.cmpop, left: Any, right: Any) -> Any:
    try:
        if isinstance(op, ast.Eq):
            return left == right
        if isinstance(op, ast.NotEq):
            return left != right
        if isinstance(op, ast.In):
            return left in right
        if isinstance(op, ast.NotIn):
            return left not in right
        if isinstance(op, ast.Is):
            return left is right
        if isinstance(op, ast.IsNot):
            return left is not right
    except TypeError:
        return UNKNOWN
    return UNKNOWN


def _locals(function: ast.AST | None) -> dict[str, ast.AST]:
    """A function's names assigned once from a chain (``mode = self.config.trainer.mode``)."""
    if function is None:
        return {}
    assigned: dict[str, list[ast.AST]] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                assigned.setdefault(target.id, []).append(node.value)
    return {name: values[0] for name, values in assigned.items() if len(values) == 1}


def guards(use: Use) -> Iterator[tuple[ast.AST, bool]]:
    """(test, the value it must have for the use to run) of each enclosing ``if`` and
    conditional expression."""
    chain = (*use.ancestors, use.node)
    for parent, child in itertools.pairwise(chain):
        if isinstance(parent, ast.If | ast.IfExp):
            body = parent.body if isinstance(parent.body, list) else [parent.body]
            orelse = parent.orelse if isinstance(parent.orelse, list) else [parent.orelse]
            if any(child is node for node in body):
                yield parent.test, True
            elif any(child is node for node in orelse):
                yield parent.test, False


# --- the proof ------------------------------------------------------------------------------


@dataclass
class Proof:
    """What a key's proof found: the places it could not rule out, and how the others went."""

    unproven: list[str]
    ruled_out: dict[str, str]


def prove_unread(
    release: Release,
    key: str,
    leaves: Mapping[str, Any],
    entry: str,
    copies: tuple[str, ...] = (),
) -> Proof:
    """Whether nothing on ``entry``'s path reads ``key`` (or a key copying it: ``copies``) on
    the configuration whose leaves are ``leaves`` (the resolved tree's, with what upstream's
    config classes hold after their conversion where they convert: see the module's
    docstring)."""
    roots = {entry} | {
        str(v).rpartition(".")[0] for k, v in leaves.items() if k.endswith("_target_")
    }
    modules = release.closure(frozenset(roots))
    classes = section_classes(leaves)
    unproven: list[str] = []
    ruled_out: dict[str, str] = {}
    for each in (key, *copies):
        section, _, name = each.rpartition(".")
        for use in release.uses(name, modules):
            why = _off_path(release, use, each, section, name, leaves, classes, modules)
            if why:
                ruled_out[use.where] = why
            else:
                owner = f" ({use.cls.name})" if use.cls is not None else ""
                unproven.append(f"{use.where}{owner}")
    return Proof(sorted(set(unproven)), ruled_out)


def _off_path(
    release: Release,
    use: Use,
    key: str,
    section: str,
    name: str,
    leaves: Mapping[str, Any],
    classes: Mapping[str, str],
    modules: frozenset[str],
) -> str:
    """Why ``use`` does not read ``key`` on this path, or "" when the reading cannot say."""
    owner = use.cls
    if owner is not None and _on_self(use.node):
        mine = release.ancestry(classes[section]) if section in classes else set()
        if owner.name not in mine:
            others = [
                s for s, c in classes.items() if s != section and owner.name in release.ancestry(c)
            ]
            if others:
                return f"{owner.name} is the config class of {others[0]}: its own {name}"
            if _sets_itself(owner, name) and not release.splatted(owner.name, modules):
                return (
                    f"{owner.name} sets its own {name}, and nothing on the path builds it from a "
                    "whole section"
                )
    local = _locals(use.function)
    guard = Guard(key, leaves, local)
    for test, needed in guards(use):
        value = guard.decide(test)
        if value is not UNKNOWN and bool(value) != needed:
            return f"runs only if `{ast.unparse(test)}` is {needed}, and it is {not needed} here"
    if owner is not None:
        built = _registry_rules_out(release, owner.name, key, leaves, modules)
        if built:
            return built
    return ""


def _on_self(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _sets_itself(owner: ast.ClassDef, name: str) -> bool:
    for node in ast.walk(owner):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == name
            and isinstance(node.ctx, ast.Store)
        ):
            return True
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.target.id == name:
                return True
    return False


def _registry_rules_out(
    release: Release, owner: str, key: str, leaves: Mapping[str, Any], modules: frozenset[str]
) -> str:
    """Why no registry builds ``owner`` here, or ""."""
    registered = release.registered()
    family = release.subclasses(owner)
    if not registered or not family & set(registered):
        return ""
    if release.constructed(owner, modules) or not release.registry_lookups_by_strategy(modules):
        return ""
    strategies = set(map(str, candidates(STRATEGY, key, leaves)))
    if not strategies:
        return ""
    built = {cls for cls, backends in registered.items() if strategies & set(backends)}
    if any(owner in release.ancestry(cls) for cls in built):
        return ""
    shown = ", ".join(sorted(strategies))
    return f"no class registered for {shown} derives from {owner}"


def cited_lines(message: str) -> list[tuple[str, int]]:
    """The ``verl/….py:LINES`` places a finding's message names (``:316,459``, ``:805-807``)."""
    out = []
    for file, spans in re.findall(r"(verl/[\w/]+\.py):([\d,\-]+)", message):
        for span in spans.split(","):
            if not span:
                continue
            first, _, last = span.partition("-")
            out.extend((file, n) for n in range(int(first), int(last or first) + 1))
    return out


def reads_on_line(release: Release, file: str, line: int, name: str) -> bool:
    """Whether the release's ``file`` reads ``name`` on ``line``."""
    module = _module_name(Path(file))
    if module not in release.files:
        return False
    return any(use.line == line for use in release.uses(name, {module}))


# --- a role the run never starts (effect.no-critic-worker, effect.no-reference-worker) ---------

# Per role: what reads its section (an attribute chain's tail), and the guards that wait for the
# role (an ``if`` whose test matches; ``_is_rollout``: the standalone reference role's ``else``,
# verl/workers/engine_workers.py:472-479).
ROLE_READS = {
    "critic": (r"config\.critic$", r"use_critic|need_critic"),
    "ref": (
        r"(config|actor_rollout_ref)\.ref$",
        r"use_reference_policy|need_reference_policy|'ref' in self\.role|_is_ref|_is_rollout",
    ),
}


def role_reads_outside(root: Path, role: str) -> tuple[int, list[str]]:
    """(reads seen, reads not waiting for the role): a read of the role's section not under an
    ``if`` that tests the role, not a write into it, not in a function only called under one."""
    chain, guard = ROLE_READS[role]
    seen, found = 0, []
    for path in sorted((root / "verl").rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if "/experimental/" in relative or relative.endswith("main_ppo_v0.py"):
            continue  # other entry points' trainers (not main_ppo's path)
        text = path.read_text(encoding="utf-8")
        if not re.search(chain.rstrip("$"), text):
            continue
        source = statements.parse(str(path), relative)
        assert source is not None, relative

        def guarded(test: ast.expr) -> bool:
            return bool(re.search(guard, ast.unparse(test)))

        called_when_guarded = {
            n.func.attr
            for node in source.nodes
            if isinstance(node, ast.If) and guarded(node.test)
            for n in ast.walk(node)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
        }
        for node in source.nodes:
            if not (isinstance(node, ast.Attribute) and re.search(chain, ast.unparse(node))):
                continue
            seen += 1
            ancestors = list(source.ancestors(node))
            if any(isinstance(a, ast.If) and guarded(a.test) for a in ancestors):
                continue
            function = source.function(node)
            if function is not None and (
                function.name in called_when_guarded or re.fullmatch(r"need_\w+", function.name)
            ):
                continue
            if any(isinstance(a, ast.Assign) and node in ast.walk(a.targets[0]) for a in ancestors):
                continue  # a write into the section (total_training_steps), read by no one else
            found.append(f"{relative}:{node.lineno}")
    return seen, found


# Where each role's section lives in the config tree: its group folder, and its dotted path.
ROLE_SECTIONS = {"critic": ("critic", "critic"), "ref": ("ref", "actor_rollout_ref.ref")}


def role_copies_out(root: Path, role: str) -> list[str]:
    """Leaves outside the role's section whose value interpolates one of its leaves (a copy
    would carry the key into a role that runs)."""
    import yaml

    folder, section = ROLE_SECTIONS[role]
    pattern = re.compile(r"\$\{(oc\.select:)?" + re.escape(section) + r"\.")
    found = []
    for path in sorted((root / "verl/trainer/config").rglob("*.yaml")):
        relative = path.relative_to(root / "verl/trainer/config").as_posix()
        stack: list[tuple[str, Any]] = [("", yaml.safe_load(path.read_text(encoding="utf-8")))]
        while stack:
            where, node = stack.pop()
            if isinstance(node, dict):
                stack += [(f"{where}.{k}" if where else str(k), v) for k, v in node.items()]
            elif isinstance(node, str) and pattern.search(node):
                inside = relative.startswith(folder + "/") or where.startswith(section + ".")
                if not inside:
                    found.append(f"{relative}: {where}")
    return found
