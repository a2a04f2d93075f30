"""The read census (issue 29): docs/upstream-reads.md is the one of now, and each leaf's status
follows from where verl reads it: traced, static on its own section, never read, or undecided.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_verl_compat.pipeline.pins import installed_verl_root
from pytest_verl_compat.upstream import read_census

PAGE = Path(__file__).resolve().parents[1] / "docs" / "upstream-reads.md"
CLI = (sys.executable, "-m", "pytest_verl_compat.cli")

CONFIG_CLASS = """
from verl.base_config import BaseConfig

class FooConfig(BaseConfig):
    def __post_init__(self):
        assert self.size > 0
"""
TRAINER = """
def run(config, other):
    if config.mode == "fast":
        n = config.b.size
    return other.weight + len(["unused_but_named"])
"""
TREE = {
    "a": {"_target_": "verl.workers.config.FooConfig", "size": 1, "never": 2},
    "b": {"size": 3, "weight": 4, "unused_but_named": 5},
    "mode": "fast",
}


@pytest.fixture
def verl_parent(tmp_path: Path) -> Path:
    (tmp_path / "verl/workers/config").mkdir(parents=True)
    (tmp_path / "verl/trainer/ppo").mkdir(parents=True)
    (tmp_path / "verl/workers/config/foo.py").write_text(CONFIG_CLASS, encoding="utf-8")
    (tmp_path / "verl/trainer/ppo/run.py").write_text(TRAINER, encoding="utf-8")
    return tmp_path


def _by_leaf(entries: list[read_census.LeafReads]) -> dict[str, read_census.LeafReads]:
    return {entry.leaf: entry for entry in entries}


def test_each_leaf_gets_its_reads_and_status(verl_parent: Path) -> None:
    found = _by_leaf(read_census.census(verl_parent, {"t": TREE}, {}))
    assert sorted(found) == [
        "a.never",
        "a.size",
        "b.size",
        "b.unused_but_named",
        "b.weight",
        "mode",
    ]
    # ``self.size`` in the class the tree builds for ``a``; not ``b.size`` (another section).
    assert [p.where for p in found["a.size"].places] == ["verl/workers/config/foo.py:6"]
    # ``config.b.size`` names its section, under the guard that selects it.
    (place,) = found["b.size"].places
    assert (place.where, place.function, place.holder, place.guard) == (
        "verl/trainer/ppo/run.py:4",
        "run",
        "config.b",
        "config.mode == 'fast'",
    )
    assert found["mode"].status == "static"
    assert found["a.never"].status == "never read"
    # Read on an object the reading cannot place, or only named: undecided, with the places.
    assert found["b.weight"].status == "undecided"
    assert found["b.unused_but_named"].status == "undecided"
    assert found["b.unused_but_named"].unmatched[0].how == "mention"


def test_a_traced_read_comes_first(verl_parent: Path) -> None:
    traced = {"a.never": ["verl/trainer/ppo/run.py:5"]}
    found = _by_leaf(read_census.census(verl_parent, {"t": TREE}, traced))
    assert found["a.never"].status == "traced"
    assert found["a.never"].places[0].function == "run"
    page = read_census.render("0.0.0", list(found.values()), 1)
    assert "| 6 | 1 | 3 | 0 | 2 | 4 (66.7%) |" in page


@pytest.mark.skipif(installed_verl_root() is None, reason="verl is not installed")
def test_the_page_and_its_recorded_reads_are_the_ones_of_now(upstream_checkout: Path) -> None:
    """``census --reads --check`` re-derives the question of every configuration; a changed
    probe, verl, case or variant makes the recorded reads stale and fails here."""
    run = subprocess.run(
        [
            *CLI,
            "-q",
            "--upstream",
            str(upstream_checkout),
            "census",
            "--reads",
            "--check",
            str(PAGE),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
