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

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_verl_compat.upstream.census.static_reads import (
    SPREAD,
    WHOLE,
    Place,
    StaticRead,
    file_line,
    guard,
    source_facts,
)
from pytest_verl_compat.upstream.probes import statements

TARGET = "_target_"
# A leaf verl reads only through a leaf the tree copies it into (``rollout.response_length:
# ${oc.select:data.max_response_length,512}``): its value acts where the copy is read.
COPIED = "through a copy"


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
    facts = source_facts(verl_parent)
    down, mentions = facts.down, facts.mentions
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
    by_name: dict[str, list[StaticRead]] = {}
    for read in facts.reads:
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
            entry.places.append(_traced_place(spot, verl_parent))
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
    _as_dict_entries(out, facts.dict_fields, class_of_section)
    return out


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
    return sorted(best.values(), key=lambda p: (file_line(p.where), p.how))


def _traced_place(where: str, parent: Path) -> Place:
    file, line = file_line(where)
    source = statements.parse(str(parent / file), file)
    if source is None:
        return Place(where, "", "", "", "traced")
    statement = source.statement_at(line)
    if statement is None:
        return Place(where, "", "", "", "traced")
    return Place(
        where, source.qualname(statement) or "<module>", "", guard(source, statement), "traced"
    )
