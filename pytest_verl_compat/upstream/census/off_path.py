"""The off-path index: the leaves whose every read the configuration's own values can rule out.

``checks/off_path.py`` warns about an explicit key that no code of the selected path reads. It
runs without verl, from this index (``data/off_path_reads.json``, one entry per verl release),
which is built here from the read census (``read_census``: the probes' traced reads and the
static reads of main_ppo's path) and a scan of the whole installed ``verl`` package. A leaf enters
only when the reading is certain to have seen every read of it:

- the census found it read (traced or static) and found no read of its name on an object of
  another or an unknown section;
- every use of its name anywhere in the package (an attribute, a keyword, a parameter, a string,
  a field of a class outside the config dataclasses) is one of those places: a use the reading
  cannot attribute (a ``**kwargs`` parameter, a ``getattr``, another object's field) keeps the key
  out;
- no section above it is passed on whole (``**section``, ``asdict``, ``to_container``, ``vars``,
  ``fields``, ``.items()``, a ``for`` over it) nor walked by reflection (a config class annotated
  on a parameter that ``fields``/``asdict``/``vars`` reads): its fields would be read by name
  nowhere;
- no interpolation of verl's config files copies it into another key (``${oc.select:a.b,…}``;
  a relative one, ``${..b}``, counts for every leaf of that name): the other key may be read;
- every place has a guard (the ``if`` tests around it) that names a value of the tree.

Each place keeps the conjuncts of its guard in a normal form: a leaf is ``L['a.b.c']``, anything
the configuration does not decide is ``UNKNOWN`` (a local, a call, a leaf verl assigns to before
it tests it: ``engine_config.use_remove_padding = …``, engine_workers.py:113). A place in an engine
class's method gains the engine's dispatch as a conjunct: ``EngineRegistry.new(backend=
engine_config.strategy)`` (verl/workers/engine_workers.py:135-137) builds a class registered for
that backend (verl/workers/engine/base.py:349-390), so a method of a class runs only for the
backends of the registered classes that derive from it.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pytest_verl_compat.releases.index import DATA
from pytest_verl_compat.upstream.census import dispatch as registry_dispatch
from pytest_verl_compat.upstream.census import forced as forced_values
from pytest_verl_compat.upstream.census import normal_form, static_reads
from pytest_verl_compat.upstream.census import reads as read_census
from pytest_verl_compat.upstream.census.call_binding import attribute_chain
from pytest_verl_compat.upstream.census.static_reads import WHOLE
from pytest_verl_compat.upstream.probes import statements
from pytest_verl_compat.upstream.probes.effects import reflected_classes

# The index, beside the other data generated from the installed verl (package data).
DATA_FILE = DATA / "off_path_reads.json"
# The folders of verl's config dataclasses: a field declared there is not a use of the name.
_CONFIG_FOLDERS = ("verl/workers/config/", "verl/trainer/config/")
# Calls that hand a whole object on (its fields read by name nowhere).
_SPREADING_CALLS = frozenset({"asdict", "astuple", "vars", "fields", "to_container", "to_object"})
_SPREADING_METHODS = frozenset({"items", "keys", "values", "to_dict", "to_container"})
# The name of the section's leaf that selects the engine class (``EngineRegistry.new``'s backend).
STRATEGY = "strategy"
LEAF = "L"
# How a name is assigned on a config object: (COPY, config class, field below it), or OTHER.
Store = tuple[str, str, str]
COPY = "copy"
OTHER: Store = ("other", "", "")
# main_ppo's config tree: another entry point's tree is "foreign" unless built on it.
MAIN_TREE = "ppo_trainer"
UNKNOWN = "UNKNOWN"
# The index's two parts (``build``).
LEAVES = "leaves"
CLASSES = "classes"


@dataclass
class PackageScan:
    """What the whole installed package does with names, by name."""

    uses: dict[str, set[str]] = field(default_factory=dict)  # name → verl/…py:line
    # Names assigned on a config object, each with how (``_how_stored``): a copy of a config
    # class's own field into the section below it (``object.__setattr__(self.engine,
    # "strategy", self.strategy)``, verl/workers/config/actor.py:329), or anything else.
    stored: dict[str, set[Store]] = field(default_factory=dict)
    # Names, by the verl/…py:line that use them (imports aside): who calls a module-level
    # function or class.
    referenced: dict[str, set[str]] = field(default_factory=dict)
    # verl/…py:line of a use → the module-level function or class holding it.
    owner: dict[str, str] = field(default_factory=dict)
    # Files of entry points whose tree is not main_ppo's (``hydra.main`` on another tree).
    foreign: set[str] = field(default_factory=set)
    # What the config files' interpolations copy: absolute paths, and the names of relative ones.
    copied_paths: set[str] = field(default_factory=set)
    copied_names: set[str] = field(default_factory=set)
    # Config sections handed on whole, by the chain that names them (``self.config.rollout``,
    # ``self.engine_config``); a local's section the reading cannot tell.
    spread: set[tuple[str, ...]] = field(default_factory=set)
    # Config classes whose every field verl reads by reflection (``probes.effects``).
    reflected: frozenset[str] = frozenset()
    bases: dict[str, set[str]] = field(default_factory=dict)  # class → its base names
    backends: dict[str, set[str]] = field(default_factory=dict)  # registered engine → backends

    def copied(self, leaf: str) -> bool:
        return leaf in self.copied_paths or leaf.rpartition(".")[2] in self.copied_names

    def use(self, name: str, where: str) -> None:
        self.uses.setdefault(name, set()).add(where)

    def store(self, name: str, how: Store) -> None:
        self.stored.setdefault(name, set()).add(how)

    def off_tree(self, where: str) -> bool:
        """Whether a use lies in another tree's code: in a file of an entry point on another
        tree, or in a module-level function or class that only such files use."""
        file = where.rpartition(":")[0]
        if file in self.foreign:
            return True
        owner = self.owner.get(where)
        if not owner:
            return False
        # Who uses the owner, but the owner itself (another function of its file counts).
        users = {
            spot.rpartition(":")[0]
            for spot in self.referenced.get(owner, set())
            if not (spot.rpartition(":")[0] == file and self.owner.get(spot) == owner)
        }
        return bool(users) and users <= self.foreign

    def engine_backends(self, cls: str) -> set[str]:
        """The backends under which a method of ``cls`` can run: those of every registered engine
        class that is ``cls`` or derives from it (by name)."""
        found: set[str] = set()
        for registered, backends in self.backends.items():
            if cls in self.lineage(registered):
                found |= backends
        return found

    def lineage(self, cls: str) -> set[str]:
        seen, todo = set(), [cls]
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(self.bases.get(name, ()))
        return seen


def _last(node: ast.AST) -> str | None:
    chain = attribute_chain(node)
    return chain[-1] if chain else None


_ROOTS = ("config", "cfg")


def _section_chain(node: ast.AST) -> tuple[str, ...] | None:
    """The chain of a config section named by a path the reading can place: below the tree's
    root (``config.a.b``, ``self.config.a``) or a config attribute of ``self``
    (``self.engine_config``); None for anything else (a local, the whole tree)."""
    chain = attribute_chain(node)
    if not chain:
        return None
    rest = chain[1:] if chain[0] == "self" else chain
    if rest and rest[0] in _ROOTS and len(rest) > 1:
        return tuple(rest)
    if chain[0] == "self" and len(rest) == 1 and rest[0].endswith(("_config", "_cfg")):
        return tuple(rest)
    return None


def _call_root(node: ast.Call) -> str:
    """The first name of a call's callee: ``create_peft`` of ``create_peft(…)``, ``peft`` of
    ``peft.get_peft_model(…)``."""
    chain = attribute_chain(node.func)
    return chain[0] if chain else ""


def _callee(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


# Packages whose calls the scan models itself: verl's own, and OmegaConf's.
_OWN_PACKAGES = frozenset({"verl", "omegaconf"})


def _foreign_names(source: statements.Source) -> frozenset[str]:
    """The names the file binds by importing them from outside verl (``from megatron.bridge.peft.
    utils import create_peft``, ``import peft``), in any scope. OmegaConf's are not: the scan
    models what they read (``OmegaConf.select`` names its key, ``to_container`` spreads), and
    ``open_dict`` reads nothing."""
    names: set[str] = set()
    for node in source.nodes:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] not in _OWN_PACKAGES:
                names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(
                alias.asname or alias.name.split(".")[0]
                for alias in node.names
                if alias.name.split(".")[0] not in _OWN_PACKAGES
            )
    return frozenset(names)


def _named_section(source: statements.Source, node: ast.AST) -> str | None:
    """The last name of the section an argument holds: ``model_config.lora`` or
    ``cfg.get("lora")``, directly or through a local of the same function assigned from one
    (``lora_cfg = model_config.lora``, verl/workers/config/megatron_peft.py:22)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        holder = attribute_chain(node.func.value) or []
        if (
            node.func.attr == "get"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and any(_config_holder(part) for part in holder)
        ):
            return str(node.args[0].value)
        return None
    if isinstance(node, ast.Name):
        function = source.function(node)
        if function is None:
            return None
        for statement in source.own_nodes(function):
            if (
                isinstance(statement, ast.Assign)
                and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)
                and statement.targets[0].id == node.id
                and not isinstance(statement.value, ast.Name)
            ):
                return _named_section(source, statement.value)
        return None
    chain = attribute_chain(node)
    if not chain or len(chain) < 2 or not any(_config_holder(part) for part in chain[:-1]):
        return None  # not below a config object: a model, a tensor, a library's own object
    return chain[-1]


def _config_holder(name: str) -> bool:
    return name in _ROOTS or name.endswith(("_config", "_cfg"))


def _scan_file(scan: PackageScan, source: statements.Source) -> None:
    relative = source.relative
    in_config = relative.startswith(_CONFIG_FOLDERS)
    foreign = _foreign_names(source)
    for node in source.nodes:
        line = getattr(node, "lineno", 0)
        where = f"{relative}:{line}"
        if isinstance(node, ast.Attribute):
            scan.use(node.attr, where)
            if isinstance(node.ctx, ast.Load):
                scan.referenced.setdefault(node.attr, set()).add(where)
            elif attribute_chain(node.value) != ["self"] or in_config:
                scan.store(node.attr, _how_stored(source, node, node.value, in_config))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            scan.referenced.setdefault(node.id, set()).add(where)
        elif isinstance(node, ast.keyword):
            if node.arg:
                scan.use(node.arg, f"{relative}:{node.value.lineno}")
            else:
                _spread(scan, node.value)
        elif isinstance(node, ast.arg):
            scan.use(node.arg, where)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            scan.use(node.value, where)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store | ast.Del):
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                scan.store(node.slice.value, OTHER)
        elif isinstance(node, ast.Dict):
            # ``{**section}``: a None key is a spread.
            for key, value in zip(node.keys, node.values, strict=True):
                if key is None:
                    _spread(scan, value)
        elif isinstance(node, ast.For | ast.comprehension):
            _spread(scan, node.iter)
        elif isinstance(node, ast.Call):
            _scan_call(scan, source, node, in_config)
            if _call_root(node) in foreign:
                # A section handed to a library (``create_peft(lora_cfg)``, megatron_peft.py:
                # 29) is read there by whatever names it knows: every leaf below it may act.
                for argument in [*node.args, *(k.value for k in node.keywords)]:
                    named = _named_section(source, argument)
                    if named:
                        scan.spread.add((named,))
        elif isinstance(node, ast.ClassDef):
            _scan_class(scan, node, in_config, relative)


def _spread(scan: PackageScan, node: ast.AST) -> None:
    chain = _section_chain(node)
    if chain:
        scan.spread.add(chain)


def _how_stored(
    source: statements.Source, node: ast.AST, target: ast.AST, in_config: bool, value: Any = None
) -> Store:
    """A copy (``COPY``, the config class, the field below it) for ``self.<child>.<n> =
    self.<n>`` (or its ``setattr``) run unconditionally in a method of a config class, where
    ``self.<child>`` is the field ``<child>`` or a name the method gives it (``self.engine =
    self.fsdp_config``, verl/workers/config/actor.py:325); anything else is ``OTHER``."""
    if value is None:
        parent = source.parent(node)
        value = parent.value if isinstance(parent, ast.Assign) else None
    name = node.attr if isinstance(node, ast.Attribute) else None
    if isinstance(node, ast.Call) and len(node.args) >= 2:
        named = node.args[1]
        name = (
            named.value
            if isinstance(named, ast.Constant) and isinstance(named.value, str)
            else None
        )
    chain = attribute_chain(target)
    copied = attribute_chain(value) if value is not None else None
    function = source.function(node)
    owner = next((a for a in source.ancestors(node) if isinstance(a, ast.ClassDef)), None)
    if not (
        in_config
        and name
        and function is not None
        and owner is not None
        and chain is not None
        and len(chain) == 2
        and chain[0] == "self"
        and copied == ["self", name]
        and not static_reads.guard(source, node)
    ):
        return OTHER
    child = chain[1]
    for statement in ast.walk(function):
        # ``self.engine = self.fsdp_config``: the copy lands on the field it names.
        if (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and attribute_chain(statement.targets[0]) == ["self", chain[1]]
        ):
            alias = attribute_chain(statement.value)
            if alias is None or len(alias) != 2 or alias[0] != "self":
                return OTHER
            child = alias[1]
    return (COPY, owner.name, child)


def _scan_call(
    scan: PackageScan, source: statements.Source, node: ast.Call, in_config: bool
) -> None:
    name = _callee(node)
    if name in ("setattr", "__setattr__", "delattr") and len(node.args) >= 2:
        target = node.args[1]
        if isinstance(target, ast.Constant) and isinstance(target.value, str):
            value = node.args[2] if len(node.args) > 2 else None
            scan.store(
                target.value,
                _how_stored(source, node, node.args[0], in_config, value)
                if value is not None
                else OTHER,
            )
    if name in _SPREADING_CALLS and node.args:
        _spread(scan, node.args[0])
    if name in _SPREADING_METHODS and isinstance(node.func, ast.Attribute):
        _spread(scan, node.func.value)


def _scan_class(scan: PackageScan, node: ast.ClassDef, in_config: bool, relative: str) -> None:
    scan.bases.setdefault(node.name, set()).update(
        b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
    )
    for statement in node.body:
        # A field of a class that is not a config dataclass (built from a section with ``**``).
        if (
            not in_config
            and isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
        ):
            scan.use(statement.target.id, f"{relative}:{statement.lineno}")
    for decorator in node.decorator_list:
        if not (isinstance(decorator, ast.Call) and _callee(decorator) == "register"):
            continue
        if _last(getattr(decorator.func, "value", None) or decorator.func) != "EngineRegistry":
            continue
        for keyword in decorator.keywords:
            if keyword.arg == "backend":
                scan.backends.setdefault(node.name, set()).update(_strings(keyword.value))


def _strings(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return {
            e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
        }
    return set()


def _owners(scan: PackageScan, source: statements.Source) -> None:
    """Each line of a module-level function or class, with its name."""
    for node in source.tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                scan.owner[f"{source.relative}:{line}"] = node.name


def _tree_of(path: Path, node: ast.AST) -> Path | None:
    """The config file a ``@hydra.main(config_path=…, config_name=…)`` decorator names."""
    if not (isinstance(node, ast.Call) and _callee(node) == "main"):
        return None
    named = {
        k.arg: k.value.value
        for k in node.keywords
        if isinstance(k.value, ast.Constant) and isinstance(k.value.value, str)
    }
    if "config_name" not in named:
        return None
    return path.parent / str(named.get("config_path") or "") / f"{named['config_name']}.yaml"


def _on_main_tree(config: Path) -> bool:
    """Whether a config file is main_ppo's tree or built on it (its defaults list names it)."""
    if config.stem == MAIN_TREE:
        return True
    try:
        raw = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return True  # unreadable: not known to be another tree
    defaults = raw.get("defaults") if isinstance(raw, dict) else None
    return isinstance(defaults, list) and MAIN_TREE in defaults


_INTERPOLATION = re.compile(r"\$\{([^}]*)\}")


def _interpolations(scan: PackageScan, text: str) -> None:
    for inner in _INTERPOLATION.findall(text):
        resolver, colon, rest = inner.partition(":")
        if colon and resolver != "oc.select":
            continue  # another resolver (oc.env, …) reads no key
        path = (rest if colon else inner).split(",")[0].strip()
        if path.startswith("."):
            scan.copied_names.add(path.rpartition(".")[2])
        elif path:
            scan.copied_paths.add(path)


def scan_package(verl_parent: Path) -> PackageScan:
    scan = PackageScan(reflected=reflected_classes(verl_parent / "verl"))
    for path in sorted((verl_parent / "verl").rglob("*.yaml")):
        _interpolations(scan, path.read_text(encoding="utf-8"))
    for path in sorted((verl_parent / "verl").rglob("*.py")):
        relative = path.relative_to(verl_parent).as_posix()
        source = statements.parse(str(path), relative)
        if source is None:
            continue
        _scan_file(scan, source)
        _owners(scan, source)
        for node in source.nodes:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for decorator in node.decorator_list:
                    config = _tree_of(path, decorator)
                    if config is not None and not _on_main_tree(config):
                        scan.foreign.add(relative)
    return scan


# --- guards in normal form ---------------------------------------------------------------------


def copied_leaf(
    path: str, known: Mapping[str, Any], scan: PackageScan, classes_of: Mapping[str, set[str]]
) -> str | None:
    """The leaf whose value ``path`` holds when verl reads it: itself, the field a config class
    copies into it (``FSDPActorConfig.__post_init__`` sets ``fsdp_config.strategy`` to the actor's
    ``strategy``, verl/workers/config/actor.py:329), or None when verl assigns it otherwise. A
    section (a guard may test one for ``None``) is itself."""
    if path not in known:
        return path
    below, _, name = path.rpartition(".")
    stores = scan.stored.get(name)
    if not stores:
        return path
    if OTHER in stores:
        return None
    above, _, child = below.rpartition(".")
    built = classes_of.get(above, set())
    lineage = set().union(*(scan.lineage(c) for c in built)) if built else set()
    sources = {f"{above}.{name}" for _, cls, into in stores if cls in lineage and into == child}
    if not sources:
        return path  # every assignment of the name is a copy into another section
    source = sources.pop()
    return source if source in known else None


def normal_guard(
    place: static_reads.Place,
    section: str,
    named: Mapping[str, Any],
    copied: normal_form.Copied,
    scan: PackageScan,
    verl_parent: Path | None = None,
) -> tuple[list[str], int]:
    """The place's guard conjuncts that name a leaf (or a section: ``named``), in normal form,
    with the engine's and the registries' dispatch for a method of a class (``dispatch``), and
    how many conjuncts name no leaf (``open``: the place may or may not run whatever the
    configuration). ``copied``: the leaf whose value a leaf holds when verl reads it."""
    expander = normal_form.Expander(verl_parent, place.where) if verl_parent else None
    resolve = normal_form.resolver(place, section, named, copied, expander)
    out, opened = normal_form.normalise(place.guard, resolve)
    engine = _dispatch(place, resolve, scan)
    return out + ([engine] if engine else []), opened


def place_class(place: static_reads.Place) -> str:
    """The class whose method holds the place (the qualified name's first part), or ""."""
    head, dot, _ = place.function.partition(".")
    return head if dot and head[:1].isupper() else ""


def _dispatch(place: static_reads.Place, resolve: Any, scan: PackageScan) -> str:
    """``L['<section>.strategy'] in [...]`` for a place in a method of an engine class whose
    object is the engine's own config section (``self.engine_config``), else ""."""
    cls = place_class(place)
    if not cls or place.holder.split(".")[-1] != "engine_config":
        return ""
    strategy = resolve([*place.holder.split("."), STRATEGY])
    backends = scan.engine_backends(cls)
    if strategy is None or not backends:
        return ""
    return f"{LEAF}[{strategy!r}] in {sorted(backends)!r}"


# --- the index -----------------------------------------------------------------------------------


def _spread_sections(section: str, scan: PackageScan, classes_of: Mapping[str, set[str]]) -> bool:
    """Whether a section at or above ``section`` is handed on whole or walked by reflection."""
    parts = section.split(".") if section else []
    for depth in range(1, len(parts) + 1):
        above = parts[:depth]
        classes = classes_of.get(".".join(above), set())
        if classes & scan.reflected:
            return True
        stems = {c.lower().removesuffix("config") for c in classes}
        for chain in scan.spread:
            if chain[0] in _ROOTS:
                # ``self.config.actor_rollout_ref.rollout``: the tail names the section.
                tail = list(chain[1:])
                if above[-len(tail) :] == tail and len(tail) <= len(above):
                    return True
                continue
            # ``self.engine_config``: the section named like it, or like the class built there.
            stem = chain[0].lstrip("_").removesuffix("_config").removesuffix("_cfg")
            if stem == above[-1] or any(s.endswith(stem.replace("_", "")) for s in stems):
                return True
    return False


def _module_class(where: str, cls: str) -> str:
    """``verl.a.b.Cls`` for a class of the file ``verl/a/b.py``."""
    file = where.rpartition(":")[0]
    module = file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    return f"{module}.{cls}" if cls else ""


def _raw(place: static_reads.Place) -> bool:
    """Whether the place reads the tree itself (an OmegaConf node: ``config.a.b``,
    ``self.config.a``), not a config dataclass built from it (``engine_config``, ``self`` in a
    config class): a value a dataclass's ``__post_init__`` rewrites is still the user's there."""
    holder = [p for p in place.holder.split(".") if p and p != "self"]
    if place.how == WHOLE:
        return True
    if not holder:
        return False  # ``self`` in a config class
    return holder[0] in ("config", "cfg") or not holder[-1].endswith(("_config", "_cfg"))


def complete_reads(
    entry: read_census.LeafReads,
    scan: PackageScan,
    classes_of: Mapping[str, set[str]],
) -> bool:
    """Whether the reading is sure to have seen every read of the entry's leaf (the module's
    docstring): decided, no use of its name elsewhere, no section above it handed on whole, no
    interpolation copying it."""
    if entry.status not in ("traced", "static", "never read") or entry.unmatched or entry.outside:
        return False
    section, _, name = entry.leaf.rpartition(".")
    if _spread_sections(section, scan, classes_of) or scan.copied(entry.leaf):
        return False
    places_at = {p.where for p in entry.places}
    # A use of the name the census did not attribute to this leaf keeps it out.
    return not any(w not in places_at and not scan.off_tree(w) for w in scan.uses.get(name, ()))


def forced_reads_complete(
    entry: read_census.LeafReads,
    scan: PackageScan,
    classes_of: Mapping[str, set[str]],
) -> bool:
    """Whether no read can take the tree's own value of a leaf a config class's ``__post_init__``
    rewrites. Weaker than ``complete_reads`` on purpose: uses of the name on objects that are no
    config section (Megatron's ``tfconfig.sequence_parallel``, verl/utils/model.py:602) and the
    dataclass handed on whole (``self.engine_config``) carry the rewritten value; what could carry
    the user's is a read on the tree (``raw``), a read the census could not attribute, the tree's
    section handed on whole, or an interpolation copying the leaf."""
    if entry.status not in ("traced", "static", "never read") or entry.unmatched or entry.outside:
        return False
    if any(_raw(place) for place in entry.places) or scan.copied(entry.leaf):
        return False
    section = entry.leaf.rpartition(".")[0]
    tree_spreads = PackageScan(spread={c for c in scan.spread if c[0] in _ROOTS})
    return not _spread_sections(section, tree_spreads, classes_of)


def build(
    verl_parent: Path,
    trees: Mapping[str, Mapping[str, Any]],
    traced: Mapping[str, list[str]],
    entries: list[read_census.LeafReads] | None = None,
) -> dict[str, dict[str, Any]]:
    """``leaves``: leaf → whether every read of it was seen (``complete``) and its places (``where``,
    ``guard`` conjuncts in normal form, ``open``: conjuncts no leaf decides, ``traced``,
    ``class``: the method's class, ``raw``: read on the tree itself), with the values a config
    class's ``__post_init__`` forces on it (``forced``); ``classes``: for a method's class, the
    condition under which a registry builds it (``dispatch.conjunct``); sorted. ``entries``: the
    read census of the same trees and reads, when the caller has it."""
    if entries is None:
        entries = read_census.census(verl_parent, trees, traced)
    scan = scan_package(verl_parent)
    known: dict[str, Any] = {}
    classes_of: dict[str, set[str]] = {}
    for tree in trees.values():
        known.update(read_census.leaves(tree))
        for name, sections in read_census.targets(tree).items():
            for section in sections:
                classes_of.setdefault(section, set()).add(name)
    # The sections too: a guard may test one (``filter_groups is not None``).
    section_paths: set[str] = set()
    for leaf in known:
        above = leaf.rpartition(".")[0]
        while above and above not in section_paths:
            section_paths.add(above)
            above = above.rpartition(".")[0]
    named = {**known, **dict.fromkeys(section_paths - set(known))}
    sources = registry_dispatch.verl_sources(verl_parent)

    def copied(path: str) -> str | None:
        return path if path in section_paths else copied_leaf(path, known, scan, classes_of)

    def normalise_text(text: str, resolve: normal_form.Resolve) -> str:
        conjuncts, opened = normal_form.normalise(text, resolve)
        return " and ".join(f"({c})" for c in conjuncts) if conjuncts and not opened else UNKNOWN

    dispatch = registry_dispatch.scan(sources, named, classes_of, copied, normalise_text)
    forced_by_leaf = forced_values.scan(
        verl_parent, sources, named, classes_of, copied, scan.lineage
    )
    out: dict[str, dict[str, Any]] = {}
    classes: dict[str, str] = {}
    for entry in entries:
        section = entry.leaf.rpartition(".")[0]
        places = []
        for place in entry.places:
            guard, opened = normal_guard(
                place, place.section or section, named, copied, scan, verl_parent
            )
            found: dict[str, Any] = {"where": place.where, "guard": guard}
            if opened:
                found["open"] = opened
            if place.how == "traced":
                found["traced"] = True
            cls = place_class(place)
            if cls:
                found["class"] = _module_class(place.where, cls)
                builds = registry_dispatch.conjunct(found["class"], dispatch)
                if builds:
                    classes[found["class"]] = builds
            if _raw(place):
                found["raw"] = True
            places.append(found)
        item: dict[str, Any] = {"places": places}
        if complete_reads(entry, scan, classes_of):
            item["complete"] = True
        if forced_by_leaf.get(entry.leaf):
            item["forced"] = forced_by_leaf[entry.leaf]
            if not item.get("complete") and forced_reads_complete(entry, scan, classes_of):
                item["forced_complete"] = True
        out[entry.leaf] = item
    return {LEAVES: dict(sorted(out.items())), CLASSES: dict(sorted(classes.items()))}


def dumps(version: str, index: Mapping[str, Any], previous: str = "") -> str:
    """The data file with ``version``'s entry set to ``index`` (other versions kept): one line
    per leaf and per class, so that a change reads as the leaves it changes."""
    data: dict[str, Any] = json.loads(previous) if previous else {}
    data[version] = index
    lines = ["{"]
    versions = sorted(data)
    for v_index, name in enumerate(versions):
        parts = data[name] if isinstance(data[name], dict) else {}
        lines.append(f" {json.dumps(name)}: {{")
        kinds = [k for k in (LEAVES, CLASSES) if k in parts]
        for k_index, kind in enumerate(kinds):
            lines.append(f"  {json.dumps(kind)}: {{")
            items = sorted(parts[kind].items())
            for i_index, (key, value) in enumerate(items):
                comma = "," if i_index < len(items) - 1 else ""
                lines.append(f"   {json.dumps(key)}: {json.dumps(value, sort_keys=True)}{comma}")
            lines.append("  }" + ("," if k_index < len(kinds) - 1 else ""))
        lines.append(" }" + ("," if v_index < len(versions) - 1 else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"
