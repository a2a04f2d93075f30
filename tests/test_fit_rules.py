"""The memory forecast's rule pages (memory.<phase>): every phase has a page in docs/rules.md and
``verl-compat rule``; a page with an example fires on it and not on its valid twin, through the
path ``check --gpu`` takes (the example's options name the GPU)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from pytest_verl_compat.cli.fit_common import choose_gpu, memory_check
from pytest_verl_compat.memory import findings as memory_findings
from pytest_verl_compat.memory.parts import PHASES
from pytest_verl_compat.pipeline.audit import AuditSession
from pytest_verl_compat.upstream.verdict.rules import all_rules

RULES = {rule: doc for rule, doc in all_rules().items() if doc.source == memory_findings.SOURCE}
WITH_EXAMPLES = sorted(rule for rule, doc in RULES.items() if doc.example is not None)
_counter = itertools.count()


def test_every_phase_has_a_page_and_the_examples_name_a_gpu() -> None:
    phases = {memory_findings.rule_id(phase) for phase in PHASES}
    assert set(RULES) == phases | {memory_findings.NOT_FORECAST, memory_findings.LORA_TARGETS}
    assert RULES[memory_findings.NOT_FORECAST].level == "info"
    for rule in WITH_EXAMPLES:
        example = RULES[rule].example
        assert example is not None and "--gpu" in example.options, rule
        assert example.fires != example.twin, rule
    assert len(WITH_EXAMPLES) >= 5, WITH_EXAMPLES


def _fired(session: AuditSession, rule: str, overrides: tuple[str, ...]) -> list[str]:
    example = RULES[rule].example
    assert example is not None
    options = dict(zip(example.options[::2], example.options[1::2], strict=True))
    assert session.manifest is not None
    base = session.manifest.case(example.base)
    case = dataclasses.replace(base, id=f"{base.id}+memory-example{next(_counter)}")
    case = session.with_overrides(case, overrides)
    gpu = choose_gpu(options["--gpu"], None, None)
    return [finding.rule for finding in memory_check(session, case, gpu)]


@pytest.mark.parametrize("rule", WITH_EXAMPLES)
def test_memory_example_fires_and_its_twin_does_not(
    upstream_session: AuditSession, rule: str
) -> None:
    example = RULES[rule].example
    assert example is not None
    fires = _fired(upstream_session, rule, example.fires)
    twin = _fired(upstream_session, rule, example.twin)
    assert rule in fires, f"{rule} does not fire on its example {example.fires}: {fires}"
    assert rule not in twin, f"{rule} fires on its valid twin {example.twin}: {twin}"
