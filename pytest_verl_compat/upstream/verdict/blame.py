"""The keys behind an upstream failure whose failing statement reads none, found by experiment.

A statement can fail on a value that no configuration read on its own lines decides:
``_load_checkpoint``'s ``int(global_step_folder.split(…))`` (verl/trainer/ppo/v1/trainer_base.py:815)
raises UnboundLocalError when ``trainer.resume_mode`` is none of the modes its ``if`` tests
(:793-812), and the failing line reads no key. Its keys are then found as delta debugging finds a
failure's cause (Zeller's ddmin, over the reset of keys): the script's explicit keys are reset to
the tree's defaults (their fields left out of the composition, so an interpolated copy follows
its source), in halves, then in smaller parts, and the smallest set whose reset removes the
failure (the same upstream line raising the same exception type) is named. When resetting every
key the script sets still fails, none of them decides it: a default of upstream's, said so.

Each experiment is one question to the oracle on the variant's composition (types and effects not
asked), answered by a fork of the warm template: 0.4-0.7 s each on this 2-core machine, a dozen
for one key among fifty; the completed answer is kept as the question's answer, so a later
``check`` of the same script asks none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pytest_verl_compat.upstream.probes import records as ec

# In a failure record: how its keys were found, when its statement read none.
KEY_BLAME = "blame"
BY_EXPERIMENT = "experiment"  # the smallest set of the script's keys whose reset removes it
UPSTREAM_DEFAULT = "default"  # resetting every key still fails: upstream's own default
UNDECIDED = "undecided"  # the experiments could not say (a variant not composed, the budget)
# At most this many variant compositions asked per failure (ddmin needs ~2·log2(n) for one key
# among n, n² at worst).
MAX_EXPERIMENTS = 64

# The failures of upstream's code on the script with these keys reset; None when the variant
# could not be composed or asked (ddmin's "unresolved").
Experiment = Callable[[frozenset[str]], "list[Mapping[str, Any]] | None"]
# Several experiments at once (the oracle's two workers answer two at a time).
Experiments = Callable[[Sequence[frozenset[str]]], "list[list[Mapping[str, Any]] | None]"]


def pending(failures: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a failure names no key and was not yet blamed."""
    return any(not f.get(ec.KEY_KEYS) and not f.get(KEY_BLAME) for f in failures)


# The probes' phases in the order a run meets them (``UpstreamFailure.check_id``'s words).
# ``_setup`` starts the workers between its other steps, and the first step's log-prob passes,
# updates and losses interleave: each pair is one rank.
_PHASES = {
    "config load": 0,
    "trainer start": 1,
    "trainer init": 2,
    "worker start": 2,
    "first step": 3,
    "first update": 3,
}


def _phase_rank(failure: Mapping[str, Any]) -> int:
    return _PHASES.get(str(failure[ec.KEY_PHASE]).split(":", 1)[0], len(_PHASES))


def _same(failure: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """The same upstream line raising the same exception type (its message may quote values)."""
    kind = str(failure[ec.KEY_MESSAGE]).split(":", 1)[0]
    return bool(
        other[ec.KEY_WHERE] == failure[ec.KEY_WHERE]
        and str(other[ec.KEY_MESSAGE]).split(":", 1)[0] == kind
    )


class _Search:
    """ddmin over the keys whose reset removes one failure, every experiment's outcome kept."""

    def __init__(
        self, failure: Mapping[str, Any], before: Sequence[Mapping[str, Any]], run: Experiments
    ) -> None:
        self.failure, self.before, self.run = failure, before, run
        self.outcomes: dict[frozenset[str], bool | None] = {}

    def _outcome(self, failures: list[Mapping[str, Any]] | None) -> bool | None:
        """Gone (True), still there (False), or hidden: a failure the script did not have, at
        or before this one's phase, stops the run before it could show (None)."""
        if failures is None:
            return None
        if any(_same(self.failure, f) for f in failures):
            return False
        rank = _phase_rank(self.failure)
        masking = [
            f
            for f in failures
            if _phase_rank(f) <= rank and not any(_same(f, old) for old in self.before)
        ]
        return None if masking else True

    def removed(self, sets: Sequence[frozenset[str]]) -> list[bool | None]:
        """For each set: its reset removes the failure (True), keeps it (False), or cannot say."""
        fresh = [s for s in dict.fromkeys(sets) if s not in self.outcomes]
        if len(self.outcomes) + len(fresh) > MAX_EXPERIMENTS:
            raise _OutOfBudget
        for keys, failures in zip(fresh, self.run(fresh) if fresh else [], strict=True):
            self.outcomes[keys] = self._outcome(failures)
        return [self.outcomes[s] for s in sets]

    def smallest(self, keys: Sequence[str]) -> list[str] | None:
        """The 1-minimal set whose reset removes the failure ([] when none: upstream's
        default), or None when the experiments cannot tell."""
        whole = frozenset(keys)
        (everything,) = self.removed([whole])
        if everything is False:
            return []
        # Resetting everything may itself fail earlier (verl's tree leaves mandatory values
        # unset: ``rollout.name``, the micro-batch sizes), which hides the failure without
        # removing it: the search goes on through smaller resets, as ddmin does with an
        # unresolved test.
        current, parts, resolved = sorted(whole), 2, bool(everything)
        while len(current) > 1:
            chunks = _split(current, parts)
            subsets = [frozenset(chunk) for chunk in chunks]
            complements = [frozenset(current) - chunk for chunk in subsets] if parts > 2 else []
            outcomes = self.removed(subsets + complements)
            found = next((s for s, ok in zip(subsets, outcomes, strict=False) if ok), None)
            if found is not None:
                current, parts, resolved = sorted(found), 2, True
                continue
            found = next(
                (c for c, ok in zip(complements, outcomes[len(subsets) :], strict=True) if ok),
                None,
            )
            if found is not None:
                current, parts, resolved = sorted(found), max(parts - 1, 2), True
                continue
            if parts >= len(current):
                break
            parts = min(2 * parts, len(current))
        return current if resolved else None


class _OutOfBudget(Exception):
    pass


def _split(items: list[str], parts: int) -> list[list[str]]:
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        out.append(items[start:end])
        start = end
    return [chunk for chunk in out if chunk]


def complete(answer: Mapping[str, Any], keys: Sequence[str], run: Experiments) -> dict[str, Any]:
    """``answer`` with each failure that names no key given the keys found by experiment
    (``KEY_BLAME`` says how; ``keys``: the script's explicit keys, those that may be reset)."""
    failures = []
    before = list(answer.get("failures", []))
    for failure in before:
        failure = dict(failure)
        if not failure.get(ec.KEY_KEYS) and not failure.get(KEY_BLAME):
            try:
                found = _Search(failure, before, run).smallest(keys)
            except _OutOfBudget:
                found = None
            if found is None:
                failure[KEY_BLAME] = UNDECIDED
            else:
                failure[ec.KEY_KEYS] = found
                failure[KEY_BLAME] = BY_EXPERIMENT if found else UPSTREAM_DEFAULT
        failures.append(failure)
    return {**answer, "failures": failures}
