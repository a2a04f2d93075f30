"""Coverage as data, checked: every exact or lowered training setting is trained off its default
by some step case, and a wrong value of it fails the step in the variant its row names."""

from __future__ import annotations

import copy
import dataclasses
import re
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest
from corpus_facts import needs_release
from step_mutants import with_wrong_value

from pytest_verl_compat.conformance.step.cases import step_case, step_cases, step_report
from pytest_verl_compat.conformance.step.coverage import (
    classified_leaves,
    coverage_report,
    defaults,
    markdown,
    misfiled,
    moved_leaves,
    problems,
    session_coverage,
)
from pytest_verl_compat.conformance.step.plan import (
    QUANTITIES,
    CoverageRow,
    CoverageTable,
    RunConformanceCase,
    StepCase,
    load_coverage,
    load_run_conformance,
    load_step_plan,
)
from pytest_verl_compat.conformance.step.reference import step_config
from pytest_verl_compat.conformance.step.run import UpstreamSteps, compare_case
from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
from pytest_verl_compat.pipeline.profile import load_profile
from reference_trainer.config import ReferenceTrainerConfig

REPO = Path(__file__).resolve().parents[1]
ROWS = load_coverage()
PLAN = load_step_plan()
TRAINED_ROWS = [r for r in ROWS if r.how in ("case", "shape", "variant") and r.field]


@pytest.fixture(scope="module")
def session() -> AuditSession:
    return AuditSession.start(AuditOptions(manifest=None, upstream=None))


@pytest.fixture(scope="module")
def coverage(session: AuditSession) -> Any:
    return session_coverage(session)


def test_every_exact_or_lowered_training_setting_is_trained_off_its_default(coverage: Any) -> None:
    rows, unlisted = coverage
    assert not problems(rows, unlisted)
    # Every row describes some leaf of the corpus: a row nothing matches is stale.
    stale = [", ".join(r.row.patterns) for r in rows if not r.leaves]
    assert not stale, f"rows that match no exact or lowered leaf: {stale}"


def test_an_exact_leaf_outside_one_step_needs_a_run_conformance_case(session: AuditSession) -> None:
    """An `exact` leaf of an `outside` row (the loop, the data, sampling) is named until a
    run-conformance case sets it off verl's default; a case at the default does not count."""
    cases = step_cases(session)
    leaves = classified_leaves(step_report(session, case.id) for case in cases)
    verl = defaults(session)
    key = "trainer.save_freq"
    assert leaves.get(key) == "exact"

    def named(run_cases: list[RunConformanceCase]) -> list[str]:
        found = problems(*coverage_report(leaves, cases, verl, run_cases=run_cases))
        return [line for line in found if line.startswith(f"{key}: exact")]

    assert named([]), "an exact outside leaf with no run-conformance case is named"
    at_default = RunConformanceCase("loop/x", "loop", {key: verl[key]}, "")
    assert named([at_default]), "a case at verl's default moves nothing"
    moved = RunConformanceCase("loop/x", "loop", {key: int(verl[key]) + 3}, "")
    assert not named([moved])
    unmoved = dataclasses.replace(moved, no_effect="verl/x.py:1")
    assert named([unmoved]), "a case showing no effect conforms no leaf"
    assert named([dataclasses.replace(moved, ours_refuses=True)]), "nor one ours refuses"
    ours = load_run_conformance()
    assert len({c.id for c in ours}) == len(ours), "run-conformance case ids are unique"
    # The SFT tree's loop cases set keys of the same names, but conform none of the RL tree's.
    sft = load_run_conformance(sft=True)
    assert sft and all(c.area.startswith("sft_") for c in sft)
    assert not {c.id for c in sft} & {c.id for c in ours}


def test_a_setting_no_case_moves_and_a_leaf_no_row_describes_are_named(
    session: AuditSession, coverage: Any
) -> None:
    """The check fires on the near-identical plan without the cases that move a setting, and on
    a table without the row of a leaf."""
    temperature = "actor_rollout_ref.rollout.temperature"
    cases = step_cases(session)
    leaves = classified_leaves(step_report(session, case.id) for case in cases)

    def at_default(case: StepCase) -> StepCase:
        resolved = copy.deepcopy(dict(case.resolved))
        resolved["actor_rollout_ref"]["rollout"]["temperature"] = 1.0
        return dataclasses.replace(case, resolved=resolved)

    found = problems(*coverage_report(leaves, [at_default(c) for c in cases], defaults(session)))
    assert found == [f"{temperature}: no step case trains it off verl's default ({temperature})"]
    # Without its row the temperature falls to the rollout's `outside` row, which the next
    # check refuses: it changes what the step trains.
    without = CoverageTable(tuple(r for r in ROWS if temperature not in r.patterns))
    _, unlisted = coverage_report(leaves, cases, defaults(session), without)
    assert temperature not in unlisted and without.row_for(temperature).how == "outside"
    grpo = next(c for c in session.cases if c.id == "grpo")
    report = session.compile(grpo)
    mapping = session.outcome(grpo).composition.mapping
    found = misfiled(mapping, report, without, load_profile())
    assert found == [f"{temperature}: a outside row, but it changes what the step trains"]


@pytest.mark.parametrize("case_id", ["ppo", "grpo_lora", "rloo"])
def test_no_leaf_outside_the_step_changes_what_the_step_trains(
    session: AuditSession, case_id: str
) -> None:
    """An `engine`, `fixed` or `outside` row is honest: changing its leaf leaves the actor, the
    critic, the algorithm, the temperature and LoRA of the lowered config as they were."""
    case = next(c for c in session.cases if c.id == case_id)
    found = misfiled(
        session.outcome(case).composition.mapping,
        session.compile(case),
        CoverageTable(ROWS),
        load_profile(),
    )
    assert not found


def test_the_values_a_step_case_trains_differ_from_each_other(session: AuditSession) -> None:
    """A value read from the wrong setting (low for high, the critic's rate for the actor's, the
    in-reward coefficient for the loss's) changes what is trained, so it shows."""
    table = CoverageTable(ROWS)
    verl_defaults = defaults(session)
    for spec in PLAN.cases:
        case = step_case(session, spec.id)
        moved = moved_leaves(case, table, verl_defaults, PLAN.variants)
        values: dict[str, float] = {}
        for override in spec.overrides:
            path, _, text = override.partition("=")
            if path in moved and re.fullmatch(r"-?\d+\.\d+(e-?\d+)?", text):
                values[path] = float(text)
        same = [(a, b) for (a, x), (b, y) in combinations(values.items(), 2) if x == y]
        assert not same, f"{spec.id}: equal values {same}"
        for variant in case.variants:
            chosen = PLAN.variants[variant]
            assert chosen.actor_lr != chosen.critic_lr


def test_each_row_names_a_field_of_the_trainers_config_and_a_quantity_of_the_report() -> None:
    cfg = step_case(AuditSession.start(AuditOptions(manifest=None, upstream=None)), "ppo").config
    for row in TRAINED_ROWS:
        _field(cfg, row.field)  # raises on a field the config does not have
        for detect in row.detect:
            variant, _, quantity = detect.partition(".")
            assert variant in PLAN.variants, (row.patterns, detect)
            assert quantity.split("@")[0] in QUANTITIES, (row.patterns, detect)


def _field(cfg: Any, path: str) -> Any:
    for part in path.split("."):
        name, _, index = part.partition("[")
        cfg = getattr(cfg, name)
        if index:
            cfg = cfg[int(index[:-1])]
    return cfg


def test_the_trainer_page_lists_the_coverage_table(coverage: Any) -> None:
    rows, _ = coverage
    table = markdown(rows)
    page = (REPO / "docs" / "trainer.md").read_text(encoding="utf-8")
    assert table in page, (
        "docs/trainer.md: regenerate the table with "
        "python -m pytest_verl_compat.conformance.step.coverage"
    )


def test_the_coverage_command_prints_the_table_and_exits_clean(coverage: Any) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "pytest_verl_compat.conformance.step.coverage"],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == markdown(coverage[0])


# ------------------------------------------------------------------ wrong values are seen


needs_verl = needs_release()


@pytest.fixture(scope="module")
def mover(session: AuditSession, coverage: Any) -> dict[tuple[str, ...], StepCase]:
    """Per trained row, the step case its `case` names, else the first (in id order) that moves
    one of its leaves."""
    rows, _ = coverage
    by_id = {c.id: c for c in step_cases(session)}
    out = {}
    for r in rows:
        moving = sorted({c for ids in r.moved_by.values() for c in ids})
        if moving:
            out[r.row.patterns] = by_id[r.row.case or moving[0]]
    return out


@pytest.mark.slow
@needs_verl
@pytest.mark.parametrize("row", TRAINED_ROWS, ids=lambda r: r.patterns[0])
def test_a_wrong_value_of_each_setting_fails_the_variant_its_row_names(
    row: CoverageRow, step_oracle: UpstreamSteps, mover: dict[tuple[str, ...], StepCase]
) -> None:
    """Ours trains with the setting changed (`step_mutants.wrong_value`), upstream as the case
    says: the quantity the row names must differ beyond its tolerance."""
    case = mover[row.patterns]
    rule = load_profile().rule_for(row.patterns[0])
    allowed = rule.values if rule is not None else None
    for detect in row.detect:
        variant, _, quantity = detect.partition(".")
        assert variant in case.variants, f"{case.id} does not run {variant}"
        cfg: ReferenceTrainerConfig = with_wrong_value(
            step_config(case, PLAN.variants[variant]), row.field, allowed, row.wrong
        )
        try:
            entry = compare_case(step_oracle, case, variant, config=cfg)
        except Exception:  # a wrong value may also crash the step: that fails the stage too
            continue
        assert quantity in entry and not entry[quantity]["passed"], (
            f"{detect} does not see {row.field} changed in {case.id}: "
            + str({q: (e["max_abs_diff"], e["passed"]) for q, e in entry.items()})
        )
