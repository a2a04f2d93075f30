"""The no-effect claims ``check`` makes, and an independent verdict on each (see
tests/test_no_effect_adversarial.py): by running the whole run in miniature with the value changed
(``probes/whole_run.py``, upstream's own functions in the oracle's sandbox), or by a proof from the
release's own source that nothing on the run's path reads the key.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from run_conformance import SandboxQuestions

from pytest_verl_compat.model import Case, Finding

EFFECT = "effect."
OVERRIDDEN = "effect.overridden"
NEVER_READ = "effect.never-read"
OFF_PATH = "effect.off-path"
FORCED = "effect.forced"
# A role the run never starts, by rule: proven by the role-read scan (no_effect_reads).
NO_CRITIC = "effect.no-critic-worker"
NO_REFERENCE = "effect.no-reference-worker"
ROLE_RULES = {NO_CRITIC: "critic", NO_REFERENCE: "ref"}
# A run's entry holding the names its executed code mentions: never compared.
NAMES = "<names>"


@dataclass(frozen=True)
class Claim:
    """One ``effect.*`` finding ``check`` gives, with the case (and so the resolved mapping) it
    was given on."""

    rule: str
    key: str
    message: str
    label: str  # the script or manifest case, as check names it
    case: Case

    def named(self) -> str:
        return f"{self.label}: {self.rule} {self.key}"


def check_arguments(targets: list[str]) -> argparse.Namespace:
    """``verl-compat check TARGETS``'s arguments, as its parser makes them."""
    from pytest_verl_compat.cli import build_parser

    args = build_parser().parse_args(["check", *targets])
    args.argv = []
    return args


def collect(session: Any, targets: list[str]) -> list[Claim]:
    """Every ``effect.*`` finding ``check TARGETS`` gives, each with its case: the targets read,
    composed and checked by check's own functions (``cli/check.py`` ``targets``, ``prepare``,
    ``verdict/case.py`` ``check_case`` with one oracle for all), a script's ways each on its own."""
    from pytest_verl_compat.cli.check import prepare
    from pytest_verl_compat.cli.check import targets as check_targets
    from pytest_verl_compat.upstream.verdict.case import check_case, many_asker

    args = check_arguments(targets)
    with tempfile.TemporaryDirectory(prefix="no-effect-") as scratch:
        prepared = [prepare(session, t, args, Path(scratch)) for t in check_targets(args, session)]
    cases = [(p.target.label, case) for p in prepared for case in p.cases()]
    ask, close = many_asker(session, [case for _, case in cases])
    claims = []
    try:
        for label, case in cases:
            for finding in check_case(session, case, ask).findings:
                claims.extend(_claims(finding, label, case))
    finally:
        close()
    return claims


def _claims(finding: Finding, label: str, case: Case) -> list[Claim]:
    if not finding.check.startswith(EFFECT):
        return []
    return [Claim(finding.check, key, finding.message, label, case) for key in finding.keys]


# --- verdicts ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """A claim's verdict: held, or why not (what changed, or why it could not be verified)."""

    claim: Claim
    held: bool
    why: str = ""
    how: str = ""  # how it held: the values compared, or the proof's reasons

    def line(self) -> str:
        return f"{self.claim.named()}: {self.why}"


def claimed_leaves(session: Any, case: Case) -> dict[str, Any]:
    from no_effect_reads import flat

    from pytest_verl_compat.upstream.verdict.case import report_mapping

    return flat(report_mapping(session, case))


# --- by running: the whole run with the value changed --------------------------------------

# The oracle's questions of this test: the whole run, and the role classes' converted values.
SERVED = (
    "pytest_verl_compat.upstream.probes.whole_run",
    "pytest_verl_compat.upstream.probes.converted_probe",
)


def stages_for(claim: Claim) -> tuple[str, ...] | None:
    """The whole run's stages that compute from the claim's key (each must run with the claimed
    value), or None when none does: the key's section is not one the run in miniature trains
    with."""
    from pytest_verl_compat.upstream.probes import whole_run as run

    if claim.rule == FORCED:
        return (run.SETUP,)
    actor_optimizer = (run.ACTOR, run.ACTOR_SCHEDULE, f"{run.ACTOR} {run.KEY_UPSTREAM_OPTIMIZER}")
    critic_optimizer = (
        run.CRITIC,
        run.CRITIC_SCHEDULE,
        f"{run.CRITIC} {run.KEY_UPSTREAM_OPTIMIZER}",
    )
    by_section = (
        ("actor_rollout_ref.actor.optim.", actor_optimizer),
        ("actor_rollout_ref.actor.", (run.ACTOR,)),
        ("critic.optim.", critic_optimizer),
        ("critic.", (run.CRITIC,)),
        ("algorithm.", (run.ADVANTAGES,)),
    )
    for prefix, stages in by_section:
        if claim.key.startswith(prefix):
            return stages
    return None


def alternatives(key: str, value: Any) -> list[Any]:
    """Other values to run with: a flag flipped; a number halved, raised by half and a
    non-trivial 0.3 (a 0 gets 0.3, 1 and 0.01; a small fraction also ×100; an int its double,
    half and next); a string each other name upstream registers for the key."""
    from pytest_verl_compat.checks.upstream_names import REGISTRIES

    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        tried = (
            [value // 2, value * 3 // 2, value * 2, value + 1] if value > 1 else [value + 1, 3, 0]
        )
        if value < 0:
            tried = [1, 2, value - 1]
    elif isinstance(value, float):
        tried = (
            [value * 0.5, value * 1.5, 0.3 if value != 0.3 else 0.7] if value else [0.3, 1.0, 0.01]
        )
        if 0 < abs(value) < 0.01:
            tried.append(value * 100)
        tried = [float(f"{t:.6g}") for t in tried]
    elif isinstance(value, str):
        names = REGISTRIES.get(key, ((), ""))[0]
        tried = [name for name in names if name != value][:4]
    else:
        return []
    return [t for i, t in enumerate(tried) if t != value and t not in tried[:i]]


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if re.fullmatch(r"[\w.+\-]+", value) else repr(value)
    return repr(value)


def _sent(mapping: Mapping[str, Any], whole: bool) -> dict[str, Any]:
    """What the whole run reads of a resolved mapping (all of it for the set-up stage): the
    actor's, critic's, algorithm's and distillation's sections, the rollout's group size and
    log-probabilities flag, and the trainer's horizon. A section read but not sent makes the
    stage that reads it fail for every value, which no claim passes."""
    if whole:
        return copy.deepcopy(dict(mapping))
    arr = mapping["actor_rollout_ref"]
    rollout = arr["rollout"]
    return copy.deepcopy(
        {
            "actor_rollout_ref": {
                "actor": arr["actor"],
                "rollout": {k: rollout.get(k) for k in ("n", "calculate_log_probs")},
            },
            **{s: mapping[s] for s in ("algorithm", "critic", "distillation") if s in mapping},
            "trainer": {"total_training_steps": mapping["trainer"].get("total_training_steps")},
        }
    )


class WholeRuns(SandboxQuestions):
    """The oracle that runs ``probes/whole_run.py`` (two workers), each distinct question once."""

    def __init__(self, release: str) -> None:
        super().__init__(SERVED, release, workers=2)
        self._answers: dict[str, dict[str, Any]] = {}  # the converted questions', by id

    def question(
        self, mapping: Mapping[str, Any], setup: str | None, *, names: bool = False
    ) -> str:
        """Submit a question (once; with ``names``, the names its code mentions asked too);
        its id."""
        from pytest_verl_compat.upstream.probes import whole_run as run

        request: dict[str, Any] = {"kind": run.KIND, "mappings": [dict(mapping)]}
        if setup is not None:
            request[run.SETUP] = setup
        if names:
            request[run.KEY_NAMES] = True
        return self.submit(request)

    def answer(self, request_id: str, timeout: float = 1800) -> dict[str, Any]:
        """The run's stages (and, under ``NAMES``, the names its executed code mentions)."""
        from pytest_verl_compat.upstream.probes import whole_run as run

        answer = super().answer(request_id, timeout)
        if run.KEY_RUNS not in answer:
            raise RuntimeError(f"the whole run gave no answer: {answer.get('error', answer)}")
        return {**answer[run.KEY_RUNS][0], NAMES: frozenset(answer[run.KEY_NAMES])}

    def roles(self, session: Any, case: Case) -> dict[str, Any]:
        """Upstream's need_critic and need_reference_policy on the case (the converted
        question's ``roles``)."""
        from pytest_verl_compat.upstream.probes import converted_probe as probe

        return dict(self._converted_answer(session, case).get(probe.KEY_ROLES) or {})

    def converted(self, session: Any, case: Case) -> dict[str, Any]:
        """The case's resolved leaves, where a role's config class converts with the values the
        class holds after upstream's conversion (``probes/converted_probe.py``)."""

        from pytest_verl_compat.upstream.probes import converted_probe as probe

        leaves = claimed_leaves(session, case)
        answer = self._converted_answer(session, case)
        if probe.KEY_LEAVES not in answer:
            raise RuntimeError(f"no converted values: {answer.get('error', answer)}")
        return {**leaves, **answer[probe.KEY_LEAVES]}

    def _converted_answer(self, session: Any, case: Case) -> dict[str, Any]:
        from no_effect_reads import role_sections

        from pytest_verl_compat.upstream.probes import converted_probe as probe
        from pytest_verl_compat.upstream.verdict.case import report_mapping

        leaves = claimed_leaves(session, case)
        request = {
            "kind": probe.KIND,
            "mapping": json.loads(json.dumps(dict(report_mapping(session, case)), default=str)),
            "sections": role_sections(leaves),
        }
        request_id = (
            "converted-"
            + hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()[:20]
        )
        if request_id not in self._answers:
            self._answers[request_id] = self.oracle.answer(request_id, request, timeout=600)
        return self._answers[request_id]


@dataclass
class Planned:
    """A perturbation claim's questions: the claimed value's and each other value's."""

    claim: Claim
    stages: tuple[str, ...]
    claimed: str  # question id
    others: dict[str, str]  # the value as written → question id
    refused: dict[str, str]  # a value Hydra refused → why


def plan(session: Any, claim: Claim, runs: WholeRuns) -> Planned | Verdict:
    """Compose the claim's case with each other value and submit every run (or the verdict
    that it cannot be verified this way)."""
    from no_effect_reads import flat

    from pytest_verl_compat.model import StageFailed
    from pytest_verl_compat.upstream.verdict.case import report_mapping

    stages = stages_for(claim)
    if stages is None:
        return Verdict(claim, False, "no stage of the whole run computes from this section")
    leaves = claimed_leaves(session, claim.case)
    value = leaves.get(claim.key)
    tried = alternatives(claim.key, value)
    if not tried:
        return Verdict(claim, False, f"no other value to run with for {value!r}")
    setup = claim.key if claim.rule == FORCED else None
    mapping = report_mapping(session, claim.case)
    claimed = runs.question(_sent(mapping, setup is not None), setup, names=True)
    others, refused = {}, {}
    for other in tried:
        written = _literal(other)
        case_id = f"{claim.case.id}+{claim.key}={written}"
        try:
            case = session.with_overrides(
                claim.case, (f"++{claim.key}={written}",), case_id=case_id
            )
            composition = session.outcome(case).composition
        except StageFailed as exc:
            refused[written] = str(exc).splitlines()[0]
            continue
        if not composition.composed:
            refused[written] = composition.reason.splitlines()[0]
            continue
        landed = flat(composition.mapping).get(claim.key)
        if landed != other:
            return Verdict(claim, False, f"{claim.key}={written} composes to {landed!r}")
        others[written] = runs.question(_sent(composition.mapping, setup is not None), setup)
    return Planned(claim, stages, claimed, others, refused)


# Stages that convert a role's section into its config class: a value refused there is outside
# what upstream accepts, and says nothing of what training computes with the others.
_SET_UP_STAGES = ("actor setup", "critic setup")


def judge(planned: Planned, runs: WholeRuns) -> Verdict:
    """Equal runs for every other value, over every stage; the stages that compute from the key
    must have run with the claimed value."""
    from pytest_verl_compat.upstream.probes import whole_run as run

    claim = planned.claim
    base = runs.answer(planned.claimed)
    for stage in planned.stages:
        ran = {name: seen for name, seen in base.items() if _of_stage(name, stage)}
        failed = [f"{name}: {seen[run.KEY_ERROR]}" for name, seen in ran.items() if _failed(seen)]
        if not ran or failed or False in ran.values():
            why = failed[0] if failed else f"{stage} did not run upstream's code"
            return Verdict(claim, False, f"cannot run the whole run with the claimed value ({why})")
    compared = []
    refused = dict(planned.refused)
    for written, request_id in planned.others.items():
        other = runs.answer(request_id)
        conversion = [
            s for s in _SET_UP_STAGES if _failed(other.get(s)) and not _failed(base.get(s))
        ]
        if conversion:
            refused[written] = other[conversion[0]][run.KEY_ERROR]
            continue
        changed = first_difference(_computed(base), _computed(other))
        if changed:
            return Verdict(
                claim, False, f"with {claim.key}={written} instead, upstream computes {changed}"
            )
        compared.append(written)
    leaf = claim.key.rpartition(".")[2]
    if leaf not in base[NAMES]:
        return Verdict(
            claim,
            False,
            f"no code the whole run ran (nor its registries' other entries) names {leaf}: "
            "outside what the run in miniature computes",
        )
    needed = 1 if len(planned.others) + len(planned.refused) == 1 else 2
    if len(compared) < needed:
        shown = "; ".join(f"{v}: {why}" for v, why in refused.items())
        return Verdict(claim, False, f"too few other values ran ({shown})")
    return Verdict(claim, True, how=f"equal over the whole run with {', '.join(compared)}")


def _computed(run: dict[str, Any]) -> dict[str, Any]:
    return {name: seen for name, seen in run.items() if name != NAMES}


def _of_stage(name: str, stage: str) -> bool:
    """Whether an answer's entry is the stage's (``actor`` is ``actor 0`` … ``actor 3``)."""
    return name == stage or re.fullmatch(rf"{re.escape(stage)} \d+", name) is not None


def _failed(seen: Any) -> bool:
    from pytest_verl_compat.upstream.probes import whole_run as run

    return isinstance(seen, dict) and set(seen) == {run.KEY_ERROR}


def first_difference(a: Any, b: Any, where: str = "") -> str:
    """Where two observables first differ ("" when equal), e.g. ``actor 2[0].loss: -0.1 → -0.3``."""
    if a == b:
        return ""
    if isinstance(a, dict) and isinstance(b, dict):
        for name in [*a, *(n for n in b if n not in a)]:  # in the run's order
            if a.get(name) != b.get(name):
                return first_difference(
                    a.get(name), b.get(name), f"{where}.{name}" if where else name
                )
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return first_difference(x, y, f"{where}[{index}]")
    return f"{where}: {_short(a)} → {_short(b)}"


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


# --- by reading: nothing on the path reads the key ---------------------------------------------


def prove(session: Any, claim: Claim, release: Any, runs: WholeRuns) -> Verdict:
    """The read proof of ``no_effect_reads`` for a never-read or off-path claim, on the values
    the configuration's role classes hold after upstream's own conversion; an off-path claim's
    cited lines must also read the key's name in the release."""
    from no_effect_reads import cited_lines, prove_unread, reads_on_line

    from pytest_verl_compat.pipeline.entry_points import PINNED_ENTRY_MODULE

    outcome = session.outcome(claim.case)
    entry = outcome.fields.module or PINNED_ENTRY_MODULE
    name = claim.key.rpartition(".")[2]
    if claim.rule == OFF_PATH:
        for file, line in cited_lines(claim.message):
            if not reads_on_line(release, file, line, name):
                return Verdict(claim, False, f"the cited {file}:{line} does not read {name}")
    leaves = runs.converted(session, claim.case)
    proof = prove_unread(release, claim.key, leaves, entry, copies_of(session, claim))
    if proof.unproven:
        shown = ", ".join(proof.unproven[:4])
        more = f" and {len(proof.unproven) - 4} more" if len(proof.unproven) > 4 else ""
        return Verdict(
            claim, False, f"read on the path for all the reading can tell: {shown}{more}"
        )
    return Verdict(claim, True, how=f"{len(proof.ruled_out)} uses ruled out")


def prove_role(session: Any, claim: Claim, release: Any, runs: WholeRuns) -> Verdict:
    """A role-not-started claim holds when upstream's own decider, run in the oracle on the
    case's configuration (``probes/converted_probe.py``), is False, every read of the role's
    section in the release waits for the role, and no leaf outside it copies one of its
    leaves."""
    from no_effect_reads import role_copies_out, role_reads_outside

    role = ROLE_RULES[claim.rule]
    decider = {"critic": "need_critic", "ref": "need_reference_policy"}[role]
    decided = runs.roles(session, claim.case).get(decider)
    if decided is not False:
        return Verdict(claim, False, f"upstream's {decider} is {decided!r} here, not False")
    seen, outside = role_reads_outside(release.root, role)
    if outside or not seen:
        return Verdict(claim, False, f"reads of the {role} section not waiting for it: {outside}")
    copies = role_copies_out(release.root, role)
    if copies:
        return Verdict(claim, False, f"copied out of the {role} section: {copies}")
    return Verdict(claim, True, how=f"{seen} reads of the {role} section, each waiting for it")


def copies_of(session: Any, claim: Claim) -> tuple[str, ...]:
    """The keys whose tree value copies the claim's key by interpolation (``${..name}``)."""
    fields = session.outcome(claim.case).fields
    sources = session.composer(fields).interpolation_sources(fields.fields)
    found: set[str] = set()
    todo = [claim.key]
    while todo:
        source = todo.pop()
        for copy_key, copied in sources.items():
            if copied == source and copy_key not in found and copy_key != claim.key:
                found.add(copy_key)
                todo.append(copy_key)
    return tuple(sorted(found))


def verify(session: Any, claims: list[Claim], release: Any, runs: WholeRuns) -> list[Verdict]:
    """Every claim's verdict: run (effect.overridden, effect.forced) or proven from reads
    (effect.never-read, effect.off-path); any other rule is a claim this test cannot verify. Every
    run is submitted before the first answer is read, so the oracle's workers never wait (the
    proofs' questions, quick, are asked first)."""
    verdicts: list[Verdict] = []
    for claim in claims:
        if claim.rule in (NEVER_READ, OFF_PATH):
            verdicts.append(prove(session, claim, release, runs))
        elif claim.rule in ROLE_RULES:
            verdicts.append(prove_role(session, claim, release, runs))
        elif claim.rule not in (OVERRIDDEN, FORCED):
            verdicts.append(Verdict(claim, False, "a no-effect rule this test cannot verify"))
    planned = []
    for claim in claims:
        if claim.rule in (OVERRIDDEN, FORCED):
            outcome = plan(session, claim, runs)
            if isinstance(outcome, Verdict):
                verdicts.append(outcome)
            else:
                planned.append(outcome)
    verdicts.extend(judge(p, runs) for p in planned)
    return verdicts
