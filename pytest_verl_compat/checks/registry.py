"""The finding registry: one decorated function per check, with its id, level and evidence.

A check reads one resolved mapping (plus the explicit fields and the leaf verdicts) and yields
:class:`Hit` values; the registry turns each into a :class:`Finding` with the check's level and
evidence. Adding a check is one decorated function in the module of its family.

A rule is a page (STYLE.md 14e): each check also carries what it checks, the fix, and an
:class:`Example` (a manifest case plus the overrides that make it fire, and its near-identical valid
twin). ``verl-compat rule ID``, ``docs/rules.md`` and the must-fire / must-not-fire test
(tests/test_rule_pages.py) are generated from them. Findings that no static check gives (upstream's
own checks, a composition rejection, the launch reader, the inline directives) register a
:class:`RuleDoc` of their own with ``register_rule``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from pytest_verl_compat.checks.model_facts import (
    ModelFacts,
    SglangServer,
    ValueHeads,
    WrappedRouter,
)
from pytest_verl_compat.model import Finding, LeafVerdict, Level

# The case every example starts from unless it names another: the embedded manifest's GRPO script.
EXAMPLE_BASE = "grpo"
# The families of configuration a check reads (``CheckInput.family``): an RL trainer's tree
# (``ppo_trainer`` and the trees built on it) or the SFT trainer's (``sft_trainer_engine``).
RL = "rl"
SFT = "sft"
FAMILIES = (RL, SFT)
# The upstream function most static checks stand on (verl/utils/config.py): an entry point that
# never calls it never meets them.
VALIDATE_CONFIG = "validate_config"


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
    # Which checks read it (``family_of``), and the processes its launcher starts (torchrun's
    # nproc_per_node x nnodes; None when the launcher does not say).
    family: str = RL
    world_size: int | None = None
    # How the launch starts the entry module ("python", "torchrun"; None: no script read), and
    # where the entry point takes its world from ("ray", "torchrun"; ``pipeline.entry_points``).
    launcher: str | None = None
    world_source: str | None = None
    # Keys the entry point's ``main`` overwrites with another key's value before anything reads
    # them: (the key, the key it copies, the file:line) (``pipeline.entry_points``).
    forced: tuple[tuple[str, str, str], ...] = ()
    # The functions the entry point's module calls by name (``pipeline.entry_points``): a check
    # whose claim depends on the entry point (a migration only one of them runs) reads them.
    entry_calls: frozenset[str] = frozenset()
    # Whether the checked release has the code a check's evidence cites (``releases.lines``,
    # given by the pipeline): a check standing on code the release lacks says nothing of it.
    has_cited_code: Callable[[str], bool] = field(default=lambda _evidence: True)
    # The module the launch runs (``python -m MODULE``); None where no launch was read (a resolved
    # file), taken as main_ppo's.
    entry_module: str | None = None
    # The MoE routers the release's environment cannot train LoRA around, by model type
    # (``releases.lora_routers``, given by the pipeline; none: the checks that read it are quiet).
    wrapped_routers: Mapping[str, WrappedRouter] = field(default_factory=dict)
    # The critics the release's environment cannot build LoRA on (``releases.value_heads``, given
    # by the pipeline; None: the check that reads it is quiet).
    value_heads: ValueHeads | None = None
    # How the release hands SGLang the actor's LoRA (``releases.sglang_server``, given by the
    # pipeline; None: the check that reads it is quiet).
    sglang_server: SglangServer | None = None

    @property
    def version(self) -> str:
        """The upstream version the findings speak of, from the profile (never a literal)."""
        return str(self.profile.version)

    @property
    def runs_validate_config(self) -> bool:
        """Whether the launch meets ``validate_config`` (verl/utils/config.py): main_ppo's ``main``
        and one_step_off's runner call it, fully_async_main's never does; where the entry point
        is not known (a resolved file) it is taken to be main_ppo's."""
        return not self.entry_calls or VALIDATE_CONFIG in self.entry_calls


CheckFunction = Callable[[CheckInput], Iterable[Hit]]


@dataclass(frozen=True)
class Example:
    """Where a rule fires and its near-identical valid twin: a case of the embedded manifest
    (``base``) plus the overrides of each. ``model`` gives the actor model's config.json facts
    (``ModelFacts`` fields) for the checks that read them; ``upstream``: the finding comes from
    upstream's own checks (the oracle process), not a static check."""

    fires: tuple[str, ...]
    twin: tuple[str, ...]
    base: str = EXAMPLE_BASE
    model: Mapping[str, Any] = field(default_factory=dict)
    # The twin's model facts when the twin differs in the model rather than in the overrides.
    twin_model: Mapping[str, Any] | None = None
    upstream: bool = False
    # Command-line options the example needs besides the overrides (``--gpu H100-80GB``).
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class RuleDoc:
    """A rule's page: what it checks, why (the upstream file:line), the fix, and an example."""

    id: str
    level: Level
    summary: str
    why: str
    fix: str
    example: Example | None = None
    # A rule whose findings do not come from a registered check: who gives them.
    source: str = "a static check"


@dataclass(frozen=True)
class Check:
    """A registered check. ``evidence`` may name ``{profile}`` and ``{version}``, filled per run."""

    id: str
    level: Level
    evidence: str
    run: CheckFunction
    summary: str = ""
    fix: str = ""
    example: Example | None = None
    # The family of tree it reads; None: every family (a check of the tree's own types).
    family: str | None = RL
    # Rules that say more about the same key: where one of them fires on a path, this check's
    # finding on that path is left out (``yield_to_others``).
    yields_to: tuple[str, ...] = ()

    def doc(self) -> RuleDoc:
        summary = self.summary or (self.run.__doc__ or "").strip().split("\n\n")[0]
        return RuleDoc(
            self.id, self.level, " ".join(summary.split()), self.evidence, self.fix, self.example
        )

    def findings(self, inp: CheckInput) -> list[Finding]:
        evidence = self.evidence.format(profile=inp.profile.name, version=inp.version)
        return [
            Finding(self.level, hit.path, hit.message, hit.fix, evidence, check=self.id)
            for hit in self.run(inp)
        ]


CHECKS: dict[str, Check] = {}
# The pages of rules that no registered check gives (upstream.*, compose, launch.*, directive.*).
RULE_DOCS: dict[str, RuleDoc] = {}


def check(
    check_id: str,
    *,
    level: Level,
    evidence: str = "",
    summary: str = "",
    fix: str = "",
    example: Example | None = None,
    family: str | None = RL,
    yields_to: tuple[str, ...] = (),
) -> Callable[[CheckFunction], CheckFunction]:
    """Register ``function`` as the check ``check_id``; ids are unique across families.

    ``summary`` (default: the function's docstring) says what it checks, ``fix`` what to change,
    ``example`` where it fires and its valid twin: the rule's page. ``yields_to``: the rules
    whose finding on the same path makes this one's redundant.
    """

    def register(function: CheckFunction) -> CheckFunction:
        if check_id in CHECKS or check_id in RULE_DOCS:
            raise ValueError(f"check {check_id!r} is registered twice")
        CHECKS[check_id] = Check(
            check_id, level, evidence, function, summary, fix, example, family, yields_to
        )
        return function

    return register


def register_rule(doc: RuleDoc) -> RuleDoc:
    """Register the page of a rule that no check gives (its findings come from elsewhere)."""
    known = RULE_DOCS.get(doc.id)
    if doc.id in CHECKS or (known is not None and known != doc):
        raise ValueError(f"rule {doc.id!r} is registered twice")
    RULE_DOCS[doc.id] = doc
    return doc


def rule_docs() -> dict[str, RuleDoc]:
    """Every rule's page by id, sorted: the checks' and the registered ones."""
    docs = {**{c.id: c.doc() for c in CHECKS.values()}, **RULE_DOCS}
    return dict(sorted(docs.items()))


# The check that reports values of the wrong type; the others may then meet such a value.
WRONG_TYPE = "types.wrong-type"


def family_of(resolved: Mapping[str, Any]) -> str | None:
    """Which checks read a resolved mapping, by the sections it has: an RL trainer's tree has
    ``actor_rollout_ref``; the SFT trainer's has ``engine``, ``model`` and ``optim`` at the top,
    which no RL tree has: an SFT tree stays one when a run adds PPO keys to it with ``+``
    (``+algorithm.adv_estimator=grpo``), and the RL checks never read it."""
    if {"engine", "model", "optim", "data", "trainer"} <= set(resolved):
        return SFT
    if "actor_rollout_ref" in resolved:
        return RL
    return None


def yield_to_others(findings: Iterable[Finding]) -> list[Finding]:
    """``findings`` without those of a check that yields to another finding's rule on the same
    path (one key, one finding: the rule that says more)."""
    kept = list(findings)
    fired = {(f.path, f.check) for f in kept}
    return [
        f
        for f in kept
        if f.check not in CHECKS
        or not any((f.path, other) in fired for other in CHECKS[f.check].yields_to)
    ]


def semantic_findings(inp: CheckInput) -> list[Finding]:
    """Every registered check on one input, in a stable order (level, path, message).

    A value of the wrong type is reported once, by its own check; a check that does arithmetic on
    that value (``int("abc")``) then has nothing to say and is skipped, rather than failing. With
    every type right, such an error is a bug in the check and propagates.
    """
    types = CHECKS.get(WRONG_TYPE)
    typed = types.findings(inp) if types is not None and types.family in (None, inp.family) else []
    findings = list(typed)
    for entry in CHECKS.values():
        if entry.id == WRONG_TYPE or entry.family not in (None, inp.family):
            continue
        if not inp.has_cited_code(entry.evidence):
            continue
        try:
            findings.extend(entry.findings(inp))
        except (TypeError, ValueError, ArithmeticError, AttributeError):
            if not typed:
                raise
    return sorted(yield_to_others(findings), key=Finding.sort_key)
