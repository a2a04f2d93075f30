"""The forecast's words: a part (bytes, formula, evidence), a phase's peak, a kind of rank, the
forecast of a run. Plain dataclasses; the report and the picture read only these."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_verl_compat.pipeline.set_aside import SetAside

GIB = 1 << 30

# Phases, in the order a step runs them (verl/trainer/ppo/v1/trainer_base.py:536-586, _step_once).
WEIGHT_SYNC = "weight-sync"
ROLLOUT = "rollout"
REWARD = "reward-model"
OLD_LOG_PROB = "old-log-prob"
REF_LOG_PROB = "ref-log-prob"
VALUES = "critic-values"
CRITIC_UPDATE = "critic-update"
ACTOR_UPDATE = "actor-update"
CHECKPOINT = "checkpoint-save"
SERVER_START = "rollout-start"
SFT_UPDATE = "sft-update"
PHASES = (
    SERVER_START,
    WEIGHT_SYNC,
    ROLLOUT,
    REWARD,
    OLD_LOG_PROB,
    REF_LOG_PROB,
    VALUES,
    CRITIC_UPDATE,
    ACTOR_UPDATE,
    SFT_UPDATE,
    CHECKPOINT,
)
PHASE_TITLES = {
    SERVER_START: "rollout server start",
    WEIGHT_SYNC: "weight sync to the rollout",
    ROLLOUT: "rollout generation",
    REWARD: "reward model",
    OLD_LOG_PROB: "old log-prob pass",
    REF_LOG_PROB: "reference log-prob pass",
    VALUES: "critic values",
    CRITIC_UPDATE: "critic update",
    ACTOR_UPDATE: "actor update",
    SFT_UPDATE: "SFT update",
    CHECKPOINT: "checkpoint save",
}


def gib(value: int) -> float:
    return value / GIB


@dataclass(frozen=True)
class Part:
    """One share of a phase's peak: what it is, its bytes, how it is computed, and why."""

    key: str  # stable id, e.g. "actor.params"
    label: str
    bytes: int
    formula: str
    evidence: str = ""


@dataclass(frozen=True)
class PhasePeak:
    """The forecast peak of one phase on one kind of rank, as the sum of its parts."""

    phase: str
    role: str
    parts: tuple[Part, ...]

    @property
    def total(self) -> int:
        return sum(p.bytes for p in self.parts)


@dataclass(frozen=True)
class RankKind:
    """Ranks that hold the same: how many there are and what each phase peaks at on them."""

    name: str
    count: int
    description: str
    phases: tuple[PhasePeak, ...]

    @property
    def peak(self) -> PhasePeak | None:
        return max(self.phases, key=lambda p: p.total, default=None)


@dataclass(frozen=True)
class Fix:
    """A change of keys and the forecast peak of the phase after it."""

    keys: tuple[tuple[str, str], ...]  # (dotted key, new value)
    after: int
    fits: bool  # the whole run fits after the change
    phase_fits: bool = True  # this phase is then within the GPU

    def outcome(self) -> str:
        """What is still wrong after the change ("" when nothing is)."""
        if not self.phase_fits:
            return "still over"
        return "" if self.fits else "other phases still over"

    def text(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.keys)


@dataclass(frozen=True)
class ReleaseRemedy(Fix):
    """A later release whose tree gives a key the value that lowers the phase, where the release
    forecast for decides without a key: no key of that release changes (``keys`` is empty), the
    phase's peak is under the later tree's value, the rest of the run as the release forecast for
    has it."""

    release: str = ""
    key: str = ""  # the key as the later release's tree names it (its leaf)
    value: Any = None
    evidence: str = ""  # the tree's line, with the release

    def text(self) -> str:
        value = "true" if self.value is True else "false" if self.value is False else self.value
        return (
            f"on verl {self.release} ({self.key}: {value} in its tree, {self.evidence}; "
            f"fit --release {self.release})"
        )


@dataclass(frozen=True)
class Verdict:
    """One phase on one kind of rank against the capacity: error, warning or fine."""

    level: str  # error, warning, ok
    rank: str
    phase: str
    total: int
    capacity: int
    message: str
    keys: tuple[str, ...]
    fixes: tuple[Fix, ...] = ()
    remedy: ReleaseRemedy | None = None

    @property
    def suggestions(self) -> tuple[Fix, ...]:
        """The fixes, then the later release's remedy where there is one: what a finding offers."""
        return (*self.fixes, self.remedy) if self.remedy else self.fixes


# The rule of a LoRA adapter peft refuses to build for its targets (a LoRA critic's is check's
# model.critic-lora).
LORA_TARGETS = "model.lora-targets"


@dataclass(frozen=True)
class AdapterRefusal:
    """peft refusing to build a role's LoRA adapter (``memory/lora_build.py``): the run stops at
    its engine's build, before any phase; ``key`` decides it."""

    role: str
    key: str
    message: str
    fix: str
    evidence: str
    rule: str = LORA_TARGETS  # the rule that says it


@dataclass(frozen=True)
class Forecast:
    """Everything the report and the picture show."""

    script: str
    kind: str  # rl or sft
    model: str
    model_origin: str
    gpu: str
    capacity: int | None
    capacity_assumed: bool
    margin: float
    world: int
    ranks: tuple[RankKind, ...]
    verdicts: tuple[Verdict, ...] = ()
    assumptions: tuple[str, ...] = ()
    server: dict[str, int | float] = field(default_factory=dict)
    # the launch's overrides its release's tree rejected, left out of (or applied to) what was
    # forecast: each an error of the launch as written (``pipeline/set_aside.py``)
    set_aside: tuple[SetAside, ...] = ()
    # the roles whose LoRA adapter peft refuses to build: the run stops before its first phase,
    # and the phases are what it would hold had the adapter been built from what the targets match
    # (a LoRA critic's: the critic trained in full, as the forecast counts every critic)
    refused: tuple[AdapterRefusal, ...] = ()
