"""The pre-commit hook (.pre-commit-hooks.yaml), as a user's repository runs it: a
``.pre-commit-config.yaml`` names this repository at one commit, and ``pre-commit run`` installs it
into a fresh virtual environment (pip, as pre-commit does for ``language: python``) and runs the
hook on a temporary git repository's scripts."""

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


def _git(cwd: Path, *args: str, stdin: bytes | None = None) -> bytes:
    return subprocess.run(
        ["git", "-c", "user.email=ci@example.invalid", "-c", "user.name=ci", *args],
        cwd=cwd,
        input=stdin,
        check=True,
        capture_output=True,
    ).stdout


def _hook_repository(folder: Path) -> tuple[Path, str]:
    """This repository as a hook repository at one commit: a clone of it, with the checkout's
    uncommitted changes to tracked files committed on top (what ``pre-commit try-repo`` makes of
    a checkout with changes), and that commit's sha."""
    clone = folder / "hook-repo"
    _git(folder, "clone", "-q", str(REPO), str(clone))
    changes = _git(REPO, "diff", "HEAD", "--binary")
    if changes:
        _git(clone, "apply", "--index", "-", stdin=changes)
        _git(clone, "commit", "-qm", "uncommitted changes")
    return clone, _git(clone, "rev-parse", "HEAD").decode().strip()


@pytest.mark.slow
def test_the_hook_flags_an_invalid_script_and_passes_a_valid_one(
    tmp_path: Path, upstream_checkout: Path
) -> None:
    """Both runs read one ``.pre-commit-config.yaml`` and one pre-commit home, as a user's
    repository does: pre-commit installs the hook's environment (pip, ~13 s of CPU) once."""
    if shutil.which("git") is None:
        pytest.skip("pre-commit needs git")
    if subprocess.run(["git", "-C", str(REPO), "rev-parse"], capture_output=True).returncode:
        pytest.skip("the hook repository is made from this repository's git checkout")
    hook_repo, rev = _hook_repository(tmp_path)
    user = tmp_path / "user"
    user.mkdir()
    text = (upstream_checkout / GRPO).read_text()
    assert MINI_BATCH in text
    (user / "good.sh").write_text(text)
    (user / "bad.sh").write_text(text.replace(MINI_BATCH, MINI_BATCH.split("=")[0] + "=0"))
    config = {"repos": [{"repo": str(hook_repo), "rev": rev, "hooks": [{"id": "verl-compat"}]}]}
    (user / ".pre-commit-config.yaml").write_text(yaml.safe_dump(config))
    _git(user, "init", "-q")
    _git(user, "add", ".")
    _git(user, "commit", "-qm", "scripts")
    env = {
        **os.environ,
        "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"),
        # The hook's environment has no verl: the checkout is the config tree.
        "VERL_UPSTREAM": str(upstream_checkout),
        # virtualenv's periodic check for newer seed wheels (pip, setuptools) runs two
        # `pip download`s beside the install (~6 s of CPU here); the hook needs the seeds it has.
        "VIRTUALENV_NO_PERIODIC_UPDATE": "1",
    }

    def hook(*files: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pre_commit", "run", "--files", *files],
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
    # One environment for both runs (the second did not install another).
    environments = [p for p in (tmp_path / "pre-commit-home").glob("repo*/py_env-*") if p.is_dir()]
    assert len(environments) == 1, environments
