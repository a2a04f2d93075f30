"""Hostile inputs where the audit meets upstream's code (issue 14, items 1-4 and 6).

Each attack carries the canary as its payload; every test asserts that the canary never fired.
Where a payload could be dead by accident, a control proves it is live on its own.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from corpus_facts import PINNED_VERSION, needs_release, release_ready
from hostile_canary import Canary

from pytest_verl_compat.pipeline.compose import Composer
from pytest_verl_compat.pipeline.init_manifest import init_manifest
from pytest_verl_compat.pipeline.targets import foreign_targets, tree_targets
from pytest_verl_compat.upstream.oracle.client import (
    EntryArgvRefused,
    UpstreamOracle,
    compose_request,
    entry_argv,
)
from pytest_verl_compat.upstream.oracle.runner import (
    UpstreamProcess,
    safe_variables,
    sandbox_environment,
)

needs_verl = needs_release()


class _Payload:
    """Unpickling this runs a shell command: what Hydra's --experimental-rerun would do."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (self.command,))


def evil_pickle(folder: Path, canary: Canary) -> Path:
    path = folder / "evil.pkl"
    path.write_bytes(pickle.dumps(_Payload(canary.payload)))
    return path


@pytest.mark.parametrize(
    "field",
    [
        "--experimental-rerun",
        "--experimental-rerun=/tmp/evil.pkl",
        "--config-dir=/tmp",
        "-cd",
        "--cfg",
        "-m",
        "--multirun",
        "--info",
        "--run",
        "hydra.run.dir=/tmp/x",
        "+hydra.callbacks.pwn._target_=os.system",
        "++hydra.job.chdir=true",
        "~hydra.output_subdir",
        "hydra/launcher=basic",
        "hydra=none",
        "--config-path=/tmp",
        "--config-path=../../evil",
        "--config-name=../evil",
        "--config-name",
    ],
)
def test_entry_argv_refuses_hydra_flags_and_hydra_overrides(field: str) -> None:
    with pytest.raises(EntryArgvRefused):
        entry_argv([field])


def test_entry_argv_keeps_job_overrides_and_the_pinned_config_selectors() -> None:
    fields = [
        "data.train_batch_size=64",
        "+trainer.hydra_like_name=1",
        "~actor_rollout_ref.rollout.agent",
        "trainer.experiment_name=hydra.run",
        "--config-path=./config",
        "--config-name",
        "ppo_megatron_trainer.yaml",
        "-cn=ppo_trainer",
    ]
    assert entry_argv(fields) == [
        "data.train_batch_size=64",
        "+trainer.hydra_like_name=1",
        "~actor_rollout_ref.rollout.agent",
        "trainer.experiment_name=hydra.run",
        "--config-path=./config",
        "--config-name=ppo_megatron_trainer.yaml",
        "--config-name=ppo_trainer",
    ]


def test_unsafe_variable_names_never_reach_a_sandbox_environment() -> None:
    variables = {
        "PYTHONPATH": "/x",
        "PYTHONSTARTUP": "/x",
        "LD_PRELOAD": "/x.so",
        "PATH": "/evil",
        "BASH_ENV": "/x",
        "HOME": "/home/verl",
    }
    assert safe_variables(variables) == {"HOME": "/home/verl"}
    env = sandbox_environment(variables)
    assert not {"PYTHONPATH", "PYTHONSTARTUP", "LD_PRELOAD", "BASH_ENV"} & set(env)
    assert env["PATH"] != "/evil"


def test_target_foreign_to_the_tree_is_a_composition_rejection(upstream_checkout: Path) -> None:
    composer = Composer(upstream_checkout / "verl" / "trainer" / "config", "ppo_trainer")
    pwn = composer.compose(["+a.b.pwn._target_=os.system", "+a.b.pwn._args_=[id]"], {})
    assert pwn.outcome == "composition_rejection"
    assert pwn.reason.startswith("a.b.pwn._target_='os.system': a _target_ must be one of")
    optim = composer.compose(["actor_rollout_ref.actor.optim._target_=os.system"], {})
    assert optim.reason.startswith("actor_rollout_ref.actor.optim._target_='os.system'")
    # Near-identical valid configurations: an upstream class the tree names, and a value
    # that merely looks like a target.
    same = composer.compose(
        ["actor_rollout_ref.actor.optim._target_=verl.workers.config.FSDPOptimizerConfig"], {}
    )
    assert same.composed
    assert composer.compose(["trainer.project_name=os.system"], {}).composed


def test_tree_targets_are_the_classes_the_tree_names(upstream_checkout: Path) -> None:
    targets = tree_targets(upstream_checkout / "verl" / "trainer" / "config")
    assert "verl.workers.config.FSDPActorConfig" in targets
    assert not any(t.startswith(("os.", "subprocess.", "builtins.")) for t in targets)
    assert foreign_targets({"a": [{"_target_": 1}], "b": {"_target_": "os.system"}}, targets) == [
        "a[0]._target_=1",
        "b._target_='os.system'",
    ]


@pytest.fixture(scope="module")
def oracle() -> Any:
    if not release_ready():
        pytest.skip("verl is not installed")
    process = UpstreamOracle(release=PINNED_VERSION)
    yield process
    process.close()


@needs_verl
def test_oracle_rechecks_argv_a_sender_did_not(
    oracle: UpstreamOracle, canary: Canary, tmp_path: Path
) -> None:
    pickled = evil_pickle(tmp_path, canary)
    # Sent raw, as a compromised or buggy sender would: the process refuses it itself.
    for argv in (["--experimental-rerun", str(pickled)], [f"--experimental-rerun={pickled}"]):
        answer = oracle.answer(f"raw:{argv}", {"kind": "compose", "argv": argv, "env": {}})
        assert not answer["ok"] and "refused" in answer["error"]
    assert not canary.fired()
    # Control: the payload is live; unpickling it alone fires the canary.
    subprocess.run(
        [sys.executable, "-c", f"import pickle; pickle.load(open({str(pickled)!r}, 'rb'))"],
        check=True,
    )
    assert canary.fired()


@needs_verl
def test_oracle_validate_refuses_foreign_targets(oracle: UpstreamOracle, canary: Canary) -> None:
    mapping = {"pwn": {"_target_": "os.system", "_args_": [canary.payload]}}
    answer = oracle.answer("raw:validate-pwn", {"kind": "validate", "mapping": mapping})
    assert answer["verdict"] == "refused" and "pwn._target_='os.system'" in answer["message"]
    assert not canary.fired()


@needs_verl
def test_oracle_ignores_loader_variables_and_the_audited_folder(
    canary: Canary, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A folder that shadows verl and omegaconf, and a sitecustomize on PYTHONPATH.
    audited = tmp_path / "fork"
    (audited / "verl").mkdir(parents=True)
    (audited / "verl" / "__init__.py").write_text(canary.python + "\n")
    (audited / "omegaconf.py").write_text(canary.python + "\n")
    (audited / "sitecustomize.py").write_text(canary.python + "\n")
    monkeypatch.chdir(audited)
    monkeypatch.setenv("PYTHONPATH", str(audited))  # the auditing shell's own, too
    oracle = UpstreamOracle(release=PINNED_VERSION)
    try:
        request = compose_request(
            ["trainer.project_name=${oc.env:PYTHONPATH,none}"],
            {"PYTHONPATH": str(audited), "LD_PRELOAD": str(audited / "x.so")},
        )
        answer = oracle.answer("env", request)
    finally:
        oracle.close()
    assert answer["ok"], answer
    resolved = yaml.safe_load(answer["stdout"])
    assert resolved["trainer"]["project_name"] == "none"
    assert not canary.fired()
    # Control: the same folder on the path of a normal interpreter does fire.
    subprocess.run([sys.executable, "-c", "import verl"], cwd=audited, check=True)
    assert canary.fired()


def test_upstream_process_runs_in_an_empty_folder() -> None:
    process = UpstreamProcess("json.tool")  # any module: only the folder and environment matter
    try:
        cwd = Path(process._cwd.name)
        assert cwd.is_dir() and not any(cwd.iterdir())
    finally:
        process.close()
    assert not cwd.exists()


def test_one_sandboxed_process_per_rank_answers_with_rank_zeros_output() -> None:
    """run_module(..., ranks=2): the step oracle's data-parallel launch (any module will do).

    The first rank to fail ends every rank at once (a rank left running would wait forever in a
    collective), so the others' stderr is shown only as far as they wrote it by then: on a busy
    machine rank 1 may not have written its error yet. What is sure is a failing return code and
    the error of a failing rank, each line marked with its rank."""
    from pytest_verl_compat.upstream.oracle.runner import run_module

    done = run_module("json.tool", stdin='{"a": 1}', ranks=2, timeout=60)
    assert done.returncode == 0 and json.loads(done.stdout) == {"a": 1}
    failed = run_module("json.tool", stdin="not json", ranks=2, timeout=60)
    assert failed.returncode != 0
    lines = failed.stderr.splitlines()
    assert any("Expecting value" in line for line in lines), failed.stderr
    assert lines and all(line.startswith(("[rank 0] ", "[rank 1] ")) for line in lines)


def test_ranks_that_outlive_the_time_are_killed_together() -> None:
    """A rank waiting for a peer that is gone would wait forever: the time bounds all of them."""
    import time

    from pytest_verl_compat.upstream.oracle.runner import run_module

    started = time.monotonic()
    done = run_module(
        "timeit", ["-n", "1", "-r", "60", "import time; time.sleep(1)"], ranks=2, timeout=2
    )
    assert done.returncode != 0 and time.monotonic() - started < 30


HOSTILE_SCRIPTS = {
    # Hydra's own flag: unpickles the file named next to the script.
    "rerun.sh": 'python3 -m verl.trainer.main_ppo --experimental-rerun "${0%/*}/evil.pkl"\n',
    # A new node whose _target_ validate_config would instantiate.
    "target.sh": (
        "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo \\\n"
        "    '+a.b.pwn._target_=os.system' \"+a.b.pwn._args_=['PAYLOAD']\"\n"
    ),
    # Redirect Hydra's outputs.
    "hydra.sh": "python3 -m verl.trainer.main_ppo hydra.run.dir=/tmp/pwn\n",
}


@pytest.mark.slow
@needs_verl
def test_hostile_user_scripts_through_the_whole_audit(
    pytester: pytest.Pytester, upstream_checkout: Path, canary: Canary, shared_cache_dir: Path
) -> None:
    root = pytester.path / "user"
    (root / "verl" / "trainer").mkdir(parents=True)
    (root / "verl" / "trainer" / "config").symlink_to(upstream_checkout / "verl/trainer/config")
    (root / "examples").mkdir()
    evil_pickle(root / "examples", canary)
    for name, text in HOSTILE_SCRIPTS.items():
        body = text.replace("PAYLOAD", canary.payload.replace("'", ""))
        (root / "examples" / name).write_text("#!/usr/bin/env bash\n" + body)
    manifest = root / "manifest.yaml"
    init_manifest(root, manifest)
    result = pytester.runpytest_subprocess(
        "--verl-corpus",
        f"--verl-corpus-manifest={manifest}",
        f"--verl-corpus-upstream={root}",
        "--verl-corpus-trusted=require",
        "-o",
        f"cache_dir={shared_cache_dir}",
        "-k",
        "not conformance",
        "-rs",
    )
    assert not canary.fired()
    skipped = "\n".join(line for line in result.outlines if line.startswith("SKIPPED"))
    # The two that Hydra's compose API rejects never reach upstream; the hydra.* override
    # composes (Hydra's compose API accepts it) but is never sent to the entry point.
    assert "composition rejected (OverrideParseException" in skipped
    assert "composition rejected (a.b.pwn._target_='os.system'" in skipped
    assert "not sent to upstream: 'hydra.run.dir=/tmp/pwn'" in skipped
    result.stdout.fnmatch_lines(["3 cases; 1 composed; *2 composition rejections"])


@needs_release("0.9.1")
def test_a_class_named_by_its_module_path_is_never_imported_unless_it_is_verls_own() -> None:
    """0.9.1's PPOTrainer.__init__ builds ``trainer.checkpoint_callback_class`` by importing it
    (``load_class_from_fqn``, verl/trainer/ppo/checkpoint_callback.py:78-81@0.9.1): a name outside
    verl is the user's module, never imported by the probes (not evaluated, said so); verl's own
    class is built as upstream builds it, and its twin is clean."""
    from pytest_verl_compat.releases.wheels import release_tree

    composer = Composer(release_tree("0.9.1").config_dir, "ppo_trainer")
    oracle = UpstreamOracle(release="0.9.1")
    try:
        answers = {}
        for name, fqn in (
            ("user", "os.system"),
            ("verl", "verl.trainer.ppo.checkpoint_callback.CheckpointCallback"),
        ):
            mapping = composer.compose([f"trainer.checkpoint_callback_class={fqn}"], {}).mapping
            answers[name] = oracle.answer(name, {"kind": "checks", "mapping": dict(mapping)})
    finally:
        oracle.close()
    user, own = answers["user"], answers["verl"]
    assert not [f for f in user["failures"] if "system" in json.dumps(f)], user["failures"]
    refused = [n for n in user["not_evaluated"] if "a module of the user's" in n["reason"]]
    assert refused, user["not_evaluated"]
    assert not [n for n in own["not_evaluated"] if "a module of the user's" in n["reason"]]
    assert not [f for f in own["failures"] if "allback" in json.dumps(f)], own["failures"]
