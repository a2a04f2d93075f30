"""Resolved configuration files as input: compiled like composed cases, other versions recognised."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from corpus_facts import OFFICIAL_RL

from pytest_verl_compat.pipeline.compile import compile_resolved
from pytest_verl_compat.pipeline.compose import Composer
from pytest_verl_compat.pipeline.manifest import embedded_root
from pytest_verl_compat.pipeline.profile import load_profile
from pytest_verl_compat.pipeline.resolved import check_resolved

GOLDEN = embedded_root() / "golden"


def write_resolved(tmp_path: Path, case_id: str) -> Path:
    """The case's resolved mapping as verl writes it to .hydra/config.yaml (YAML, key order kept)."""
    resolved = json.loads((GOLDEN / "compose" / f"{case_id}.json").read_text())["resolved"]
    path = tmp_path / f"{case_id}.yaml"
    path.write_text(yaml.safe_dump(resolved, sort_keys=False))
    return path


# The RL cases: `compile RESOLVED` checks a run folder against main_ppo's tree (an SFT run's
# sft_trainer_engine file is not recognised yet).
@pytest.mark.parametrize("case_id", OFFICIAL_RL)
def test_resolved_file_compiles_to_the_composed_cases_report(tmp_path: Path, case_id: str) -> None:
    path = write_resolved(tmp_path, case_id)
    result = subprocess.run(
        [sys.executable, "-m", "pytest_verl_compat.cli", "compile", str(path), "--full"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    from_file = json.loads(result.stdout)
    composed = json.loads((GOLDEN / "compile" / f"{case_id}.json").read_text())
    from_file.pop("case"), composed.pop("case")
    # A resolved file holds no launch, so no key is explicit in it: the findings about a key the
    # script set (effect.off-path on dr_grpo's kl keys) are the composed case's alone.
    launch = json.loads((GOLDEN / "compose" / f"{case_id}.json").read_text())["explicit_fields"]
    explicit = {field.split("=", 1)[0].lstrip("+~") for field in launch}
    about_explicit = [f for f in composed["findings"] if f not in from_file["findings"]]
    assert all(f["path"] in explicit for f in about_explicit), about_explicit
    composed["findings"] = [f for f in composed["findings"] if f not in about_explicit]
    # A key the file sets off its tree's default counts as set there: the same finding, its
    # value spelled as the file spells it (``param_offload=true``), only for keys the launch set.
    file_only = [f for f in from_file["findings"] if f not in composed["findings"]]
    assert all(f["path"] in explicit for f in file_only), file_only
    assert {f["path"] for f in file_only} <= {f["path"] for f in about_explicit}, file_only
    from_file["findings"] = [f for f in from_file["findings"] if f not in file_only]
    assert from_file == composed
    if case_id == "dr_grpo":
        assert [f["path"] for f in about_explicit] == [
            "actor_rollout_ref.actor.kl_loss_coef",
            "actor_rollout_ref.actor.kl_loss_type",
            # no KL term: no reference runs (effect.no-reference-worker)
            "actor_rollout_ref.ref.fsdp_config.param_offload",
            "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
            "actor_rollout_ref.ref.log_prob_use_dynamic_bsz",
        ]
        assert all("has no effect here" in f["message"] for f in about_explicit)


def test_a_091_mapping_is_recognised_as_not_090(
    upstream_checkout: Path, upstream_091: Path
) -> None:
    composer_091 = Composer(upstream_091 / "verl/trainer/config", "ppo_trainer")
    mapping = composer_091.compose(["actor_rollout_ref.rollout.name=vllm"], {}).resolved
    pinned = Composer(upstream_checkout / "verl/trainer/config", "ppo_trainer")
    check = check_resolved(mapping, pinned, "verl 0.9.0", [("verl 0.9.1", composer_091)])
    assert not check.from_pinned_tree
    assert "data.continuous_token.enable" in check.pinned.missing
    assert check.best.label == "verl 0.9.1" and check.best.mismatches == 0
    assert any("most likely comes from verl 0.9.1" in line for line in check.lines())


def test_unresolved_interpolations_and_missing_values_are_listed(
    tmp_path: Path, upstream_checkout: Path
) -> None:
    mapping = json.loads((GOLDEN / "compose" / "grpo.json").read_text())["resolved"]
    mapping["trainer"]["experiment_name"] = "${trainer.project_name}_x"
    check = check_resolved(
        mapping, Composer(upstream_checkout / "verl/trainer/config", "ppo_trainer"), "verl 0.9.0"
    )
    assert check.unresolved == ["trainer.experiment_name: ${trainer.project_name}_x"]
    assert "reward.reward_model.rollout.name: ???" in check.missing
    report = compile_resolved(mapping, case_id="x", profile=load_profile())
    assert report.accepted  # the compiler itself does not resolve; the check stops such files first


def test_an_empty_mapping_the_run_filled_is_not_a_missing_leaf(upstream_checkout: Path) -> None:
    """rollout.engine_kwargs.sglang is ``{}`` in the tree; a run that adds a key under it (verl's
    own scripts add +…sglang.attention_backend) still has it. A non-empty section the file
    dropped is still missing (the twin)."""
    composer = Composer(upstream_checkout / "verl/trainer/config", "ppo_trainer")
    mapping = json.loads((GOLDEN / "compose" / "grpo.json").read_text())["resolved"]
    engine = mapping["actor_rollout_ref"]["rollout"]["engine_kwargs"]
    assert engine["sglang"] == {}
    engine["sglang"] = {"attention_backend": "triton"}
    check = check_resolved(mapping, composer, "verl 0.9.0")
    assert check.pinned.missing == []
    assert check.pinned.extra == [
        "actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend"
    ]
    del mapping["actor_rollout_ref"]["rollout"]["engine_kwargs"]["vllm"]
    mapping["trainer"].pop("project_name")
    dropped = check_resolved(mapping, composer, "verl 0.9.0")
    assert "trainer.project_name" in dropped.pinned.missing
    # an empty mapping the file lost entirely is missing too
    assert "actor_rollout_ref.rollout.engine_kwargs.vllm" in dropped.pinned.missing
