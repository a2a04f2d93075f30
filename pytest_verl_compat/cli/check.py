"""``verl-compat check``: findings and verdicts of launch scripts, as a linter gives them.

``check a.sh b.sh dir/ -`` checks every script (a folder's ``*.sh``, sorted; ``-`` is standard
input; a manifest case id also works), one result per file and one summary. Each finding carries
its rule id and where its key was set (``pipeline/locate.py``); ``--select``/``--ignore``,
``--fail-on`` and ``[tool.verl-compat]`` in the nearest ``pyproject.toml`` choose what is reported,
``# verl-compat: ignore[RULE]`` silences one line (``pipeline/suppress.py``).

Exit status: 0 nothing at or above ``--fail-on``, 1 findings at or above it (or, with
``--profile``, a script the reference trainer cannot run), 2 an input that cannot be read or a
usage error (one line each; the other files are still checked and reported), 3 a bug.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from pytest_verl_compat.bash import LaunchExited, LaunchForked, LaunchReadError, Way
from pytest_verl_compat.bash.entry_points import ENTRY_PACKAGES
from pytest_verl_compat.cli.check_report import (
    FORMATS,
    STDIN_LABEL,
    CheckRun,
    FileResult,
    FileStatus,
    dumps,
    github_lines,
    json_report,
    sarif_report,
    summary_line,
    text_lines,
    verdict_lines,
)
from pytest_verl_compat.cli.check_ways import merge_ways
from pytest_verl_compat.cli.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    add_bindings_flags,
    case_for_target,
    flag_bindings,
    given_model_facts,
    open_session,
    override_value,
    say,
)
from pytest_verl_compat.cli.output import note, waiting
from pytest_verl_compat.cli.settings import find_pyproject, settings_from
from pytest_verl_compat.files.safe_input import InputError, read_text
from pytest_verl_compat.model import (
    LEVELS,
    Bindings,
    Case,
    Finding,
    Level,
    Location,
    StageFailed,
)
from pytest_verl_compat.pipeline.audit import AuditSession
from pytest_verl_compat.pipeline.entry_points import UnknownEntryPoint
from pytest_verl_compat.pipeline.locate import Locator, TreeIndex, display_path, set_positions
from pytest_verl_compat.pipeline.retired import retired_entry
from pytest_verl_compat.pipeline.snapshot import write_atomic
from pytest_verl_compat.pipeline.suppress import (
    Selection,
    SelectorError,
    apply_directives,
    check_selectors,
    directives,
)
from pytest_verl_compat.upstream.verdict.rules import (
    COMPOSE,
    LAUNCH_NO_LAUNCHER,
    LAUNCH_UNKNOWN_ENTRY,
    LAUNCH_UNREADABLE,
    all_rules,
)

MAX_SCRIPT_BYTES = 1 << 20  # the launch reader's own bound
STDIN = "-"


def _split(values: Sequence[str] | None) -> list[str] | None:
    if values is None:
        return None
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def selection(args: argparse.Namespace) -> Selection:
    """The rules to report and the failing level: command-line values replace the file's."""
    settings: dict[str, Any] = {}
    where = "the command line"
    if not args.isolated:
        found = find_pyproject(Path.cwd())
        if found is not None:
            settings = settings_from(found)
            where = str(found)
    known = list(all_rules())
    try:
        select = check_selectors(settings.get("select", []), known, where)
        ignore = check_selectors(settings.get("ignore", []), known, where)
        given_select, given_ignore = _split(args.select), _split(args.ignore)
        if given_select is not None:
            select = check_selectors(given_select, known, "--select")
        if given_ignore is not None:
            ignore = check_selectors(given_ignore, known, "--ignore")
    except SelectorError as exc:
        raise UsageError(str(exc)) from exc
    fail_on: Level = args.fail_on or settings.get("fail-on", "error")
    args.settings_gpu = settings.get("gpu")
    return Selection(select, ignore, fail_on)


# --- targets ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One thing to check: a script file, standard input, or a manifest case."""

    label: str
    path: Path | None = None
    case_id: str | None = None
    text: str | None = None  # standard input's text
    error: str = ""  # a target that cannot be checked (one line)


def _folder_scripts(folder: Path) -> Iterator[Path]:
    """Every ``*.sh`` under ``folder``, sorted; hidden folders and folder links are not entered."""
    found: list[Path] = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend(Path(root) / name for name in files if name.endswith(".sh"))
    yield from sorted(found)


def _looks_like_path(target: str) -> bool:
    return target.endswith((".sh", ".bash")) or target.startswith((".", "/", "~")) or "/" in target


def targets(args: argparse.Namespace, session: AuditSession) -> list[Target]:
    out: list[Target] = []
    for given in args.targets:
        if given == STDIN:
            label = args.stdin_filename or STDIN_LABEL
            data = sys.stdin.buffer.read(MAX_SCRIPT_BYTES + 1)
            if len(data) > MAX_SCRIPT_BYTES:
                out.append(
                    Target(label, error=f"{label}: the script is over {MAX_SCRIPT_BYTES} bytes")
                )
                continue
            try:
                out.append(Target(label, text=data.decode("utf-8")))
            except UnicodeDecodeError:
                out.append(Target(label, error=f"{label}: the script is not UTF-8 text"))
            continue
        path = Path(given).expanduser()
        if path.is_dir():
            scripts = list(_folder_scripts(path))
            out.extend(Target(display_path(p.absolute()), p) for p in scripts)
            if not scripts:
                say("check", f"{given}: no *.sh script in this folder")
        elif os.path.lexists(path):
            out.append(Target(given, path))
        elif given in {case.id for case in session.cases}:  # field/… ids have a slash
            out.append(Target(given, case_id=given))
        elif _looks_like_path(given):
            out.append(Target(given, error=f"{given}: launch script not found"))
        else:
            case_for_target(session, given, args)  # a UsageError for an unknown case id
            out.append(Target(given, case_id=given))
    return out


# --- one target ---------------------------------------------------------------------------------


@dataclass
class Prepared:
    """A target read and composed: what check_case needs, and how to locate its findings; or
    its ways, each prepared, where the script parts at conditions only its run decides."""

    target: Target
    case: Case | None = None
    locator: Locator | None = None
    result: FileResult | None = None  # set when the target ends before check_case
    ways: list[tuple[Way, Prepared]] = dataclasses.field(default_factory=list)
    # Where the first condition the ways part at is (the note about the ways points there).
    parted: Location | None = None
    # A launch of an entry point the release no longer has but an earlier one did (its case,
    # beside the result that says so; its read fields are the locator's): fit forecasts it as
    # the trainer that replaced it.
    retired: Case | None = None

    def cases(self) -> list[Case]:
        """The cases to ask upstream about: this one's, or each way's."""
        own = [self.case] if self.case is not None else []
        return own + [case for _, way in self.ways for case in way.cases()]


# What the reader stopped at that a binding decides, and the binding that decides it.
_UNBOUND = ("unbound variable", "parameter check")


def _launch_fix(exc: LaunchReadError, bindings: Bindings) -> str:
    """The binding that gets a refused read past where it stopped, where one does: a variable
    the script needs (``set -u``, ``${X:?}``) or, for a script that exits before its launcher
    when read with no arguments, the arguments its usage asks for."""
    if isinstance(exc, LaunchExited):
        if exc.status and not bindings.args:
            return (
                'it was read with no arguments ("$#" is 0); give it the ones it takes: --arg WORD'
            )
        return ""
    if exc.construct == "no launcher":
        return ""
    if exc.construct not in _UNBOUND:
        return "bind the value, or write the override literally"
    name = exc.detail.split(":", 1)[0].lstrip("$")
    if name.isdigit() or name in ("@", "*"):  # a positional parameter: "$@" is the arguments
        return "give the script the arguments it takes: --arg WORD"
    return f"bind it: --env {name}=VALUE"


def _launch_finding(exc: LaunchReadError, label: str, bindings: Bindings) -> Finding:
    rule = (
        LAUNCH_NO_LAUNCHER
        if isinstance(exc, LaunchExited) or exc.construct == "no launcher"
        else LAUNCH_UNREADABLE
    )
    level: Level = "info" if rule == LAUNCH_NO_LAUNCHER else "error"
    fix = _launch_fix(exc, bindings)
    return Finding(
        level,
        "<launch>",
        f"{exc.construct}: {exc.detail}".replace("\n", "\\n"),
        fix,
        check=rule,
        location=Location(label, exc.line or 1, 0, "script"),
    )


def _launch_line(session: AuditSession, case: Case, label: str) -> Location:
    """The launcher line of a case whose launch the reader did follow (line 1 when unknown)."""
    try:
        line = session.read_fields(case).launch_line
    except StageFailed:
        line = None
    return Location(label, line or 1, 0, "launcher")


def _condition_place(way: Way, label: str, launch: str | None) -> Location:
    """Where the first condition a script's ways part at is written: its line in the script,
    or the script's first line when it is in a file the script sources."""
    first = way.conditions[0] if way.conditions else None
    script = os.path.normpath(launch or "")
    if first is None or not launch or not os.path.normpath(first.path).endswith(script):
        return Location(label, 1, 0, "script")
    return Location(label, first.line, 0, "script")


def _script_text(target: Target, scratch: Path) -> tuple[Path, str]:
    """The script's file and text (standard input is written to a private file first)."""
    if target.text is not None:
        path = scratch / "stdin.sh"
        path.write_text(target.text, encoding="utf-8")
        return path, target.text
    assert target.path is not None
    return target.path, read_text(target.path, MAX_SCRIPT_BYTES, "launch script")


def prepare(
    session: AuditSession, target: Target, args: argparse.Namespace, scratch: Path
) -> Prepared:
    named = target.case_id or ""  # the case id a result names, when a case was named
    if target.error:
        return Prepared(
            target, result=FileResult(target.label, "unreadable", error=target.error, case=named)
        )
    text: str | None = None
    fallback: Location | None = None
    label = target.label
    try:
        if target.case_id is not None:
            case = case_for_target(session, target.case_id, args)
            assert session.manifest is not None
            fallback = Location(display_path(session.manifest.path), case.line, 0, "manifest")
        else:
            path, text = _script_text(target, scratch)
            if not any(package in text for package in ENTRY_PACKAGES):
                # No word of an entry package at all: a helper script, not read further.
                finding = Finding(
                    "info",
                    "<launch>",
                    "no module of verl's entry packages is named in the script: nothing to check",
                    check=LAUNCH_NO_LAUNCHER,
                    location=Location(label, 1, 0, "script"),
                )
                return Prepared(
                    target, result=FileResult(label, "not-a-launcher", [finding], case=named)
                )
            case = session.case_for_script(path, flag_bindings(args))
            # The session keeps each case's results by id, and a script's id is its stem: two
            # scripts of one call (grpo_trainer/run_x.sh, ppo_trainer/run_x.sh) must not share.
            case = dataclasses.replace(case, id=f"{case.id}@{path.resolve()}")
    except InputError as exc:
        return Prepared(target, result=FileResult(label, "unreadable", error=str(exc), case=named))
    except StageFailed as exc:
        return Prepared(target, result=FileResult(label, "unreadable", error=str(exc), case=named))
    return prepare_case(session, target, case, args, text, fallback)


def prepare_case(
    session: AuditSession,
    target: Target,
    case: Case,
    args: argparse.Namespace,
    text: str | None,
    fallback: Location | None,
    split: bool = True,
) -> Prepared:
    """Read and compose one case (a script's, or one way of it) and make its locator; a script
    whose ways part at a condition only its run decides is prepared way by way (``split``)."""
    named = target.case_id or ""
    label = target.label
    overrides = tuple(args.set or ())
    base = case
    try:
        case = session.with_overrides(case, overrides)
        outcome = session.outcome(case)
    except InputError as exc:
        return Prepared(target, result=FileResult(label, "unreadable", error=str(exc), case=named))
    except StageFailed as exc:
        if split and isinstance(exc.__cause__, LaunchForked):
            try:
                ways = session.case_ways(base)
            except StageFailed as refused:
                exc = refused
            else:
                return Prepared(
                    target,
                    ways=[
                        (way, prepare_case(session, target, case, args, text, fallback, False))
                        for way, case in ways
                    ],
                    parted=_condition_place(ways[0][0], label, base.launch),
                )
        cause = exc.__cause__
        if isinstance(cause, UnknownEntryPoint):
            fix = f"launch {cause.near}" if cause.near else ""
            unknown = Finding(
                "error", "<launch>", str(cause), fix, check=LAUNCH_UNKNOWN_ENTRY,
                location=_launch_line(session, case, label),
            )  # fmt: skip
            retired = case if retired_entry(cause.module) is not None else None
            # fit forecasts a retired entry point's launch from these fields (the --set overrides
            # after the script's), its findings located at the script's keys as a composed
            # launch's are
            locator = None
            if retired is not None:
                read = session.read_fields(case)
                fields = dataclasses.replace(read, fields=(*read.fields, *overrides))
                locator = Locator(label, text, fields, set_positions(args.argv, overrides))
            return Prepared(
                target,
                result=FileResult(label, "checked", [unknown], valid=False, case=named),
                retired=retired,
                locator=locator,
            )
        if isinstance(cause, LaunchReadError):
            finding = _launch_finding(cause, label, case.bindings)
            status: FileStatus = (
                "not-a-launcher" if finding.rule == LAUNCH_NO_LAUNCHER else "checked"
            )
            valid = None if status == "not-a-launcher" else False
            return Prepared(
                target, result=FileResult(label, status, [finding], valid=valid, case=named)
            )
        return Prepared(target, result=FileResult(label, "unreadable", error=str(exc), case=named))
    if text is None and case.launch is not None and outcome.fields_source == "launch":
        root = session.upstream.root if session.upstream is not None else Path("/")
        try:
            text = read_text(root / case.launch, MAX_SCRIPT_BYTES, "launch script")
            label = display_path(root / case.launch)
        except InputError:
            text = None
    fields = outcome.fields

    def config_files() -> list[tuple[Path, str]]:
        return session.composer().config_files(fields.fields)

    locator = Locator(
        label,
        text,
        fields,
        set_positions(args.argv, overrides),
        TreeIndex(config_files) if outcome.composition.composed else None,
        fallback,
    )
    return Prepared(target, case, locator)


def finish(
    session: AuditSession,
    prepared: Prepared,
    ask: Any,
    chosen: Selection,
    gpu: Any = None,
) -> FileResult:
    from pytest_verl_compat.upstream.verdict.case import check_case

    if prepared.ways:
        results = [(way, finish(session, part, ask, chosen, gpu)) for way, part in prepared.ways]
        assert prepared.parted is not None
        return merge_ways(prepared.target.label, results, chosen, prepared.parted)
    if prepared.result is not None:
        result = prepared.result
        result.findings = [f for f in result.findings if chosen.reports(f.rule)]
        return result
    assert prepared.case is not None and prepared.locator is not None
    locator = prepared.locator
    try:
        verdict = check_case(session, prepared.case, ask)
    except StageFailed as exc:
        return FileResult(locator.label, "unreadable", error=str(exc))
    found = list(verdict.findings)
    if gpu is not None:  # check --gpu: the memory forecast's findings too
        from pytest_verl_compat.cli.fit_common import memory_check

        memory = memory_check(session, prepared.case, gpu)
        if any(f.rule == COMPOSE for f in memory):
            # composed without the overrides the tree rejects: each is said at its own line
            # (memory_check's compose errors), Hydra's first rejection no longer alone
            found = [f for f in found if f.rule != COMPOSE]
        # a finding check's own rules already gave (a LoRA critic is both a check and a
        # refusal the forecast meets) is said once
        said = {(f.rule, f.path) for f in found}
        found = [*found, *(f for f in memory if (f.rule, f.path) not in said)]
    located = [f for f in locator.located(found) if chosen.reports(f.rule)]
    launcher = locator.launcher()
    silenced = 0
    if locator.text is not None:
        known = list(all_rules())
        outcome = apply_directives(
            located,
            directives(locator.text),
            locator.label,
            launcher.line if launcher is not None else None,
            known,
        )
        located = list(outcome.kept) + [f for f in outcome.unused if chosen.reports(f.rule)]
        silenced = outcome.silenced
    return FileResult(
        locator.label,
        "checked",
        located,
        silenced,
        verdict.valid,
        verdict.runnable if verdict.composed else False,
        verdict.not_runnable,
        verdict.upstream_skipped,
        launcher=launcher,
        problems=verdict.problems,
        model_facts=bool(session.model_facts(prepared.case)) if verdict.composed else None,
        case=prepared.target.case_id or "",
        keys=[answer.to_json() for answer in verdict.keys],
    )


# --- the command --------------------------------------------------------------------------------


def tool_version() -> str:
    try:
        return metadata.version("pytest-verl-compat")
    except metadata.PackageNotFoundError:
        return "unknown"


def _asker(
    session: AuditSession, prepared: list[Prepared], args: argparse.Namespace
) -> tuple[Any, Callable[[], None]]:
    """Upstream's early checks for every composed case: one oracle process for the whole run."""
    from pytest_verl_compat.upstream.verdict.case import many_asker

    cases = [case for p in prepared for case in p.cases()]
    return many_asker(session, cases, enabled=not args.no_upstream_checks)


def cmd_check(args: argparse.Namespace) -> int:
    """Check every target; print the findings in the chosen format, then the summary."""
    if not hasattr(args, "argv"):
        args.argv = []
    chosen = selection(args)
    gpu = None
    if getattr(args, "gpu", None) or getattr(args, "gpu_memory", None) or args.settings_gpu:
        from pytest_verl_compat.cli.fit_common import choose_gpu

        gpu = choose_gpu(args.gpu, args.gpu_memory, args.settings_gpu)
    session = open_session(args)
    if args.model_config:
        session.model_facts_override = given_model_facts(args.model_config)
    if args.targets.count(STDIN) > 1:
        raise UsageError("standard input (-) can be read once")
    listed = targets(args, session)
    with tempfile.TemporaryDirectory(prefix="verl-compat-check-") as scratch:
        with waiting("check", f"composing {_count(listed)} on the verl {session.pin.version} tree"):
            prepared = [prepare(session, target, args, Path(scratch)) for target in listed]
        with waiting(
            "check",
            f"starting verl {session.pin.version} for its own checks "
            "(import ~5 s in a sandboxed process; answers are cached)",
        ):
            ask, close = _asker(session, prepared, args)
            try:
                results = [finish(session, p, ask, chosen, gpu) for p in prepared]
            finally:
                close()
    rules = all_rules(session.pin.version, Path(session.profile_name).stem)
    if gpu is None:  # the memory.* pages belong to check --gpu's output only
        rules = {rule: doc for rule, doc in rules.items() if not rule.startswith("memory.")}
    run = CheckRun(
        results,
        session.version,
        tool_version(),
        rules,
        Path.cwd(),
        session.release.why if session.release else "",
    )
    write_output(run, args, session)
    return exit_status(run, chosen, args)


def _count(listed: Sequence[Target]) -> str:
    return listed[0].label if len(listed) == 1 else f"{len(listed)} targets"


def exit_status(run: CheckRun, chosen: Selection, args: argparse.Namespace) -> int:
    if any(r.status == "unreadable" for r in run.results):
        return EXIT_USAGE
    failing = any(chosen.fails(f) for r in run.results for f in r.findings)
    if args.profile:
        failing = failing or any(r.runnable is False for r in run.results)
    return EXIT_FINDINGS if failing else EXIT_OK


def write_output(
    run: CheckRun, args: argparse.Namespace, session: AuditSession, command: str = "check"
) -> None:
    many = len(run.results) > 1
    for result in run.results:
        if result.status == "unreadable":
            say(command, result.error)
    # The release is a choice, said as one: which one, and what chose it (an input not read was
    # checked against none).
    if any(result.status != "unreadable" for result in run.results):
        note(command, f"checked against verl {run.version} ({run.release_why})")
    skipped = sorted({r.upstream_skipped for r in run.results if r.upstream_skipped})
    for reason in skipped:
        say(command, f"upstream's own checks skipped: {reason}")
    if args.format == "text":
        lines = [line for r in run.results for line in text_lines(r)]
    elif args.format == "github":
        lines = github_lines(run)
    else:
        payload = json_report(run) if args.format == "json" else sarif_report(run)
        lines = [dumps(payload).rstrip("\n")]
    text = "".join(line + "\n" for line in lines)
    if args.output_file:
        try:
            write_atomic(Path(args.output_file), text)
        except OSError as exc:
            raise UsageError(f"{args.output_file}: cannot write: {exc.strerror}") from exc
    else:
        sys.stdout.write(text)
    if args.format != "text":
        if many:
            print(summary_line(run), file=sys.stderr)
        return
    for result in run.results:
        prefix = f"{result.label}: " if many else ""
        if args.profile:
            for problem in result.problems:
                print(f"{prefix}ERROR {problem}")
        if not many and result.model_facts is False:
            print(
                "model facts: none (no local config.json at the model paths; --model-config PATH "
                "adds the heads, experts and context checks)",
                file=sys.stderr,
            )
        for line in verdict_lines(result, run.version, many):
            print(line, file=sys.stderr)
    if many:
        print(summary_line(run), file=sys.stderr)


def add_check_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    check = sub.add_parser(
        "check",
        parents=[common],
        help="print the findings of launch scripts (or cases); exit 1 on an error",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    check.add_argument(
        "targets",
        nargs="+",
        metavar="SCRIPT|FOLDER|CASE|-",
        help="launch scripts, folders (their *.sh, sorted), manifest case ids, or - for stdin",
    )
    check.add_argument(
        "--set", action="append", type=override_value, metavar="KEY=VALUE", help="an extra override"
    )
    add_report_flags(check)
    check.add_argument(
        "--gpu",
        metavar="TYPE",
        help="also forecast each phase's GPU memory on this GPU type (memory.* findings; see fit)",
    )
    check.add_argument(
        "--gpu-memory",
        type=float,
        metavar="GIB",
        help="as --gpu, for a GPU of this many usable GiB",
    )
    check.add_argument(
        "--stdin-filename", metavar="NAME", help="the name of the script read from standard input"
    )
    check.add_argument(
        "--profile",
        action="store_true",
        help="also fail (exit 1) when the reference trainer cannot run the case, listing why",
    )
    add_bindings_flags(check)
    check.set_defaults(func=cmd_check)


def add_report_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that choose and print findings: ``check``'s, and ``compile``'s (one rule set)."""
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="text",
        help="text (default), json (schema: pytest_verl_compat/data/check.schema.json), "
        "sarif (2.1.0, for GitHub code scanning) or github (workflow annotations)",
    )
    parser.add_argument(
        "--output-file", metavar="PATH", help="write the findings there instead of stdout"
    )
    parser.add_argument(
        "--select",
        action="append",
        metavar="RULES",
        help="report only these rule ids or families (comma-separated; e.g. batch,upstream)",
    )
    parser.add_argument(
        "--ignore",
        action="append",
        metavar="RULES",
        help="do not report these rule ids or families",
    )
    parser.add_argument(
        "--fail-on",
        choices=LEVELS[:2],
        default=None,
        help="exit 1 on findings at or above this level (default: error)",
    )
    parser.add_argument(
        "--isolated",
        action="store_true",
        help="ignore [tool.verl-compat] in pyproject.toml",
    )
    parser.add_argument(
        "--model-config",
        metavar="PATH|MODEL",
        help="the actor model's config.json (or its folder), or a model the shipped table or the "
        "Hugging Face cache knows by name: checks heads, experts, context length and tokenizer "
        "against the layout, and --gpu forecasts with it; read as JSON only, never run",
    )
    parser.add_argument(
        "--no-upstream-checks",
        action="store_true",
        help="skip upstream's own config-only checks (run in a sandboxed verl process, cached)",
    )
