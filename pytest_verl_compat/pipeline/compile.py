"""Compile stage: classify every resolved leaf against a versioned profile, accept or reject the case."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_verl_compat.checks import CheckInput, semantic_findings
from pytest_verl_compat.checks.model_facts import ModelFacts
from pytest_verl_compat.checks.registry import RL
from pytest_verl_compat.model import (
    ACCEPTED,
    SEMANTIC_REJECTION,
    CompileReport,
    Finding,
    LeafVerdict,
)
from pytest_verl_compat.pipeline.compose import iter_leaves
from pytest_verl_compat.pipeline.profile import Profile, load_profile
from pytest_verl_compat.releases.lines import cite, cites_only_gone
from pytest_verl_compat.releases.lora_routers import wrapped_routers
from pytest_verl_compat.releases.sglang_server import sglang_server
from pytest_verl_compat.releases.value_heads import value_heads


def _same(a: Any, b: Any) -> bool:
    # 1 == True in Python; a profile value `true` must not accept the integer 1.
    return type(a) is type(b) and a == b


def classify_leaf(profile: Profile, path: str, value: Any) -> LeafVerdict:
    """The first matching rule's class; ``unknown`` (a rejection) when none matches."""
    rule = profile.rule_for(path)
    if rule is None:
        return LeafVerdict(
            path,
            value,
            "unknown",
            f"no rule of profile {profile.name} classifies this field",
            problem=f"{path}: unknown field (value {value!r}); profile {profile.name} has no rule for it",
        )
    problem = ""
    if rule.klass == "unsupported" and not any(_same(value, n) for n in rule.neutral or ()):
        neutral = ", ".join(repr(n) for n in rule.neutral or ())
        problem = f"{path}={value!r} is not supported ({rule.reason}); supported: {neutral}"
    elif rule.values is not None and not any(_same(value, v) for v in rule.values):
        allowed = ", ".join(str(v) for v in rule.values)
        problem = f"{path}={value!r} is not supported by the reference trainer; supported values: {allowed}"
    return LeafVerdict(
        path,
        value,
        rule.klass,
        rule.reason,
        " | ".join(rule.patterns),
        rule.detail,
        problem,
        rule.no_effect,
    )


def classify(profile: Profile, resolved: Mapping[str, Any]) -> list[LeafVerdict]:
    return [classify_leaf(profile, path, value) for path, value in iter_leaves(resolved)]


# Warnings about what verl does that the reference trainer does not do the same way: verl runs
# the configuration, the reference trainer refuses it (a problem, not an error finding).
REFERENCE_UNMODELLED = {
    "batch.padded-step": "the reference trainer does not pad a step with no-op responses as "
    "verl's V1 trainer does (its last mini-batch would be short instead)",
}


def reference_problems(
    leaves: Sequence[LeafVerdict], findings: Sequence[Finding], *, skip_unknown: bool = False
) -> list[str]:
    """Why the reference trainer cannot run it: leaves it does not understand (optionally not
    counting unknown ones), and what verl does that it does not do the same way."""
    problems = [
        leaf.problem
        for leaf in leaves
        if leaf.problem and not (skip_unknown and leaf.klass == "unknown")
    ]
    return problems + [
        f"{f.path}: {REFERENCE_UNMODELLED[f.check]}"
        for f in findings
        if f.check in REFERENCE_UNMODELLED
    ]


def rejection_reasons(
    leaves: Sequence[LeafVerdict], findings: Sequence[Finding], *, skip_unknown: bool = False
) -> list[str]:
    """Every reason to reject: the reference trainer's problems, then verl's error findings."""
    errors = [f"{f.path}: {f.message}" for f in findings if f.level == "error"]
    return reference_problems(leaves, findings, skip_unknown=skip_unknown) + errors


def in_release(finding: Finding, version: str) -> Finding:
    """``finding`` citing ``version``'s own lines of upstream (``releases.lines``)."""
    cited = dataclasses.replace(
        finding,
        message=cite(finding.message, version),
        fix=cite(finding.fix, version),
        evidence=cite(finding.evidence, version),
    )
    return cited if cited != finding else finding


def compile_resolved(
    resolved: Mapping[str, Any],
    *,
    case_id: str,
    profile: Profile | None = None,
    explicit_fields: Sequence[str] = (),
    model_facts: Mapping[str, ModelFacts] | None = None,
    defaults: Mapping[str, Any] | None = None,
    family: str = RL,
    world_size: int | None = None,
    launcher: str | None = None,
    world_source: str | None = None,
    forced: tuple[tuple[str, str, str], ...] = (),
    entry_calls: frozenset[str] = frozenset(),
    entry_module: str | None = None,
) -> CompileReport:
    """Classify every leaf and run the semantic checks of the tree's ``family`` (the launch's
    ``world_size`` for the checks that need it); any problem or error rejects the case."""
    profile = profile or load_profile()
    leaves = classify(profile, resolved)
    findings = semantic_findings(
        CheckInput(
            resolved,
            tuple(explicit_fields),
            tuple(leaves),
            profile,
            model_facts or {},
            defaults or {},
            family,
            world_size,
            launcher,
            world_source,
            forced,
            entry_calls,
            lambda evidence: not cites_only_gone(evidence, profile.version),
            entry_module,
            wrapped_routers(profile.version),
            value_heads(profile.version),
            sglang_server(profile.version),
        )
    )
    # The checks cite the lines of the release the project's texts are written for; the
    # findings of another release's profile cite that release's own lines.
    findings = [in_release(finding, profile.version) for finding in findings]
    reasons = rejection_reasons(leaves, findings)
    if reasons:
        more = f" (and {len(reasons) - 3} more)" if len(reasons) > 3 else ""
        return CompileReport(
            case_id,
            profile.name,
            SEMANTIC_REJECTION,
            "; ".join(reasons[:3]) + more,
            tuple(leaves),
            tuple(findings),
        )
    return CompileReport(
        case_id,
        profile.name,
        ACCEPTED,
        "every leaf is understood by the reference trainer",
        tuple(leaves),
        tuple(findings),
    )


@dataclass(frozen=True)
class Verdicts:
    """The two questions a compile report answers, kept apart.

    ``valid``: does verl itself accept and run the configuration (no error finding; each error
    cites the upstream code that raises or misbehaves)? ``runnable``: can the reference trainer
    run it (every leaf understood by the profile, and valid)? A script can be valid for verl and
    still use an algorithm the reference trainer lacks.
    """

    valid: bool
    runnable: bool
    errors: tuple[str, ...]
    problems: tuple[str, ...]


def verdicts(report: CompileReport) -> Verdicts:
    errors = tuple(f.line() for f in report.findings if f.level == "error")
    problems = tuple(reference_problems(report.leaves, report.findings))
    return Verdicts(not errors, report.accepted, errors, problems)
