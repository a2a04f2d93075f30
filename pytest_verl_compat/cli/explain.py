"""``verl-compat explain KEY [SCRIPT]``: where verl reads a key, and whether it acts in a script."""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path
from typing import Any

from pytest_verl_compat.checks import off_path
from pytest_verl_compat.cli.census import read_trees
from pytest_verl_compat.cli.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    UsageError,
    add_bindings_flags,
    flag_bindings,
    open_session,
    release_root,
    say,
)
from pytest_verl_compat.pipeline.answers import load_recorded, recorded_path


def cmd_explain(args: argparse.Namespace) -> int:
    """Print where the installed verl reads KEY; with SCRIPT, whether it acts there."""
    from pytest_verl_compat.upstream.census import checks_run as census_run
    from pytest_verl_compat.upstream.census import explain
    from pytest_verl_compat.upstream.census import reads as read_census

    session = open_session(args)
    root = release_root(session)
    trees = read_trees(session, root)
    leaves = {leaf for tree in trees.values() for leaf in read_census.leaves(tree)}
    if args.key not in leaves:
        near = difflib.get_close_matches(args.key, sorted(leaves), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        raise UsageError(f"{args.key}: not a leaf of main_ppo's trees{hint}")
    # The traced reads recorded for the read census (``census --reads --write``), by leaf.
    recorded = load_recorded(recorded_path(session.golden_dir, census_run.READS_NAME))
    traced: dict[str, list[str]] = next(
        (v[census_run.KEY_READS] for v in recorded.values() if census_run.KEY_READS in v), {}
    )
    if not traced:
        say("explain", "no recorded traced reads: the places below are static only")
    entries = read_census.census(root, trees, traced, session.composer().interpolation_sources())
    entry = next(e for e in entries if e.leaf == args.key)
    print(f"{args.key}: where verl {session.pin.version} reads it ({entry.status})")
    for place in entry.places:
        print(f"  {_place(place)}")
    for place in entry.unmatched:
        print(f"  {_place(place)}  [its name, on an object of unknown section]")
    if not args.script:
        return EXIT_OK
    mapping = _configuration(session, args)
    here = census_run.traced_reads_of(mapping, args.key, session.version)
    values = read_census.leaves(mapping)
    result = explain.explain(entry, here, values)
    verdict = result.verdict
    # Where ``check``'s index (effect.off-path) holds the key, its judgement of the places: it
    # models the engine dispatch and the values a config class copies (verl/workers/config/
    # actor.py:329 gives fsdp_config the actor's strategy), which the guards alone do not.
    by_index = off_path.judged(args.key, mapping, session.pin.version)
    if by_index is not None and not result.traced:
        ruled = all(read is not None for _, read in by_index)
        verdict = explain.NO_EFFECT if ruled else explain.UNDECIDED
    print(f"\n{args.script}: {args.key} = {values.get(args.key)!r}: {verdict}")
    for where in result.traced:
        print(f"  read here: {where} (traced: the probes ran this line on this configuration)")
    if by_index is not None:
        for spot, read in by_index:
            because = ", ".join(f"{leaf}={value!r}" for leaf, value in sorted((read or {}).items()))
            state = "off this path" if read is not None else "may run here"
            print(f"  {state}: {spot.where}" + (f"  [{because}]" if because else ""))
        return EXIT_FINDINGS if verdict == explain.NO_EFFECT else EXIT_OK
    for judged in result.judged:
        state = {True: "guard holds", False: "off this path", None: "guard not evaluated"}[
            judged.holds
        ]
        because = ", ".join(f"{leaf}={value!r}" for leaf, value in judged.because)
        print(f"  {state}: {_place(judged.place)}" + (f"  [{because}]" if because else ""))
    return EXIT_FINDINGS if verdict == explain.NO_EFFECT else EXIT_OK


def _place(place: Any) -> str:
    text = f"{place.where} {place.function}".rstrip()
    if place.holder:
        text += f" on {place.holder}"
    if place.guard:
        text += f" if {place.guard}"
    text += "" if place.how == "traced" else f" ({place.how})"
    return text + (f", {place.via}" if place.via else "")


def _configuration(session: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The resolved mapping of SCRIPT (a launch script or a corpus case id) with ``--set``."""
    script = args.script
    if Path(script).is_file():
        case = session.case_for_script(Path(script), flag_bindings(args))
    else:
        found = [c for c in session.cases if c.id == script]
        if not found:
            raise UsageError(f"{script}: neither a launch script nor a corpus case")
        case = found[0]
    case = session.with_overrides(case, tuple(args.set or ()))
    composition = session.outcome(case).composition
    if not composition.composed:
        raise UsageError(f"{script}: does not compose: {composition.reason}")
    return dict(composition.mapping)


def add_explain_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser(
        "explain",
        parents=[common],
        help="where verl reads a config key, and whether it acts in a script's configuration",
    )
    parser.add_argument("key", metavar="KEY", help="a dotted leaf of main_ppo's tree")
    parser.add_argument(
        "script", metavar="SCRIPT", nargs="?", help="a launch script or a corpus case id"
    )
    parser.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="a Hydra override added to SCRIPT's (repeatable)",
    )
    add_bindings_flags(parser)
    parser.set_defaults(func=cmd_explain)
