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
from collections.abc import Iterable, Iterator, Mapping
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
GUARDS_SHOWN = 2
PLACES_SHOWN = 4


@dataclass(frozen=True, order=True)
class Place:
    """One read of a leaf: where, in which function, from which object, under which guard."""

    where: str  # verl/…py:line
    function: str
    holder: str  # the object read (``self.config.actor_rollout_ref.actor``), "" when traced only
    guard: str  # the enclosing ``if`` tests, innermost first
    how: str  # "traced", "static", or "mention" (the name only, not a read the reading knows)


@dataclass
class LeafReads:
    leaf: str
    places: list[Place] = field(default_factory=list)
    unmatched: list[Place] = field(default_factory=list)  # its name, on an unknown section
    trees: tuple[str, ...] = ()  # the composed trees that hold the leaf (all when empty)

    @property
    def status(self) -> str:
        if any(p.how == "traced" for p in self.places):
            return "traced"
        if self.places:
            return "static"
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
        for node in ast.walk(source.tree):
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


def static_reads(sources: list[statements.Source], classes: frozenset[str]) -> Iterator[StaticRead]:
    """Every read of a field on a configuration object in ``sources``."""
    empty = census_reads.Index()
    for source in sources:
        functions = [
            n
            for n in ast.walk(source.tree)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        for function in functions:
            context = census_reads.context_of(source, function, empty, classes)
            context.roots |= set(context.derived)
            owner = next(
                (a.name for a in source.ancestors(function) if isinstance(a, ast.ClassDef)), ""
            )
            for node in ast.walk(function):
                found = _field_read(node, context)
                if found is None or source.function(node) is not function:
                    continue
                name, holder = found
                line = getattr(node, "lineno", function.lineno)
                yield StaticRead(
                    name,
                    holder,
                    Place(
                        f"{source.relative}:{line}",
                        source.qualname(node),
                        ".".join(holder),
                        guard(source, node),
                        "static",
                    ),
                    owner if holder == ["self"] and context.config_self else "",
                )


def _within_config(holder: list[str], context: census_reads.Context) -> bool:
    """The object is a config section or a section within one (``self.config.actor_rollout_ref``)."""
    return any(census_reads._holds_config(holder[:k], context) for k in range(1, len(holder) + 1))


def _mentions(sources: list[statements.Source]) -> dict[str, list[str]]:
    """Every name used as an attribute, a keyword or a string in ``sources``, with its places."""
    found: dict[str, set[str]] = {}
    for source in sources:
        for node in ast.walk(source.tree):
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


def _field_read(node: ast.AST, context: census_reads.Context) -> tuple[str, list[str]] | None:
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
        holder = census_reads.attribute_chain(node.value)
        if (
            holder is not None
            and _within_config(holder, context)
            and not node.attr.startswith("_")
            and node.attr not in census_reads._METHODS
        ):
            return node.attr, holder
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        holder = census_reads.attribute_chain(node.func.value)
        if (
            node.func.attr == "get"
            and holder is not None
            and _within_config(holder, context)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            return node.args[0].value, holder
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        holder = census_reads.attribute_chain(node.value)
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
    """Whether the read's object is ``section`` (the leaf's parent)."""
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
) -> list[LeafReads]:
    """Every leaf of the ``trees`` (by name: the default and each ``model_engine`` choice) with
    its reads: ``traced`` (leaf → ``verl/…py:line``) first, then the static reads of the path's
    files."""
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
    for leaf in sorted(held):
        section, _, name = leaf.rpartition(".")
        in_all = len(held[leaf]) == len(trees)
        entry = LeafReads(leaf, trees=() if in_all else tuple(held[leaf]))
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
        if not entry.places and not entry.unmatched:
            # Its name is used, but not as a read of a config object the reading recognises.
            entry.unmatched = [Place(w, "", "", "", "mention") for w in mentions.get(name, [])]
        entry.places = _distinct(entry.places)
        entry.unmatched = _distinct(entry.unmatched)
        out.append(entry)
    return out


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


def summary(entries: list[LeafReads]) -> dict[str, int]:
    counts = {"leaves": len(entries), "traced": 0, "static": 0, "never read": 0, "undecided": 0}
    for entry in entries:
        counts[entry.status] += 1
    return counts


def render(
    version: str, entries: list[LeafReads], configurations: int, trees: Iterable[str] = ()
) -> str:
    """The page (Markdown), byte-stable for the same verl, tree and recorded reads."""
    counts = summary(entries)
    decided = counts["leaves"] - counts["undecided"]
    share = 100.0 * decided / counts["leaves"] if counts["leaves"] else 100.0
    lines = [
        f"# verl {version}'s reads of main_ppo's configuration: the read census",
        "",
        "Generated by `verl-compat census --reads --write docs/upstream-reads.md` from the "
        f"installed verl {version} (`pytest_verl_compat/upstream/read_census.py`); do not edit. "
        "For every leaf of main_ppo's composed trees (`_target_` entries aside): "
        + (", ".join(f"`{t}`" for t in trees) or "`ppo_trainer`")
        + " (a leaf only some of them hold names them), the places "
        "verl reads it: *traced* where `check`'s probes ran the line on one of "
        f"{configurations} configurations (the corpus's `main_ppo` cases and "
        "`census_variants.yaml`) and the recorder saw the key read there; *static* where a file "
        "of main_ppo's path reads a field of that name on an object of that section "
        "(`self.config.actor_rollout_ref.actor`, `actor_config`, an `…_config` object named like "
        "the class the tree's `_target_` builds there, as `engine_config` for `FSDPEngineConfig`, "
        "or `self` in that class). The guard is the `if` tests around the place in its "
        "function, innermost first: what the configuration must select for it to run. A leaf is "
        "*decided* when such a read is found, or when no file of the path uses its name at all "
        "(no attribute, keyword or string of that name: *never read*); it is *undecided* when "
        "its name is read only on objects whose section the reading cannot tell, or used only "
        "as a keyword or string (a dict passed on, a `getattr`): listed at the end with those "
        "places.",
        "",
        "`verl-compat explain KEY [SCRIPT]` answers from this census for one key and, given a "
        "launch script or corpus case (and `--set` overrides), says whether the key acts in "
        "that configuration: read there by the probes (*acts*), every place's guard false on "
        "its values (*no effect*, with the leaves that decide it), or neither (*undecided*).",
        "",
        "`verl-compat check` warns about such a key (`effect.off-path`, docs/rules.md) for the "
        "leaves whose every read this census is sure to have seen (no use of the name it cannot "
        "attribute, no section handed on whole, no interpolation copying it, guards on values "
        "verl never reassigns but by the copies it models): `census --reads --write` records "
        "them, with each place's guard and the engine dispatch, in "
        "`pytest_verl_compat/data/off_path_reads.json` (`upstream/off_path.py`), so the check "
        "runs without verl.",
        "",
        "Check that this page is the one of now (the probes' reads are recorded by content in "
        "`golden/answers/reads.json`, so this takes seconds when nothing changed):",
        "",
        "```bash",
        f"verl-compat census --upstream verl-v{version} --reads --check docs/upstream-reads.md",
        "```",
        "",
        "| leaves | traced | static only | never read | undecided | decided |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| {counts['leaves']} | {counts['traced']} | {counts['static']} | "
        f"{counts['never read']} | {counts['undecided']} | {decided} ({share:.1f}%) |",
        "",
    ]
    sections = sorted({e.leaf.split(".")[0] for e in entries})
    for section in sections:
        lines += [
            f"## `{section}`",
            "",
            "| leaf | read at (function; object; guard) | status |",
            "| --- | --- | --- |",
        ]
        for entry in (e for e in entries if e.leaf.split(".")[0] == section):
            only = f" ({', '.join(entry.trees)})" if entry.trees else ""
            lines.append(f"| `{entry.leaf}`{only} | {_places(entry.places)} | {entry.status} |")
        lines.append("")
    undecided = [e for e in entries if e.status == "undecided"]
    lines += [
        "## Undecided leaves",
        "",
        "Read by name only on objects whose section the reading cannot tell, or named only as "
        "a keyword or string (*name only*):",
        "",
        "| leaf | its name is read at |",
        "| --- | --- |",
    ]
    lines += [f"| `{e.leaf}` | {_places(e.unmatched)} |" for e in undecided]
    lines.append("")
    return "\n".join(lines)


def _places(places: list[Place]) -> str:
    if not places:
        return "—"
    cells = []
    for place in places[:PLACES_SHOWN]:
        parts = [f"`{place.where}`"]
        if place.function:
            parts.append(f"`{_cell(place.function, 50)}`")
        if place.holder:
            parts.append(f"on `{_cell(place.holder, 50)}`")
        if place.guard:
            parts.append(f"if `{_cell(place.guard, 80)}`")
        suffix = {"traced": "", "static": " (static)", "mention": " (name only)"}[place.how]
        cells.append(" ".join(parts) + suffix)
    more = len(places) - PLACES_SHOWN
    if more > 0:
        cells.append(f"and {more} more")
    return "<br>".join(cells)


def _cell(text: str, limit: int) -> str:
    text = text.replace("|", "\\|").replace("`", "'")
    return text if len(text) <= limit else text[: limit - 1] + "…"
