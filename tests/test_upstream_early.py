"""Upstream's own config-only checks, run early (issue 16, items 2 and 5).

Every phase has a configuration where upstream's check fires (its message quoted, its file:line
in the installed verl holding an ``assert`` or a ``raise``) and a near-identical one where it does
not; the answers are cached per (verl version, tree, mapping); a foreign ``_target_`` is never
instantiated.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from corpus_facts import (
    PINNED_VERSION,
    needs_release,
    release_ready,
    release_root,
    skip_unless_built,
)
from hostile_canary import Canary

from pytest_verl_compat.checks import CHECKS
from pytest_verl_compat.model import Finding, StageFailed, StageUnavailable
from pytest_verl_compat.pipeline.answers import CHECKS as CHECK_ANSWERS
from pytest_verl_compat.pipeline.answers import UserAnswers
from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
from pytest_verl_compat.releases.index import load_release_index
from pytest_verl_compat.upstream.oracle.client import UpstreamOracle, checks_request
from pytest_verl_compat.upstream.verdict.case import upstream_question
from pytest_verl_compat.upstream.verdict.early import (
    STATIC_EQUIVALENT_MESSAGES,
    STATIC_EQUIVALENTS,
    ChecksQuestion,
    EarlyAnswer,
    UpstreamFailure,
    cache_key,
    checked_entry,
    covered_static_findings,
    early_answer,
    lines_in,
    shipped_statement_lines,
)

needs_verl = needs_release()

ARR = "actor_rollout_ref"
# Static micro-batches that divide everything of the grpo case (8 GPUs, 1024 prompts × n=5).
STATIC = {
    f"{ARR}.actor.use_dynamic_bsz": False,
    f"{ARR}.rollout.log_prob_use_dynamic_bsz": False,
    f"{ARR}.ref.log_prob_use_dynamic_bsz": False,
    f"{ARR}.actor.ppo_micro_batch_size_per_gpu": 4,
    f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu": 8,
    f"{ARR}.ref.log_prob_micro_batch_size_per_gpu": 8,
}
# One GPU, one prompt per response: a batch of 12 rows, the last mini-batch of 8 is short.
SMALL = {
    "trainer.n_gpus_per_node": 1,
    f"{ARR}.rollout.tensor_model_parallel_size": 1,
    f"{ARR}.rollout.n": 1,
    "data.train_batch_size": 12,
}

REWARD_MODEL = {"reward.reward_model.enable": True, "reward.reward_model.rollout.name": "vllm"}
# On-policy distillation with a top-k loss (the census's variant): the update's
# distillation_use_topk is set (trainer_base.py:1679-1683).
TOPK_DISTILLATION = {
    "distillation.enabled": True,
    "distillation.n_gpus_per_node": 8,
    "distillation.nnodes": 1,
    "distillation.teacher_models.teacher_model.model_path": "/home/verl/teacher",
    "distillation.teacher_models.teacher_model.key": "gsm8k",
    "distillation.teacher_models.teacher_model.num_replicas": 4,
    "distillation.distillation_loss.loss_mode": "forward_kl_topk",
}


@pytest.fixture(scope="module")
def session(upstream_session: AuditSession) -> AuditSession:
    return upstream_session


@pytest.fixture(scope="module")
def grpo(session: AuditSession) -> dict[str, Any]:
    return session.outcome(session.manifest.case("grpo")).composition.mapping  # type: ignore[union-attr]


def edited(mapping: Mapping[str, Any], edits: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(mapping))
    for dotted, value in edits.items():
        node = out
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return out


def ask(oracle: UpstreamOracle, mapping: Mapping[str, Any]) -> EarlyAnswer:
    key = json.dumps(mapping, sort_keys=True)
    raw = oracle.answer(key, checks_request(mapping))
    assert "verdict" in raw, raw
    return EarlyAnswer.from_json(raw)


def upstream_line(where: str) -> str:
    path, _, line = where.rpartition(":")
    lines = (release_root() / path).read_text(encoding="utf-8").splitlines()
    return lines[int(line) - 1]


# (phase prefix, upstream file, words of upstream's message, the edits that make it fire, the
# near-identical edits where it must not)
PHASES = {
    "trainer-start": (
        "trainer start: validate_config",
        "verl/utils/config.py",
        "validation gen temperature should be greater than 0",
        {f"{ARR}.rollout.val_kwargs.do_sample": True, f"{ARR}.rollout.temperature": 0},
        {f"{ARR}.rollout.val_kwargs.do_sample": True, f"{ARR}.rollout.temperature": 0.7},
    ),
    "config-load": (
        "config load: RolloutConfig.__post_init__ (worker start: ActorRolloutRefWorker.init_model)",
        "verl/workers/config/rollout.py",
        "ValueError: Rollout mode 'sync' has been removed",
        {f"{ARR}.rollout.mode": "sync"},
        {f"{ARR}.rollout.mode": "async"},
    ),
    "reward-model": (
        "config load: RolloutConfig.__post_init__ (worker start: RolloutReplica.__init__ "
        "(reward model))",
        "verl/workers/config/rollout.py",
        "ValueError: Rollout mode 'sync' has been removed",
        {**REWARD_MODEL, "reward.reward_model.rollout.mode": "sync"},
        {**REWARD_MODEL, "reward.reward_model.rollout.mode": "async"},
    ),
    "worker-start": (
        "worker start: ActorRolloutRefWorker.init_model",
        "verl/workers/engine_workers.py",
        "AssertionError",
        {**STATIC, f"{ARR}.rollout.log_prob_use_dynamic_bsz": True},
        STATIC,
    ),
    "train-mini-batch": (
        "first update: TrainingWorker.train_mini_batch (actor)",
        "verl/workers/engine_workers.py",
        "Got mini_batch_size=20 and self.engine.get_data_parallel_size()=8",
        {f"{ARR}.actor.ppo_mini_batch_size": 4},
        {f"{ARR}.actor.ppo_mini_batch_size": 8},
    ),
    "micro-batches": (
        "first update: TrainingWorker.train_mini_batch (actor)",
        "verl/workers/engine/utils.py",
        "data size must be divisible by force_group_size * micro_batch_size_per_gpu",
        {**STATIC, f"{ARR}.actor.ppo_micro_batch_size_per_gpu": 3},
        STATIC,
    ),
    "log-prob-micro-batches": (
        "first step: TrainingWorker.infer_batch (actor)",
        "verl/workers/engine/utils.py",
        "data size must be divisible by force_group_size * micro_batch_size_per_gpu",
        {**STATIC, f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu": 7},
        STATIC,
    ),
    # PPOTrainer.step splits the batch over parameter_sync_step (trainer_base.py:509-515).
    "parameter-sync-step": (
        "first step: PPOTrainer.step",
        "verl/trainer/ppo/v1/trainer_base.py",
        "must be divisible by parameter_sync_step (3)",
        {"trainer.v1.sync.parameter_sync_step": 3},
        {"trainer.v1.sync.parameter_sync_step": 4},
    ),
    # Its first batch is whole gen_batch_size fetches (_next_train_batch, trainer_base.py:1328-1340).
    "gen-batch-size": (
        "first step: PPOTrainer.step",
        "verl/trainer/ppo/v1/trainer_base.py",
        "must be a positive multiple of gen_batch_size (96)",
        {"data.gen_batch_size": 96},
        {"data.gen_batch_size": 256},
    ),
    # A rollout replica's GPUs fill whole nodes (RolloutReplica.__init__, replica.py:107-116):
    # 12 GPUs per replica on 8-GPU nodes.
    "rollout-replica-nodes": (
        "trainer init: LLMServerManager.create",
        "verl/workers/rollout/replica.py",
        "world_size 12 must be divisible by gpus_per_node 8",
        {"trainer.nnodes": 3, f"{ARR}.rollout.tensor_model_parallel_size": 12},
        {"trainer.nnodes": 3, f"{ARR}.rollout.tensor_model_parallel_size": 8},
    ),
    # compute_topk_loss knows the fsdp, veomni and megatron strategies, not fsdp2
    # (trainer/distillation/losses.py:137-148).
    "topk-distillation-strategy": (
        "first update: the top-k distillation loss in the logits processor (actor)",
        "verl/trainer/distillation/losses.py",
        "Unsupported strategy: config.strategy='fsdp2'",
        {**TOPK_DISTILLATION, f"{ARR}.actor.strategy": "fsdp2"},
        {**TOPK_DISTILLATION, f"{ARR}.actor.strategy": "fsdp"},
    ),
}


@needs_verl
@pytest.mark.parametrize("name", sorted(PHASES))
def test_upstream_check_fires_at_its_phase_and_not_on_the_valid_twin(
    name: str, oracle: UpstreamOracle, grpo: dict[str, Any]
) -> None:
    phase, upstream_file, words, bad_edits, good_edits = PHASES[name]
    bad = ask(oracle, edited(grpo, bad_edits))
    fired = [f for f in bad.failures if f.phase.startswith(phase) and words in f.message]
    assert fired, f"failures={bad.failures}, but should include {phase!r} with {words!r}"
    failure = fired[0]
    assert failure.where.startswith(upstream_file + ":"), failure
    line = upstream_line(failure.where)
    assert "assert" in line or "raise" in line, (failure.where, line)
    # The failure names the configuration keys that decided it, among them one the edit set.
    assert set(failure.keys) & set(bad_edits), failure.keys
    good = ask(oracle, edited(grpo, good_edits))
    assert not [f for f in good.failures if f.phase.startswith(phase)], good.failures


MEGATRON_EXAMPLE = "examples/gpg_trainer/run_qwen3_8b_megatron"
MEGATRON = f"{ARR}.actor.megatron"
PER_TOKEN_LOSS = {f"{MEGATRON}.override_transformer_config.calculate_per_token_loss": True}
# The Megatron engine's own checks of a micro-batch (verl/workers/engine/megatron/transformer_impl.py),
# on verl's Megatron GPG example: (phase prefix, words, fires, valid twin).
MEGATRON_PHASES = {
    # forward_step: pad_to_length with router replay (:1243-1252).
    "pad-to-length-router-replay": (
        "first step: MegatronEngine.forward_step (actor",
        "pad_to_length is not supported with router replay",
        {f"{MEGATRON}.pad_to_length": True, f"{MEGATRON}.router_replay.mode": "R2"},
        {f"{MEGATRON}.router_replay.mode": "R2"},
    ),
    # forward_step: pad_to_length with the update's top-k distillation (:1243-1250).
    "pad-to-length-topk-distillation": (
        "first step: MegatronEngine.forward_step (actor, train_batch)",
        "pad_to_length is not supported with top-K distillation",
        {**TOPK_DISTILLATION, f"{MEGATRON}.pad_to_length": True},
        TOPK_DISTILLATION,
    ),
    # postprocess_micro_batch_func under calculate_per_token_loss (:1440-1455).
    "per-token-loss-seq-mean-token-mean": (
        "first update: MegatronEngine.postprocess_micro_batch_func (actor)",
        "loss_agg_mode='seq-mean-token-mean' is incompatible with calculate_per_token_loss=True",
        {**PER_TOKEN_LOSS, f"{ARR}.actor.loss_agg_mode": "seq-mean-token-mean"},
        {**PER_TOKEN_LOSS, f"{ARR}.actor.loss_agg_mode": "token-mean"},
    ),
    # ... and without remove-padding (BSHD, :1456-1463).
    "per-token-loss-bshd": (
        "first update: MegatronEngine.postprocess_micro_batch_func (actor)",
        "calculate_per_token_loss=True requires use_remove_padding=True",
        {**PER_TOKEN_LOSS, f"{ARR}.model.use_remove_padding": False},
        {**PER_TOKEN_LOSS, f"{ARR}.model.use_remove_padding": True},
    ),
}


@pytest.fixture(scope="module")
def megatron(session: AuditSession) -> dict[str, Any]:
    from pytest_verl_compat.pipeline.manifest import default_examples_path, load_examples

    assert session.manifest is not None
    examples = load_examples(default_examples_path(), session.manifest.bindings)
    case = next(case for case in examples if case.id == MEGATRON_EXAMPLE)
    return session.outcome(case).composition.mapping


@needs_verl
@pytest.mark.parametrize("name", sorted(MEGATRON_PHASES))
def test_megatron_engine_check_fires_on_its_batch_and_not_on_the_valid_twin(
    name: str, oracle: UpstreamOracle, megatron: dict[str, Any]
) -> None:
    phase, words, bad_edits, good_edits = MEGATRON_PHASES[name]
    bad = ask(oracle, edited(megatron, bad_edits))
    fired = [f for f in bad.failures if f.phase.startswith(phase) and words in f.message]
    assert fired, f"failures={bad.failures}, but should include {phase!r} with {words!r}"
    failure = fired[0]
    assert failure.where.startswith("verl/workers/engine/megatron/transformer_impl.py:"), failure
    assert "raise" in upstream_line(failure.where), failure.where
    assert set(failure.keys) & set(bad_edits), failure.keys
    good = ask(oracle, edited(megatron, good_edits))
    assert not [f for f in good.failures if f.phase.startswith(phase)], good.failures
    # The steps stop at the first tensor the rollout would fill: the probe's limit, not a finding.
    assert any("MegatronEngine" in step["step"] for step in good.not_evaluated), good


# A Megatron layout that does not divide the world: megatron.core's initialize_model_parallel
# refuses it when the actor's engine starts (transformer_impl.py:272-282), unless an earlier
# configuration left the parallel state initialised (:245-257).
BAD_LAYOUT = {f"{MEGATRON}.tensor_model_parallel_size": 3}


@needs_verl
def test_an_answer_does_not_depend_on_the_questions_the_worker_answered_before(
    megatron: dict[str, Any],
) -> None:
    """One worker asked the bad layout, then its valid twin, then the bad layout again: the same
    failures both times (upstream's parallel state is cleared after each configuration,
    probes/patching.py LIBRARY_TEARDOWNS)."""
    oracle = UpstreamOracle(
        workers=1, release=PINNED_VERSION
    )  # one worker: every question meets the one before
    bad = edited(megatron, BAD_LAYOUT)
    try:
        first = oracle.answer("bad-first", checks_request(bad))
        valid = oracle.answer("valid", checks_request(megatron))
        again = oracle.answer("bad-again", checks_request(bad))
    finally:
        oracle.close()
    layout = [
        f
        for f in EarlyAnswer.from_json(first).failures
        if "initialize_model_parallel" in f.message or "divisible" in f.message
    ]
    assert layout, EarlyAnswer.from_json(first).failures
    assert not EarlyAnswer.from_json(valid).failures, valid
    assert again == first


@needs_verl
def test_v1_pads_the_batch_so_make_iterator_passes(
    oracle: UpstreamOracle, grpo: dict[str, Any]
) -> None:
    """trainer_base.py _get_required_batch_multiple: V1 pads 12 rows to 16, two mini-batches of 8."""
    answer = ask(oracle, edited(grpo, {**SMALL, f"{ARR}.actor.ppo_mini_batch_size": 8}))
    assert not [f for f in answer.failures if "make_iterator" in f.phase], answer.failures


# verl refuses a vLLM LoRA rank above vLLM's largest (get_vllm_max_lora_rank, called by
# validate_config: verl/utils/config.py:190-200@0.9.0, :205-215@0.9.1); the vLLM module it imports
# is stood in for, and the stand-in's rule must be a finding, not the sandbox's stop.
LORA_RANK = f"{ARR}.model.lora_rank"
VLLM_RANK_FIRES = {
    "lora_rank": {LORA_RANK: 1024},
    "lora.rank": {f"{ARR}.model.lora.rank": 513},
}
VLLM_RANK_TWINS = {
    "largest": {LORA_RANK: 512},
    "rounded up": {LORA_RANK: 48},
    "merged": {LORA_RANK: 1024, f"{ARR}.model.lora.merge": True},
    "sglang": {LORA_RANK: 1024, f"{ARR}.rollout.name": "sglang"},
}


@pytest.mark.parametrize("version", ["0.9.0", "0.9.1"])
def test_the_stand_ins_vllm_lora_ranks_are_verls_own_list(version: str) -> None:
    """The stand-in applies the ranks each release's get_vllm_max_lora_rank falls back to
    (vLLM 0.18.0's and 0.24.0's MaxLoRARanks are the same list)."""
    import ast

    from pytest_verl_compat.checks.upstream_names import VLLM_LORA_RANKS

    skip_unless_built(version)
    path = release_root(version) / "verl/workers/rollout/vllm_rollout/utils.py"
    function = next(
        node
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef) and node.name == "get_vllm_max_lora_rank"
    )
    literal = next(
        node.slice
        for node in ast.walk(function)
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", "") == "Literal"
    )
    assert tuple(ast.literal_eval(literal)) == VLLM_LORA_RANKS


@needs_verl
@pytest.mark.parametrize("name", sorted(VLLM_RANK_FIRES))
def test_a_vllm_lora_rank_above_vllms_largest_fails_validate_config(
    name: str, oracle: UpstreamOracle, grpo: dict[str, Any]
) -> None:
    edits = VLLM_RANK_FIRES[name]
    answer = ask(oracle, edited(grpo, edits))
    assert answer.verdict == "fails", answer
    fired = [
        f for f in answer.failures if "lora_rank must be less than or equal to 512" in f.message
    ]
    assert fired, answer.failures
    assert fired[0].where.startswith("verl/utils/config.py:"), fired[0]
    assert "get_vllm_max_lora_rank(lora_rank)" in upstream_line(fired[0].where)
    assert set(fired[0].keys) & set(edits), fired[0].keys
    assert not answer.notes, answer.notes  # not filed as the sandbox's


@needs_verl
@pytest.mark.parametrize("name", sorted(VLLM_RANK_TWINS))
def test_a_vllm_lora_rank_verl_accepts_passes_validate_config(
    name: str, oracle: UpstreamOracle, grpo: dict[str, Any]
) -> None:
    answer = ask(oracle, edited(grpo, VLLM_RANK_TWINS[name]))
    assert not [f for f in answer.failures if "lora_rank" in f.message], answer.failures
    assert not [n for n in answer.notes if "lora" in str(n)], answer.notes


@needs_verl
def test_the_grpo_case_passes_every_early_check(
    oracle: UpstreamOracle, grpo: dict[str, Any]
) -> None:
    answer = ask(oracle, grpo)
    assert answer.verdict == "passes" and answer.failures == (), answer


@needs_verl
def test_a_foreign_target_is_never_instantiated(oracle: UpstreamOracle, canary: Canary) -> None:
    payload = {"_target_": "os.system", "_args_": [canary.payload]}
    for mapping in (
        {"pwn": payload},
        {ARR: {"rollout": {"checkpoint_engine": payload}}},
    ):
        answer = oracle.answer(json.dumps(mapping), checks_request(mapping))
        assert answer["verdict"] == "refused" and answer["failures"] == [], answer
        assert "_target_='os.system'" in answer["message"]
    assert not canary.fired()


def test_every_static_equivalent_names_a_registered_check_and_a_real_statement() -> None:
    from pytest_verl_compat.upstream.verdict.early import statement_lines

    for version in load_release_index().supported_versions:
        root = release_root(version)
        for check_id, statements in STATIC_EQUIVALENTS.items():
            assert check_id in CHECKS
            for relative, statement, *function in statements:
                found = statement_lines(root, relative, statement, *function)
                assert found, (version, relative, statement, function)
    assert set(STATIC_EQUIVALENT_MESSAGES) <= set(CHECKS)


DYNAMIC_AGREES = (
    "assert self.config.actor.use_dynamic_bsz == self.config.rollout.log_prob_use_dynamic_bsz"
)


def test_a_static_finding_is_left_out_only_for_upstreams_statement_at_the_same_section() -> None:
    if not release_ready():
        pytest.skip("verl is not installed")
    where = _where("verl/workers/engine_workers.py", DYNAMIC_AGREES)
    keys = (f"{ARR}.actor.use_dynamic_bsz", f"{ARR}.rollout.log_prob_use_dynamic_bsz")
    same = UpstreamFailure("worker start: x", "AssertionError", where, DYNAMIC_AGREES, keys=keys)
    other_line = UpstreamFailure("worker start: x", "AssertionError", where + "0", "", keys=keys)
    elsewhere = UpstreamFailure("worker start: x", "AssertionError", where, "", keys=("data.x",))
    static = Finding("error", ", ".join(keys), "m", check="worker.dynamic-batch-disagrees")
    unrelated = Finding("error", keys[0], "m", check="batch.padded-step")

    def covered(*failures: UpstreamFailure) -> list[Finding]:
        answer = EarlyAnswer("passes", "", failures)
        return covered_static_findings(
            answer, [static, unrelated], lambda f: f.keys, lines_in(release_root())
        )

    assert covered(same) == [static]
    assert covered(other_line) == [] and covered(elsewhere) == []
    # The shipped lines answer as the files do.
    shipped = shipped_statement_lines(PINNED_VERSION)
    assert shipped is not None
    answer = EarlyAnswer("passes", "", (same,))
    assert covered_static_findings(answer, [static, unrelated], lambda f: f.keys, shipped) == [
        static
    ]


@pytest.mark.parametrize("version", load_release_index().supported_versions)
def test_the_shipped_statement_lines_are_the_releases_own(version: str) -> None:
    """data/releases/VERSION/statement_lines.json equals the statements' lines in the release's
    files (else: ``verl-compat release derive VERSION --only statements``)."""
    import json

    from pytest_verl_compat.upstream.verdict.early import shipped_statements_path, statement_table

    root = release_root(version)
    shipped = shipped_statements_path(version).read_text()
    assert json.loads(shipped) == statement_table(root), "stale: release derive --only statements"
    assert all(row["lines"] for row in statement_table(root)), "a statement the release lacks"


# --- the cache -----------------------------------------------------------------------------


class CountingOracle:
    """Stands for the oracle process: answers one fixed failure and counts the questions."""

    def __init__(self) -> None:
        self.asked = 0

    def answer(self, key: str, request: Mapping[str, Any]) -> dict[str, Any]:
        self.asked += 1
        failure = {
            "phase": "worker start: ActorRolloutRefWorker.init_model",
            "message": "AssertionError",
            "where": "verl/workers/engine_workers.py:610",
            "source": DYNAMIC_AGREES,
            "stand_in": "",
            "check": "PPOTrainer._setup",
            "keys": [f"{ARR}.actor.use_dynamic_bsz"],
        }
        return {"verdict": "passes", "message": "", "failures": [failure]}

    def close(self) -> None:
        pass


SESSION = SimpleNamespace(pin=SimpleNamespace(version="0.9.0"))


def test_cache_cold_then_warm_and_a_corrupt_entry_is_a_miss(tmp_path: Path) -> None:
    cache, oracle, mapping = (
        UserAnswers(CHECK_ANSWERS, tmp_path, checked_entry),
        CountingOracle(),
        {"a": 1},
    )
    cold = early_answer(SESSION, ChecksQuestion(mapping), "tree", cache, oracle)  # type: ignore[arg-type]
    warm = early_answer(SESSION, ChecksQuestion(mapping), "tree", cache, oracle)  # type: ignore[arg-type]
    assert (cold.cached, warm.cached, oracle.asked) == (False, True, 1)
    assert warm.failures == cold.failures and warm.failures[0].where.endswith(":610")
    entry = tmp_path / f"{cache_key('0.9.0', 'tree', mapping)}.json"
    assert entry.is_file() and not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]
    for corrupt in (b"{not json", b'{"verdict": 1}', b"[]", b" " * (2 << 20)):
        entry.write_bytes(corrupt)
        again = early_answer(SESSION, ChecksQuestion(mapping), "tree", cache, oracle)  # type: ignore[arg-type]
        assert not again.cached and again.failures == cold.failures
    assert oracle.asked == 5
    # A FIFO or a link where the entry should be is a miss, never a read that blocks.
    entry.unlink()
    os.mkfifo(entry)
    assert cache.get(cache_key("0.9.0", "tree", mapping)) is None
    entry.unlink()
    (tmp_path / "elsewhere.json").write_text(json.dumps({"verdict": "passes", "message": ""}))
    entry.symlink_to(tmp_path / "elsewhere.json")
    assert cache.get(cache_key("0.9.0", "tree", mapping)) is None


def test_cache_key_changes_with_the_mapping_the_tree_and_the_version() -> None:
    base = cache_key("0.9.0", "tree", {"a": 1})
    assert base == cache_key("0.9.0", "tree", {"a": 1})
    assert (
        len(
            {
                base,
                cache_key("0.9.0", "tree", {"a": 2}),
                cache_key("0.9.1", "tree", {"a": 1}),
                cache_key("0.9.0", "other", {"a": 1}),
            }
        )
        == 4
    )


def test_an_unwritable_cache_is_only_slower(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    cache, oracle = UserAnswers(CHECK_ANSWERS, blocked / "sub", checked_entry), CountingOracle()
    for _ in range(2):
        assert early_answer(SESSION, ChecksQuestion({"a": 1}), "t", cache, oracle).failures  # type: ignore[arg-type]
    assert oracle.asked == 2


# --- the command ---------------------------------------------------------------------------


def cli(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    import os

    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    return subprocess.run(
        [sys.executable, "-m", "pytest_verl_compat.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )


@needs_verl
def test_check_reports_upstreams_failure_warm_from_the_cache_and_can_skip_it(
    upstream_checkout: Path, tmp_path: Path
) -> None:
    """validate_config asserts a positive temperature for sampled validation (config.py): the
    static finding of the same statement is left out, and comes back with --no-upstream-checks."""
    sampled = (
        *("--upstream", str(upstream_checkout), "check", "grpo"),
        *("--set", f"{ARR}.rollout.val_kwargs.do_sample=True"),
        *("--set", f"{ARR}.rollout.temperature=0"),
    )
    cold = cli(*sampled, cache=tmp_path)
    assert cold.returncode == 1, cold.stderr
    # Each line is located (FILE:LINE[:COL]: ...); what follows is the rule and the message.
    where = _where(
        "verl/utils/config.py", "assert config.actor_rollout_ref.rollout.temperature > 0"
    )
    (line,) = cold.stdout.splitlines()
    assert line.split(": ", 1)[1].startswith(
        f"error[upstream.trainer-start] {ARR}.rollout.temperature, {ARR}.rollout.val_kwargs.do_sample: "
        "AssertionError: validation gen temperature should be greater than 0 when enabling "
        f"do_sample (verl 0.9.0 raises it at trainer start: validate_config, {where}) (change "
    ), line
    assert "valid for verl 0.9.0: no" in cold.stderr
    assert sorted(p.name for p in (tmp_path / "pytest-verl-compat").iterdir()) == [
        "answers",
        "results",
    ]
    warm = cli(*sampled, cache=tmp_path)
    assert (warm.returncode, warm.stdout) == (cold.returncode, cold.stdout)
    static = cli(*sampled, "--no-upstream-checks", cache=tmp_path)
    assert static.returncode == 1 and "upstream's own checks" not in static.stderr
    assert static.stdout.split(": ", 1)[1].startswith(
        "error[validate.sampled-validation-temperature] actor_rollout_ref.rollout.val_kwargs.do_sample, "
    )
    assert "upstream." not in static.stdout and "sampled validation needs" in static.stdout


def _where(relative: str, statement: str) -> str:
    lines = (release_root() / relative).read_text(encoding="utf-8").splitlines()
    line = next(n for n, text in enumerate(lines, 1) if text.strip().startswith(statement))
    return f"{relative}:{line}"


@needs_verl
def test_check_leaves_out_the_static_finding_upstream_repeats(
    upstream_checkout: Path, tmp_path: Path
) -> None:
    edits = [f"{ARR}.actor.use_dynamic_bsz=False", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=4"]
    args = ("--upstream", str(upstream_checkout), "check", "grpo")
    both = cli(*args, *(w for e in edits for w in ("--set", e)), cache=tmp_path)
    assert both.returncode == 1
    assert _where("verl/workers/engine_workers.py", DYNAMIC_AGREES) in both.stdout
    assert "asserts they are equal" not in both.stdout
    static = cli(
        *args, *(w for e in edits for w in ("--set", e)), "--no-upstream-checks", cache=tmp_path
    )
    assert static.returncode == 1 and "asserts they are equal" in static.stdout


def test_check_says_why_upstreams_checks_are_skipped(
    upstream_checkout: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_verl_compat.releases.index import ReleaseError
    from pytest_verl_compat.upstream.oracle import client
    from pytest_verl_compat.upstream.verdict.case import check_case, live_asker

    def offline(version: str) -> None:
        raise ReleaseError(f"cannot fetch the pinned wheels of verl {version} (offline)")

    monkeypatch.setattr(client, "release_interpreter", offline)
    session = AuditSession.start(AuditOptions(upstream=str(upstream_checkout)))
    case = session.manifest.case("grpo")  # type: ignore[union-attr]
    static = check_case(session, case, None)
    result = check_case(session, case, live_asker(session, cache=None))
    assert result.findings == static.findings and result.valid
    assert result.upstream_skipped == (
        f"cannot fetch the pinned wheels of verl {session.pin.version} (offline)"
    )


@needs_verl
def test_an_unknown_dataclass_field_fails_at_the_verl_line_that_instantiates_it(
    oracle: UpstreamOracle, grpo: dict[str, Any]
) -> None:
    """What the SAPO examples do: ``+…policy_loss.tau_pos`` is an ActorConfig field, not a
    PolicyLossConfig one, so validate_config's omega_conf_to_dataclass raises a TypeError."""
    mapping = copy.deepcopy(grpo)
    mapping[ARR]["actor"]["policy_loss"]["tau_pos"] = 1.0
    answer = ask(oracle, mapping)
    fired = [f for f in answer.failures if "unexpected keyword argument 'tau_pos'" in f.message]
    assert fired and fired[0].phase == "trainer start: validate_config", answer.failures
    assert fired[0].message.startswith("TypeError: PolicyLossConfig.__init__()")
    assert "instantiate(" in upstream_line(fired[0].where)
    assert answer.verdict == "fails"


# The examples whose configuration upstream's own early checks reject, and where. Every other
# composed example passes every early check.
CONFIG_LOAD = ("upstream.config-load", "verl/workers/config/rollout.py")
FIRST_UPDATE = ("upstream.first-update", "verl/workers/engine/utils.py")
TRAINER_START = ("upstream.trainer-start", "verl/utils/config.py")
# V1's _compute_advantage hands the estimator only the fields it selects (trainer_base.py:1590):
# no prompts for GDPO, no sum_pi_squared for OTB, no reward_baselines for ReMax.
FIRST_STEP = ("upstream.first-step", "verl/trainer/ppo/ray_trainer.py")
EXAMPLE_FAILURES = {
    "examples/gdpo_trainer/run_qwen3_8b_fsdp": (
        "upstream.first-step",
        "verl/trainer/ppo/core_algos.py",
    ),
    "examples/otb_trainer/run_qwen3_8b_fsdp": FIRST_STEP,
    "examples/remax_trainer/run_qwen3_8b_fsdp": FIRST_STEP,
    "examples/grpo_trainer/run_qwen3_235b_a22b_megatron": CONFIG_LOAD,
    "examples/grpo_trainer/run_qwen3_30b_a3b_megatron": CONFIG_LOAD,
    "examples/rollout_correction/run_qwen2_5_7b_fsdp": FIRST_UPDATE,
    "examples/rollout_correction/run_qwen2_5_7b_fsdp_multi_rs": FIRST_UPDATE,
    "examples/sapo_trainer/run_qwen3_30b_a3b_fsdp": TRAINER_START,
    "examples/sapo_trainer/run_qwen3_8b_fsdp": TRAINER_START,
}


@needs_verl
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:provider=hydra.searchpath")  # Megatron-Lite's own search path
def test_upstreams_early_checks_on_every_composed_example(
    example_answers: Path, session: AuditSession
) -> None:
    """Each composed example's first upstream failure, as ``check`` asks and reads it (the run's
    shared answers: ``example_answers`` asked verl once for every example)."""
    from pytest_verl_compat.pipeline.manifest import (
        default_examples_path,
        default_manifest_path,
        load_examples,
        load_manifest,
    )
    from pytest_verl_compat.upstream.verdict.case import many_asker

    cases = load_examples(default_examples_path(), load_manifest(default_manifest_path()).bindings)
    questions = {}
    for case in cases:
        try:
            composition = session.outcome(case).composition
        except (StageFailed, StageUnavailable):
            continue  # not read (the script exits before its launcher): upstream never sees it
        if not composition.composed:
            continue
        # Asked as check asks it: main_ppo's probes or the SFT trainer's, by the launch.
        question = upstream_question(session, case)
        if isinstance(question, str):
            continue
        questions[case.id] = (case, question)
    assert len(questions) > 80
    ask, close = many_asker(session, [case for case, _ in questions.values()])
    assert ask is not None
    found = {}
    try:
        for case_id, (_, question) in questions.items():
            answer = ask(question)
            assert isinstance(answer, EarlyAnswer), f"{case_id}: {answer}"
            if answer.failures:
                failure = answer.failures[0]
                found[case_id] = (failure.check_id, failure.where.split(":")[0])
    finally:
        close()
    assert found == EXAMPLE_FAILURES
