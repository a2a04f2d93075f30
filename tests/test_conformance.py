"""Our reference math against each supported release's own: every conformance case, then the mutants.

Upstream's side comes from the release's oracle (its own environment), each answer kept with the
release's golden files (``reference_answers``): a run with them recorded imports no verl.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conformance_mutants import MUTATIONS, run_mutation_check
from corpus_facts import PINNED_VERSION, REPO, release_ready

from pytest_verl_compat.conformance.compare import ConformanceResult
from pytest_verl_compat.conformance.plan import (
    COMPONENTS,
    DUAL_CLIP_FAMILY,
    ConformanceCase,
    conformance_cases,
    load_tolerances,
    upstream_missing_reason,
)
from pytest_verl_compat.conformance.reference_answers import OracleReferences, reference_answers
from pytest_verl_compat.conformance.run import run_case
from pytest_verl_compat.pipeline.audit import RELEASES_GOLDEN
from pytest_verl_compat.releases.index import load_release_index

TOLERANCES = REPO / "corpus" / "conformance.yaml"
CASES = conformance_cases(load_tolerances(TOLERANCES))
RELEASES = load_release_index().supported_versions


def golden_dir(version: str) -> Path:
    """Where ``version``'s answers are kept (the embedded corpus's golden files)."""
    top = REPO / "golden"
    return top if version == PINNED_VERSION else top / RELEASES_GOLDEN / version


@pytest.fixture(scope="module", params=RELEASES)
def references(request: pytest.FixtureRequest) -> Iterator[OracleReferences]:
    """Upstream's side of every case on one release: its kept answers, else its oracle."""
    from pytest_verl_compat.upstream.oracle.client import UpstreamOracle

    version = request.param
    missing = upstream_missing_reason(version)
    if missing is not None or not release_ready(version):
        pytest.skip(missing or f"the environment of verl {version} is not built")
    from pytest_verl_compat.plugin.state import REFERENCE_ANSWERS

    oracle = UpstreamOracle(served=(REFERENCE_ANSWERS,), release=version)
    try:
        yield OracleReferences(oracle, reference_answers(golden_dir(version), user=False))
    finally:
        oracle.close()


def assert_conforms(result: ConformanceResult) -> None:
    __tracebackhide__ = True
    if not result.passed:
        pytest.fail(result.message, pytrace=False)


def test_case_ids_are_unique_and_cover_every_component() -> None:
    ids = [case.id for case in CASES]
    assert ids, "no conformance cases were generated"
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
    assert {case.component for case in CASES} == set(COMPONENTS)
    assert {case.dtype for case in CASES} == {"float32", "float64"}
    assert "advantage.grpo[no-std-ragged-float64]" in ids


def test_float64_tolerances_are_tight() -> None:
    loose = [c.id for c in CASES if c.dtype == "float64" and c.rtol > 1e-10 and not c.divergence]
    assert not loose, f"float64 cases looser than 1e-10 without a known divergence: {loose}"


def test_tolerance_file_rejects_loose_float64_and_unmatched_divergences(tmp_path: Path) -> None:
    data = yaml.safe_load(TOLERANCES.read_text(encoding="utf-8"))
    data["tolerances"]["kl"]["float64"]["rtol"] = 1e-6
    loose = tmp_path / "loose.yaml"
    loose.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ValueError, match="at most 1e-10"):
        load_tolerances(loose)

    data = yaml.safe_load(TOLERANCES.read_text(encoding="utf-8"))
    data["known_divergences"][0]["variants"] = ["no_such_estimator"]
    with pytest.raises(ValueError, match="match no case"):
        conformance_cases(data)


@pytest.mark.parametrize("case", [pytest.param(case, id=case.id) for case in CASES])
def test_conformance(
    case: ConformanceCase, references: OracleReferences, record_property: pytest.RecordProperty
) -> None:
    result = run_case(case, reference=references, candidate=references.candidate)
    record_property("max_abs_err", result.max_abs_err)
    record_property("max_grad_abs_err", result.max_grad_abs_err)
    assert_conforms(result)


def test_a_module_of_substitutes_replaces_our_functions(references: OracleReferences) -> None:
    case = next(c for c in CASES if c.id == "kl.k3[large-float64]")
    broken = types.ModuleType("broken")
    broken.kl_penalty = lambda log_prob, ref, name: (log_prob - ref) * 0  # type: ignore[attr-defined]
    result = run_case(case, broken, reference=references)
    assert not result.passed
    assert "kl.k3[large-float64]" in result.message and "rtol=1e-10" in result.message


def test_every_mutant_is_killed(
    references: OracleReferences, record_property: pytest.RecordProperty
) -> None:
    outcome = run_mutation_check(CASES, reference=references)
    killed = [name for name, dead, _ in outcome if dead]
    print(f"mutation check: {len(killed)}/{len(outcome)} mutants killed")
    for name, dead, failed in outcome:
        print(f"  {name:<34} {'killed' if dead else 'SURVIVED'} by {len(failed)} cases")
    record_property("mutants_killed", f"{len(killed)}/{len(outcome)}")
    assert len(outcome) == len(MUTATIONS) >= 12
    survivors = [name for name, dead, _ in outcome if not dead]
    assert not survivors, f"mutants survived: {survivors}, but every mutant should be killed"


DUAL_CLIP_CASES = [c for c in CASES if c.family.endswith(DUAL_CLIP_FAMILY)]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in DUAL_CLIP_CASES])
def test_the_dual_clip_cases_reach_their_bound(
    case: ConformanceCase, references: OracleReferences
) -> None:
    """Upstream's own loss clips some tokens at clip_ratio_c (its pg_clipfrac_lower, the share
    of negative-advantage tokens whose ratio passes the bound), in every sample and dtype; a case
    whose bound nothing reached could not tell a loss that ignores the setting."""
    assert {c.dtype for c in DUAL_CLIP_CASES} == {"float32", "float64"}
    for sample in range(case.samples):
        upstream = references(case, sample)
        assert float(upstream["actor/pg_clipfrac_lower"]) > 0, (case.id, sample)
