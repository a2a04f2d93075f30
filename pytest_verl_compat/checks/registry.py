"""The finding registry: one decorated function per check, with its id, level and evidence.

A check reads one resolved mapping (plus the explicit fields and the leaf verdicts) and yields
:class:`Hit` values; the registry turns each into a :class:`Finding` with the check's level and
evidence. Adding a check is one decorated function in the module of its family.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from pytest_verl_compat.checks.model_facts import ModelFacts
from pytest_verl_compat.model import Finding, LeafVerdict, Level


class Hit(NamedTuple):
    """One place a check fires: the dotted path(s), what is wrong, and how to fix it."""

    path: str
    message: str
    fix: str = ""


class ProfileLike(Protocol):
    """The compiling profile as checks see it (a pipeline ``Profile`` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str: ...


class ProfileInfo(NamedTuple):
    """A profile's name and upstream version without the profile itself (for direct callers)."""

    name: str
    version: str


@dataclass(frozen=True)
class CheckInput:
    """What every check reads."""

    resolved: Mapping[str, Any]
    explicit_fields: tuple[str, ...]
    leaves: tuple[LeafVerdict, ...]
    profile: ProfileLike
    # Facts from a model's config.json, by model section (checks/model_facts.py ACTOR_MODEL,
    # CRITIC_MODEL); empty when no config was readable, and the checks that need them stay quiet.
    model_facts: Mapping[str, ModelFacts] = field(default_factory=dict)
    # The tree's override-free resolved mapping (the defaults), when the caller has the tree.
    defaults: Mapping[str, Any] = field(default_factory=dict)

    @property
    def version(self) -> str:
        """The upstream version the findings speak of, from the profile (never a literal)."""
        return str(self.profile.version)


CheckFunction = Callable[[CheckInput], Iterable[Hit]]


@dataclass(frozen=True)
class Check:
    """A registered check. ``evidence`` may name ``{profile}`` and ``{version}``, filled per run."""

    id: str
    level: Level
    evidence: str
    run: CheckFunction

    def findings(self, inp: CheckInput) -> list[Finding]:
        evidence = self.evidence.format(profile=inp.profile.name, version=inp.version)
        return [
            Finding(self.level, hit.path, hit.message, hit.fix, evidence, check=self.id)
            for hit in self.run(inp)
        ]


CHECKS: dict[str, Check] = {}


def check(
    check_id: str, *, level: Level, evidence: str = ""
) -> Callable[[CheckFunction], CheckFunction]:
    """Register ``function`` as the check ``check_id``; ids are unique across families."""

    def register(function: CheckFunction) -> CheckFunction:
        if check_id in CHECKS:
            raise ValueError(f"check {check_id!r} is registered twice")
        CHECKS[check_id] = Check(check_id, level, evidence, function)
        return function

    return register


# The check that reports values of the wrong type; the others may then meet such a value.
WRONG_TYPE = "types.wrong-type"


def semantic_findings(inp: CheckInput) -> list[Finding]:
    """Every registered check on one input, in a stable order (level, path, message).

    A value of the wrong type is reported once, by its own check; a check that does arithmetic on
    that value (``int("abc")``) then has nothing to say and is skipped, rather than failing. With
    every type right, such an error is a bug in the check and propagates.
    """
    typed = CHECKS[WRONG_TYPE].findings(inp) if WRONG_TYPE in CHECKS else []
    findings = list(typed)
    for entry in CHECKS.values():
        if entry.id == WRONG_TYPE:
            continue
        try:
            findings.extend(entry.findings(inp))
        except (TypeError, ValueError, ArithmeticError, AttributeError):
            if not typed:
                raise
    return sorted(findings, key=Finding.sort_key)
