"""Manifest validation errors, composition rejections and the ``verl-compat`` read/compose commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pytest_verl_compat.pipeline.compose import Composer, count_leaves
from pytest_verl_compat.pipeline.manifest import ManifestError, embedded_root, load_manifest

MANIFEST = embedded_root() / "corpus" / "manifest.yaml"


def write_manifest(tmp_path: Path, mutate) -> Path:
    data = yaml.safe_load(MANIFEST.read_text())
    mutate(data)
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_embedded_manifest_has_the_seven_official_cases() -> None:
    manifest = load_manifest(MANIFEST)
    assert [c.id for c in manifest.cases if c.kind == "official"] == [
        "ppo",
        "grpo",
        "rloo",
        "reinforce_plus_plus",
        "grpo_lora",
        "grpo_reward_model",
        "dr_grpo",
    ]
    assert manifest.upstream.commit == "483b8a009ba3a97563edee3a19887e4862b8094a"
    assert manifest.bindings.variables == {"HOME": "/home/verl"}
    assert all(case.error is None for case in manifest.cases)


def test_bad_case_field_names_file_case_and_field_and_spares_the_others(tmp_path: Path) -> None:
    def mutate(data: dict) -> None:
        data["cases"][1]["inputs"][0]["sha256"] = "not-a-hash"

    manifest = load_manifest(write_manifest(tmp_path, mutate))
    broken = [case for case in manifest.cases if case.error]
    message = broken[0].error
    assert str(tmp_path / "manifest.yaml") in message
    assert "case 'grpo'" in message
    assert "cases[1].inputs[0].sha256" in message
    # Cases derived from the broken one cannot be built either, and say so; the rest are intact.
    assert all(
        "field base: 'grpo' is not a case defined above" in case.error for case in broken[1:]
    )
    assert [case.id for case in manifest.cases if not case.error] == [
        "ppo",
        "rloo",
        "reinforce_plus_plus",
        "grpo_lora",
        "grpo_reward_model",
        "dr_grpo",
        "field/lora-sglang-without-merge",
    ]


def test_duplicate_ids_are_rejected_precisely(tmp_path: Path) -> None:
    manifest = load_manifest(
        write_manifest(tmp_path, lambda d: d["cases"].append(dict(d["cases"][0])))
    )
    duplicate = manifest.cases[-1]
    assert duplicate.error and "duplicate case id 'ppo' (first defined at line" in duplicate.error


def test_unknown_top_level_key_is_a_manifest_error(tmp_path: Path) -> None:
    with pytest.raises(
        ManifestError, match=r"manifest.yaml: field <top level>: Additional properties"
    ):
        load_manifest(write_manifest(tmp_path, lambda d: d.update(surprise=1)))


def test_derived_case_needs_a_known_base(tmp_path: Path) -> None:
    def mutate(data: dict) -> None:
        data["cases"].append(
            {"id": "derived/x", "kind": "derived", "base": "nope", "overrides": []}
        )

    manifest = load_manifest(write_manifest(tmp_path, mutate))
    assert "field base: 'nope' is not a case defined above this one" in manifest.cases[-1].error


@pytest.fixture(scope="module")
def composer(upstream_checkout: Path) -> Composer:
    return Composer(upstream_checkout / "verl/trainer/config", "ppo_trainer")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("actor_rollout_ref.actor.optim.lr=1e-6,2e-6", "Ambiguous value for argument"),
        ("trainer.project_name=${does.not.exist}", "Interpolation key 'does.not.exist' not found"),
        ("trainer.no_such_key=1", "Could not override 'trainer.no_such_key'"),
        (
            "+trainer.user=${oc.env:USER}",
            "environment variable 'USER' is not bound in the manifest",
        ),
        ("+trainer.when=${now:%Y}", "the `now` resolver reads the clock"),
    ],
)
def test_composition_errors_become_rejections_with_hydras_message(
    composer: Composer, override: str, message: str
) -> None:
    composition = composer.compose([override], {"HOME": "/home/verl"})
    assert composition.outcome == "composition_rejection"
    assert message in composition.reason


def test_missing_mandatory_values_are_recorded_not_raised(composer: Composer) -> None:
    composition = composer.compose([], {})
    assert composition.composed
    assert "actor_rollout_ref.rollout.name" in composition.missing
    assert composition.resolved["actor_rollout_ref"]["rollout"]["name"] == "???"
    assert count_leaves(composition.resolved) == 882


def test_bound_env_resolver_reads_only_the_manifest(composer: Composer) -> None:
    composition = composer.compose(["+trainer.home=${oc.env:HOME}"], {"HOME": "/home/verl"})
    assert composition.resolved["trainer"]["home"] == "/home/verl"


def test_count_leaves_counts_list_items_and_empty_containers() -> None:
    assert count_leaves({"a": [1, 2, {"b": {}}], "c": [], "d": {"e": None}}) == 5


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_verl_compat.cli", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_cli_read_prints_fields_and_honours_bindings(upstream_checkout: Path) -> None:
    script = str(upstream_checkout / "examples/grpo_trainer/run_qwen3_8b_fsdp.sh")
    default = cli("read", script)
    assert default.returncode == 0, default.stderr
    assert (
        "trainer.experiment_name=qwen3_8b_grpo_vllm_fsdp_20260101_0000"
        in default.stdout.splitlines()
    )
    bound = cli(
        "read", script, "--env", "DEVICE=npu", "--subst", "date +%Y%m%d_%H%M", "19990101_0000"
    )
    lines = bound.stdout.splitlines()
    assert "data.train_batch_size=16" in lines
    assert "trainer.experiment_name=qwen3_8b_grpo_vllm_fsdp_19990101_0000" in lines


def test_cli_read_reports_launch_errors(tmp_path: Path) -> None:
    script = tmp_path / "hostile.sh"
    script.write_text("X=$(touch SOMEFILE)\npython3 -m verl.trainer.main_ppo a=$X\n")
    result = cli("read", str(script))
    assert result.returncode == 2
    assert f"{script}:1: command substitution" in result.stderr
    assert not (Path.cwd() / "SOMEFILE").exists() and not (tmp_path / "SOMEFILE").exists()


def test_cli_compose_prints_resolved_yaml(upstream_checkout: Path) -> None:
    result = cli("--upstream", str(upstream_checkout), "compose", "dr_grpo")
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert resolved["actor_rollout_ref"]["actor"]["loss_agg_mode"] == "seq-mean-token-sum-norm"
    assert resolved["algorithm"]["norm_adv_by_std_in_grpo"] is False


def test_cli_check_prints_findings_and_exits_1_on_error(upstream_checkout: Path) -> None:
    bad = cli(
        "--upstream", str(upstream_checkout), "check", "grpo", "--set", "data.train_batch_size=100"
    )
    assert bad.returncode == 1
    assert bad.stdout.startswith(
        "ERROR data.train_batch_size, actor_rollout_ref.actor.ppo_mini_batch_size: "
    )
    assert "100 prompts × n=5 = 500 responses" in bad.stdout and "(set " in bad.stdout
    script = str(upstream_checkout / "examples/grpo_trainer/run_qwen3_8b_fsdp.sh")
    warn = cli(
        "--upstream",
        str(upstream_checkout),
        "check",
        script,
        "--set",
        "actor_rollout_ref.rollout.n=1",
    )
    assert warn.returncode == 0, warn.stderr
    assert warn.stdout.startswith("WARNING actor_rollout_ref.rollout.n: ")
    clean = cli("--upstream", str(upstream_checkout), "check", "ppo")
    assert clean.returncode == 0 and clean.stdout == ""
