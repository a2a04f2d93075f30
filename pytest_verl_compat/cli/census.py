"""``verl-compat census``: upstream's checks on the main_ppo V1 path, and which ``check`` runs."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from typing import Any

from pytest_verl_compat.cli.common import EXIT_FINDINGS, EXIT_OK, UsageError, open_session, say
from pytest_verl_compat.pipeline.answers import CHECKS, dumps_recorded, load_recorded, stale_keys
from pytest_verl_compat.pipeline.pins import installed_verl_root
from pytest_verl_compat.pipeline.snapshot import write_atomic


def cmd_census(args: argparse.Namespace) -> int:
    """Scan the installed verl, run the probes' coverage, print or write the page."""
    from pytest_verl_compat.upstream import census, census_run

    installed = installed_verl_root()
    session = open_session(args)
    if installed is None or installed[1] != session.pin.version:
        raise UsageError(
            f"needs the installed verl {session.pin.version}: pip install 'pytest-verl-compat[upstream]'"
        )
    reasons = census.load_reasons()
    entries = census.settled(census.scan(installed[0]), reasons)
    configs = census_run.configurations(session)
    recorded_file = census_run.recorded_file(session)
    recorded = {} if args.fresh else load_recorded(recorded_file)
    say("census", f"{len(entries)} checks on {len(configs)} configurations")
    ran, answers = census_run.coverage(configs, entries, recorded)
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


def add_census_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser(
        "census",
        parents=[common],
        help="list verl's raise/assert checks on the main_ppo path and which `check` evaluates",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", metavar="PATH", help="write the page (docs/upstream-checks.md)")
    mode.add_argument("--check", metavar="PATH", help="exit 1 when PATH is not the page of now")
    mode.add_argument("--json", action="store_true", help="print the counts as JSON")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="ask the oracle for every configuration, ignoring golden/answers/census.json",
    )
    parser.set_defaults(func=cmd_census)
