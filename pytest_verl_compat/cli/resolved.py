"""``verl-compat compile RESOLVED``: a run's resolved configuration, checked by ``check``'s rules.

A run folder's ``.hydra/config.yaml`` (or the folder itself; Hydra's ``overrides.yaml`` beside it
names the keys the run set) becomes a case of the session (``AuditSession.case_for_resolved``):
composed as a launch is (a ``_target_`` the tree does not name is refused, the file must match the
tree of its family, main_ppo's or the SFT trainer's), compiled against that family's profile, and
judged by ``upstream.verdict.case.check_case`` with upstream's own early checks, exactly as
``check`` judges a script. The findings print in ``check``'s formats; each is located at its key's
line in the resolved file. What a resolved file cannot give is the launch's own: the script's
lines, its entry module (main_ppo is assumed for an RL tree), the launcher, and torchrun's world
(``--world-size``); ``docs/compiler.md`` lists the rules that need them.

Exit status as ``check --profile``: 1 when a finding is at or above ``--fail-on`` or the
reference trainer cannot run the configuration; ``--full`` prints the compile report (every
leaf's class) instead, exit 1 when it is not accepted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pytest_verl_compat.cli.check import (
    Prepared,
    Target,
    add_report_flags,
    exit_status,
    finish,
    selection,
    tool_version,
    write_output,
)
from pytest_verl_compat.cli.check_report import CheckRun, FileResult
from pytest_verl_compat.cli.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    existing_file,
    given_model_facts,
    open_session,
    say,
)
from pytest_verl_compat.cli.output import waiting
from pytest_verl_compat.files.safe_input import InputError
from pytest_verl_compat.model import Location, StageFailed
from pytest_verl_compat.pipeline.audit import AuditSession
from pytest_verl_compat.pipeline.locate import Locator, TreeIndex, display_path
from pytest_verl_compat.pipeline.resolved import CONFIG_FILE, HYDRA_FOLDER
from pytest_verl_compat.upstream.verdict.rules import all_rules


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of processes, 1 or more")
    return value


def add_world_size_flag(parser: argparse.ArgumentParser) -> None:
    """``--world-size``, for a resolved file (compile, fit): what no resolved file records."""
    parser.add_argument(
        "--world-size",
        type=_positive,
        metavar="N",
        help="the processes the run's launcher started (torchrun's nnodes x nproc_per_node), "
        "which a resolved file does not record",
    )


def is_resolved_target(given: str) -> bool:
    """Whether a command's target is a run's resolved configuration (a ``.yaml`` file, or a run
    folder holding ``.hydra/config.yaml``) rather than a launch script or a case."""
    path = Path(given)
    if path.is_dir():
        return (path / HYDRA_FOLDER / CONFIG_FILE).is_file()
    return path.suffix.lower() in (".yaml", ".yml") and path.is_file()


def prepare_resolved(session: AuditSession, given: str, args: argparse.Namespace) -> Prepared:
    """The resolved file as ``check`` prepares a script: its case, and a locator that finds each
    key at its own line of the file (``Locator.defined_here``)."""
    label = display_path(Path(given).absolute())
    target = Target(label, Path(given))
    try:
        case = session.case_for_resolved(given, args.world_size)
        outcome = session.outcome(case)
    except (InputError, StageFailed) as exc:
        return Prepared(target, result=FileResult(label, "unreadable", error=str(exc)))
    assert case.resolved is not None
    file = Path(case.resolved)
    label = display_path(file)
    locator = Locator(
        label,
        None,
        outcome.fields,
        (),
        TreeIndex(lambda: [(file, "")]),
        Location(label, 1, 0, "resolved"),
        defined_here=True,
    )
    return Prepared(Target(label, file), case, locator)


def cmd_compile(args: argparse.Namespace) -> int:
    """Check a run's resolved configuration with ``check``'s rules; print as ``check`` does."""
    args.argv, args.profile = [], True
    existing_file(args.resolved, "resolved configuration")
    chosen = selection(args)
    session = open_session(args)
    if args.model_config:
        session.model_facts_override = given_model_facts(args.model_config)
    prepared = prepare_resolved(session, args.resolved, args)
    if prepared.case is not None and args.tree:
        _say_other_trees(session, prepared, args.tree)
    if args.full:
        return _full_report(session, prepared)
    from pytest_verl_compat.upstream.verdict.case import many_asker

    cases = [prepared.case] if prepared.case is not None else []
    with waiting("compile", f"starting verl {session.pin.version} for its own checks"):
        ask, close = many_asker(session, cases, enabled=not args.no_upstream_checks)
        try:
            result = finish(session, prepared, ask, chosen)
        finally:
            close()
    rules = all_rules(session.pin.version, Path(session.profile_name).stem)
    run = CheckRun(
        [result],
        session.version,
        tool_version(),
        rules,
        Path.cwd(),
        session.release.why if session.release else "",
    )
    write_output(run, args, session, "compile")
    return exit_status(run, chosen, args)


def _say_other_trees(session: AuditSession, prepared: Prepared, trees: list[str]) -> None:
    """Which of the trees given the file most likely comes from (stderr), when it is not the
    checked release's."""
    from pytest_verl_compat.pipeline.compose import Composer
    from pytest_verl_compat.pipeline.pins import UpstreamError, checkout_tree
    from pytest_verl_compat.pipeline.resolved import ResolvedFileError, check_resolved, load_run

    assert prepared.case is not None and prepared.case.resolved is not None
    if session.outcome(prepared.case).composition.composed:
        return
    others = []
    for tree_path in trees:
        try:
            tree = checkout_tree(Path(tree_path), session.pin, "option")
        except UpstreamError as exc:
            raise UsageError(str(exc)) from exc
        others.append(
            (f"the tree at {tree_path}", Composer(tree.config_dir, session.pin.config_name))
        )
    try:
        run = load_run(Path(prepared.case.resolved))
        check = check_resolved(run.mapping, session.composer(), f"verl {session.version}", others)
    except ResolvedFileError:
        return
    for line in check.lines():
        print(line, file=sys.stderr)


def _full_report(session: AuditSession, prepared: Prepared) -> int:
    """The compile report as JSON: every leaf's class and the static findings."""
    from pytest_verl_compat.pipeline.snapshot import dumps

    if prepared.result is not None:
        say("compile", prepared.result.error)
        return EXIT_USAGE
    assert prepared.case is not None
    report = session.compile(prepared.case)
    if report is None:
        reason = session.outcome(prepared.case).composition.reason
        say("compile", f"{prepared.target.label}: not compiled: {reason}")
        return EXIT_FINDINGS
    sys.stdout.write(dumps(report.to_json()))
    return EXIT_OK if report.accepted else EXIT_FINDINGS


def add_compile_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    comp = sub.add_parser(
        "compile",
        parents=[common],
        help="check a run's resolved configuration (RUN/.hydra/config.yaml) with check's rules",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    comp.add_argument(
        "resolved",
        metavar="RESOLVED.yaml|RUN",
        help="a resolved configuration file, or a run folder holding .hydra/config.yaml",
    )
    comp.add_argument(
        "--tree", action="append", metavar="PATH", help="another upstream tree to compare with"
    )
    comp.add_argument(
        "--full",
        action="store_true",
        help="print the compile report (every leaf's class and the static findings) as JSON",
    )
    add_world_size_flag(comp)
    add_report_flags(comp)
    comp.set_defaults(func=cmd_compile)
