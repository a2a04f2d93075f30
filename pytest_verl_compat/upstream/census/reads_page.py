"""The read census's page (``docs/census/<version>/reads.md``): its counts, the scripts' explicit keys
as a second denominator, and every leaf's places, from ``read_census.census``'s entries."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pytest_verl_compat.upstream.census.checks_run import census_page, scripts_release
from pytest_verl_compat.upstream.census.reads import COPIED, LeafReads, leaves
from pytest_verl_compat.upstream.census.static_reads import WHOLE, Place

PLACES_SHOWN = 4


def summary(entries: list[LeafReads]) -> dict[str, int]:
    entries = [e for e in entries if not e.outside]
    counts = {
        "leaves": len(entries),
        "traced": 0,
        "static": 0,
        COPIED: 0,
        WHOLE: 0,
        "never read": 0,
        "undecided": 0,
    }
    for entry in entries:
        counts[entry.status] += 1
    return counts


def _share(part: int, whole: int) -> str:
    return f"{100.0 * part / whole if whole else 100.0:.1f}%"


# Keys a script passes that are Hydra's own, not the tree's: its options, a group's package
# (``actor@actor_rollout_ref.actor``), a group's choice (``model_engine=``, as
# ``census_run.explicit_keys`` writes it): they select and place config files.
def hydra_own(key: str) -> bool:
    return key.startswith(("--", "hydra.")) or "@" in key or key.endswith("=")


@dataclass(frozen=True)
class ExplicitKeys:
    """The keys the scripts set, by how the census decides them."""

    decided: list[LeafReads]
    undecided: list[LeafReads]
    hydra: list[str]  # Hydra's options and group packages: no key of the tree

    @property
    def total(self) -> int:
        return len(self.decided) + len(self.undecided)


def explicit_coverage(entries: list[LeafReads], explicit: Mapping[str, list[str]]) -> ExplicitKeys:
    """The explicit keys (key → the cases that set it), each by its entry: a leaf's, or, for a
    key no tree holds (``census(outside=…)``), its own."""
    by_leaf = {e.leaf: e for e in entries}
    hydra = [k for k in explicit if hydra_own(k)]
    found = [by_leaf[k] for k in explicit if k in by_leaf and not hydra_own(k)]
    missing = [k for k in explicit if k not in by_leaf and not hydra_own(k)]
    if missing:
        raise ValueError(f"explicit keys without a census entry: {missing[:5]}")
    decided = [e for e in found if e.status != "undecided"]
    undecided = [e for e in found if e.status == "undecided"]
    return ExplicitKeys(decided, undecided, hydra)


def explicit_outside(trees: Mapping[str, Mapping[str, Any]], explicit: Iterable[str]) -> list[str]:
    """The explicit keys no tree holds (``+`` into a section, a key of a script that does not
    compose), Hydra's own aside: ``census``'s ``outside``."""
    held = {leaf for tree in trees.values() for leaf in leaves(tree)}
    return sorted(k for k in explicit if k not in held and not hydra_own(k))


def _explicit_section(
    version: str, entries: list[LeafReads], explicit: Mapping[str, list[str]]
) -> list[str]:
    found = explicit_coverage(entries, explicit)
    cases = len({case for ids in explicit.values() for case in ids})
    outside = [e for e in [*found.decided, *found.undecided] if e.outside]
    outside_decided = sum(1 for e in found.decided if e.outside)
    by_use = sorted(found.undecided, key=lambda e: (-len(explicit[e.leaf]), e.leaf))
    share = _share(len(found.decided), found.total)
    return [
        "## The keys the scripts set",
        "",
        f"The {cases} read cases that launch main_ppo (the corpus's and verl {version}'s example "
        f"scripts', `corpus/examples.yaml`) set {found.total} distinct keys (`+`/`~` stripped; "
        "Hydra's own options, group choices and packages aside: "
        + (", ".join(f"`{k}`" for k in found.hydra) or "none")
        + f"). Their reads are decided for **{len(found.decided)} ({share})**. A leaf of the "
        f"trees has its status above; {len(outside)} keys are in no tree (added with `+` into a "
        "section, or set by a script that does not compose), each decided as a leaf is (a "
        f"section above it passed on whole, its name never used) for {outside_decided} of them.",
        "",
        "| explicit keys | decided | undecided | of them in no tree (decided) |",
        "| ---: | ---: | ---: | ---: |",
        f"| {found.total} | {len(found.decided)} ({share}) | {len(found.undecided)} | "
        f"{len(outside)} ({outside_decided}) |",
        "",
        "Undecided, by the number of cases that set them (*in no tree* marked):",
        "",
        "| key | cases |",
        "| --- | ---: |",
        *(
            f"| `{e.leaf}`{' (in no tree)' if e.outside else ''} | {len(explicit[e.leaf])} |"
            for e in by_use
        ),
        "",
    ]


def render(
    version: str,
    entries: list[LeafReads],
    configurations: int,
    trees: Iterable[str] = (),
    explicit: Mapping[str, list[str]] | None = None,
) -> str:
    """The page (Markdown), byte-stable for the same verl, tree, recorded reads and scripts."""
    counts = summary(entries)
    decided = counts["leaves"] - counts["undecided"]
    share = 100.0 * decided / counts["leaves"] if counts["leaves"] else 100.0
    lines = [
        f"# verl {version}'s reads of main_ppo's configuration: the read census",
        "",
        f"Generated by `verl-compat census --release {version} --reads --write "
        f"{census_page(version, 'reads')}` from verl {version}'s own files and its code, run in "
        "its own environment (`pytest_verl_compat/upstream/census/reads.py`); do not edit. "
        "For every leaf of main_ppo's composed trees (`_target_` entries aside): "
        + (", ".join(f"`{t}`" for t in trees) or "`ppo_trainer`")
        + " (a leaf only some of them hold names them), the places "
        "verl reads it: *traced* where `check`'s probes ran the line on one of "
        f"{configurations} configurations (the corpus's `main_ppo` cases and "
        "`census_variants.yaml`) and the recorder saw the key read there; *static* where a file "
        "of main_ppo's path reads a field of that name on an object of that section "
        "(`self.config.actor_rollout_ref.actor`, `actor_config`, an `…_config` object named like "
        "the class the tree's `_target_` builds there, as `engine_config` for `FSDPEngineConfig`, "
        "or `self` in that class), or on a parameter that the path's calls pass such an object "
        "(`RLHFDataset.__init__`'s `config`, passed `data_config`: the place names the call); "
        "*through a copy* where the leaf has no read of its own but the tree copies it into a "
        "leaf that is read (`${oc.select:data.max_response_length,512}`), at the copy's places. "
        "The guard is the `if` tests around the place in its "
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
        "the release's golden answers, `reads.json`, so this takes seconds when nothing changed):",
        "",
        "```bash",
        f"verl-compat census --release {version} --upstream verl-v{scripts_release()} --reads "
        f"--check {census_page(version, 'reads')}",
        "```",
        "",
        "| leaves | traced | static only | through a copy | passed whole | never read | "
        "undecided | decided |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| {counts['leaves']} | {counts['traced']} | {counts['static']} | {counts[COPIED]} | "
        f"{counts[WHOLE]} | {counts['never read']} | {counts['undecided']} | {decided} "
        f"({share:.1f}%) |",
        "",
    ]
    if explicit is not None:
        lines += _explicit_section(version, entries, explicit)
    entries = [e for e in entries if not e.outside]
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
        suffix = {
            "traced": "",
            "static": " (static)",
            "mention": " (name only)",
            WHOLE: " (passed whole)",
        }[place.how]
        if place.via:
            suffix += f", {_cell(place.via, 90)}"
        cells.append(" ".join(parts) + suffix)
    more = len(places) - PLACES_SHOWN
    if more > 0:
        cells.append(f"and {more} more")
    return "<br>".join(cells)


def _cell(text: str, limit: int) -> str:
    text = text.replace("|", "\\|").replace("`", "'")
    return text if len(text) <= limit else text[: limit - 1] + "…"
