"""Run conformance of the sampling leaves (issue 46): each case of
corpus/run_conformance/sampling.yaml, on the grpo case with its ``sets`` applied, gives the same
result in the reference trainer as in verl 0.9.0, and each leaf it sets changes upstream's result.

The result of a configuration:

- **train** and **validate**: what a batch's prompts are sampled with: the responses per prompt,
  the agent loop, and how each token is drawn (greedy, or a temperature with the top-k and top-p
  filters that act). Upstream's is what its V1 agent loop sends to the rollout server
  (``probes/sampling_run.py``), read with vLLM's documented semantics: a temperature below
  ``_SAMPLING_EPS`` (1e-5) is greedy and ignores top_k and top_p, top_k -1 (or 0) and top_p 1
  disable their filter (https://docs.vllm.ai/en/latest/api/vllm/sampling_params.html). Ours is
  ``generation.sampling_settings``, what the trainer hands ``generate`` for each batch.
- **kept**: of a fixed batch of finished groups (per-response scores), the groups training keeps:
  upstream's replay buffer (``_dapo_filtered_keys``), ours ``batching.group_filter_metric`` and
  ``informative_groups`` as the trainer's rollout calls them; a refusal on either side reads
  ``refused``.

The sampler itself (top_k, top_p on fixed logits) is compared with transformers' own
``TopKLogitsWarper`` and ``TopPLogitsWarper``, the same semantics as vLLM's (vLLM does not install
here).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from corpus_facts import needs_release, release_root
from run_conformance import SandboxQuestions, with_sets
from run_conformance import leaf as value_at

from pytest_verl_compat.upstream.probes import sampling_run as probe
from reference_trainer.reward import SCORE_DTYPE

pytestmark = [needs_release()]

ROOT = Path(__file__).resolve().parents[1]
CASES = yaml.safe_load((ROOT / "corpus" / "run_conformance" / "sampling.yaml").read_text())
BASE_CASE = "grpo"
# vLLM's greedy threshold (``_SAMPLING_EPS``): below it the server ignores top_k and top_p.
VLLM_GREEDY_BELOW = 1e-5
# The finished groups every configuration filters (uid → each response's score): all alike at
# 1, at 0 and at 0.5 (dropped when filtering), mixed (kept), a single response (kept: a group of
# one is never filtered, replay_buffer.py:295), and three at 0.1 (kept: their float64 std is
# about 1e-17, not 0).
GROUPS: dict[str, list[float]] = {
    "all-one": [1.0, 1.0, 1.0, 1.0],
    "all-zero": [0.0, 0.0, 0.0, 0.0],
    "all-half": [0.5, 0.5, 0.5, 0.5],
    "mixed": [0.0, 1.0, 0.25, 1.0],
    "single": [1.0],
    "all-tenth": [0.1, 0.1, 0.1],
}
REFUSED = "refused"


# --- configurations ------------------------------------------------------------------------


def _base() -> dict[str, Any]:
    from pytest_verl_compat.pipeline.manifest import embedded_root

    golden = embedded_root() / "golden" / "compose" / f"{BASE_CASE}.json"
    return dict(json.loads(golden.read_text())["resolved"])


def _defaults() -> dict[str, Any]:
    """verl 0.9.0's default configuration (its generated ppo_trainer tree)."""
    path = release_root() / "verl" / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    return dict(yaml.safe_load(path.read_text()))


# --- upstream's side ----------------------------------------------------------------------


class Upstream(SandboxQuestions):
    """The oracle answering ``sampling_run`` questions, each distinct mapping once."""

    def __init__(self, release: str) -> None:
        super().__init__((probe.__name__,), release, prefix="sampling-")

    @staticmethod
    def request(mapping: Mapping[str, Any]) -> dict[str, Any]:
        return {"kind": probe.KIND, probe.KEY_MAPPING: dict(mapping), probe.KEY_GROUPS: GROUPS}

    def result(self, mapping: Mapping[str, Any]) -> dict[str, Any]:
        answer = self.ask(self.request(mapping))
        if probe.TRAIN not in answer:
            raise RuntimeError(f"no sampling answer: {answer.get('error', answer)}")
        return {
            probe.TRAIN: _upstream_batch(answer[probe.TRAIN]),
            probe.VALIDATE: _upstream_batch(answer[probe.VALIDATE]),
            probe.KEPT: REFUSED if probe.KEY_ERROR in answer[probe.KEPT] else answer[probe.KEPT],
        }


def _drawn(greedy: bool, temperature: float, top_k: int, top_p: float) -> Any:
    """How a token is drawn, with only the settings that act."""
    if greedy:
        return "greedy"
    return {
        "temperature": float(temperature),
        "top_k": int(top_k) if int(top_k) > 0 else None,
        "top_p": float(top_p) if float(top_p) < 1.0 else None,
    }


def _upstream_batch(prompts: Any) -> Any:
    """One batch's sampling, read with vLLM's semantics; every prompt must agree."""
    if probe.KEY_ERROR in prompts:
        return prompts
    seen = set()
    for sessions in prompts.values():
        sent = sessions[probe.SESSIONS]
        names = {tuple(session[probe.REGISTERED_AS]) for session in sent}
        params = {json.dumps(session[probe.SAMPLING_PARAMS], sort_keys=True) for session in sent}
        assert len(names) == 1 and len(params) == 1, sessions  # every session alike
        p = json.loads(params.pop())
        drawn = _drawn(
            p["temperature"] < VLLM_GREEDY_BELOW, p["temperature"], p["top_k"], p["top_p"]
        )
        seen.add(json.dumps({"n": len(sent), "agent loop": list(names.pop()), "drawn": drawn}))
    assert len(seen) == 1, seen
    return json.loads(seen.pop())


@pytest.fixture(scope="module")
def upstream(upstream_session: Any) -> Iterator[Upstream]:
    """Every case's questions submitted at once: the oracle works while the first is judged."""
    served = Upstream(upstream_session.version)
    base = _base()
    defaults = _defaults()
    try:
        for case in CASES:
            mapping = with_sets(base, case["sets"])
            served.submit(served.request(mapping))
            for leaf in case["sets"]:
                served.submit(served.request(with_sets(mapping, {leaf: value_at(defaults, leaf)})))
        yield served
    finally:
        served.close()


# --- ours ---------------------------------------------------------------------------------


def ours(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """The reference trainer's result on the configuration: the compiler's verdict, the sampling
    the trainer hands ``generate`` for each batch, and the groups its rollout keeps."""
    from pytest_verl_compat.pipeline.compile import compile_resolved
    from pytest_verl_compat.pipeline.lower import reference_config
    from pytest_verl_compat.pipeline.profile import load_profile
    from reference_trainer import generation

    report = compile_resolved(dict(mapping), case_id=f"{BASE_CASE}+run", profile=load_profile())
    if not report.accepted:
        return {REFUSED: str(report.reason)}
    cfg = reference_config(mapping, report)

    def batch(validate: bool) -> dict[str, Any]:
        settings = generation.sampling_settings(cfg.rollout, validate=validate)
        drawn = _drawn(settings.greedy, settings.temperature, settings.top_k, settings.top_p)
        return {"n": settings.n, "agent loop": [generation.AGENT_LOOP], "drawn": drawn}

    return {probe.TRAIN: batch(False), probe.VALIDATE: batch(True), probe.KEPT: _kept(cfg)}


def _kept(cfg: Any) -> Any:
    from reference_trainer import batching

    try:
        metric = batching.group_filter_metric(cfg.algorithm)
    except ValueError:
        return REFUSED
    if metric is None:
        return sorted(GROUPS)
    uids = np.array([uid for uid, scores in GROUPS.items() for _ in scores])
    # The score tensor as the trainer's score phase stores it (reward.score_batch).
    scores = torch.tensor([s for values in GROUPS.values() for s in values], dtype=SCORE_DTYPE)
    rows, _ = batching.informative_groups(uids, scores)
    return sorted({str(uids[row]) for row in rows})


# --- the cases ----------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_case_matches_upstream_and_each_leaf_changes_it(
    case: dict[str, Any], upstream: Upstream
) -> None:
    mapping = with_sets(_base(), case["sets"])
    theirs = upstream.result(mapping)
    mine = ours(mapping)
    if case.get("ours_refuses"):
        assert REFUSED in mine, f"ours={mine}, but should be refused [{case['id']}]"
        unnamed = [leaf for leaf in case["sets"] if leaf not in mine[REFUSED]]
        assert not unnamed, f"refusal={mine[REFUSED]!r}, but should name {unnamed} [{case['id']}]"
    else:
        assert mine == theirs, f"ours={mine}, but should be upstream's {theirs} [{case['id']}]"
    defaults = _defaults()
    for leaf in case["sets"]:
        at_default = upstream.result(with_sets(mapping, {leaf: value_at(defaults, leaf)}))
        if case.get("no_effect"):
            assert at_default == theirs, (
                f"upstream at {leaf}'s default={at_default}, but should be {theirs} "
                f"(no effect: {case['no_effect']}) [{case['id']}]"
            )
        else:
            assert at_default != theirs, (
                f"upstream at {leaf}'s default={at_default}, but should differ from the "
                f"case's [{case['id']}]"
            )


def test_every_leaf_of_the_area_is_set_off_its_default() -> None:
    area = {
        f"actor_rollout_ref.rollout.{leaf}"
        for leaf in (
            "do_sample",
            "top_k",
            "top_p",
            *(f"val_kwargs.{k}" for k in ("do_sample", "n", "temperature", "top_k", "top_p")),
            "agent.default_agent_loop",
        )
    } | {"algorithm.filter_groups.enable", "algorithm.filter_groups.metric"}
    defaults = _defaults()
    set_off = {
        leaf
        for case in CASES
        for leaf, value in case["sets"].items()
        if value != value_at(defaults, leaf)
    }
    assert CASES, "corpus/run_conformance/sampling.yaml lists no case"
    assert area <= set_off, (
        f"leaves set off their default={sorted(set_off)}, but should hold {sorted(area - set_off)}"
    )
    ids = [case["id"] for case in CASES]
    assert len(set(ids)) == len(ids), f"case ids={ids}, but should be unique"


def test_a_metric_the_trajectories_lack_is_refused_on_both_sides(upstream: Upstream) -> None:
    """A scorer's one float reaches the replay buffer as ``acc`` only: upstream refuses the
    groups for any other metric (replay_buffer.py:288-291), and so does ours; its twin ``acc``
    is kept by both."""
    for metric, refused in (("score", True), ("seq_reward", True), ("acc", False)):
        mapping = with_sets(
            _base(),
            {"algorithm.filter_groups.enable": True, "algorithm.filter_groups.metric": metric},
        )
        theirs = upstream.result(mapping)[probe.KEPT]
        assert (theirs == REFUSED) is refused, (metric, theirs)
        assert ours(mapping)[probe.KEPT] == theirs, metric


# --- the proof the comparison can fail -------------------------------------------------------


def _ignoring_validation(real: Callable[..., Any]) -> Callable[..., Any]:
    return lambda rollout, *, validate: real(rollout, validate=False)


def _ignoring_top_k(real: Callable[..., Any]) -> Callable[..., Any]:
    import dataclasses

    return lambda rollout, *, validate: dataclasses.replace(
        real(rollout, validate=validate), top_k=-1
    )


@pytest.mark.parametrize(
    ("mutant", "case_id"),
    [(_ignoring_validation, "sampling/validation-sampled"), (_ignoring_top_k, "sampling/top-k")],
    ids=["val-kwargs-ignored", "top-k-ignored"],
)
def test_a_reference_trainer_ignoring_a_leaf_fails_its_case(
    monkeypatch: pytest.MonkeyPatch, upstream: Upstream, mutant: Any, case_id: str
) -> None:
    from reference_trainer import generation

    case = next(case for case in CASES if case["id"] == case_id)
    mapping = with_sets(_base(), case["sets"])
    monkeypatch.setattr(generation, "sampling_settings", mutant(generation.sampling_settings))
    assert ours(mapping) != upstream.result(mapping)


def test_a_reference_trainer_ignoring_filter_groups_fails_its_case(
    monkeypatch: pytest.MonkeyPatch, upstream: Upstream
) -> None:
    from reference_trainer import batching

    case = next(case for case in CASES if case["id"] == "filter/acc")
    mapping = with_sets(_base(), case["sets"])
    monkeypatch.setattr(batching, "group_filter_metric", lambda algorithm: None)
    assert ours(mapping) != upstream.result(mapping)


# --- the sampler's semantics ----------------------------------------------------------------


def _logits() -> torch.Tensor:
    """Rows of fixed logits: spread, peaked, nearly flat, with a tie at the top."""
    generator = torch.Generator().manual_seed(0)
    rows = [
        torch.randn(13, generator=generator) * 2.0,
        torch.randn(13, generator=generator) * 6.0,
        torch.randn(13, generator=generator) * 0.1,
        torch.tensor([3.0, 3.0, 1.0, 0.5, 0.5, -1.0, -2.0, 0.0, 0.2, 2.5, -0.5, 1.5, 1.0]),
    ]
    return torch.stack(rows)


@pytest.mark.parametrize("top_k", [1, 2, 5, 12])
def test_top_k_keeps_what_transformers_keeps(top_k: int) -> None:
    from transformers import TopKLogitsWarper

    from reference_trainer.generation import filter_logits

    logits = _logits()
    expected = TopKLogitsWarper(top_k=top_k)(None, logits.clone())
    assert torch.equal(filter_logits(logits, top_k, 1.0).isinf(), expected.isinf())


@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.5, 0.9, 0.99])
def test_top_p_keeps_what_transformers_keeps(top_p: float) -> None:
    from transformers import TopPLogitsWarper

    from reference_trainer.generation import filter_logits

    logits = _logits()
    expected = TopPLogitsWarper(top_p=top_p)(None, logits.clone())
    assert torch.equal(filter_logits(logits, -1, top_p).isinf(), expected.isinf())


def test_top_k_then_top_p_as_transformers_chains_them() -> None:
    from transformers import LogitsProcessorList, TopKLogitsWarper, TopPLogitsWarper

    from reference_trainer.generation import filter_logits

    logits = _logits()
    chain = LogitsProcessorList([TopKLogitsWarper(top_k=5), TopPLogitsWarper(top_p=0.7)])
    assert torch.equal(filter_logits(logits, 5, 0.7).isinf(), chain(None, logits.clone()).isinf())


@pytest.mark.parametrize(("top_k", "top_p"), [(-1, 1.0), (0, 1.0), (13, 1.0)])
def test_disabled_filters_keep_every_token(top_k: int, top_p: float) -> None:
    """vLLM: top_k -1 (or 0) and top_p 1 disable the filter; a k of the whole vocabulary keeps
    it all."""
    from reference_trainer.generation import filter_logits

    logits = _logits()
    assert torch.equal(filter_logits(logits, top_k, top_p), logits)


@pytest.mark.parametrize(
    ("temperature", "greedy"), [(0.0, True), (5e-6, True), (1e-5, False), (0.7, False)]
)
def test_greedy_exactly_below_vllms_threshold(temperature: float, greedy: bool) -> None:
    """A temperature below 1e-5 is greedy (vLLM's _SAMPLING_EPS), whatever do_sample says."""
    from reference_trainer.generation import SamplingSettings

    assert SamplingSettings(n=1, temperature=temperature, top_k=5, top_p=0.5).greedy is greedy
