"""Hostile input through the command line (issue 23): every class ends in exit 2 and one stderr
line naming the file or value, never a traceback or "internal error" (exit 3).

Each test drives one class and, where one exists, its near-identical valid twin.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from corpus_facts import release_ready

from pytest_verl_compat.cli import main
from pytest_verl_compat.cli.common import EXIT_BROKEN_PIPE, EXIT_USAGE
from pytest_verl_compat.pipeline.compose import MAX_OVERRIDE_KEY, Composer
from pytest_verl_compat.pipeline.init_manifest import init_manifest
from pytest_verl_compat.pipeline.manifest import MAX_BASE_CHAIN, default_manifest_path
from pytest_verl_compat.pipeline.profile import default_profile, profile_path

GRPO_SCRIPT = "examples/grpo_trainer/run_qwen3_8b_fsdp.sh"
KEY_2000 = ".".join(["a"] * 2000)
HUGE = "9" * 5000


@pytest.fixture
def tree(monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded default's config tree (the installed verl), no checkout from the env."""
    if not release_ready():
        pytest.skip("needs the installed verl (the [upstream] extra)")
    monkeypatch.delenv("VERL_UPSTREAM", raising=False)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, list[str]]]:
    """``verl-compat ARGS`` in this process: (exit status, stderr lines)."""

    def run(*args: str) -> tuple[int, list[str]]:
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse refuses before a command runs
            code = int(exc.code or 0)
        return code, capsys.readouterr().err.splitlines()

    return run


def one_line_naming(lines: list[str], *names: str) -> str:
    """The one stderr line; it names every one of ``names``."""
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0] and "internal error" not in lines[0], lines[0]
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def copy_tree(source: Path, dest: Path) -> Path:
    """A folder laid out like a checkout holding a copy of ``source``'s config tree."""
    config = dest / "verl" / "trainer" / "config"
    shutil.copytree(source / "verl" / "trainer" / "config", config)
    return config


def script_with(folder: Path, name: str, fields: str) -> Path:
    path = folder / name
    path.write_text(f"#!/usr/bin/env bash\npython3 -m verl.trainer.main_ppo {fields}\n")
    return path


# --- values -----------------------------------------------------------------------------------


def test_set_without_equals(cli, tree: None, tmp_path: Path) -> None:
    code, err = cli("check", "grpo", "--set", "actor_rollout_ref.rollout.n")
    assert code == EXIT_USAGE
    one_line_naming(err, "--set", "'actor_rollout_ref.rollout.n'", "KEY=VALUE")
    code, _ = cli("check", "grpo", "--no-upstream-checks", "--set", "actor_rollout_ref.rollout.n=2")
    assert code == 0


def test_a_key_of_2000_segments(cli, tree: None, tmp_path: Path) -> None:
    code, err = cli("check", "grpo", "--set", f"+{KEY_2000}=1")
    assert code == EXIT_USAGE
    one_line_naming(err, "--set", "2000 segments", f"at most {MAX_OVERRIDE_KEY}")
    # In a launch script the same key is the script's composition rejection (a finding, exit 1).
    script = script_with(tmp_path, "deep.sh", f"+{KEY_2000}=1")
    code, err = cli("check", str(script), "--no-upstream-checks")
    assert code == 1 and not any("Traceback" in line for line in err), err
    # A long key that is still a key composes.
    long_key = ".".join(["a"] * 90)
    assert len(long_key) < MAX_OVERRIDE_KEY
    code, _ = cli("check", "grpo", "--no-upstream-checks", "--set", f"+{long_key}=1")
    assert code in (0, 1)


def test_override_key_bound_in_the_composer(upstream_checkout: Path) -> None:
    composer = Composer(upstream_checkout / "verl" / "trainer" / "config", "ppo_trainer")
    refused = composer.compose([f"+{KEY_2000}=1"], {})
    assert refused.outcome == "composition_rejection"
    assert "2000 segments" in refused.reason and "\n" not in refused.reason
    assert composer.compose(["+trainer.my_note=1"], {}).composed


def test_huge_integers(cli, tree: None, tmp_path: Path) -> None:
    code, err = cli("check", "grpo", "--set", f"data.train_batch_size={HUGE}")
    assert code == EXIT_USAGE
    one_line_naming(err, "data.train_batch_size", "5000 digits")
    resolved = tmp_path / "config.yaml"
    resolved.write_text(f"trainer:\n  total_epochs: {HUGE}\n")
    code, err = cli("compile", str(resolved))
    assert code == EXIT_USAGE
    one_line_naming(err, str(resolved), "line 2", "5000 digits")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(f'{{"num_attention_heads": {HUGE}}}')
    code, err = cli("check", "grpo", "--no-upstream-checks", "--model-config", str(model))
    assert code == EXIT_USAGE
    one_line_naming(err, "config.json", "5000 digits")
    # The same files with integers Python converts are read.
    (model / "config.json").write_text('{"num_attention_heads": 32, "num_key_value_heads": 8}')
    code, _ = cli("check", "grpo", "--no-upstream-checks", "--model-config", str(model))
    assert code in (0, 1)


# --- files and folders --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_a_fifo_or_device_in_a_folder_given_to_init(
    cli, tmp_path: Path, upstream_checkout: Path, kind: str
) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    shutil.copy(upstream_checkout / GRPO_SCRIPT, folder / "a.sh")
    if kind == "fifo":
        os.mkfifo(folder / "b.sh")  # a read would wait for a writer forever
    else:
        (folder / "b.sh").symlink_to("/dev/zero")  # a read would never end
    out = tmp_path / "manifest.yaml"
    code, err = cli("init", str(folder), "--out", str(out))
    assert code == EXIT_USAGE
    one_line_naming(err, str(folder / "b.sh"), "not a regular file")
    assert not out.exists()
    (folder / "b.sh").unlink()
    code, _ = cli("init", str(folder), "--out", str(out))
    assert code == 0 and out.is_file()


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_a_fifo_or_device_in_a_tree_given_to_drift(
    cli, tmp_path: Path, upstream_checkout: Path, upstream_091: Path, kind: str
) -> None:
    config = copy_tree(upstream_091, tmp_path / "other")
    bad = config / "algorithm" / "extra.yaml"
    if kind == "fifo":
        os.mkfifo(bad)
    else:
        bad.symlink_to("/dev/zero")
    code, err = cli(
        "--upstream", str(upstream_checkout), "drift", "--against", str(tmp_path / "other")
    )
    assert code == EXIT_USAGE
    one_line_naming(err, str(bad), "not a regular file")


def test_a_python_tag_in_a_tree(cli, tmp_path: Path, upstream_checkout: Path, canary) -> None:
    config = copy_tree(upstream_checkout, tmp_path / "tree")
    tagged = config / "algorithm" / "rollout_correction.yaml"
    payload = f"x: !!python/object/apply:os.system [{canary.payload!r}]\n"
    tagged.write_text(tagged.read_text() + payload)
    tree = str(tmp_path / "tree")
    code, err = cli("--upstream", tree, "check", "grpo", "--no-upstream-checks")
    assert code == EXIT_USAGE
    one_line_naming(err, str(tagged), "python/object/apply:os.system")
    code, err = cli("--upstream", str(upstream_checkout), "drift", "--against", tree)
    assert code == EXIT_USAGE
    one_line_naming(err, str(tagged))
    assert not canary.fired()
    # An exclamation mark that is no tag (a string) is fine.
    tagged.write_text(tagged.read_text().replace(payload, "x: 'fine!'\n"))
    code, _ = cli("--upstream", tree, "check", "grpo", "--no-upstream-checks")
    assert code in (0, 1)


def test_a_chain_of_1500_derived_cases(cli, tmp_path: Path, upstream_checkout: Path) -> None:
    raw = yaml.safe_load(default_manifest_path().read_text(encoding="utf-8"))
    raw.pop("conformance", None)
    base = "grpo"
    for index in range(1500):
        raw["cases"].append(
            {"id": f"derived/c{index}", "kind": "derived", "base": base,
             "overrides": [f"trainer.total_epochs={index + 1}"]}
        )  # fmt: skip
        base = f"derived/c{index}"
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(yaml.safe_dump(raw, sort_keys=False))
    common = ("--manifest", str(manifest), "--upstream", str(upstream_checkout))
    code, err = cli(*common, "check", "derived/c1499", "--no-upstream-checks")
    assert code == EXIT_USAGE
    one_line_naming(err, str(manifest), "'derived/c1499'", f"at most {MAX_BASE_CHAIN}")
    # The longest chain allowed composes, with every override of its bases.
    code, err = cli(*common, "check", f"derived/c{MAX_BASE_CHAIN - 1}", "--no-upstream-checks")
    assert code == 0, err


def test_pickled_model_weights_are_never_loaded(cli, tree: None, tmp_path: Path, canary) -> None:
    from reference_trainer.tiny import build_tiny_policy, build_tiny_tokenizer

    class Payload:
        def __reduce__(self):  # what unpickling would call
            return (os.system, (canary.payload,))

    model = tmp_path / "model"
    tokenizer = build_tiny_tokenizer()
    build_tiny_policy(tokenizer, 0).save_pretrained(model)
    tokenizer.save_pretrained(model)
    (model / "model.safetensors").unlink()
    (model / "pytorch_model.bin").write_bytes(pickle.dumps(Payload()))
    out = tmp_path / "run"
    args = ("train", "grpo", "--model", str(model), "--steps", "1", "--out", str(out))
    code, err = cli(*args, "--no-progress")
    assert code == EXIT_USAGE
    one_line_naming(err, str(model / "pytorch_model.bin"), "pickled weights are refused")
    assert not canary.fired()


def test_an_unreadable_script_leaves_the_others_in_the_audit(
    cli, tmp_path: Path, upstream_checkout: Path
) -> None:
    import json

    root = tmp_path / "runs"
    (root / "verl" / "trainer").mkdir(parents=True)
    (root / "verl" / "trainer" / "config").symlink_to(upstream_checkout / "verl/trainer/config")
    for name in ("a.sh", "b.sh"):
        shutil.copy(upstream_checkout / GRPO_SCRIPT, root / name)
    manifest = root / "manifest.yaml"
    init_manifest(root, manifest)
    out = tmp_path / "audit.json"
    common = ("--manifest", str(manifest), "--upstream", str(root), "audit", "--json", str(out))
    code, _ = cli(*common)
    assert code == 0 and [c["id"] for c in json.loads(out.read_text())["cases"]] == ["a", "b"]
    (root / "b.sh").write_text("echo edited\n")
    code, err = cli(*common)
    assert code == EXIT_USAGE
    one_line_naming([line for line in err if "b.sh" in line], "[b] b.sh", "pinned sha256")
    assert [c["id"] for c in json.loads(out.read_text())["cases"]] == ["a"]


# --- output -----------------------------------------------------------------------------------


def test_a_reader_that_closed_stdout_ends_the_command_quietly(upstream_checkout: Path) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # `| head -1` after its one line: every write now fails with EPIPE
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest_verl_compat.cli",
                "read",
                str(upstream_checkout / GRPO_SCRIPT),
            ],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    finally:
        os.close(write_end)
    assert result.returncode == EXIT_BROKEN_PIPE, result.stderr
    assert result.stderr == ""


def test_a_malformed_profile_the_manifest_names(cli, tree: None, tmp_path: Path) -> None:
    raw = yaml.safe_load(default_manifest_path().read_text(encoding="utf-8"))
    raw.pop("conformance", None)
    raw["golden_dir"] = str(default_manifest_path().parents[1] / "golden")
    raw["profile"] = "mine.yaml"
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(yaml.safe_dump(raw, sort_keys=False))
    profile = tmp_path / "mine.yaml"
    shipped = yaml.safe_load(profile_path(default_profile()).read_text(encoding="utf-8"))
    del shipped["rules"][3]["class"]
    profile.write_text(yaml.safe_dump(shipped, sort_keys=False))
    code, err = cli("--manifest", str(manifest), "check", "grpo", "--no-upstream-checks")
    assert code == EXIT_USAGE
    one_line_naming(err, str(profile), "rules[3]", "no 'class'")
    # The shipped profile's own text, as a path, is a profile like any other.
    profile.write_text(profile_path(default_profile()).read_text(encoding="utf-8"))
    code, _ = cli("--manifest", str(manifest), "check", "grpo", "--no-upstream-checks")
    assert code == 0
