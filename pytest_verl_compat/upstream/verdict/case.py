"""One case's verdict, as ``verl-compat check`` gives it and the plugin's check stage records it.

The static findings of the compile report, then upstream's own early checks on the same resolved
mapping (the static findings they repeat left out), and the two verdicts: *valid for verl* (no
error finding) and *runnable by the reference trainer* (the report accepted and valid). Every front
end asks here, so the command line, the pytest stage and the examples recording cannot disagree;
they differ only in who answers for upstream (``Asker``). ``many_asker`` asks for many cases through one
oracle process (check's targets, a release matrix's scripts); ``pinned_verdicts`` is the matrix's
view of the same verdicts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_verl_compat.checks.fields import field_key
from pytest_verl_compat.checks.off_path import flat
from pytest_verl_compat.checks.registry import RL, SFT, WRONG_TYPE, family_of, yield_to_others
from pytest_verl_compat.model import Case, CompileReport, Finding
from pytest_verl_compat.pipeline.compile import reference_problems
from pytest_verl_compat.pipeline.entry_points import ASYNC_ENTRY_MODULES, SFT_ENTRY_MODULE
from pytest_verl_compat.pipeline.memo import VERDICT, finding_from_json, finding_json
from pytest_verl_compat.pipeline.naming import NAMING_FILE, what_it_names
from pytest_verl_compat.upstream.oracle.client import CHECKED_ENTRIES, ENTRY_MODULE, UpstreamOracle
from pytest_verl_compat.upstream.probes import types as probe_types
from pytest_verl_compat.upstream.probes.records import KEY_READ_AT
from pytest_verl_compat.upstream.verdict import keys as key_answers
from pytest_verl_compat.upstream.verdict import sentinels
from pytest_verl_compat.upstream.verdict.early import (
    AnswerStore,
    ChecksQuestion,
    EarlyAnswer,
    StatementLines,
    UpstreamFailure,
    UpstreamGate,
    check_answers,
    covered_static_findings,
    early_answer,
    lines_in,
    prefetch_answer,
    shipped_statement_lines,
    upstream_gate,
)
from pytest_verl_compat.upstream.verdict.keys import KeyAnswer
from pytest_verl_compat.upstream.verdict.rules import COMPOSE, LAUNCH_RUNTIME

if TYPE_CHECKING:
    from pytest_verl_compat.pipeline.audit import AuditSession

# The path of the one finding a composition rejection gives.
COMPOSITION = "<composition>"

# Upstream's answer to one question (a resolved mapping, the keys the script set, the launch's
# entry point and world size), or the one-line reason it gave none.
Asker = Callable[[ChecksQuestion], "EarlyAnswer | str"]


@dataclass(frozen=True)
class CaseCheck:
    """What ``check`` says of one case: findings in order, the two verdicts and why."""

    findings: tuple[Finding, ...]
    valid: bool
    runnable: bool
    # Why the reference trainer cannot run it (its problems and verl's errors), "" when it can.
    not_runnable: str
    # Why upstream's own checks did not run ("" when they did or were not asked).
    upstream_skipped: str = ""
    composed: bool = True
    problems: tuple[str, ...] = ()
    # Static findings left out because upstream's failure says the same cause (``covered``).
    said_by_upstream: tuple[Finding, ...] = ()
    # Each explicit key's answer: acts, no effect or undecided (``verdict/keys.py``).
    keys: tuple[KeyAnswer, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "runnable": self.runnable,
            "composed": self.composed,
            "findings": [finding.to_json() for finding in self.findings],
            "upstream_skipped": self.upstream_skipped,
            "keys": [answer.to_json() for answer in self.keys],
        }

    def memo_json(self) -> dict[str, Any]:
        """Everything, as the memo keeps it (``from_json`` gives it back)."""
        return {
            **dataclasses.asdict(self),
            "findings": [finding_json(f) for f in self.findings],
            "said_by_upstream": [finding_json(f) for f in self.said_by_upstream],
            "keys": [dataclasses.asdict(answer) for answer in self.keys],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> CaseCheck:
        return cls(
            tuple(finding_from_json(f) for f in raw["findings"]),
            raw["valid"],
            raw["runnable"],
            raw["not_runnable"],
            raw["upstream_skipped"],
            raw["composed"],
            tuple(raw["problems"]),
            tuple(finding_from_json(f) for f in raw["said_by_upstream"]),
            tuple(
                KeyAnswer(**{**answer, "where": tuple(answer["where"])})
                for answer in raw.get("keys", [])
            ),
        )


def live_asker(
    session: AuditSession,
    cache: AnswerStore | None = None,
    oracle: UpstreamOracle | None = None,
    gate: UpstreamGate | None = None,
) -> Asker:
    """Upstream's early checks through the oracle process (or its cache), behind the gate."""
    gate = gate if gate is not None else upstream_gate(session)

    def ask(question: ChecksQuestion) -> EarlyAnswer | str:
        if gate.tree is None:
            return gate.reason
        try:
            answer = early_answer(session, question, gate.tree, cache, oracle)
        except RuntimeError as exc:
            return str(exc).splitlines()[0]
        return answer.message if answer.verdict == "refused" else answer

    return ask


def explicit_keys(session: AuditSession, case: Case) -> tuple[str, ...]:
    """The keys the script (or ``--set``) set, sorted: what upstream's answer examines for effect."""
    return tuple(sorted({field_key(field) for field in session.outcome(case).fields.fields}))


def _user_keys(session: AuditSession, case: Case) -> Callable[[Iterable[str]], list[str]]:
    """Keys as the user set them: a key the tree copies from another by interpolation
    (``fsdp_config.strategy: ${..strategy}``) is that other key, unless the script set the copy
    itself; the keys the script set come first (a statement that reads several keys is decided,
    for the user, by the ones they wrote, not by a default read before them)."""
    explicit = set(explicit_keys(session, case))
    fields = session.outcome(case).fields
    sources = session.composer(fields).interpolation_sources(fields.fields)

    def keys_of(keys: Iterable[str]) -> list[str]:
        out: list[str] = []
        for key in keys:
            seen = {key}
            while key not in explicit and key in sources and sources[key] not in seen:
                key = sources[key]
                seen.add(key)
            if key not in out:
                out.append(key)
        return [k for k in out if k in explicit] + [k for k in out if k not in explicit]

    return keys_of


def _deciding_path(keys: Sequence[str], explicit: set[str]) -> str:
    """The path an upstream failure names: the keys the script set among those upstream read on
    its deciding lines, when it set any (the condition in the fix still shows the others)."""
    named = [key for key in keys if key in explicit] or list(keys)
    return ", ".join(named)


def _explicit_first(finding: Finding, explicit: set[str]) -> Finding:
    """A finding of several keys with the script's own keys first: its key and its location
    are then the one the user wrote (``pipeline/locate.py`` locates the first)."""
    keys = finding.keys
    if len(keys) < 2 or finding.path.startswith("<"):
        return finding
    ordered = [k for k in keys if k in explicit] + [k for k in keys if k not in explicit]
    return (
        finding if list(keys) == ordered else dataclasses.replace(finding, path=", ".join(ordered))
    )


def _with_static_fix(finding: Finding, covered: list[Finding]) -> Finding:
    """Upstream's failure with the fix of a static finding it stands for at the same key (a typo's
    "did you mean"), which says more than "change the key"."""
    keys = set(finding.path.split(", "))
    same = [f for f in covered if f.fix and set(f.path.split(", ")) & keys]
    return dataclasses.replace(finding, fix=same[0].fix) if same else finding


def recorded_asker(answer: Mapping[str, Any] | None) -> Asker:
    """Upstream's answer as recorded (``examples_record``): the same findings without an oracle."""

    def ask(question: ChecksQuestion) -> EarlyAnswer | str:
        if answer is None:
            return "no recorded answer of upstream's checks"
        return EarlyAnswer.from_json(answer)

    return ask


def upstream_question(session: AuditSession, case: Case) -> ChecksQuestion | str:
    """What upstream's own checks are asked of a composed case, or why they are not asked: an RL
    trainer's tree goes to main_ppo's probes, or to the asynchronous trainers' when their entry
    point launches it; the SFT trainer's to its own (with torchrun's world size); any other tree
    has no probes."""
    outcome = session.outcome(case)
    mapping = outcome.composition.mapping
    explicit = explicit_keys(session, case)
    family = family_of(mapping)
    module = outcome.fields.module
    entry = session.entry_point(outcome.fields)
    if entry is not None and not entry.trains_at:
        return (
            f"{entry.module} never trains (no trainer's fit is reached from {entry.file}): "
            "upstream's training checks do not apply; its tree is composed only"
        )
    if family == RL and module in (None, ENTRY_MODULE):
        return ChecksQuestion(mapping, explicit, launch=(outcome.fields, case.bindings))
    if family == RL and module in ASYNC_ENTRY_MODULES:
        return ChecksQuestion(mapping, explicit, module, launch=(outcome.fields, case.bindings))
    if family == SFT and module in (None, SFT_ENTRY_MODULE):
        return ChecksQuestion(
            mapping,
            explicit,
            SFT_ENTRY_MODULE,
            outcome.fields.world_size,
            launch=(outcome.fields, case.bindings),
        )
    launched = f"{module}'s" if module else "this"
    # Each entry point's own trainer is probed, never another's (fully_async_main's rollouter
    # requires data.train_batch_size=0, which main_ppo's dataloader divides by).
    return (
        f"upstream's own checks are probed on the launches of {', '.join(CHECKED_ENTRIES)}; "
        f"{launched} trainer is checked statically only"
    )


def _moved_place(session: AuditSession, reason: str) -> tuple[str, str]:
    """(fix, evidence) for a rejected key whose section an earlier release's tree mounted
    elsewhere (verl 0.7's critic.model.fsdp_config is critic.fsdp): where to write it, in place
    of Hydra's "use +key", which would add a key nothing reads; ("", "") for any other."""
    from pytest_verl_compat.pipeline.set_aside import rejected_key
    from pytest_verl_compat.upstream.drift.mounts import relocation

    key = rejected_key(reason)
    place = relocation(session.version, key) if key else None
    if place is None:
        return "", ""
    successor, evidence = place
    return f"write {successor} instead, not a `+` key nothing reads: its section moved", evidence


def check_case(session: AuditSession, case: Case, ask: Asker | None) -> CaseCheck:
    """The case's findings and verdicts; ``ask`` None leaves upstream's own checks out."""
    report = session.compile(case)
    if report is None:
        reason = session.outcome(case).composition.reason
        finding = Finding(
            "error", COMPOSITION, reason, *_moved_place(session, reason), check=COMPOSE
        )
        return CaseCheck((finding,), False, False, reason, composed=False)
    answer: EarlyAnswer | str | None = None
    if ask is not None:
        question = upstream_question(session, case)
        answer = question if isinstance(question, str) else ask(question)
    compiled = session.compile_key(case)
    key = None
    if compiled is not None:
        asked = answer if answer is None or isinstance(answer, str) else answer.to_json()
        key = session.memo.key(VERDICT, {"compile": compiled, "answer": asked})
        kept = session.memo.get(VERDICT, key)
        if kept is not None:
            return CaseCheck.from_json(kept)
    verdict = _verdict(session, case, report, answer)
    if key is not None:
        session.memo.put(VERDICT, key, verdict.memo_json())
    return verdict


def _statement_lines(session: AuditSession) -> StatementLines:
    """Where the checked release has the statements a static finding may repeat: shipped with a
    supported release, else found in its files (fetched then)."""
    assert session.release is not None
    shipped = shipped_statement_lines(session.release.version)
    return shipped if shipped is not None else lines_in(session.release_files().root)


def _verdict(
    session: AuditSession, case: Case, report: CompileReport, answer: EarlyAnswer | str | None
) -> CaseCheck:
    findings = list(report.findings)
    upstream: list[Finding] = []
    covered: list[Finding] = []
    skipped = ""
    if answer is not None:
        if isinstance(answer, str):
            skipped = answer
        else:
            user_keys = _user_keys(session, case)

            def keys_of(failure: UpstreamFailure) -> list[str]:
                return user_keys(failure.keys)

            if answer.failures and findings:
                covered = covered_static_findings(
                    answer, findings, keys_of, _statement_lines(session)
                )
            # A dataclass annotation is upstream's own typing and outranks the tree default's
            # type (``rollout_is_threshold: str | float`` defaults to 2.0).
            admitted = {str(t[probe_types.KEY_KEY]) for t in answer.admitted_types}
            findings = [
                f
                for f in findings
                if f not in covered and not (f.check == WRONG_TYPE and f.path in admitted)
            ]
            # A string the code that reads the key replaces before any use is its type too
            # (``sentinels``: the SFT trainer's "after_each_epoch", sft_trainer.py:190-196).
            if any(f.check == WRONG_TYPE for f in findings):
                read_at = dict(answer.path.get(KEY_READ_AT) or {})
                values = flat(report_mapping(session, case))
                root = session.release_files().root
                findings = [
                    f
                    for f in findings
                    if not (
                        f.check == WRONG_TYPE
                        and sentinels.accepted(f.path, values.get(f.path), read_at, root)
                    )
                ]
            explicit = set(explicit_keys(session, case))
            upstream = [
                _with_static_fix(
                    failure.finding(
                        session.pin.version,
                        _deciding_path(keys_of(failure), explicit),
                        ", ".join(sorted(keys_of(failure))),
                    ),
                    covered,
                )
                for failure in answer.failures
            ]
            typed = {f.path for f in findings if f.check == WRONG_TYPE}
            upstream += [
                f
                for f in answer.type_findings(session.pin.version, explicit, user_keys)
                if f.path not in typed
            ]
            module = session.outcome(case).fields.module
            upstream += answer.effect_findings(session.pin.version, module)
            upstream += answer.note_findings(user_keys)
    explicit_set = set(explicit_keys(session, case))
    path = answer.path if answer is not None and not isinstance(answer, str) else None
    module = session.outcome(case).fields.module
    upstream += key_answers.path_findings(
        path,
        session.outcome(case).fields.fields,
        session.pin.version,
        lambda: session.release_files().root,
    )
    # A static finding that yields to upstream's own on the same key (effect.off-path to
    # effect.overridden) is left out, and so is a static no-effect claim on a key the probes saw
    # read on this very configuration.
    findings = key_answers.without_contradicted(findings, path, _user_keys(session, case))
    findings = yield_to_others([_explicit_first(f, explicit_set) for f in findings] + upstream)
    findings += [
        Finding(
            "info",
            key,
            f"its value holds {what}, a value only known when the script runs; the verdict "
            f"stands for any value there, since it only names {what_it_names(key)}",
            "nothing to do; bind the value (--env NAME=VALUE, --subst COMMAND OUTPUT) to see it",
            evidence=f"{NAMING_FILE}: where a value only names something, and where verl reads it",
            check=LAUNCH_RUNTIME,
        )
        for key, what in session.outcome(case).fields.carried
    ]
    valid = not any(f.level == "error" for f in findings)
    runnable = report.accepted and valid
    if runnable:
        not_runnable = ""
    elif not report.accepted:
        not_runnable = report.reason
    else:
        not_runnable = "; ".join(f"{f.path}: {f.message}" for f in upstream if f.level == "error")
    problems = tuple(reference_problems(report.leaves, report.findings))
    composer = session.composer()
    fields = session.outcome(case).fields.fields
    answers = key_answers.answer_keys(
        fields,
        report_mapping(session, case),
        findings,
        session.pin.version,
        path=path,
        interpolations=composer.interpolation_sources(),
        groups=[field_key(f) for f in fields if composer.is_group(field_key(f))],
        entry_module=module,
    )
    return CaseCheck(
        tuple(findings),
        valid,
        runnable,
        not_runnable,
        skipped,
        True,
        problems,
        tuple(covered),
        tuple(answers),
    )


def report_mapping(session: AuditSession, case: Case) -> Mapping[str, Any]:
    """The case's resolved mapping (what upstream's code is given)."""
    return session.outcome(case).composition.mapping


def many_asker(
    session: AuditSession, cases: Sequence[Case], *, enabled: bool = True, workers: int = 2
) -> tuple[Asker | None, Callable[[], None]]:
    """One asker for many cases, and what closes it: every question the cache cannot answer is
    sent to one oracle process before the first answer is read, so a hundred scripts import verl
    once (its workers fork after the import)."""
    if not enabled:
        return None, lambda: None
    gate = upstream_gate(session)
    cache = check_answers(session.golden_dir)
    composed = [case for case in cases if session.outcome(case).composition.composed]
    if gate.tree is None or not composed:
        return live_asker(session, cache, None, gate), lambda: None
    oracle = UpstreamOracle(workers=workers if len(composed) > 1 else 1, release=session.version)
    for case in composed:
        question = upstream_question(session, case)
        if not isinstance(question, str):
            prefetch_answer(session, question, gate.tree, cache, oracle)
    return live_asker(session, cache, oracle, gate), oracle.close


@dataclass(frozen=True)
class PinnedVerdict:
    """What ``check`` says of a composed case on the pinned release (a matrix cell's verdict)."""

    valid: bool
    runnable: bool
    findings: tuple[Finding, ...]
    # Empty when upstream's own checks ran; otherwise why they were skipped (as `check` says it).
    upstream_skipped: str = ""


def pinned_verdicts(
    session: AuditSession,
    cases: Iterable[Case],
    *,
    upstream_checks: bool = True,
    workers: int = 2,
) -> dict[str, PinnedVerdict]:
    """``check_case`` for every composed case, by case id (the others are left out), with one
    oracle for all of them."""
    composed = [case for case in cases if session.outcome(case).composition.composed]
    ask, close = many_asker(session, composed, enabled=upstream_checks, workers=workers)
    skipped = "" if upstream_checks else "not asked (--no-upstream-checks)"
    try:
        checks = {case.id: check_case(session, case, ask) for case in composed}
    finally:
        close()
    return {
        case_id: PinnedVerdict(
            c.valid, c.runnable, c.findings, c.upstream_skipped if upstream_checks else skipped
        )
        for case_id, c in checks.items()
    }
