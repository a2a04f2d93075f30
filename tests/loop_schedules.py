"""What the RL and SFT loop run-conformance tests share: a phase's record of ours, in the keys
upstream's loop probes answer with (``probes/run_schedule``; ``sft_schedule`` takes its keys),
and a case's variants (the case, then each leaf back at verl's default)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_verl_compat.upstream.probes import run_schedule as schedule


def phase_record(trainer: Any) -> dict[str, Any]:
    """Where a recording trainer resumed from, the step it started at and its events."""
    resumed = trainer.resumed_from
    return {
        schedule.RESUMED: resumed.name if resumed is not None else None,
        schedule.START: trainer.start,
        schedule.EVENTS: trainer.events,
    }


def case_variants(sets: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The case's settings, then one copy per leaf it sets with that leaf at verl's default."""
    return [dict(sets)] + [{**sets, leaf: defaults[leaf]} for leaf in sets]
