"""The pre-commit hook (.pre-commit-hooks.yaml), as a user's repository runs it: ``pre-commit
try-repo`` installs this repository into a fresh virtual environment (pip, as pre-commit does for
``language: python``) and runs the hook on a temporary git repository's scripts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
GRPO = "examples/grpo_trainer/run_qwen3_8b_fsdp.sh"
MINI_BATCH = "actor_rollout_ref.actor.ppo_mini_batch_size=${ppo_mini_batch_size}"


def test_the_hook_is_declared_as_documented() -> None:
    (hook,) = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    assert hook["id"] == "verl-compat" and hook["entry"] == "verl-compat check"
    assert hook["language"] == "python" and hook["files"] == r"\.sh$"
    assert hook["require_serial"] is True


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.email=ci@example.invalid", "-c", "user.name=ci", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


@pytest.mark.slow
def test_try_repo_flags_an_invalid_script_and_passes_a_valid_one(
    tmp_path: Path, upstream_checkout: Path
) -> None:
    if shutil.which("git") is None:
        pytest.skip("pre-commit needs git")
    if subprocess.run(["git", "-C", str(REPO), "rev-parse"], capture_output=True).returncode:
        pytest.skip("try-repo needs this repository's git checkout")
    user = tmp_path / "user"
    user.mkdir()
    text = (upstream_checkout / GRPO).read_text()
    assert MINI_BATCH in text
    (user / "good.sh").write_text(text)
    (user / "bad.sh").write_text(text.replace(MINI_BATCH, MINI_BATCH.split("=")[0] + "=0"))
    _git(user, "init", "-q")
    _git(user, "add", ".")
    _git(user, "commit", "-qm", "scripts")
    env = {
        **os.environ,
        "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"),
        # The hook's environment has no verl: the checkout is the config tree.
        "VERL_UPSTREAM": str(upstream_checkout),
    }
    pre_commit = [sys.executable, "-m", "pre_commit", "try-repo", str(REPO), "verl-compat"]

    def hook(*files: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*pre_commit, "--files", *files],
            cwd=user,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )

    failed = hook("bad.sh", "good.sh")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    line = next(n for n, t in enumerate(text.splitlines(), 1) if MINI_BATCH in t)
    column = text.splitlines()[line - 1].index("actor_rollout_ref") + 1
    assert (
        f"bad.sh:{line}:{column}: error[batch.mini-batch-not-positive] "
        "actor_rollout_ref.actor.ppo_mini_batch_size: must be positive, got 0"
    ) in failed.stdout
    assert "checked 2 files: 1 valid for verl" in failed.stdout
    passed = hook("good.sh")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "verl-compat check" in passed.stdout and "Passed" in passed.stdout
