"""The shared vocabulary of every layer: cases, bindings, fields, compositions, verdicts, findings.

Every other module takes these words from here; nothing here imports the rest of the package, so
any layer may import it. Strings that cross process boundaries or land in golden files (outcomes,
leaf classes, levels, JSON keys) are defined here once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal, get_args

# --- outcomes, classes and levels ------------------------------------------------------------

Outcome = Literal["composed", "composition_rejection", "accepted", "semantic_rejection"]
COMPOSED: Final = "composed"
COMPOSITION_REJECTION: Final = "composition_rejection"
# The rule id of a launch Hydra rejects (check's error[compose], fit's set-aside overrides).
COMPOSE_RULE: Final = "compose"
ACCEPTED: Final = "accepted"
SEMANTIC_REJECTION: Final = "semantic_rejection"

LeafClass = Literal["exact", "lowered", "binding", "inert", "unsupported", "unknown"]
# In report order; `unknown` is never a rule's class: it is what no rule matched.
LEAF_CLASSES: Final[tuple[LeafClass, ...]] = get_args(LeafClass)
RULE_CLASSES: Final[tuple[LeafClass, ...]] = LEAF_CLASSES[:-1]

Level = Literal["error", "warning", "info"]
LEVELS: Final[tuple[Level, ...]] = get_args(Level)

# `script` is a one-off case for a launch script named on the command line, never a manifest kind;
# `example` is one of upstream's own launch scripts, listed in corpus/examples.yaml.
CaseKind = Literal[
    "official", "derived", "field", "user", "resolved", "script", "example", "invalid"
]
SCRIPT: Final = "script"
EXAMPLE: Final = "example"

# Where a case's explicit fields came from.
FieldsSource = Literal["launch", "golden", "resolved"]

# --- JSON keys that travel between processes (xdist workers, JUnit, the audit report) --------

KEY_CASE: Final = "verl_case"
KEY_STAGE: Final = "verl_stage"
KEY_FACTS: Final = "verl_facts"
KEY_AUDIT_ENTRY: Final = "verl_audit_entry"
KEY_COMPILE_SECONDS: Final = "verl_compile_seconds"
KEY_CONFORMANCE: Final = "verl_conformance"


# --- the exceptions every stage raises --------------------------------------------------------


class StageUnavailable(Exception):
    """A stage cannot run here, for a reason that is not the case's fault (becomes a skip)."""


class StageFailed(Exception):
    """A stage failed for this case (becomes a test failure with this message)."""


# --- the manifest's words --------------------------------------------------------------------


@dataclass(frozen=True)
class Bindings:
    """What a launch script sees: its variables, command-substitution outputs and ``"$@"``."""

    variables: Mapping[str, str] = field(default_factory=dict)
    substitutions: Mapping[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    # Which way the script goes at a condition only the running system decides (a file test, a
    # run-time value) whose ways differ: its place (FILE:LINE:COLUMN, #N when met again) -> the
    # way (true: the test succeeds). Set per way when ``check`` follows each.
    conditions: Mapping[str, bool] = field(default_factory=dict)

    def overlay(self, other: Bindings) -> Bindings:
        """Return these bindings with ``other``'s entries taking precedence."""
        return Bindings(
            variables={**self.variables, **other.variables},
            substitutions={**self.substitutions, **other.substitutions},
            args=other.args or self.args,
            conditions={**self.conditions, **other.conditions},
        )

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> Bindings:
        raw = raw or {}
        return cls(
            variables=dict(raw.get("variables", {})),
            substitutions=dict(raw.get("substitutions", {})),
            args=tuple(raw.get("args", ())),
        )


@dataclass(frozen=True)
class InputPin:
    """One upstream file a case reads, relative to the upstream root, with its sha256."""

    path: str
    sha256: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "sha256": self.sha256}


@dataclass(frozen=True)
class OverrideBlock:
    """A fenced block of overrides under a Markdown heading (e.g. the README's Dr. GRPO)."""

    path: str
    heading: str


@dataclass(frozen=True)
class UpstreamPin:
    """The upstream release the corpus is pinned to."""

    repository: str
    tag: str
    commit: str
    version: str
    config_dir: str
    config_name: str
    tree_sha256: str


@dataclass(frozen=True)
class Case:
    """One corpus case; ``error`` is set when its manifest entry is malformed."""

    id: str
    kind: CaseKind
    line: int
    title: str = ""
    launch: str | None = None
    base: str | None = None
    resolved: str | None = None
    overrides: tuple[str, ...] = ()
    override_blocks: tuple[OverrideBlock, ...] = ()
    inputs: tuple[InputPin, ...] = ()
    bindings: Bindings = field(default_factory=Bindings)
    expected: Mapping[str, Any] | None = None
    upstream: Mapping[str, Any] | None = None
    notes: str = ""
    error: str | None = None

    def pinned_inputs(self) -> list[dict[str, str]]:
        return [pin.to_json() for pin in self.inputs]

    def in_release(self, version: str) -> Case:
        """The case as ``version`` is expected to judge it: ``expected.releases[version]`` (a
        known divergence of another release than the manifest's) replaces what it names."""
        releases = (self.expected or {}).get("releases") or {}
        if not self.expected or "releases" not in self.expected:
            return self
        base = {k: v for k, v in self.expected.items() if k != "releases"}
        return replace(self, expected={**base, **dict(releases.get(version) or {})})


@dataclass(frozen=True)
class Manifest:
    """A validated manifest; malformed cases are kept, with their error, so only they fail."""

    path: Path
    upstream: UpstreamPin
    bindings: Bindings
    cases: tuple[Case, ...]
    profile: str | None = None
    golden_dir: Path | None = None
    known_divergences: tuple[Mapping[str, str], ...] = ()
    # Tolerances and known divergences of the conformance stage, a file beside the manifest.
    conformance: Path | None = None

    def case(self, case_id: str) -> Case:
        for case in self.cases:
            if case.id == case_id:
                return case
        known = ", ".join(c.id for c in self.cases)
        raise KeyError(f"no case {case_id!r} in {self.path}; known cases: {known}")


# --- what the stages produce -----------------------------------------------------------------


@dataclass(frozen=True)
class ExplicitFields:
    """The override list a case passes to ``verl.trainer.main_ppo``, with where it came from."""

    fields: tuple[str, ...]
    launch_line: int | None
    # The launcher's known environment as the script (and its wrappers) leave it, which
    # `${oc.env:NAME}` reads; None when the fields did not come from reading a script.
    variables: Mapping[str, str] | None = None
    # The entry module the launch runs (`verl.trainer.sft_trainer`); None: the pinned one.
    module: str | None = None
    # The processes its launcher starts (torchrun's nproc_per_node x nnodes), None when the
    # launcher does not say (a plain Python launch: Ray places the workers) or only the run does.
    world_size: int | None = None
    world_size_reason: str = ""
    # What runs the entry module: "python" or "torchrun"; None when no script was read.
    launcher: str | None = None
    # Overrides whose value holds a run-time value carried as a placeholder (``RUNTIME_PWD``):
    # (the key, what the value holds and where it comes from).
    carried: tuple[tuple[str, str], ...] = ()

    def environment(self, bindings: Bindings) -> Mapping[str, str]:
        """What ``${oc.env:...}`` sees: the launcher's environment, else the case's bindings."""
        return bindings.variables if self.variables is None else self.variables


@dataclass(frozen=True)
class Composition:
    """A composed case: its resolved mapping, or the reason Hydra rejected it."""

    outcome: Outcome  # COMPOSED or COMPOSITION_REJECTION
    resolved: dict[str, Any] | None = None
    reason: str = ""
    missing: tuple[str, ...] = field(default_factory=tuple)

    @property
    def composed(self) -> bool:
        return self.outcome == COMPOSED

    @property
    def mapping(self) -> dict[str, Any]:
        """The resolved mapping of a composed case; asking a rejection for it is a bug."""
        if self.resolved is None:
            raise ValueError(f"not composed: {self.reason}")
        return self.resolved


@dataclass(frozen=True)
class LeafVerdict:
    """One resolved leaf, its class and why."""

    path: str
    value: Any
    klass: LeafClass
    reason: str
    rule: str = ""
    detail: str = ""
    problem: str = ""  # why this leaf rejects the case, if it does
    no_effect: bool = False  # setting it explicitly signals an intent 0.9.x ignores


# Where a finding's location points: the script text that sets the key, the launcher line (the
# key is set, but not by text the locator can find), a ``--set`` argument, the config tree's YAML
# line of a key left at its default, or the manifest entry of a case with no script text.
LocationOrigin = Literal["script", "launcher", "set", "tree", "manifest", "resolved"]


@dataclass(frozen=True)
class Location:
    """A file, 1-based line and column (``column`` 0: the whole line), and what it points at."""

    file: str
    line: int
    column: int
    origin: LocationOrigin

    def __str__(self) -> str:
        return (
            f"{self.file}:{self.line}:{self.column}" if self.column else f"{self.file}:{self.line}"
        )

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "column": self.column, "origin": self.origin}


@dataclass(frozen=True)
class Finding:
    """``LEVEL path: message (fix)``, with the upstream evidence."""

    level: Level
    path: str
    message: str
    fix: str = ""
    evidence: str = ""
    # The registered check that said it: the finding's rule id (``verl-compat rule ID``). Not
    # part of ``to_json``, so the compile golden files stay as they were; ``check --format json``
    # prints it as ``rule``.
    check: str = field(default="", compare=False)
    # Where the key of ``path`` was set (``pipeline/locate.py``); None until located.
    location: Location | None = field(default=None, compare=False)
    # The way of the script it is about, when its ways at a condition only the running system
    # decides give different verdicts (``when [ -d "$HOME/models/Q" ] (line 2) is true``).
    when: str = field(default="", compare=False)

    @property
    def rule(self) -> str:
        return self.check

    @property
    def keys(self) -> tuple[str, ...]:
        """The dotted config keys the path names (a finding may name several, ", "-joined)."""
        return tuple(part.strip() for part in self.path.split(", ") if part.strip())

    def to_json(self) -> dict[str, str]:
        return {
            "level": self.level,
            "path": self.path,
            "message": self.message,
            "fix": self.fix,
            "evidence": self.evidence,
        }

    def line(self) -> str:
        fix = f" ({self.fix})" if self.fix else ""
        return f"{self.level.upper()} {self.path}: {self.message}{fix}"

    def sort_key(self) -> tuple[int, str, str]:
        return (LEVELS.index(self.level), self.path, self.message)


@dataclass(frozen=True)
class CompileReport:
    """What the compiler concluded about one resolved mapping."""

    case_id: str
    profile: str
    outcome: Outcome  # ACCEPTED or SEMANTIC_REJECTION
    reason: str
    leaves: tuple[LeafVerdict, ...]
    findings: tuple[Finding, ...]

    @property
    def counts(self) -> dict[str, int]:
        counter = Counter(leaf.klass for leaf in self.leaves)
        return {klass: counter.get(klass, 0) for klass in LEAF_CLASSES}

    @property
    def bindings(self) -> list[str]:
        return [leaf.path for leaf in self.leaves if leaf.klass == "binding"]

    @property
    def lowered(self) -> dict[str, str]:
        return {leaf.path: leaf.detail for leaf in self.leaves if leaf.klass == "lowered"}

    @property
    def accepted(self) -> bool:
        return self.outcome == ACCEPTED

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


# --- line numbers as text -------------------------------------------------------------------


def line_spans(lines: list[int]) -> str:
    """``[3, 4, 5, 9]`` as ``"3-5,9"``: source lines, compact and readable (recorded answers'
    lines, the places a finding names)."""
    runs: list[list[int]] = []
    for line in sorted(set(lines)):
        if runs and runs[-1][1] == line - 1:
            runs[-1][1] = line
        else:
            runs.append([line, line])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in runs)


def dotted_value(mapping: Mapping[str, Any], dotted: str) -> Any:
    """The value at a dotted path of a nested mapping (a resolved configuration), None where
    any part is missing."""
    node: Any = mapping
    for part in dotted.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node
