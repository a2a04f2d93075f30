"""``verl-compat explain KEY [SCRIPT]``: where verl reads a key, and whether it acts in a script."""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from pytest_verl_compat.upstream.verdict.keys import KeyAnswer


def cmd_explain(args: argparse.Namespace) -> int:
    """Print where the installed verl reads KEY; with SCRIPT, whether it acts there."""
    from pytest_verl_compat.upstream.census import checks_run as census_run
    from pytest_verl_compat.upstream.census import reads as read_census
    from pytest_verl_compat.upstream.verdict import keys as key_answers

    session = open_session(args)
    root = release_root(session)
    trees = read_trees(session, root)
    leaves = {leaf for tree in trees.values() for leaf in read_census.leaves(tree)}
    configured = _configuration(session, args) if args.script else None
    if args.key not in leaves and not (
        configured is not None and args.key in read_census.leaves(configured[1])
    ):
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
    entry = next((e for e in entries if e.leaf == args.key), None)
    if entry is not None:
        print(f"{args.key}: where verl {session.pin.version} reads it ({entry.status})")
        for place in entry.places:
            print(f"  {_place(place)}")
        for place in entry.unmatched:
            print(f"  {_place(place)}  [its name, on an object of unknown section]")
    else:
        print(f"{args.key}: a key of the launch's own tree (the read census is main_ppo's)")
    if configured is None:
        return EXIT_OK
    case, mapping = configured
    values = read_census.leaves(mapping)
    if args.key not in values:
        # Another tree's leaf (an FSDP key in a Megatron run): Hydra refuses it without `+`, and
        # with `+` check answers it (upstream's config classes refuse the unknown field).
        print(
            f"\n{args.script}: {args.key} is not a key of this script's configuration; "
            f"setting it needs +{args.key}=VALUE (check it with: verl-compat check "
            f"{args.script} --set +{args.key}=VALUE)"
        )
        return EXIT_OK
    answer = _answer(session, case, args.key, values, not args.no_upstream_checks)
    print(f"\n{args.script}: {args.key} = {values.get(args.key)!r}: {answer.answer}")
    print(f"  {answer.why}")
    said = answer.where if answer.answer == key_answers.ACTS else ()
    for where in said:
        print(f"  read here: {where}")
    for spot, read in off_path.judged(args.key, mapping, session.pin.version) or []:
        if read is None and spot.where in said:
            continue  # a read seen run here is not also a place that "may run"
        because = ", ".join(f"{leaf}={value!r}" for leaf, value in sorted((read or {}).items()))
        state = "off this path" if read is not None else "may run here"
        print(f"  {state}: {spot.where}" + (f"  [{because}]" if because else ""))
    return EXIT_FINDINGS if answer.answer == key_answers.NO_EFFECT else EXIT_OK


def _answer(session: Any, case: Any, key: str, values: dict[str, Any], upstream: bool) -> KeyAnswer:
    """``check``'s answer for ``key`` on the case: the case's own when the script sets the key,
    else the case's with the key set to the value it resolves to (the same configuration, the
    key examined as ``check`` examines the keys a script sets)."""
    from pytest_verl_compat.upstream.verdict import keys as key_answers
    from pytest_verl_compat.upstream.verdict.case import check_case, explicit_keys, live_asker

    if key not in explicit_keys(session, case):
        written = _override(key, values.get(key))
        if written is not None:
            case = session.with_overrides(case, (written,), case_id=f"{case.id}+explain")
    ask = live_asker(session) if upstream else None
    verdict = check_case(session, case, ask)
    found = next((a for a in verdict.keys if a.key == key), None)
    if found is None:  # a value no override can write back: judged on the case as it is
        found = key_answers.answer_keys(
            [key], session.outcome(case).composition.mapping, verdict.findings, session.pin.version
        )[0]
    return found


def _override(key: str, value: Any) -> str | None:
    """``key=value`` as Hydra reads back the same scalar, or None for anything else."""
    if value is None:
        return f"{key}=null"
    if isinstance(value, bool):
        return f"{key}={str(value).lower()}"
    if isinstance(value, int | float):
        return f"{key}={value!r}"
    if isinstance(value, str) and value and all(c.isalnum() or c in "_-./" for c in value):
        return f"{key}={value}"
    return None


def _place(place: Any) -> str:
    text = f"{place.where} {place.function}".rstrip()
    if place.holder:
        text += f" on {place.holder}"
    if place.guard:
        text += f" if {place.guard}"
    text += "" if place.how == "traced" else f" ({place.how})"
    return text + (f", {place.via}" if place.via else "")


def _configuration(session: Any, args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The case of SCRIPT (a launch script or a corpus case id) with ``--set``, and its resolved
    mapping."""
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
    return case, dict(composition.mapping)


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
    parser.add_argument(
        "--no-upstream-checks",
        action="store_true",
        help="answer from the static reading only (no run of the release's code)",
    )
    add_bindings_flags(parser)
    parser.set_defaults(func=cmd_explain)
