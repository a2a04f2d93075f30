"""The SFT step oracle: the reference trainer's SFT steps against verl 0.9.0's engine steps.

verl runs once for every case and variant (one sandboxed subprocess), also under xdist: the
first worker that needs it runs it under a file lock, the others load its results.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from corpus_facts import PINNED_VERSION, needs_release
from filelock import FileLock
from sft_step_mutants import SFT_SOURCE_MUTANTS
from step_mutants import SourceMutant

from pytest_verl_compat.conformance.step.run import case_failures, report_json
from pytest_verl_compat.conformance.step.sft import (
    SFTStepPlan,
    compare_sft_case,
    load_sft_step_plan,
    run_key,
    run_sft_upstream,
    step_batches,
)
from pytest_verl_compat.pipeline.lower import NotAccepted

needs_verl = needs_release()


@pytest.fixture(scope="module")
def plan() -> SFTStepPlan:
    return load_sft_step_plan()


@pytest.fixture(scope="module")
def sft_oracle(
    plan: SFTStepPlan, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[dict[str, Any], Path]]:
    """Upstream's steps of every SFT case and variant, and the models both sides start from."""
    from pytest_verl_compat.plugin.keys import is_xdist_worker
    from pytest_verl_compat.upstream.oracle.runner import release_runner

    # One folder per run, shared by its xdist workers: they share the parent of their base
    # folders and the run's id (as tests/conftest.py's RL step oracle).
    root = tmp_path_factory.getbasetemp() / "sft-step-oracle"
    if is_xdist_worker(request.config):
        run = request.config.workerinput["testrunuid"]  # type: ignore[attr-defined]
        root = tmp_path_factory.getbasetemp().parent / f"sft-step-oracle-{run}"
    with FileLock(str(root) + ".lock"):
        if not (root / "done").exists():
            run_sft_upstream(plan, release_runner(PINNED_VERSION), root)
            (root / "done").write_text("")
    yield (
        {key: torch.load(path, weights_only=False) for key, path in _results(plan, root)},
        (root / "models"),
    )


def _results(plan: SFTStepPlan, root: Path) -> list[tuple[str, Path]]:
    keys = [run_key(case.id, v) for case in plan.cases for v in plan.variants]
    return [(key, root / "out" / f"{key}.pt") for key in keys]


def test_every_case_is_lowered_through_the_compile_gate(plan: SFTStepPlan) -> None:
    assert {c.id for c in plan.cases} == {
        "sft/gsm8k",
        "sft/full",
        "sft/token-budget",
        "sft/lora",
        "sft/warmup-steps",
    }
    full = next(c for c in plan.cases if c.id == "sft/full")
    assert (full.config.data.micro_batch_size, full.config.optim.zero_indexed_step) == (2, False)
    batches = step_batches(plan, full.config)
    assert [len(b) for b in batches] == [4, 4]
    # Two-turn conversations: an untrained user turn between two trained answers.
    masks = [row["loss_mask"] for batch in batches for row in batch]
    assert any(m.count(1) and "".join(map(str, m)).strip("0").count("10") for m in masks)


def test_a_case_the_profile_rejects_never_trains(tmp_path: Path) -> None:
    text = (Path(__file__).parents[1] / "corpus" / "sft_step.yaml").read_text()
    bad = tmp_path / "sft_step.yaml"
    bad.write_text(text.replace("- data.train_batch_size=4\n", "- data.pad_mode=right\n", 1))
    with pytest.raises(NotAccepted, match=r"data\.pad_mode='right' is not supported"):
        load_sft_step_plan(bad)


@pytest.mark.slow
@needs_verl
def test_every_sft_step_case_matches_upstream(
    plan: SFTStepPlan, sft_oracle: tuple[dict[str, Any], Path]
) -> None:
    """Full fine-tuning and LoRA, SGD and AdamW, one and two steps, within the tolerances."""
    upstream, models = sft_oracle
    report = {
        case.id: {v: compare_sft_case(plan, upstream, models, case, v) for v in plan.variants}
        for case in plan.cases
    }
    print(report_json(report))
    failures = {case: case_failures(entry) for case, entry in report.items()}
    assert not any(failures.values()), failures


@pytest.mark.slow
@needs_verl
@pytest.mark.parametrize("mutant", SFT_SOURCE_MUTANTS, ids=lambda m: m.name)
def test_a_seeded_sft_step_bug_fails_the_step(
    mutant: SourceMutant,
    plan: SFTStepPlan,
    sft_oracle: tuple[dict[str, Any], Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    upstream, models = sft_oracle
    mutant.apply(monkeypatch)
    survived = []
    for case_id, variant in mutant.caught_by:
        case = next(c for c in plan.cases if c.id == case_id)
        try:
            entry = compare_sft_case(plan, upstream, models, case, variant)
        except Exception:  # a bug may also crash the step: that fails the stage too
            continue
        if not case_failures({variant: entry}):
            survived.append(f"{case_id} ({variant})")
    assert not survived, f"{mutant.name} survives {survived}"


@pytest.mark.slow
@needs_verl
def test_a_wrong_value_of_the_lowered_config_is_seen(
    plan: SFTStepPlan, sft_oracle: tuple[dict[str, Any], Path]
) -> None:
    """The lowered config is what trains: a changed field of it fails the comparison."""
    upstream, models = sft_oracle
    lora = next(c for c in plan.cases if c.id == "sft/lora")
    for optim in (
        dataclasses.replace(lora.config.optim, lr=2e-2, weight_decay=0.1),
        dataclasses.replace(lora.config.optim, lr=2e-2, grad_clip=100.0),
    ):
        wrong = dataclasses.replace(lora.config, optimizer="SGD", optim=optim)
        entry = compare_sft_case(plan, upstream, models, lora, "sgd", config=wrong)
        assert case_failures({"sgd": entry}), optim
