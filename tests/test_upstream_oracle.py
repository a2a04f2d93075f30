"""The oracle process's plumbing: what the parent parses, when it starts and how it ends."""

from __future__ import annotations

import json
import shutil
import signal
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from corpus_facts import PINNED_VERSION, needs_release, release_ready
from omegaconf import OmegaConf

from pytest_verl_compat.pipeline.manifest import embedded_root
from pytest_verl_compat.upstream.oracle.client import (
    UpstreamOracle,
    compose_request,
    validate_request,
)
from pytest_verl_compat.upstream.oracle.trusted import printed_config

needs_verl = needs_release()


def test_printed_config_parses_as_safe_load_does() -> None:
    # The scalars where YAML 1.1 resolution is subtle: exponent floats without a dot stay strings,
    # .inf/.nan, null spellings, octal-looking and quoted numbers, booleans, empty mappings.
    tricky = textwrap.dedent(
        """\
        a: 1e-6
        b: 1.0e-06
        c: .inf
        d: -.inf
        e: null
        f: ~
        g: '0o17'
        h: 017
        i: 'true'
        j: yes
        k: {}
        l: []
        m: 3.0
        n: 0x1F
        o: '1.5'
        p: 2026-11-30
        """
    )
    assert printed_config(tricky) == yaml.safe_load(tricky)
    resolved = json.loads((embedded_root() / "golden" / "compose" / "grpo.json").read_text())
    printed = OmegaConf.to_yaml(OmegaConf.create(resolved["resolved"]))
    assert printed_config(printed) == yaml.safe_load(printed) == resolved["resolved"]


@needs_verl
def test_close_ends_a_process_with_nothing_outstanding_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VERL_COMPAT_WARM_SECONDS", "0")  # a cold process, still importing verl
    oracle = UpstreamOracle(release=PINNED_VERSION)
    oracle.start()
    assert oracle._process is not None
    process = oracle._process.process
    oracle.close()  # still importing verl: no answer is owed, so it is not waited for
    assert process.returncode == -signal.SIGKILL


def test_a_selection_without_upstream_stages_starts_no_process(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if not release_ready():
        pytest.skip("needs the installed verl (the [upstream] extra)")
    monkeypatch.delenv("VERL_UPSTREAM", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no answer kept yet
    marker = pytester.path / "started"
    # Records the oracle's start (at its first question) instead of importing verl; answers
    # validate as upstream would.
    pytester.makeconftest(
        f"""
        from pytest_verl_compat.upstream.oracle.client import UpstreamOracle

        def _start(self):
            open({str(marker)!r}, "a").write("started\\n")

        def answer(self, request_id, request, timeout=600):
            self._start()
            return {{"verdict": "passes", "message": ""}}

        UpstreamOracle._start = _start
        UpstreamOracle.answer = answer
        """
    )
    # The embedded golden files without the answers recorded for them: every question misses.
    golden = tmp_path / "golden"
    shutil.copytree(embedded_root() / "golden", golden, ignore=shutil.ignore_patterns("answers"))

    def run(selection: str, *options: str) -> None:
        result = pytester.runpytest_subprocess(
            "-p", "no:cacheprovider", "--verl-corpus", "--verl-corpus-trusted=off", "-k", selection,
            *options,
        )  # fmt: skip
        assert result.ret == 0, result.stdout.str()[-2000:]

    run("test_compose and grpo", f"--verl-corpus-golden={golden}")
    assert not marker.exists()
    # With the recorded answers, the verdict stage asks nothing either.
    run("test_verdict and grpo")
    assert not marker.exists()
    run("test_verdict and grpo", f"--verl-corpus-golden={golden}")  # the control
    assert Path(marker).read_text().splitlines()[:1] == ["started"]


@needs_verl
def test_forked_workers_answer_each_question_as_one_process_would() -> None:
    golden = embedded_root() / "golden" / "compose"
    cases = {name: json.loads((golden / f"{name}.json").read_text()) for name in ("grpo", "ppo")}
    oracle = UpstreamOracle(workers=2, release=PINNED_VERSION)
    try:
        for name, case in cases.items():
            oracle.submit(name, compose_request(case["explicit_fields"], {}))
        oracle.submit("validate", validate_request(cases["grpo"]["resolved"]))
        oracle.submit("refused", {"kind": "compose", "argv": ["--cfg", "hydra"], "env": {}})
        for name, case in cases.items():
            answer = oracle.answer(name, {})
            assert answer["ok"], answer
            assert printed_config(answer["stdout"]) == case["resolved"]
        assert oracle.answer("validate", {})["verdict"] == "passes"
        refused = oracle.answer("refused", {})  # a worker re-checks the argv as one process does
        assert not refused["ok"] and refused["error"].startswith("refused: ")
        assert oracle._process is not None
        workers = _children(oracle._process.process.pid)
        assert len(workers) == 2
    finally:
        oracle.close()
    assert _all_end(workers), "the forked workers outlived the oracle"


def _children(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (from /proc: Linux, like the sandbox)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def _all_end(pids: list[int], seconds: float = 30) -> bool:
    """Whether every process in `pids` is gone (or a zombie awaiting init) within `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                alive.append(pid)
        if not alive:
            return True
        time.sleep(0.1)
    return False


def test_conformance_answers_travel_bit_exact() -> None:
    import numpy as np
    import torch

    from pytest_verl_compat.conformance.reference_answers import decode, encode

    value = {
        "loss": torch.tensor(0.1234567, dtype=torch.float32),
        "grad/log_prob": torch.randn(3, 5, dtype=torch.float64),
        "empty": torch.zeros(0, 4),
        "metric": 1 / 3,
        "clipfrac": np.float64(2 / 7),
        "nan": float("nan"),
        "rows": (1, [2.5, None]),
    }
    back = decode(json.loads(json.dumps(encode(value))))
    assert list(back) == list(value)
    for key in ("loss", "grad/log_prob", "empty"):
        assert back[key].dtype == value[key].dtype and torch.equal(back[key], value[key])
    assert back["metric"] == value["metric"] and type(back["clipfrac"]) is np.float64
    assert back["clipfrac"] == value["clipfrac"] and back["rows"] == value["rows"]
    assert back["nan"] != back["nan"]


class _AskedOracle:
    """The release's oracle, with every question it is asked counted."""

    def __init__(self) -> None:
        from pytest_verl_compat.plugin.state import REFERENCE_ANSWERS

        self.oracle = UpstreamOracle(served=(REFERENCE_ANSWERS,), release=PINNED_VERSION)
        self.release = PINNED_VERSION
        self.asked: list[str] = []

    def submit(self, request_id: str, request: dict[str, Any]) -> None:
        self.oracle.submit(request_id, request)

    def answer(self, request_id: str, request: dict[str, Any]) -> dict[str, Any]:
        self.asked.append(request_id)
        return self.oracle.answer(request_id, request)


@needs_verl
def test_conformance_from_the_oracle_passes_and_leaves_our_own_references_here() -> None:
    """Upstream's side of a case comes from the release's oracle (its environment); a case whose
    reference is built from our own functions never goes there."""
    from pytest_verl_compat.conformance.plan import conformance_cases, load_tolerances
    from pytest_verl_compat.conformance.reference_answers import OracleReferences, answer_key_of
    from pytest_verl_compat.conformance.run import run_case

    cases = conformance_cases(load_tolerances(embedded_root() / "corpus" / "conformance.yaml"))
    # One case per component and family: the oracle answers the reference side of all of them,
    # and the candidate side where it calls none of our functions (verl's own micro-batch split).
    chosen = list({(c.component, c.family): c for c in cases}.values())
    asked_oracle = _AskedOracle()
    references = OracleReferences(asked_oracle)
    try:
        for case in chosen:
            result = run_case(case, reference=references, candidate=references.candidate)
            assert result.passed, (case.id, result.message)
    finally:
        asked_oracle.oracle.close()
    by_key = {answer_key_of(c, PINNED_VERSION): c.id for c in chosen}
    asked = {by_key[key] for key in asked_oracle.asked}
    assert any(c.id in asked and not c.family.startswith("ours-") for c in chosen)
    ours = [c.id for c in chosen if c.family.startswith("ours-")]
    assert ours and not asked & set(ours), "a reference built from our own functions stays here"


@needs_verl
def test_the_oracle_serves_only_this_packages_modules() -> None:
    oracle = UpstreamOracle(served=("json",), release=PINNED_VERSION)
    try:
        with pytest.raises(RuntimeError, match="not a module of pytest_verl_compat"):
            oracle.answer("x", {"kind": "conformance"}, timeout=120)
    finally:
        oracle.close()
