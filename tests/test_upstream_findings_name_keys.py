"""Issue 46, class 5: every ``upstream.*`` finding names the user's key.

Over every answer upstream gave on every supported release (the 109 example scripts' and the
corpus's, as recorded by ``release derive``), each failure names the keys that decide it: the
statement's own reads, or the fewest of the script's keys whose reset removes it (``blame``);
the only failure without a key is one that survives resetting them all, and it says it is a
default of upstream's. The recorded answers are the ones ``check`` and the audit give (their
staleness is tests/test_recorded_answers.py's and tests/test_examples.py's to catch).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from corpus_facts import PINNED_VERSION, REPO

from pytest_verl_compat.pipeline.audit import RELEASES_GOLDEN
from pytest_verl_compat.releases.index import load_release_index
from pytest_verl_compat.upstream.verdict import blame
from pytest_verl_compat.upstream.verdict.early import EarlyAnswer, UpstreamFailure

RELEASES = load_release_index().supported_versions
# The answers files whose entries are upstream's answers to the probes' questions.
ANSWER_FILES = ("answers/checks.json", "answers/checks-examples.json")


def _golden(version: str) -> Path:
    top = REPO / "golden"
    return top if version == PINNED_VERSION else top / RELEASES_GOLDEN / version


def _answers(version: str) -> dict[str, dict[str, Any]]:
    """Every recorded answer of ``version``, by where it is kept."""
    golden = _golden(version)
    found: dict[str, dict[str, Any]] = {}
    for name in ANSWER_FILES:
        for key, answer in json.loads((golden / name).read_text(encoding="utf-8")).items():
            found[f"{name}:{key[:12]}"] = answer
    examples = json.loads((golden / "examples/upstream.json").read_text(encoding="utf-8"))
    for script, entry in examples.items():
        if entry.get("upstream_answer"):
            found[script] = entry["upstream_answer"]
    return found


@pytest.mark.parametrize("version", RELEASES)
def test_every_upstream_failure_names_a_key_or_is_upstreams_default(version: str) -> None:
    answers = _answers(version)
    failures = [
        (where, failure)
        for where, answer in answers.items()
        for failure in EarlyAnswer.from_json(answer).failures
    ]
    assert len(answers) >= 100 and failures, (len(answers), len(failures))
    unnamed = [
        f"{where}: {failure.check_id} {failure.message[:80]}"
        for where, failure in failures
        if not failure.keys and failure.blame != blame.UPSTREAM_DEFAULT
    ]
    assert not unnamed, "\n".join(unnamed)


def test_a_finding_without_keys_says_it_is_upstreams_default() -> None:
    """The finding itself: an unnamed failure is located at its rule, and says why."""
    failure = UpstreamFailure(
        phase="trainer start: validate_config",
        message="AssertionError: x",
        where="verl/trainer/main_ppo.py:1",
        source="assert x",
        blame=blame.UPSTREAM_DEFAULT,
    )
    finding = failure.finding(PINNED_VERSION)
    assert finding.path == "<upstream.trainer-start>"
    assert "a default of upstream's" in finding.message
    named = UpstreamFailure(
        phase="trainer start: validate_config",
        message="AssertionError: x",
        where="verl/trainer/main_ppo.py:1",
        source="assert x",
        keys=("data.train_batch_size",),
    )
    assert named.finding(PINNED_VERSION).path == "data.train_batch_size"
    assert "default of upstream's" not in named.finding(PINNED_VERSION).message
