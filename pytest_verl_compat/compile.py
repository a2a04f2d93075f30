"""Compile stage: classify every resolved leaf against a versioned profile, accept or reject the case."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from pytest_verl_compat.compose import iter_leaves
from pytest_verl_compat.findings import Finding, semantic_findings

CLASSES = ("exact", "lowered", "binding", "inert", "unsupported", "unknown")
DEFAULT_PROFILE = "verl-0.9.0-single-device"


@dataclass(frozen=True)
class Rule:
    """Dotted-path patterns mapped to one class, with the reason and what the class needs."""

    patterns: tuple[str, ...]
    klass: str
    reason: str
    detail: str = ""  # exact: target field; lowered: the lowering; binding: what is bound
    values: tuple[Any, ...] | None = None  # exact/binding/lowered: the supported values
    neutral: tuple[Any, ...] | None = None  # unsupported: values that keep the feature off
    regex: re.Pattern[str] = field(default=re.compile(""), compare=False, repr=False)


@dataclass(frozen=True)
class Profile:
    """A versioned profile: an ordered list of rules; the first match classifies a leaf."""

    name: str
    version: str
    tree_sha256: str
    rules: tuple[Rule, ...]
    path: str
    _memo: dict[str, Rule | None] = field(default_factory=dict, compare=False, repr=False)

    def rule_for(self, dotted: str) -> Rule | None:
        # Every case has the same ~880 paths; matching ~150 rules per path dominated compile time.
        if dotted in self._memo:
            return self._memo[dotted]
        found = next((rule for rule in self.rules if rule.regex.fullmatch(dotted)), None)
        self._memo[dotted] = found
        return found


def _pattern_regex(patterns: Iterable[str]) -> re.Pattern[str]:
    # `**` crosses segments, `*` stays inside one; list indices are written `[*]` or `[0]`.
    parts = []
    for pattern in patterns:
        escaped = re.escape(pattern).replace(r"\*\*", "\0").replace(r"\*", r"[^.\[]*")
        parts.append(escaped.replace("\0", r".*"))
    return re.compile("|".join(f"(?:{p})" for p in parts))


def profile_path(name: str) -> Path:
    return Path(str(resources.files("pytest_verl_compat") / "profiles" / f"{name}.yaml"))


@lru_cache(maxsize=8)
def load_profile(name_or_path: str = DEFAULT_PROFILE) -> Profile:
    """A profile by name (shipped in the package) or by path to its YAML file."""
    # Profile names contain dots (verl-0.9.0-...), so only a YAML suffix means a path.
    path = (
        Path(name_or_path)
        if name_or_path.endswith((".yaml", ".yml"))
        else profile_path(name_or_path)
    )
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    rules = []
    for index, entry in enumerate(raw["rules"]):
        klass = entry["class"]
        if klass not in CLASSES[:-1]:
            raise ValueError(
                f"{path}: rules[{index}]: class {klass!r} is not one of {CLASSES[:-1]}"
            )
        patterns = entry["match"] if isinstance(entry["match"], list) else [entry["match"]]
        rules.append(
            Rule(
                patterns=tuple(patterns),
                klass=klass,
                reason=entry["reason"],
                detail=entry.get("target") or entry.get("lowering") or entry.get("binding") or "",
                values=tuple(entry["values"]) if "values" in entry else None,
                neutral=tuple(entry["neutral"]) if "neutral" in entry else None,
                regex=_pattern_regex(patterns),
            )
        )
    return Profile(
        name=raw["profile"],
        version=str(raw["upstream"]["version"]),
        tree_sha256=raw["upstream"]["tree_sha256"],
        rules=tuple(rules),
        path=str(path),
    )


@dataclass(frozen=True)
class LeafVerdict:
    """One resolved leaf, its class and why."""

    path: str
    value: Any
    klass: str
    reason: str
    rule: str = ""
    detail: str = ""
    problem: str = ""  # why this leaf rejects the case, if it does


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
        path, value, rule.klass, rule.reason, " | ".join(rule.patterns), rule.detail, problem
    )


def classify(profile: Profile, resolved: Mapping[str, Any]) -> list[LeafVerdict]:
    return [classify_leaf(profile, path, value) for path, value in iter_leaves(resolved)]


@dataclass(frozen=True)
class CompileReport:
    """What the compiler concluded about one resolved mapping."""

    case_id: str
    profile: str
    outcome: str  # "accepted" or "semantic_rejection"
    reason: str
    leaves: tuple[LeafVerdict, ...]
    findings: tuple[Finding, ...]

    @property
    def counts(self) -> dict[str, int]:
        counter = Counter(leaf.klass for leaf in self.leaves)
        return {klass: counter.get(klass, 0) for klass in CLASSES}

    @property
    def bindings(self) -> list[str]:
        return [leaf.path for leaf in self.leaves if leaf.klass == "binding"]

    @property
    def lowered(self) -> dict[str, str]:
        return {leaf.path: leaf.detail for leaf in self.leaves if leaf.klass == "lowered"}

    @property
    def accepted(self) -> bool:
        return self.outcome == "accepted"

    def to_json(self) -> dict[str, Any]:
        """The snapshotted compile report: per-leaf verdicts, counts, bindings, findings."""
        return {
            "case": self.case_id,
            "profile": self.profile,
            "outcome": self.outcome,
            "reason": self.reason,
            "leaf_classes": self.counts,
            "required_bindings": sorted(self.bindings),
            "lowered": self.lowered,
            "findings": [f.to_json() for f in self.findings],
            # Classes only: the rules' reasons live once in the profile, not in every report.
            "leaves": {leaf.path: leaf.klass for leaf in self.leaves},
            "problems": [leaf.problem for leaf in self.leaves if leaf.problem],
        }


def compile_resolved(
    resolved: Mapping[str, Any],
    *,
    case_id: str,
    profile: Profile | None = None,
    explicit_fields: Sequence[str] = (),
) -> CompileReport:
    """Classify every leaf and run the semantic checks; any problem or error rejects the case."""
    profile = profile or load_profile()
    leaves = classify(profile, resolved)
    findings = semantic_findings(resolved, explicit_fields, leaves)
    problems = [leaf.problem for leaf in leaves if leaf.problem]
    errors = [f"{f.path}: {f.message}" for f in findings if f.level == "error"]
    if problems or errors:
        reasons = problems + errors
        more = f" (and {len(reasons) - 3} more)" if len(reasons) > 3 else ""
        return CompileReport(
            case_id,
            profile.name,
            "semantic_rejection",
            "; ".join(reasons[:3]) + more,
            tuple(leaves),
            tuple(findings),
        )
    return CompileReport(
        case_id,
        profile.name,
        "accepted",
        "every leaf is understood by the reference trainer",
        tuple(leaves),
        tuple(findings),
    )
