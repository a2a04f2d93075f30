"""``verl-compat pin``: re-pins every case input in place, keeping the manifest's own text."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_verl_compat.cli import main
from pytest_verl_compat.files.digests import sha256_file
from pytest_verl_compat.files.safe_input import InputError
from pytest_verl_compat.pipeline.init_manifest import init_manifest
from pytest_verl_compat.pipeline.manifest import default_manifest_path, load_manifest
from pytest_verl_compat.pipeline.pin_manifest import pin_manifest

SCRIPTS = {
    "a.sh": "examples/ppo_trainer/run_qwen3_8b_fsdp.sh",
    "b.sh": "examples/grpo_trainer/run_qwen3_8b_fsdp.sh",
}


def user_folder(tmp_path: Path, upstream_checkout: Path) -> Path:
    root = tmp_path / "my-runs"
    root.mkdir()
    for name, script in SCRIPTS.items():
        shutil.copy(upstream_checkout / script, root / name)
    init_manifest(root, root / "manifest.yaml")
    return root


def test_the_embedded_manifest_is_pinned_already(tmp_path: Path, upstream_checkout: Path) -> None:
    manifest = tmp_path / "manifest.yaml"
    shutil.copy(default_manifest_path(), manifest)
    before = manifest.read_bytes()
    assert pin_manifest(manifest, upstream_checkout) == []
    assert manifest.read_bytes() == before


def test_an_edited_script_is_re_pinned_and_nothing_else_moves(
    tmp_path: Path, upstream_checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = user_folder(tmp_path, upstream_checkout)
    manifest = root / "manifest.yaml"
    # A comment and a quoted pin of the user's own, kept as they are.
    text = manifest.read_text().replace("cases:\n", "cases:  # mine\n")
    old = sha256_file(root / "b.sh")
    text = text.replace(f"sha256: {old}", f'sha256: "{old}"', 1)
    manifest.write_text(text)
    (root / "b.sh").write_text((root / "b.sh").read_text() + "\n# edited\n")
    new = sha256_file(root / "b.sh")

    assert main(["pin", str(manifest), "--dry-run"]) == 0
    assert manifest.read_text() == text, "--dry-run writes nothing"
    assert main(["pin", str(manifest)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == f"b.sh: sha256 {old[:12]} -> {new[:12]} (b)"
    assert f"wrote {manifest} (1 pins changed)" in err
    assert manifest.read_text() == text.replace(f'"{old}"', f'"{new}"')
    assert load_manifest(manifest).case("b").inputs[0].sha256 == new
    assert pin_manifest(manifest, root) == [], "a second run finds nothing to change"


def test_a_missing_or_escaping_input_writes_nothing(
    tmp_path: Path, upstream_checkout: Path
) -> None:
    root = user_folder(tmp_path, upstream_checkout)
    manifest = root / "manifest.yaml"
    (root / "a.sh").write_text("echo edited\n")
    (root / "b.sh").unlink()
    before = manifest.read_text()
    with pytest.raises(InputError, match=r"b\.sh: cannot read the pinned input: not found"):
        pin_manifest(manifest, root)
    assert manifest.read_text() == before
    escaping = before.replace('path: "b.sh"', 'path: "../b.sh"')
    manifest.write_text(escaping)
    with pytest.raises(InputError, match=r"'\.\./b\.sh' is not a path under"):
        pin_manifest(manifest, root)
    assert manifest.read_text() == escaping
