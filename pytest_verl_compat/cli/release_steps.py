"""The steps of ``verl-compat release derive``: what a release's own files give, in order.

Each step derives one kind of fact from the release's pinned wheel (and runs its code only in its
own environment), keeps it (``Derivation.keep``: written, or named stale with ``--check``) and
adds to ``Derivation.person`` what no derivation can settle: a profile rule to review, a rule
whose cited line the release changed, a patch point or statement the probes need that moved, a
census entry nobody explained, a case the release judges otherwise than the manifest expects.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_verl_compat.pipeline.snapshot import write_atomic
from pytest_verl_compat.releases.environment_records import RECORDS, EnvironmentRecord
from pytest_verl_compat.releases.index import (
    Release,
    ReleaseError,
    ReleaseUnsupported,
    load_release_index,
)
from pytest_verl_compat.releases.wheels import ReleaseTree, release_tree

if TYPE_CHECKING:
    from pytest_verl_compat.pipeline.audit import AuditSession

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "pytest_verl_compat" / "profiles"
# Where a release's census pages go (docs/census/<version>/).
CENSUS_PAGES = REPO / "docs" / "census"


@dataclass
class Derivation:
    """What one ``release derive`` did: the files written (or stale), what needs a person."""

    version: str
    write: bool
    written: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    person: list[str] = field(default_factory=list)

    def keep(self, path: Path, text: str) -> None:
        """Write ``text`` to ``path`` (``--write``), or note that it differs (``--check``)."""
        old = path.read_text(encoding="utf-8") if path.is_file() else None
        if old == text:
            return
        if self.write:
            write_atomic(path, text)
            self.written.append(str(path))
        else:
            self.stale.append(str(path))


@dataclass
class DeriveContext:
    """What the steps share: the release, its files, the citations' release's files, a session."""

    release: Release
    upstream: str | None
    only: list[str] | None
    # The command line's entry (``cli.main``), given by it: the census and audit steps run their
    # commands as a user would.
    run_command: Callable[[list[str]], int]
    _session: AuditSession | None = None

    @property
    def version(self) -> str:
        return self.release.version

    @property
    def is_base(self) -> bool:
        """The release the project's texts cite: its lines, profile and reasons are written by a
        person, not derived from another release's."""
        return self.version == load_release_index().citations

    def files(self) -> ReleaseTree:
        return release_tree(self.version)

    def base(self) -> ReleaseTree:
        return release_tree(load_release_index().citations)

    def session(self) -> AuditSession:
        """A session checking this release (the embedded corpus, the checkout's scripts)."""
        if self._session is None:
            from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession

            self._session = AuditSession.start(
                AuditOptions(upstream=self.upstream, release=self.version)
            )
            if self._session.release is None:
                raise ReleaseError(self._session.release_error)
        return self._session


def _files(derivation: Derivation, context: DeriveContext) -> None:
    files = context.files()
    if not (files.package / "trainer" / "main_ppo.py").is_file():
        derivation.person.append(f"verl {context.version} has no verl/trainer/main_ppo.py")


def _lock(derivation: Derivation, context: DeriveContext) -> None:
    from pytest_verl_compat.releases.environment import load_lock
    from pytest_verl_compat.releases.lock import derive_lock, lock_destination

    try:
        load_lock(context.release)
    except ReleaseError:
        index = load_release_index()
        derivation.keep(
            lock_destination(context.release, package=True), derive_lock(context.release, index)
        )


def _line_map(derivation: Derivation, context: DeriveContext) -> None:
    if context.is_base:
        return
    from pytest_verl_compat.releases.lines import derive_line_map, dumps_line_map, lines_path

    data = derive_line_map(context.base().root, context.files().root)
    derivation.keep(lines_path(context.version), dumps_line_map(data))
    from pytest_verl_compat.releases.lines import line_map

    line_map.cache_clear()


def _profile(derivation: Derivation, context: DeriveContext) -> None:
    """A release without a profile gets the citations release's, retargeted (its citations moved
    to this release's lines); every leaf no rule classifies is a person's."""
    if context.is_base:
        return
    from pytest_verl_compat.pipeline.compose import Composer, iter_leaves
    from pytest_verl_compat.pipeline.profile import load_profile
    from pytest_verl_compat.releases.lines import cite
    from pytest_verl_compat.upstream.drift.retarget import retarget_profile

    index = load_release_index()
    base = index.release(index.citations)
    for family, base_name, name, config in (
        ("rl", base.profile, context.release.profile, "ppo_trainer"),
        ("sft", base.sft_profile, context.release.sft_profile, "sft_trainer_engine"),
    ):
        if not name:
            name = f"verl-{context.version}-{'single-device' if family == 'rl' else 'sft'}"
            key = "profile" if family == "rl" else "sft_profile"
            derivation.person.append(
                f"name {name} as the release's `{key}` in releases.yaml (until then no command "
                f"compiles its {family} tree)"
            )
        path = PROFILES / f"{name}.yaml"
        if not path.is_file():
            if not derivation.write:
                derivation.stale.append(str(path))
                continue
            written = retarget_profile(
                base_name,
                context.files().root,
                name,
                out_dir=PROFILES,
                version=context.version,
                config_name=config,
            )
            written.write_text(cite(written.read_text(encoding="utf-8"), context.version))
            derivation.written.append(str(written))
            derivation.person.append(
                f"{written.name}: review the rules retarget added for the leaves {base_name} "
                "cannot classify, and the rules whose cited lines moved"
            )
            load_profile.cache_clear()
        profile = load_profile(name)
        composition = Composer(context.files().config_dir, config).compose([], {})
        for leaf, _ in iter_leaves(composition.resolved) if composition.composed else ():
            if profile.rule_for(leaf) is None:
                derivation.person.append(f"{name}: no rule classifies {leaf}")


def _rule_citations(derivation: Derivation, context: DeriveContext) -> None:
    """Each rule's upstream lines, found in this release; one it changed needs a person."""
    if context.is_base:
        return
    from pytest_verl_compat.memory import findings  # noqa: F401  (registers the memory.* pages)
    from pytest_verl_compat.releases.lines import cite
    from pytest_verl_compat.upstream.verdict.rules import all_rules

    for rule_id, doc in sorted(all_rules(context.version, context.release.profile).items()):
        cited = cite(doc.why, context.version)
        for word in (f"changed in {context.version}", f"gone in {context.version}"):
            if word in cited:
                derivation.person.append(
                    f"rule {rule_id}: a line it cites is {word.split()[0]} in "
                    f"{context.version} (check the rule still holds there): {cited[:200]}"
                )
                break


def _memory_facts(derivation: Derivation, context: DeriveContext) -> None:
    """The memory forecast's facts of this release (``data/releases/VERSION/memory.yaml``,
    written by a person): each statement at its cited lines of the release's files."""
    from pytest_verl_compat.memory.release_facts import (
        ReleaseFactsError,
        installed_root,
        release_facts,
    )

    try:
        facts = release_facts(context.version)
    except ReleaseFactsError as exc:
        derivation.person.append(f"memory facts: {exc}")
        return
    root = context.files().root
    installed = installed_root(context.version)
    cited = [("memory fact", name, fact) for name, fact in sorted(facts.facts.items())]
    cited += [("memory tree key", key, fact) for key, fact in sorted(facts.tree_keys.items())]
    for what, name, fact in cited:
        if fact.cites_metadata and installed is None:
            derivation.person.append(
                f"{what} {name}: cites the METADATA of verl {context.version}, whose "
                "environment is not built (`verl-compat release env VERSION` builds it)"
            )
        elif not fact.found_in(root, installed):
            derivation.person.append(
                f"{what} {name}: `{fact.statement}` is not at {fact.where} in "
                f"{context.version} (data/releases/{context.version}/memory.yaml)"
            )


def _statements(derivation: Derivation, context: DeriveContext) -> None:
    """The statements a static finding is the same as (``early.STATIC_EQUIVALENTS``), found by
    their shape in this release."""
    import json

    from pytest_verl_compat.upstream.verdict.early import (
        STATIC_EQUIVALENTS,
        shipped_statements_path,
        statement_lines,
        statement_table,
    )

    root = context.files().root
    # Shipped, so that a verdict needs none of the release's files to find them.
    path = shipped_statements_path(context.version)
    derivation.keep(path, json.dumps(statement_table(root), indent=1, sort_keys=True) + "\n")
    for check_id, statements in sorted(STATIC_EQUIVALENTS.items()):
        for relative, statement, *function in statements:
            if not statement_lines(root, relative, statement, *function):
                derivation.person.append(
                    f"{check_id}: `{statement}` ({relative} {''.join(function)}) is not in "
                    f"{context.version}: its static finding is no longer left out for upstream's"
                )


# What the oracle imports first in a release's environment: the entry points it runs.
ENTRY_MODULES = ("verl.trainer.main_ppo", "verl.trainer.sft_trainer")


def _environment(derivation: Derivation, context: DeriveContext) -> None:
    """The environment, built from the lock, and its entry points imported there: a lock whose
    wheels install but do not import together (a pin the release's metadata leaves out) stops
    the steps that run its code, naming the import's last words."""
    import subprocess
    import tempfile

    from pytest_verl_compat.upstream.oracle.runner import (
        release_interpreter,
        sandbox_environment,
        say_progress,
    )

    interpreter = release_interpreter(context.version, say_progress)
    assert interpreter.python is not None
    for module in ENTRY_MODULES:
        with tempfile.TemporaryDirectory(prefix="verl-compat-import-") as empty:
            done = subprocess.run(
                [interpreter.python, "-I", "-c", f"import {module}"],
                capture_output=True,
                text=True,
                timeout=600,
                env=sandbox_environment(),
                cwd=empty,
                check=False,
            )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
            raise ReleaseError(
                f"verl {context.version}'s environment cannot import {module}: {last} (pin what "
                f"it needs under the release's `environment` in releases.yaml, then `verl-compat "
                f"release derive {context.version} --only lock`)"
            )


def _keep_version_entry(derivation: Derivation, path: Path, version: str, value: Any) -> None:
    """``path`` (a YAML file keyed by release, its comment lines first) with ``version``'s entry
    set to ``value``: the other releases' entries and the comments kept."""
    import yaml

    text = path.read_text(encoding="utf-8")
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    listed = yaml.safe_load(text) or {}
    listed[version] = value
    body = yaml.safe_dump(dict(sorted(listed.items())), sort_keys=True, default_flow_style=False)
    derivation.keep(path, header + body)


# The config-group selections whose defaults ``string_admitting`` reads (both engines' sections).
ANNOTATED_SELECTIONS: tuple[tuple[str, ...], ...] = ((), ("model_engine=megatron",))


def _annotated_strings(derivation: Derivation, context: DeriveContext) -> None:
    """The keys whose tree default is a number or a flag but whose config dataclass admits a
    string, by this release's own annotations (its code, in its environment)."""

    from pytest_verl_compat.checks.types import ANNOTATED_STRINGS
    from pytest_verl_compat.upstream.oracle.client import UpstreamOracle
    from pytest_verl_compat.upstream.probes import annotated_strings_probe as probe

    session = context.session()
    oracle = UpstreamOracle(
        served=("pytest_verl_compat.upstream.probes.annotated_strings_probe",),
        release=context.version,
    )
    found: set[str] = set()
    try:
        for index, selections in enumerate(ANNOTATED_SELECTIONS):
            question = {
                "kind": probe.KIND,
                "mapping": session.composer().defaults(selections),
            }
            answer = oracle.answer(f"annotated-strings-{index}", question)
            if probe.KEY_KEYS not in answer:
                raise ReleaseError(f"annotated strings of {context.version}: {answer}")
            found.update(answer[probe.KEY_KEYS])
    finally:
        oracle.close()
    _keep_version_entry(
        derivation, REPO / "pytest_verl_compat" / ANNOTATED_STRINGS, context.version, sorted(found)
    )


def _entry_points(derivation: Derivation, context: DeriveContext) -> None:
    """The release's entry points and module names, shipped so that reading a launch needs
    none of its files (``pipeline.entry_registry.shipped``)."""
    import json

    from pytest_verl_compat.pipeline.entry_registry import ReleaseModules, shipped_path

    found = ReleaseModules.from_site(context.files().root)
    path = shipped_path(context.version)
    derivation.keep(path, json.dumps(found.to_json(), indent=1, sort_keys=True) + "\n")


def _string_sentinel_modules() -> tuple[str, ...]:
    """The entry modules whose own code the static type check asks for replaced strings; SFT's
    Ray trainer reads the same keys as the torchrun one."""
    from pytest_verl_compat.pipeline import entry_points as ep

    return (
        ep.PINNED_ENTRY_MODULE,
        ep.SFT_ENTRY_MODULE,
        "verl.trainer.sft_trainer_ray",
        *ep.ASYNC_ENTRY_MODULES,
    )


def _string_sentinels(derivation: Derivation, context: DeriveContext) -> None:
    """The strings each entry point's own module replaces in a key before any use (the SFT
    trainer's ``"after_each_epoch"``), read from this release's files: the static type check's
    answer where upstream's code is not run (``--no-upstream-checks``)."""

    from pytest_verl_compat.checks.types import STRING_SENTINELS
    from pytest_verl_compat.upstream.probes import statements
    from pytest_verl_compat.upstream.verdict.sentinels import module_sentinels

    root = context.files().root
    found: dict[str, dict[str, dict[str, str]]] = {}
    for module in sorted(_string_sentinel_modules()):
        relative = module.replace(".", "/") + ".py"
        source = statements.parse(str(root / relative), relative)
        keys = module_sentinels(source) if source is not None else {}
        if keys:
            found[module] = keys
    _keep_version_entry(
        derivation, REPO / "pytest_verl_compat" / STRING_SENTINELS, context.version, found
    )


def _patch_points(derivation: Derivation, context: DeriveContext) -> None:
    """Every patch point the probes meet on the census's configurations, found in the files."""
    from pytest_verl_compat.releases.patch_points import check, dumps_points, points_path
    from pytest_verl_compat.upstream.census import checks_run
    from pytest_verl_compat.upstream.oracle.client import UpstreamOracle
    from pytest_verl_compat.upstream.probes import patch_points_probe

    session = context.session()
    configs = checks_run.configurations(session)
    oracle = UpstreamOracle(
        2,
        served=("pytest_verl_compat.upstream.probes.patch_points_probe",),
        release=context.version,
    )
    met: set[str] = set()
    unsupported: dict[str, list[str]] = {}  # what the release lacks -> the configurations
    try:
        questions = {
            cid: {"kind": patch_points_probe.KIND, "mapping": dict(m)} for cid, m in configs.items()
        }
        for cid, question in questions.items():
            oracle.submit(cid, question)
        for cid, question in questions.items():
            try:
                answer = oracle.answer(cid, question)
            except ReleaseUnsupported as exc:
                unsupported.setdefault(str(exc), []).append(cid)
                continue
            met.update(answer.get(patch_points_probe.KEY_POINTS, []))
    finally:
        oracle.close()
    for said, where in sorted(unsupported.items()):
        derivation.person.append(f"{said} (on {len(where)} configurations, e.g. {where[0]})")
    derivation.keep(points_path(context.version), dumps_points(met))
    for found in check(context.files().root, tuple(sorted(met))):
        if found.where is None:
            derivation.person.append(f"patch point {found.point}: {found.reason}")


def _census_reasons(derivation: Derivation, context: DeriveContext) -> None:
    """The census's reasons of the citations release, their lines moved to this release's, for a
    person to confirm (a reason names what the release lacks, in its own lines)."""
    if context.is_base:
        return
    from pytest_verl_compat.releases.lines import cite
    from pytest_verl_compat.upstream.census.checks import reasons_file

    target = reasons_file(context.version)
    if target.is_file():
        return
    base = reasons_file(load_release_index().citations).read_text(encoding="utf-8")
    derivation.keep(target, cite(base, context.version))
    derivation.person.append(f"{target}: confirm each reason holds in {context.version}")


def _environment_record(
    record: EnvironmentRecord, derivation: Derivation, context: DeriveContext
) -> None:
    """Keep what ``record``'s probe finds in the release's environment (sandboxed) at its path,
    as sorted JSON; a probe that fails is the person's to look at
    (``releases/environment_records.py`` says what each record holds)."""
    from pytest_verl_compat.upstream.oracle.runner import release_runner

    run = release_runner(context.version)(record.probe)
    if run.returncode != 0:
        derivation.person.append(f"{record.step}: the probe failed: {run.stderr_tail(3)}")
        return
    path = record.path(context.version)
    derivation.keep(path, json.dumps(json.loads(run.stdout), indent=1, sort_keys=True) + "\n")


def _census(derivation: Derivation, context: DeriveContext) -> None:
    page = CENSUS_PAGES / context.version / "checks.md"
    mode = "--write" if derivation.write else "--check"
    args = ["census", "--release", context.version, mode, str(page)]
    if context.upstream:
        args += ["--upstream", context.upstream]
    if context.run_command(args) != 0:
        (derivation.person if derivation.write else derivation.stale).append(
            f"{page}: unexplained checks (the page lists them) or stale"
        )


def _reads(derivation: Derivation, context: DeriveContext) -> None:
    page = CENSUS_PAGES / context.version / "reads.md"
    mode = "--write" if derivation.write else "--check"
    args = ["census", "--reads", "--release", context.version, mode, str(page)]
    if context.upstream:
        args += ["--upstream", context.upstream]
    if context.run_command(args) != 0:
        derivation.stale.append(str(page))


def _golden(derivation: Derivation, context: DeriveContext) -> None:
    """The corpus's snapshots and verdicts on this release, and its cases judged otherwise than
    the manifest expects."""
    from pytest_verl_compat.model import StageFailed, StageUnavailable
    from pytest_verl_compat.pipeline.snapshot import dumps

    session = context.session()
    for case in session.cases:
        try:
            payload = session.golden_payload(case)
            report = session.compile(case)
        except (StageFailed, StageUnavailable) as exc:
            derivation.person.append(f"{case.id}: not composed on {context.version}: {exc}")
            continue
        derivation.keep(session.golden_dir / "compose" / f"{case.id}.json", dumps(payload))
        if report is not None:
            derivation.keep(
                session.golden_dir / "compile" / f"{case.id}.json", dumps(report.to_json())
            )
            expected = (case.expected or {}).get("outcome", "accepted")
            if report.outcome != expected and case.kind != "field":
                derivation.person.append(
                    f"{case.id}: {report.outcome} on {context.version}, the manifest expects "
                    f"{expected} (add expected.releases.{context.version} with the reason)"
                )
    args = ["audit", "--release", context.version, "--write" if derivation.write else "--check"]
    if context.upstream:
        args += ["--upstream", context.upstream]
    if context.run_command(args) != 0:
        derivation.stale.append(str(session.golden_dir / "audit.json"))


def _examples(derivation: Derivation, context: DeriveContext) -> None:
    from pytest_verl_compat.upstream.verdict import examples

    if not context.upstream:
        derivation.person.append("examples: pass --upstream CHECKOUT (the example scripts)")
        return
    if not derivation.write:
        return  # tests/test_examples.py keeps them true
    examples.main(["--upstream", context.upstream, "--release", context.version, "--audit"])


def _moved_mounts(derivation: Derivation, context: DeriveContext) -> None:
    """The sections this release's tree mounts elsewhere than an earlier release's did, shipped
    for ``fit`` (``upstream/drift/mounts.py``)."""
    from pytest_verl_compat.upstream.drift.mounts import (
        derive_moved_mounts,
        dumps_moved_mounts,
        moved_mounts_path,
    )

    entries = derive_moved_mounts(context.version)
    derivation.keep(moved_mounts_path(context.version), dumps_moved_mounts(entries))


STEPS: dict[str, Callable[[Derivation, Any], None]] = {
    "files": _files,
    "lock": _lock,
    "line-map": _line_map,
    "profile": _profile,
    "rule-citations": _rule_citations,
    "memory-facts": _memory_facts,
    **{record.step: functools.partial(_environment_record, record) for record in RECORDS},
    "statements": _statements,
    "environment": _environment,
    "patch-points": _patch_points,
    "annotated-strings": _annotated_strings,
    "string-sentinels": _string_sentinels,
    "entry-points": _entry_points,
    "moved-mounts": _moved_mounts,
    "census-reasons": _census_reasons,
    # The reads first: the census page shows where each check's key was traced (their index).
    "reads": _reads,
    "census": _census,
    # The examples before the golden files: the audit's golden file carries their totals.
    "examples": _examples,
    "golden": _golden,
}
