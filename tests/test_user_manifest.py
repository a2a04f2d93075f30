"""A user's own launch scripts: `verl-compat init`, bind, audit, edit, see the diff, accept."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from pytest_verl_compat.files.digests import sha256_file
from pytest_verl_compat.pipeline.init_manifest import PLACEHOLDER, case_id, init_manifest
from pytest_verl_compat.pipeline.manifest import load_manifest

COMMON = """\
    data.train_files="$HOME/data/gsm8k/train.parquet" \\
    actor_rollout_ref.model.path=Qwen/Qwen3-0.6B \\
    actor_rollout_ref.rollout.name=vllm \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \\
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \\
"""

GRPO = f"""\
#!/usr/bin/env bash
set -euo pipefail
COMMIT=$(git rev-parse --short HEAD)
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
{COMMON}    data.train_batch_size=64 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \\
    actor_rollout_ref.actor.use_kl_loss=True \\
    actor_rollout_ref.rollout.n=4 \\
    trainer.experiment_name="grpo_${{COMMIT}}" \\
    "$@"
"""

DR_GRPO = f"""\
#!/usr/bin/env bash
set -euo pipefail
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    algorithm.norm_adv_by_std_in_grpo=False \\
{COMMON}    data.train_batch_size=32 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \\
    actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm \\
    actor_rollout_ref.rollout.n=8 \\
    trainer.experiment_name="drgrpo_$(date +%Y%m%d_%H%M)"
"""


def user_folder(root: Path, config_dir: Path) -> Path:
    """The user's upstream root: their scripts under examples/, the pinned tree as a symlink."""
    (root / "verl" / "trainer").mkdir(parents=True)
    (root / "verl" / "trainer" / "config").symlink_to(config_dir)
    (root / "examples").mkdir()
    (root / "examples" / "my_grpo.sh").write_text(GRPO)
    (root / "examples" / "My-DrGRPO.sh").write_text(DR_GRPO)
    return root


def test_case_ids() -> None:
    taken: set[str] = set()
    assert case_id("My-DrGRPO", taken) == "my_drgrpo"
    assert case_id("my_drgrpo", taken) == "my_drgrpo_2"
    assert case_id("---", taken) == "script"


def test_init_manifest_validates(tmp_path: Path, upstream_checkout: Path) -> None:
    root = user_folder(tmp_path / "user", upstream_checkout / "verl" / "trainer" / "config")
    (root / "examples" / "not_a_launcher.sh").write_text("#!/bin/bash\necho hello\n")
    text = init_manifest(root)
    raw = yaml.safe_load(text)
    schema = json.loads(
        (Path(__file__).parents[1] / "pytest_verl_compat/data/manifest.schema.json").read_text()
    )
    jsonschema.validate(raw, schema)
    embedded = yaml.safe_load((Path(__file__).parents[1] / "corpus" / "manifest.yaml").read_text())
    assert raw["upstream"] == embedded["upstream"]
    assert raw["environment"]["variables"] == {"HOME": "/home/verl"}
    # Unknown substitutions wait for a value; the embedded corpus's known ones are prefilled.
    assert raw["environment"]["substitutions"] == {
        "git rev-parse --short HEAD": PLACEHOLDER,
        "date +%Y%m%d_%H%M": "20260101_0000",
    }
    assert "# examples/my_grpo.sh:3" in text
    assert "# examples/My-DrGRPO.sh:" in text
    assert [c["id"] for c in raw["cases"]] == ["my_drgrpo", "my_grpo", "not_a_launcher"]
    for case in raw["cases"]:
        assert case["kind"] == "user"
        assert case["inputs"] == [
            {"path": case["launch"], "sha256": sha256_file(root / case["launch"])}
        ]
    assert "# cannot read yet: examples/not_a_launcher.sh" in text


def test_init_cli(tmp_path: Path, upstream_checkout: Path, capsys: pytest.CaptureFixture) -> None:
    import argparse

    from pytest_verl_compat.cli.drift import add_drift_parsers

    root = user_folder(tmp_path / "user", upstream_checkout / "verl" / "trainer" / "config")
    parser = argparse.ArgumentParser()
    add_drift_parsers(parser.add_subparsers(dest="command", required=True))
    out = tmp_path / "m.yaml"
    args = parser.parse_args(["init", str(root), "--out", str(out)])
    assert args.func(args) == 0
    assert f'bind every "{PLACEHOLDER}"' in capsys.readouterr().err
    assert load_manifest(out).cases[0].id == "my_drgrpo"
    assert args.func(args) == 2, "an existing manifest is not overwritten without --force"


def run_audit(pytester: pytest.Pytester, cache: Path, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "--verl-corpus",
        "-p",
        "no:randomly",
        "-o",
        f"cache_dir={cache}",
        "-rfEs",
        # As the README runs it: no -k (a manifest init writes has no conformance cases).
        *args,
    )


@pytest.mark.slow
def test_user_manifest_through_every_stage(
    pytester: pytest.Pytester, upstream_checkout: Path, shared_cache_dir: Path
) -> None:
    root = user_folder(pytester.path / "user", upstream_checkout / "verl" / "trainer" / "config")
    manifest = pytester.path / "user" / "manifest.yaml"
    init_manifest(root, manifest)
    manifest.write_text(manifest.read_text().replace(f'"{PLACEHOLDER}"', '"abc1234"'))
    loaded = load_manifest(manifest)
    assert [c.id for c in loaded.cases] == ["my_drgrpo", "my_grpo"]
    assert all(c.error is None for c in loaded.cases)
    args = (f"--verl-corpus-manifest={manifest}", f"--verl-corpus-upstream={root}")

    first = run_audit(pytester, shared_cache_dir, *args, "--snapshot-update")
    assert first.ret == 0, first.stdout.str()[-4000:]
    golden = root / "golden"
    assert sorted(p.name for p in (golden / "compose").iterdir()) == [
        "my_drgrpo.json",
        "my_grpo.json",
    ]
    snapshot = json.loads((golden / "compose" / "my_grpo.json").read_text())
    assert "trainer.experiment_name=grpo_abc1234" in snapshot["explicit_fields"]

    green = run_audit(pytester, shared_cache_dir, *args)
    # read, compose, compile, verdict, trusted, snapshot per case; tree; orphans; the tolerance
    # file check. The conformance, step and SFT step stages have no case here: one skipped
    # placeholder each.
    green.assert_outcomes(passed=2 * 6 + 3, skipped=3)
    green.stdout.fnmatch_lines(["2 cases; 2 composed; 2 accepted; *"])

    # The user doubles the batch: the read stage says so, once, with the command that re-pins.
    script = root / "examples" / "my_grpo.sh"
    old_sha = sha256_file(script)
    script.write_text(script.read_text().replace("train_batch_size=64", "train_batch_size=128"))
    stale = run_audit(pytester, shared_cache_dir, *args)
    assert stale.ret == 1
    failed = {r.split(" ")[1].split("::", 1)[1] for r in stale.outlines if r.startswith("FAILED")}
    assert failed == {"test_read[my_grpo]"}, stale.stdout.str()[-3000:]
    repin = f"re-pin the manifest: verl-compat pin {manifest}"
    # Once in the failures; pytest's short summary repeats a failure's line (in full on CI, where
    # it does not truncate it to the terminal's width), which is that same message, not another.
    failures = stale.stdout.str().split("short test summary info")[0]
    assert failures.count(repin) == 1, stale.stdout.str()[-3000:]
    assert failures.count(f"pinned sha256 {old_sha}, found") == 1

    before = manifest.read_text()
    pinned = subprocess.run(
        [sys.executable, "-m", "pytest_verl_compat.cli", "pin", str(manifest)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert pinned.returncode == 0, pinned.stderr
    new_sha = sha256_file(script)
    assert (
        pinned.stdout == f"examples/my_grpo.sh: sha256 {old_sha[:12]} -> {new_sha[:12]} (my_grpo)\n"
    )
    assert manifest.read_text() == before.replace(old_sha, new_sha), "only the pin changed"
    changed = run_audit(pytester, shared_cache_dir, *args)
    assert changed.ret == 1
    accept = (
        f"pytest --verl-corpus --verl-corpus-manifest {manifest} --verl-corpus-upstream {root} "
        "--snapshot-update"
    )
    changed.stdout.fnmatch_lines(
        [
            "*golden differs at these leaves (- golden, + now):*",
            '*~ explicit_fields[[]*[]]: "data.train_batch_size=64" -> "data.train_batch_size=128"*',
            "*~ resolved.data.train_batch_size: 64 -> 128*",
            f"*run {accept} to accept the change*",
        ],
        consecutive=False,
    )
    failed = {r.split(" ")[1].split("::", 1)[1] for r in changed.outlines if r.startswith("FAILED")}
    assert failed == {"test_snapshot[my_grpo]"}, changed.stdout.str()[-3000:]

    accepted = run_audit(pytester, shared_cache_dir, *args, "--snapshot-update")
    assert accepted.ret == 0, accepted.stdout.str()[-4000:]
    # (syrupy's own summary line is not printed in every environment; the green rerun shows it.)
    again = run_audit(pytester, shared_cache_dir, *args)
    again.assert_outcomes(passed=2 * 6 + 3, skipped=3)


SCRIPT_DIR = """\
#!/usr/bin/env bash
set -euo pipefail
HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" >/dev/null 2>&1 && pwd)
ROOT=$(cd "$HERE/.." && pwd)
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
COMMON    data.train_batch_size=64 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \\
    actor_rollout_ref.rollout.n=4 \\
    data.val_files="$ROOT/data/test.parquet" \\
    trainer.default_local_dir="$HERE/checkpoints"
""".replace("COMMON", COMMON.replace("$HOME", "$ROOT"))


def test_the_script_directory_needs_no_binding_in_a_manifest(
    tmp_path: Path, upstream_checkout: Path
) -> None:
    """`init`, the manifest's read stage, `read SCRIPT` and `check SCRIPT` all know the script's
    folder: the idiom evaluates to it, so init asks no binding for it."""
    import subprocess
    import sys

    from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession

    root = user_folder(tmp_path / "user", upstream_checkout / "verl" / "trainer" / "config")
    (root / "examples" / "here.sh").write_text(SCRIPT_DIR)
    manifest = root / "manifest.yaml"
    text = init_manifest(root, manifest)
    assert "dirname" not in text and "pwd" not in text
    expected = [
        f"data.train_files={root}/data/gsm8k/train.parquet",
        f"data.val_files={root}/data/test.parquet",
        f"trainer.default_local_dir={root}/examples/checkpoints",
    ]
    loaded = load_manifest(manifest)
    case = next(c for c in loaded.cases if c.id == "here")
    session = AuditSession.start(AuditOptions(manifest=str(manifest), upstream=str(root)))
    fields = session.outcome(case).fields.fields
    assert all(line in fields for line in expected)
    cli = [sys.executable, "-m", "pytest_verl_compat.cli"]
    read = subprocess.run(
        [*cli, "read", "examples/here.sh"], cwd=root, capture_output=True, text=True, check=False
    )
    assert read.returncode == 0, read.stderr
    assert all(line in read.stdout.splitlines() for line in expected)
    check = subprocess.run(
        [*cli, "check", "--no-upstream-checks", "examples/here.sh"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode in (0, 1), check.stderr
    assert "run-time value" not in check.stderr
