"""A regression corpus of real out-of-memory reports (tests/data/fit/oom_reports.yaml): each
report's launch forecast on its GPU must say OOM, in the phase the report shows where it shows
one; a configuration the thread found to run must forecast "fits".

One formula set for every entry: the data holds the reports' launches, never a constant. Each
report is forecast with the behaviour of the verl its reporter ran (its defaults class: the
release facts of that code, and the keys that now decide what it did), by the same mechanism as a
supported release's facts. Where the forecast misses, the entry says why in ``miss`` and must keep
missing (a change that fixes it is seen and the note removed). The score is printed; the issue's
bar (90%) is asserted in ``test_the_corpus_meets_the_bar``, expected to fail while the score is
below it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from fit_points import Outcome, forecast_entry, merged

from pytest_verl_compat.memory.release_facts import ReleaseFacts, facts_from_mapping

DATA = Path(__file__).parent / "data" / "fit" / "oom_reports.yaml"
BAR = 0.90


def _data() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(DATA.read_text(encoding="utf-8"))
    return loaded


@dataclass(frozen=True)
class Case:
    """One scored forecast: a report's launch, or the configuration its thread found to run."""

    id: str
    entry: dict[str, Any]
    overrides: tuple[str, ...]
    expect: str  # oom | fits
    phase: str  # the phase the report shows (unknown / none)
    miss: str


def _cases() -> list[Case]:
    data = _data()
    out = []
    for entry in data["reports"]:
        defaults = data["defaults"][entry["defaults"]]["overrides"]
        launch = merged(defaults, entry["overrides"])
        out.append(
            Case(
                entry["id"],
                entry,
                tuple(launch),
                entry["expect"],
                entry["phase"],
                entry.get("miss", ""),
            )
        )
        fixed = entry.get("fixed")
        if fixed:
            out.append(
                Case(
                    entry["id"] + "/fixed",
                    entry,
                    tuple(merged(launch, fixed["overrides"])),
                    "fits",
                    "none",
                    fixed.get("miss", ""),
                )
            )
    return out


CASES = {case.id: case for case in _cases()}


def _behaviour(name: str) -> ReleaseFacts:
    """The release facts of a defaults class: what the reporters' verl did."""
    found = _data()["defaults"][name]
    return facts_from_mapping(
        {"release": found["release"], "facts": found["behaviour"]}, f"{DATA.name}: {name}"
    )


@pytest.fixture(scope="module")
def outcomes(upstream_session: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    folder = tmp_path_factory.mktemp("oom-reports")
    return {
        cid: forecast_entry(
            upstream_session,
            folder,
            case.entry,
            case.overrides,
            facts=_behaviour(case.entry["defaults"]),
        )
        for cid, case in CASES.items()
    }


def _hit(case: Case, outcome: Outcome) -> bool:
    if outcome.not_forecast:
        return False
    if case.expect == "fits":
        return not outcome.oom
    known = case.phase not in ("unknown", "none")
    return outcome.oom and (not known or case.phase in outcome.phases)


def test_every_report_cites_its_thread_and_gpu() -> None:
    from pytest_verl_compat.memory.gpus import find_gpu

    data = _data()
    for name in data["defaults"]:
        assert _behaviour(name).facts, name  # every class says how its verl behaved
    for entry in data["reports"]:
        assert entry["url"].startswith("https://github.com/"), entry["id"]
        assert entry["defaults"] in data["defaults"], entry["id"]
        find_gpu(entry["gpu"])
        assert entry["expect"] in ("oom", "fits"), entry["id"]


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_report_forecasts_as_it_ran(case_id: str, outcomes: dict[str, Outcome]) -> None:
    case, outcome = CASES[case_id], outcomes[case_id]
    if case.miss:
        assert not _hit(case, outcome), (
            f"{case_id} now forecasts as it ran ({outcome.describe()}): remove its `miss` note"
        )
    else:
        where = f" in {case.phase}" if case.phase not in ("unknown", "none") else ""
        assert _hit(case, outcome), (
            f"{case_id}: ran {case.expect}{where}, forecast {outcome.describe()}"
        )


def _score(outcomes: dict[str, Outcome]) -> tuple[int, int]:
    return sum(_hit(case, outcomes[cid]) for cid, case in CASES.items()), len(CASES)


def test_report_the_corpus_score(
    outcomes: dict[str, Outcome], capsys: pytest.CaptureFixture[str], record_property: Any
) -> None:
    hits, total = _score(outcomes)
    record_property("oom_corpus_score", f"{hits}/{total}")
    with capsys.disabled():
        print(f"\nout-of-memory corpus: {hits}/{total} forecast as they ran ({hits / total:.0%})")
        for cid in sorted(CASES):
            case = CASES[cid]
            mark = "ok  " if _hit(case, outcomes[cid]) else "MISS"
            print(f"  {mark} {cid}: ran {case.expect}, forecast {outcomes[cid].describe()}")
    assert hits, "no report forecasts as it ran"


# How a 2024-25 launch wrote what the corpus writes in 0.9.0's keys: the critic's engine section
# before 0.8 (critic/dp_critic.yaml's mount) and global micro-batch sizes (the older workers
# divided them by GPUs / Ulysses size).
OLD_SPELLING = (("critic.fsdp.", "critic.model.fsdp_config."),)
GLOBAL_SIZES = (
    "actor_rollout_ref.actor.ppo_micro_batch_size",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size",
    "actor_rollout_ref.ref.log_prob_micro_batch_size",
)


def _as_its_verl_wrote_it(overrides: list[str], gpus: int) -> list[str]:
    old = []
    for override in overrides:
        key, _, value = override.partition("=")
        for new, before in OLD_SPELLING:
            key = key.replace(new, before)
        if key.removesuffix("_per_gpu") in GLOBAL_SIZES and key.endswith("_per_gpu"):
            key, value = key.removesuffix("_per_gpu"), str(int(value) * gpus)
        old.append(f"{key}={value}")
    return old


def test_a_report_quoted_in_its_verls_keys_forecasts_as_its_translation(
    upstream_session: Any, tmp_path_factory: pytest.TempPathFactory, outcomes: dict[str, Outcome]
) -> None:
    """A held-out report may quote its launch as its verl took it: searchr1-111's in Search-R1's
    own keys (critic.model.fsdp_config.*, global micro-batch sizes over its 8 GPUs) forecasts the
    same peak and phases as the entry written in 0.9.0's keys."""
    case = CASES["searchr1-111-qwen2.5-7b-8xh100"]
    quoted = _as_its_verl_wrote_it(case.overrides, int(case.entry["gpus"]))
    assert any(o.startswith("critic.model.fsdp_config.") for o in quoted)
    assert any(o.startswith("actor_rollout_ref.actor.ppo_micro_batch_size=") for o in quoted)
    outcome = forecast_entry(
        upstream_session,
        tmp_path_factory.mktemp("quoted"),
        case.entry,
        quoted,
        facts=_behaviour(case.entry["defaults"]),
    )
    translated = outcomes[case.id]
    assert (outcome.phases, outcome.peak_phase, outcome.peak_gib) == (
        translated.phases,
        translated.peak_phase,
        translated.peak_gib,
    )


@pytest.mark.xfail(
    strict=True,
    reason="the corpus scores below the issue's 90% (see test_report_the_corpus_score and "
    "the `miss` notes); strict: passing means the notes and this mark are out of date",
)
def test_the_corpus_meets_the_bar(outcomes: dict[str, Outcome]) -> None:
    hits, total = _score(outcomes)
    assert hits / total >= BAR, f"{hits}/{total}"
