"""Manifest validation errors, composition rejections and the ``verl-compat`` read/compose commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from corpus_facts import release_ready

from pytest_verl_compat.pipeline.compose import Composer, count_leaves
from pytest_verl_compat.pipeline.manifest import ManifestError, embedded_root, load_manifest

MANIFEST = embedded_root() / "corpus" / "manifest.yaml"


def write_manifest(tmp_path: Path, mutate) -> Path:
    data = yaml.safe_load(MANIFEST.read_text())
    mutate(data)
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_embedded_manifest_has_the_official_cases() -> None:
    """The seven official RL cases and two official SFT scripts (their arguments bound)."""
    manifest = load_manifest(MANIFEST)
    assert [c.id for c in manifest.cases if c.kind == "official"] == [
        "ppo",
        "grpo",
        "rloo",
        "reinforce_plus_plus",
        "grpo_lora",
        "grpo_reward_model",
        "sft_gsm8k",
        "sft_multiturn",
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
        "sft_gsm8k",
        "sft_multiturn",
        "dr_grpo",
        "field/lora-sglang-without-merge",
    ]


def test_duplicate_ids_are_rejected_precisely(tmp_path: Path) -> None:
    manifest = load_manifest(
        write_manifest(tmp_path, lambda d: d["cases"].append(dict(d["cases"][0])))
    )
    duplicate = manifest.cases[-1]
    assert duplicate.error and "duplicate case id 'ppo' (first defined at line" in duplicate.error


def test_a_valid_case_reusing_an_invalid_cases_id_is_a_duplicate(tmp_path: Path) -> None:
    # Found by the manifest fuzzer: the first 'ppo' fails the schema, and its valid copy further
    # down used to be built as if it were the only 'ppo' (two test ids, one golden file).
    def mutate(data: dict) -> None:
        data["cases"].append(dict(data["cases"][0]))
        del data["cases"][0]["kind"]

    manifest = load_manifest(write_manifest(tmp_path, mutate))
    first, later = manifest.cases[0], manifest.cases[-1]
    assert first.id == "ppo" and first.error and "kind" in first.error
    assert later.id.startswith("ppo#duplicate-") and later.error
    assert "duplicate case id 'ppo'" in later.error


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
    assert f"{script}:2: run-time value: $(touch SOMEFILE) (line 1)" in result.stderr
    assert not (Path.cwd() / "SOMEFILE").exists() and not (tmp_path / "SOMEFILE").exists()


def test_cli_compose_prints_resolved_yaml(upstream_checkout: Path) -> None:
    result = cli("--upstream", str(upstream_checkout), "compose", "dr_grpo")
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert resolved["actor_rollout_ref"]["actor"]["loss_agg_mode"] == "seq-mean-token-sum-norm"
    assert resolved["algorithm"]["norm_adv_by_std_in_grpo"] is False


def test_cli_check_prints_findings_and_exits_1_on_error(upstream_checkout: Path) -> None:
    small = ("check", "grpo", "--set", "data.train_batch_size=100", "--no-upstream-checks")
    # The legacy trainer's make_iterator asserts on a batch smaller than one mini-batch ...
    bad = cli("--upstream", str(upstream_checkout), *small, "--set", "trainer.use_v1=False")
    assert bad.returncode == 1
    # Located at the --set argument that set the key (the 6th word after verl-compat).
    assert bad.stdout.startswith(
        "<command line>:1:6: error[batch.mini-batch-larger-than-batch] "
        "data.train_batch_size, actor_rollout_ref.actor.ppo_mini_batch_size: "
    )
    assert "100 prompts × n=5 = 500 responses" in bad.stdout and "(set " in bad.stdout
    # ... while the V1 trainer (the default) pads the step with no-op responses and runs: a
    # warning, valid for verl, and the reference trainer (which does not pad) refuses it.
    padded = cli("--upstream", str(upstream_checkout), *small)
    assert padded.returncode == 0, padded.stdout
    assert padded.stdout.startswith(
        "<command line>:1:6: warning[batch.padded-step] data.train_batch_size, "
    )
    assert "appends 780 no-op padding responses every step" in padded.stdout
    assert "valid for verl 0.9.0: yes" in padded.stderr
    assert "runnable by the reference trainer: no (" in padded.stderr
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
    assert warn.stdout.startswith(
        "<command line>:1:6: warning[group.one-response-grpo] actor_rollout_ref.rollout.n: "
    )
    # ppo's script sets critic.ppo_max_token_len_per_gpu, which 0.9.0's critic never reads (a
    # warning since checks/micro_batch.py); grpo is the clean case.
    clean = cli("--upstream", str(upstream_checkout), "check", "grpo")
    assert clean.returncode == 0 and clean.stdout == ""


# --- documented commands on the installed verl only, and the CLI's conventions ----------------


def cli_here(cwd: Path, *args: str, env: dict[str, str] | None = None):
    """The CLI from ``cwd`` with no checkout in the environment: the installed verl is the tree."""
    import os

    environ = {k: v for k, v in os.environ.items() if k != "VERL_UPSTREAM"}
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "pytest_verl_compat.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        env=environ,
    )


@pytest.fixture
def installed_verl() -> None:

    if not release_ready():
        pytest.skip("needs the installed verl (the [upstream] extra)")


def test_check_with_set_needs_only_the_installed_verl(tmp_path: Path, installed_verl: None) -> None:
    result = cli_here(
        tmp_path, "check", "grpo", "--set", "actor_rollout_ref.actor.ppo_mini_batch_size=100"
    )
    assert result.returncode == 1, result.stderr
    assert (
        "error[upstream.first-update] actor_rollout_ref.actor.ppo_mini_batch_size, "
        "actor_rollout_ref.rollout.n, trainer.n_gpus_per_node, trainer.nnodes: AssertionError: "
        "Got mini_batch_size=500" in result.stdout
    )
    # The same case without --set is accepted: the override, not the golden lookup, decides.
    clean = cli_here(tmp_path, "check", "grpo")
    assert clean.returncode == 0 and clean.stdout == "", clean.stderr


def test_check_script_needs_only_the_installed_verl(
    tmp_path: Path, installed_verl: None, upstream_checkout: Path
) -> None:
    script = tmp_path / "my.sh"
    script.write_bytes(
        (upstream_checkout / "examples/grpo_trainer/run_qwen3_8b_fsdp.sh").read_bytes()
    )
    result = cli_here(tmp_path, "check", "my.sh", "--set", "actor_rollout_ref.rollout.n=1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        "<command line>:1:4: warning[group.one-response-grpo] actor_rollout_ref.rollout.n: "
    )


def test_version_and_exit_codes_are_documented(tmp_path: Path) -> None:
    from importlib import metadata

    version = cli_here(tmp_path, "--version")
    assert version.returncode == 0
    assert version.stdout.strip() == f"verl-compat {metadata.version('pytest-verl-compat')}"
    helped = cli_here(tmp_path, "--help")
    assert "exit status: 0 clean, 1 findings or drift, 2 usage" in " ".join(helped.stdout.split())


def test_did_you_mean_for_subcommands_and_case_ids(tmp_path: Path) -> None:
    typo = cli_here(tmp_path, "chek", "grpo")
    assert typo.returncode == 2
    assert "did you mean 'check'?" in typo.stderr
    case = cli_here(tmp_path, "check", "grop")
    assert case.returncode == 2
    assert "no case 'grop'" in case.stderr and "did you mean 'grpo'?" in case.stderr
    assert "known cases" not in case.stderr and case.stdout == ""


def test_a_missing_file_is_not_found_not_no_case(tmp_path: Path) -> None:
    for args, message in (
        (("check", "missing.sh"), "missing.sh: launch script not found"),
        (("compose", "./scripts/run.sh"), "./scripts/run.sh: launch script not found"),
        (("read", "missing.sh"), "missing.sh: launch script not found"),
        (("compile", "missing.yaml"), "missing.yaml: resolved configuration not found"),
        (("check", "grpo", "--manifest", "nope.yaml"), "nope.yaml: manifest not found"),
        (("audit", "--manifest", "nope.yaml"), "nope.yaml: manifest not found"),
    ):
        result = cli_here(tmp_path, *args)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr and "no case" not in result.stderr


def test_manifest_and_upstream_are_accepted_after_every_case_command(
    tmp_path: Path, upstream_checkout: Path
) -> None:
    from pytest_verl_compat.cli import build_parser

    parser = build_parser()
    for command in (
        "read x",
        "compose x",
        "check x",
        "compile x",
        "audit",
        "train x",
        "drift --against .",
        "retarget --against . --profile p",
    ):
        args = parser.parse_args([*command.split(), "--manifest", "m.yaml", "--upstream", "u"])
        assert (args.manifest, args.upstream) == ("m.yaml", "u"), command
        before = parser.parse_args(["--manifest", "m.yaml", "--upstream", "u", *command.split()])
        assert (before.manifest, before.upstream) == ("m.yaml", "u"), command
    after = cli_here(tmp_path, "compose", "dr_grpo", "--upstream", str(upstream_checkout))
    assert after.returncode == 0, after.stderr


def test_audit_stdout_is_only_json(tmp_path: Path, installed_verl: None) -> None:
    import json

    result = cli_here(tmp_path, "audit")
    assert result.returncode == 0, result.stderr
    audit = json.loads(result.stdout)
    assert audit["totals"]["cases"] == 18
    assert "18 cases; 16 composed" in result.stderr


def test_an_internal_error_is_exit_3_not_a_finding(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from pytest_verl_compat import cli
    from pytest_verl_compat.cli import check

    def broken(args: object) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr(check, "cmd_check", broken)
    assert cli.main(["check", "grpo"]) == 3
    err = capsys.readouterr().err
    assert "verl-compat check: internal error (a bug, please report it): RuntimeError: a bug" in err


def test_a_missing_extra_is_named_in_one_line(tmp_path: Path) -> None:
    # torch made unimportable, as in an install without the [trainer] extra.
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from pytest_verl_compat.cli import main\n"
        "raise SystemExit(main(['train', 'grpo', '--steps', '1', '--out', 'run']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "verl-compat train: needs the [trainer] extra (torch is not installed): "
        "pip install 'pytest-verl-compat[trainer]'"
    )
    assert "Traceback" not in result.stderr


# --- `verl-compat init` for a folder of one's own scripts (docs/drift.md) ----------------------


def own_scripts(root: Path, upstream_checkout: Path) -> Path:
    """docs/drift.md's layout: scripts at the top of the folder, the tree as a symlink, no examples/."""
    (root / "verl" / "trainer").mkdir(parents=True)
    (root / "verl" / "trainer" / "config").symlink_to(upstream_checkout / "verl/trainer/config")
    script = upstream_checkout / "examples/ppo_trainer/run_qwen3_8b_fsdp.sh"
    (root / "ppo.sh").write_bytes(script.read_bytes())
    return root


def test_init_prints_bind_me_only_when_something_is_left_to_bind(
    tmp_path: Path, upstream_checkout: Path
) -> None:
    root = own_scripts(tmp_path / "my-runs", upstream_checkout)
    done = cli_here(tmp_path, "init", "my-runs", "--out", "my-runs/manifest.yaml")
    assert done.returncode == 0, done.stderr
    assert "BIND_ME" not in done.stderr and "BIND_ME" not in (root / "manifest.yaml").read_text()
    assert done.stdout == "", "messages go to stderr"
    (root / "git.sh").write_text("C=$(git rev-parse HEAD)\npython3 -m verl.trainer.main_ppo a=$C\n")
    left = cli_here(tmp_path, "init", "my-runs", "--out", "my-runs/manifest.yaml", "--force")
    assert 'bind every "BIND_ME" in the manifest before auditing: git rev-parse HEAD' in left.stderr


def test_init_asks_only_for_substitutions_the_argv_depends_on(
    tmp_path: Path, upstream_checkout: Path
) -> None:
    from pytest_verl_compat.pipeline.init_manifest import PLACEHOLDER, init_manifest

    root = own_scripts(tmp_path / "my-runs", upstream_checkout)
    (root / "run.sh").write_text(
        "STAMP=$(date +%s)\nmkdir -p logs/$STAMP\nC=$(git rev-parse HEAD)\n"
        "python3 -m verl.trainer.main_ppo trainer.experiment_name=$C\n"
    )
    raw = yaml.safe_load(init_manifest(root))
    # $(date +%s) only names a folder the script makes: bash needs no value for it, nor do we.
    substitutions = raw["environment"]["substitutions"]
    assert "date +%s" not in substitutions
    assert substitutions["git rev-parse HEAD"] == PLACEHOLDER
    # ppo.sh's run name carries its launch time: that one reaches the argv and stays.
    assert substitutions["date +%Y%m%d_%H%M"] == "20260101_0000"


def test_init_writes_no_machine_path(tmp_path: Path, upstream_checkout: Path) -> None:
    from pytest_verl_compat.pipeline.init_manifest import init_manifest

    root = own_scripts(tmp_path / "my-runs", upstream_checkout)
    text = init_manifest(root)
    assert str(tmp_path) not in text
    assert str(embedded_root()) not in text, "the plugin's own install path is not portable"
    manifest = root / "manifest.yaml"
    manifest.write_text(text)
    assert load_manifest(manifest).conformance is None


def test_init_quotes_every_string_it_writes(tmp_path: Path, upstream_checkout: Path) -> None:
    from pytest_verl_compat.pipeline.init_manifest import init_manifest

    root = own_scripts(tmp_path / "my-runs", upstream_checkout)
    hostile = "a\nprofile: evil\n\u2028golden_dir: etc\x85#.sh"
    (root / hostile).write_text("X=$(hostname)\npython3 -m verl.trainer.main_ppo a=$X\n")
    text = init_manifest(root)
    raw = yaml.safe_load(text)
    assert "profile" not in raw and raw["golden_dir"] == "golden"
    assert [c["launch"] for c in raw["cases"]] == [hostile, "ppo.sh"]
    manifest = root / "manifest.yaml"
    manifest.write_text(text)
    loaded = load_manifest(manifest)
    assert all(case.error is None for case in loaded.cases)


def test_a_folder_without_examples_is_read_as_a_tree(
    tmp_path: Path, upstream_checkout: Path
) -> None:
    from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
    from pytest_verl_compat.pipeline.init_manifest import init_manifest

    root = own_scripts(tmp_path / "my-runs", upstream_checkout)
    init_manifest(root, root / "manifest.yaml")
    session = AuditSession.start(
        AuditOptions(manifest=str(root / "manifest.yaml"), upstream=str(root))
    )
    (case,) = session.cases
    fields = session.read(case)
    assert "algorithm.adv_estimator=gae" in fields.fields
