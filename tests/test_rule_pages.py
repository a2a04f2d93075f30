"""A rule is a page (STYLE.md 14e): every rule has one, each example fires and its twin does not,
and docs/rules.md is the registry's own rendering.

The must-fire / must-not-fire test is generated from the registry: one test per rule with an
example, compiling the example's base case plus its overrides (with the example's model facts,
for the checks that read a config.json). Upstream's own rules (``upstream.*``) ask the oracle
process, as ``verl-compat check`` does.
"""

from __future__ import annotations

import dataclasses
import itertools
import subprocess
import sys
from pathlib import Path

import pytest
from corpus_facts import release_ready

from pytest_verl_compat.checks import CHECKS, Example
from pytest_verl_compat.checks.model_facts import ModelFacts
from pytest_verl_compat.cli.rules import markdown, page_lines, pinned_rules, pinned_version
from pytest_verl_compat.memory import findings as memory_findings  # registers the memory.* pages
from pytest_verl_compat.model import Case
from pytest_verl_compat.pipeline.audit import AuditSession
from pytest_verl_compat.upstream.oracle.client import UpstreamOracle
from pytest_verl_compat.upstream.verdict.case import check_case, live_asker
from pytest_verl_compat.upstream.verdict.rules import all_rules

REPO = Path(__file__).resolve().parents[1]
RULES = all_rules()
# The memory forecast's pages need a GPU (check --gpu): tests/test_fit_rules.py runs theirs.
MEMORY = {rule for rule, doc in RULES.items() if doc.source == memory_findings.SOURCE}
WITH_EXAMPLES = sorted(
    rule for rule, doc in RULES.items() if doc.example is not None and rule not in MEMORY
)
# Rules whose findings cannot be produced by a case plus overrides: the launch reader's (a script's
# text decides them; tests/test_check_command.py, tests/test_sandbox_and_user_keys.py and, for the
# ways of a run-time test with their agreeing twin, tests/test_run_time_conditions.py fire them)
# and the directives'.
WITHOUT_EXAMPLES = {
    "launch.unreadable",
    "launch.run-time-value",
    "launch.run-time-condition",
    "launch.no-launcher",
    "launch.unknown-entry-point",
    "sft.needs-torchrun",
    "directive.unused",
}
_counter = itertools.count()


def test_every_rule_has_a_page_and_every_check_an_example() -> None:
    assert set(CHECKS) <= set(RULES)
    for rule, doc in RULES.items():
        assert doc.summary and doc.why and doc.fix, f"{rule}: the page lacks what, why or fix"
        assert doc.level in ("error", "warning", "info"), rule
    missing = sorted(set(RULES) - set(WITH_EXAMPLES) - WITHOUT_EXAMPLES - MEMORY)
    assert not missing, f"rules with no example that fires and no valid twin: {missing}"
    for rule in WITH_EXAMPLES:
        example = RULES[rule].example
        assert (example is not None and example.fires != example.twin) or example.model, rule


def test_docs_rules_md_is_the_registry() -> None:
    """docs/rules.md has a section for every rule and none for an id that is not one."""
    text = (REPO / "docs" / "rules.md").read_text(encoding="utf-8")
    sections = {line[3:] for line in text.splitlines() if line.startswith("## ")}
    assert sections == set(RULES), (
        f"no page: {sorted(set(RULES) - sections)}; no rule: {sorted(sections - set(RULES))}"
    )
    assert text == markdown(pinned_rules(), pinned_version()), (
        "docs/rules.md is stale: regenerate it with `verl-compat rule --write docs/rules.md`"
    )


def test_rule_command_prints_the_page_and_refuses_an_unknown_id() -> None:
    cli = [sys.executable, "-m", "pytest_verl_compat.cli", "rule"]
    page = subprocess.run([*cli, "batch.padded-step"], capture_output=True, text=True, check=False)
    assert page.returncode == 0, page.stderr
    assert page.stdout.splitlines() == page_lines(
        pinned_rules()["batch.padded-step"], pinned_version()
    )
    for part in ("What it checks:", "Why (upstream):", "Fires", "Its valid twin:", "Fix:"):
        assert part in page.stdout
    assert "verl/trainer/ppo/v1/trainer_base.py:" in page.stdout
    typo = subprocess.run([*cli, "batch.paded-step"], capture_output=True, text=True, check=False)
    assert typo.returncode == 2
    assert typo.stderr.strip().splitlines() == [
        "verl-compat rule: no rule 'batch.paded-step'; did you mean 'batch.padded-step'? "
        "(verl-compat rule lists them)"
    ]
    listing = subprocess.run(cli, capture_output=True, text=True, check=True).stdout
    assert [line.split()[0] for line in listing.splitlines()] == list(RULES)


@pytest.fixture(scope="module")
def session(upstream_session: AuditSession) -> AuditSession:
    return upstream_session


def _case(session: AuditSession, example: Example, overrides: tuple[str, ...]) -> Case:
    if example.base.endswith(".sh"):
        assert session.upstream is not None
        base = session.case_for_script(session.upstream.root / example.base)
    else:
        assert session.manifest is not None
        base = session.manifest.case(example.base)
    # A fresh id: the session keeps results (and model facts) per case id.
    return dataclasses.replace(base, id=f"{base.id}+example{next(_counter)}")


def fired(
    session: AuditSession,
    rule: str,
    overrides: tuple[str, ...],
    twin: bool,
    oracle: UpstreamOracle | None = None,
) -> list[str]:
    """The rule ids of every finding of the example's base case plus ``overrides``."""

    example = RULES[rule].example
    assert example is not None
    model = example.twin_model if twin and example.twin_model is not None else example.model
    session.model_facts_override = ModelFacts("example config.json", **model) if model else None
    case = session.with_overrides(_case(session, example, overrides), overrides)
    ask = live_asker(session, None, oracle) if example.upstream else None
    return [finding.rule for finding in check_case(session, case, ask).findings]


@pytest.mark.parametrize("rule", WITH_EXAMPLES)
def test_example_fires_and_its_twin_does_not(
    session: AuditSession, rule: str, request: pytest.FixtureRequest
) -> None:
    example = RULES[rule].example
    assert example is not None
    oracle = None
    if example.upstream:
        if not release_ready():
            pytest.skip("upstream's own checks need the installed verl")
        oracle = request.getfixturevalue("oracle")
    try:
        fires = fired(session, rule, example.fires, twin=False, oracle=oracle)
        twin = fired(session, rule, example.twin, twin=True, oracle=oracle)
    finally:
        session.model_facts_override = None
    assert rule in fires, f"{rule} does not fire on its example {example.fires}: {fires}"
    assert rule not in twin, f"{rule} fires on its valid twin {example.twin}: {twin}"
