"""``verl-compat census``: upstream's checks on the main_ppo V1 path, and which ``check`` runs."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from typing import Any

from pytest_verl_compat.cli.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    UsageError,
    open_session,
    release_root,
    say,
)
from pytest_verl_compat.pipeline.answers import (
    CHECKS,
    dumps_recorded,
    load_recorded,
    recorded_path,
    stale_keys,
)
from pytest_verl_compat.pipeline.snapshot import write_atomic


def cmd_census(args: argparse.Namespace) -> int:
    """Scan the installed verl, run the probes' coverage, print or write the page."""
    from pytest_verl_compat.upstream.census import checks as census
    from pytest_verl_compat.upstream.census import checks_run as census_run

    session = open_session(args)
    root = release_root(session)
    if args.reads:
        return _reads(args, session, root)
    reasons = census.load_reasons(session.version)
    traced = census_run.recorded_traced(session.golden_dir)
    entries = census.settled(census.scan(root, traced, reasons), reasons)
    configs = census_run.configurations(session)
    recorded_file = census_run.recorded_file(session)
    recorded = {} if args.fresh else load_recorded(recorded_file)
    say("census", f"{len(entries)} checks on {len(configs)} configurations")
    ran, answers = census_run.coverage(configs, entries, recorded, release=session.version)
    asked = sum(1 for key in answers if key not in recorded)
    say("census", f"{len(answers) - asked} answers recorded, {asked} asked of the oracle")
    page = census_run.render(session.pin.version, entries, ran, reasons, len(configs))
    counts = census.summary(entries, ran, reasons)
    print(
        f"census: {counts['entries']} checks ({counts['config']} read the configuration); "
        f"{counts['config_evaluated']} evaluated by check; {len(counts['unexplained'])} unexplained",
        file=sys.stderr,
    )
    if args.check:
        target = Path(args.check)
        old = target.read_text(encoding="utf-8") if target.is_file() else ""
        missing, unused = stale_keys(load_recorded(recorded_file), answers)
        if missing or unused:
            say(
                "census",
                f"{recorded_file} is stale ({len(missing)} answers not recorded, {len(unused)} "
                "no longer asked): re-record with `verl-compat census --write PAGE`",
            )
        if old != page:
            say("census", f"{target} is out of date:")
            sys.stderr.writelines(
                difflib.unified_diff(
                    old.splitlines(True), page.splitlines(True), str(target), "now", n=0
                )
            )
            return EXIT_FINDINGS
        if missing or unused:
            return EXIT_FINDINGS
        say("census", f"{target} is up to date")
        return EXIT_FINDINGS if counts["unexplained"] else EXIT_OK
    if args.write:
        write_atomic(Path(args.write), page)
        write_atomic(recorded_file, dumps_recorded(CHECKS, answers).decode("utf-8"))
        say("census", f"wrote {args.write} and {recorded_file}")
    elif args.json:
        sys.stdout.write(json.dumps(counts, indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write(page)
    return EXIT_FINDINGS if counts["unexplained"] else EXIT_OK


def _compare(target: Path, page: str) -> bool:
    """Whether ``target`` holds ``page``; says how it differs when not."""
    old = target.read_text(encoding="utf-8") if target.is_file() else ""
    if old == page:
        say("census", f"{target} is up to date")
        return True
    say("census", f"{target} is out of date:")
    sys.stderr.writelines(
        difflib.unified_diff(old.splitlines(True), page.splitlines(True), str(target), "now", n=0)
    )
    return False


def read_trees(session: Any, verl_parent: Path) -> dict[str, dict[str, Any]]:
    """main_ppo's composed trees by name: the default ``ppo_trainer`` and each other choice of
    its ``model_engine`` group (the installed verl's ``trainer/config/model_engine/*.yaml``)."""
    default = session.composer().compose((), {})
    if not default.composed:
        raise UsageError(f"main_ppo's default tree does not compose: {default.reason}")
    trees = {"ppo_trainer": dict(default.mapping)}
    for path in sorted((verl_parent / "verl/trainer/config/model_engine").glob("*.yaml")):
        override = f"model_engine={path.stem}"
        composed = session.composer().compose((override,), {})
        if composed.composed and dict(composed.mapping) != trees["ppo_trainer"]:
            trees[override] = dict(composed.mapping)
    return trees


def _reads(args: argparse.Namespace, session: Any, verl_parent: Path) -> int:
    """The read census (``read_census``): every leaf of main_ppo's trees and where verl reads it."""
    from pytest_verl_compat.upstream.census import checks_run as census_run
    from pytest_verl_compat.upstream.census import off_path
    from pytest_verl_compat.upstream.census import reads as read_census
    from pytest_verl_compat.upstream.census import reads_page as read_census_page

    trees = read_trees(session, verl_parent)
    configs = census_run.reads_configurations(census_run.configurations(session))
    recorded_file = recorded_path(session.golden_dir, census_run.READS_NAME)
    recorded = {} if args.fresh else load_recorded(recorded_file)
    wanted = {leaf for tree in trees.values() for leaf in read_census.leaves(tree)}
    say("census", f"{len(wanted)} leaves; the probes' reads on {len(configs)} configurations")
    traced, answer = census_run.traced_reads(configs, wanted, recorded, release=session.version)
    copies = session.composer().interpolation_sources()
    explicit = census_run.explicit_keys(session)
    outside = read_census_page.explicit_outside(trees, explicit)
    entries = read_census.census(verl_parent, trees, traced, copies, outside)
    page = read_census_page.render(session.pin.version, entries, len(configs), trees, explicit)
    # What ``effect.off-path`` reads without verl (package data), from the same census.
    data_file = off_path.DATA_FILE
    previous = data_file.read_text(encoding="utf-8") if data_file.is_file() else ""
    data = off_path.dumps(
        session.pin.version, off_path.build(verl_parent, trees, traced, entries), previous
    )
    counts = read_census_page.summary(entries)
    found = read_census_page.explicit_coverage(entries, explicit)
    counts["explicit keys"] = found.total
    counts["explicit decided"] = len(found.decided)
    print(
        f"census --reads: {counts['leaves']} leaves; {counts['traced']} traced, "
        f"{counts['static']} static only, {counts[read_census.COPIED]} through a copy, "
        f"{counts['never read']} never read, {counts['undecided']} undecided; the scripts' "
        f"explicit keys: {len(found.decided)} of {found.total} decided",
        file=sys.stderr,
    )
    if args.check:
        missing, unused = stale_keys(load_recorded(recorded_file), answer)
        up_to_date = _compare(Path(args.check), page)
        data_current = _compare(data_file, data)
        if missing or unused:
            say("census", f"{recorded_file} is stale: re-record with `census --reads --write`")
        current = up_to_date and data_current and not (missing or unused)
        return EXIT_OK if current else EXIT_FINDINGS
    if args.write:
        write_atomic(Path(args.write), page)
        write_atomic(recorded_file, dumps_recorded(CHECKS, answer).decode("utf-8"))
        write_atomic(data_file, data)
        say("census", f"wrote {args.write}, {recorded_file} and {data_file}")
    elif args.json:
        sys.stdout.write(json.dumps(counts, indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write(page)
    return EXIT_OK


def add_census_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser(
        "census",
        parents=[common],
        help="list verl's raise/assert checks on the main_ppo path and which `check` evaluates",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--write", metavar="PATH", help="write the page (docs/census/VERSION/checks.md)"
    )
    mode.add_argument("--check", metavar="PATH", help="exit 1 when PATH is not the page of now")
    mode.add_argument("--json", action="store_true", help="print the counts as JSON")
    parser.add_argument(
        "--reads",
        action="store_true",
        help="the read census instead: every leaf of main_ppo's tree and where verl reads it "
        "(docs/census/VERSION/reads.md)",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="ask the oracle for every configuration, ignoring the recorded answers "
        "(golden/answers/census.json, reads.json)",
    )
    parser.set_defaults(func=cmd_census)
