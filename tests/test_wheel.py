"""The built wheel: what it contains, what it leaves out, and its metadata."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(REPO),
        ],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("pytest_verl_compat-*.whl")
    return built


def test_wheel_ships_corpus_golden_and_profiles_but_no_tests_or_upstream_files(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    for required in (
        "pytest_verl_compat/plugin/__init__.py",
        "pytest_verl_compat/py.typed",
        "pytest_verl_compat/data/manifest.schema.json",
        "pytest_verl_compat/profiles/verl-0.9.0-single-device.yaml",
        "pytest_verl_compat/_embedded/corpus/manifest.yaml",
        "pytest_verl_compat/_embedded/corpus/conformance.yaml",
        "pytest_verl_compat/_embedded/golden/audit.json",
        "pytest_verl_compat/_embedded/golden/compose/grpo.json",
        "pytest_verl_compat/_embedded/golden/compile/derived/missing-filter-metric.json",
        "reference_trainer/trainer.py",
        "reference_trainer/data/prompts.jsonl",
    ):
        assert required in names, required
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", ".ci/", "docs/"))]
    assert not [
        n for n in names if n.endswith((".sh", "conftest.py")) or "/verl/trainer/config/" in n
    ]


def _member(wheel: Path, suffix: str) -> str:
    """The text of the wheel's one member whose name ends with ``suffix``."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(suffix)]
        return archive.read(name).decode()


def test_wheel_metadata_is_complete(wheel: Path) -> None:
    meta = Parser().parsestr(_member(wheel, ".dist-info/METADATA"))
    assert meta["Name"] == "pytest-verl-compat"
    assert meta["Version"]
    assert meta["License-Expression"] == "Apache-2.0"
    assert "Framework :: Pytest" in meta.get_all("Classifier")
    # This project's pages only: verl's repository is not where this package lives.
    assert not [url for url in meta.get_all("Project-URL") or [] if "verl-project" in url]
    # No verl, not even as an extra: each release's code runs in an environment of its own.
    assert not [r for r in meta.get_all("Requires-Dist") if r.startswith("verl")]
    entry_points = _member(wheel, ".dist-info/entry_points.txt")
    assert "verl_corpus = pytest_verl_compat.plugin" in entry_points
    assert "verl-compat = pytest_verl_compat.cli:main" in entry_points


def test_plain_install_is_light_and_the_trainer_is_an_extra(wheel: Path) -> None:
    requires = Parser().parsestr(_member(wheel, ".dist-info/METADATA")).get_all("Requires-Dist")
    plain = [r.split(";")[0] for r in requires if "extra ==" not in r]
    heavy = ("torch", "transformers", "peft", "matplotlib")
    assert not [r for r in plain if r.split("=")[0].split(">")[0].split("<")[0] in heavy], plain
    trainer = {r.split(";")[0] for r in requires if "extra == 'trainer'" in r}
    assert {
        "torch==2.13.0",
        "transformers==5.10.4",
        "peft==0.21.2",
        "matplotlib>=3.8",
        "tensorboard>=2.16",
    } <= trainer
    # The test extra includes the trainer's (hatchling writes the self-reference out).
    test = {r.split(";")[0] for r in requires if "extra == 'test'" in r}
    assert trainer <= test


def test_license_is_in_the_repository_and_the_wheel(wheel: Path) -> None:
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert _member(wheel, ".dist-info/licenses/LICENSE") == text
