"""How the forecast reads an engine's keys where the engines differ.

- Megatron recomputes what ``override_transformer_config`` asks (its engine hands the mapping
  to the Megatron config, verl/workers/engine/megatron/transformer_impl.py:296, :364-365, and
  never reads ``model.enable_gradient_checkpointing``): full recompute keeps layer boundaries,
  the tree's null keeps every layer, whatever the model's flag; the FSDP engine follows the flag.
- The critic's micro-batches follow the release's ``critic_micro_batches`` fact: 0.9.0's V1
  critic runs both passes on ``ppo_infer_max_token_len_per_gpu``; a release whose critic splits
  each pass by its own keys (the legacy dp_critic) takes ``ppo_micro_batch_size_per_gpu`` for
  the update and ``forward_micro_batch_size_per_gpu`` for the values.
- Deferred gradient sync: where the tree has ``use_no_sync_for_gradient_accumulation`` the fix
  turns it off; where it has none (0.9.0 defers always) the fix is a mini-batch in one
  micro-batch, and a run already there gets no larger micro-batch proposed.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from fit_points import launch, merged

from pytest_verl_compat.memory.forecast import forecast
from pytest_verl_compat.memory.gpus import custom_gpu, find_gpu
from pytest_verl_compat.memory.layout import RoleLayout
from pytest_verl_compat.memory.models import from_table
from pytest_verl_compat.memory.parts import Part
from pytest_verl_compat.memory.passes import compute_parts
from pytest_verl_compat.memory.release_facts import (
    CRITIC_MICRO_BATCHES,
    ReleaseFacts,
    release_facts,
)
from pytest_verl_compat.memory.residency import states_of
from pytest_verl_compat.memory.runs import Request, build_layout
from pytest_verl_compat.memory.values import (
    UnreadableRun,
    fraction,
    precision_bytes,
    server_dtype_bytes,
)
from pytest_verl_compat.pipeline.audit import AuditSession

MODEL = "Qwen/Qwen2.5-0.5B"
RECOMPUTE = "actor_rollout_ref.actor.megatron.override_transformer_config"


def _resolved(
    session: AuditSession,
    folder: Path,
    overrides: list[str],
    config_name: str = "",
    model_entry: Mapping[str, Any] | None = None,
) -> Mapping[str, Any]:
    entry = {"id": "reading", "model": MODEL, "gpus": 8, "config_name": config_name}
    entry.update(model_entry or {})
    named = [config_name, str(entry["model"]), *overrides]
    digest = hashlib.sha1("\n".join(named).encode()).hexdigest()[:10]
    script = folder / f"reading-{digest}.sh"
    script.write_text(launch(entry, overrides))
    composition = session.outcome(session.case_for_script(script)).composition
    assert composition.composed, composition.reason
    return composition.mapping


def _role(
    session: AuditSession,
    folder: Path,
    overrides: list[str],
    role: str,
    config_name: str = "",
    facts: ReleaseFacts | None = None,
    model_entry: Mapping[str, Any] | None = None,
) -> RoleLayout:
    resolved = _resolved(session, folder, overrides, config_name, model_entry)
    request = Request(gpu=find_gpu("H100"), facts=facts or release_facts(session.version))
    found = build_layout(resolved, request).role(role)
    assert found is not None, role
    return found


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fit-reading")


MEGATRON_RUN = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=16",
    "data.max_prompt_length=512",
    "data.max_response_length=1024",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
]


# micro-batches of 16 sequences, with the 16 sequences per data-parallel rank (of 4: tensor
# parallel 2 on 8 GPUs) a micro-batch can hold no more than
MEGATRON_MICRO_16 = [
    "data.train_batch_size=64",
    "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
]


@pytest.mark.parametrize("flag", [True, False])
def test_megatron_keeps_every_layer_unless_full_recompute_whatever_the_models_flag(
    upstream_session: AuditSession, folder: Path, flag: bool
) -> None:
    model_flag = f"actor_rollout_ref.model.enable_gradient_checkpointing={flag}"
    tree = _role(
        upstream_session, folder, [*MEGATRON_RUN, model_flag], "actor", "ppo_megatron_trainer"
    )
    full = _role(
        upstream_session,
        folder,
        [*MEGATRON_RUN, model_flag, f"{RECOMPUTE}.recompute_granularity=full"],
        "actor",
        "ppo_megatron_trainer",
    )
    assert tree.spec.strategy == "megatron"
    assert not tree.checkpointing, "the tree's recompute_granularity is null: nothing recomputed"
    assert full.checkpointing


@pytest.mark.parametrize("flag", [True, False])
def test_fsdp_follows_the_models_checkpointing_flag(
    upstream_session: AuditSession, folder: Path, flag: bool
) -> None:
    run = [o for o in MEGATRON_RUN if ".megatron." not in o]
    actor = _role(
        upstream_session,
        folder,
        [*run, f"actor_rollout_ref.model.enable_gradient_checkpointing={flag}"],
        "actor",
    )
    assert actor.spec.strategy in ("fsdp", "fsdp2")
    assert actor.checkpointing is flag


def test_an_oom_megatron_update_proposes_the_recompute_megatron_reads(
    upstream_session: AuditSession, folder: Path
) -> None:
    """The fix for a Megatron update without recompute sets override_transformer_config, the
    keys its engine reads, never the model flag it ignores."""
    resolved = _resolved(
        upstream_session,
        folder,
        merged(MEGATRON_RUN, MEGATRON_MICRO_16),
        "ppo_megatron_trainer",
    )
    request = Request(gpu=custom_gpu(12.0), facts=release_facts(upstream_session.version))
    result = forecast(resolved, request)
    keys = {
        key
        for verdict in result.verdicts
        if verdict.phase == "actor-update"
        for fix in verdict.fixes
        for key, _ in fix.keys
    }
    assert f"{RECOMPUTE}.recompute_granularity" in keys, sorted(keys)
    assert "actor_rollout_ref.model.enable_gradient_checkpointing" not in keys, sorted(keys)


PPO_RUN = [
    "data.train_batch_size=64",
    "data.max_prompt_length=512",
    "data.max_response_length=512",
    "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
    f"critic.model.path={MODEL}",
    "critic.ppo_micro_batch_size_per_gpu=1",
    "critic.forward_micro_batch_size_per_gpu=4",
]


def _with_critic_fact(facts: ReleaseFacts, value: str) -> ReleaseFacts:
    fact = dataclasses.replace(facts.facts[CRITIC_MICRO_BATCHES], value=value)
    return dataclasses.replace(facts, facts={**facts.facts, CRITIC_MICRO_BATCHES: fact})


def test_a_critic_splitting_per_pass_takes_each_passs_micro_batch(
    upstream_session: AuditSession, folder: Path
) -> None:
    facts = release_facts(upstream_session.version)
    sequence = 1024
    per_pass = _role(
        upstream_session, folder, PPO_RUN, "critic", facts=_with_critic_fact(facts, "per-pass")
    )
    assert (per_pass.train_tokens, per_pass.infer_tokens) == (sequence, 4 * sequence)
    assert per_pass.train_budget_key == "critic.ppo_micro_batch_size_per_gpu"


def test_the_v1_critic_takes_its_token_budget_for_both_passes(
    upstream_session: AuditSession, folder: Path
) -> None:
    """The same run with the checked release's own fact: the per-pass keys are not read, both
    passes fill critic.ppo_infer_max_token_len_per_gpu."""
    facts = release_facts(upstream_session.version)
    assert facts.value(CRITIC_MICRO_BATCHES) == "infer-budget"
    critic = _role(upstream_session, folder, PPO_RUN, "critic", facts=facts)
    assert critic.train_budget_key == "critic.ppo_infer_max_token_len_per_gpu"
    assert critic.train_tokens > 1024 and critic.infer_tokens > 4 * 1024


def _global_sizes(run: list[str]) -> list[str]:
    """The run with its actor, rollout and reference per-GPU sizes written as the global sizes
    of a 2024-25 launch (per GPU x 8 GPUs)."""
    out = []
    for override in run:
        key, _, value = override.partition("=")
        if key.startswith("actor_rollout_ref.") and key.endswith("micro_batch_size_per_gpu"):
            override = f"{key.removesuffix('_per_gpu')}={int(value) * 8}"
        out.append(override)
    return out


def test_a_global_micro_batch_size_is_read_as_the_older_workers_divided_it(
    upstream_session: AuditSession, folder: Path
) -> None:
    """A launch of verl's legacy workers gives ppo_micro_batch_size (global): 0.9.0 asserts the
    per-GPU key at start (check's error), and the forecast reads the size the older workers
    used, global // (GPUs / Ulysses size), saying so; the same run written per GPU forecasts the
    same micro-batches without the note, and a launch with neither keeps the 1 it always read."""
    facts = release_facts(upstream_session.version)
    run = [*PPO_RUN, "actor_rollout_ref.actor.use_kl_loss=True"]  # a reference pass too
    per_gpu = [_role(upstream_session, folder, run, r, facts=facts) for r in ("actor", "ref")]
    old = _global_sizes(run)
    global_ = [_role(upstream_session, folder, old, r, facts=facts) for r in ("actor", "ref")]
    for written, read in zip(per_gpu, global_, strict=True):
        assert (read.train_tokens, read.infer_tokens) == (
            written.train_tokens,
            written.infer_tokens,
        )
        assert not written.assumed
    (said,) = global_[0].assumed[:1]
    assert "actor_rollout_ref.actor.ppo_micro_batch_size=16 is a global size" in said
    assert "read as 2 per GPU, 16 over 8 data-parallel rank(s)" in said and "004c888" in said
    ulysses = _role(
        upstream_session,
        folder,
        [*old, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
        "actor",
        facts=facts,
    )
    assert ulysses.train_tokens == 4 * 1024 // 2  # 16 // (8 / 2) = 4 sequences, split over 2
    resolved = _resolved(upstream_session, folder, old)
    request = Request(gpu=find_gpu("H100"), facts=facts)
    assert any("is a global size" in a for a in forecast(resolved, request).assumptions)
    neither = [o for o in run if "actor.ppo_micro_batch_size" not in o]
    assert _role(upstream_session, folder, neither, "actor", facts=facts).train_tokens == 1024


# A LoRA run on FSDP1 whose weight sync collects the adapters (lora.merge false): without
# layered_summon, verl/utils/fsdp_utils.py:740 opens summon_full_params on the whole model.
LORA_MODEL = "Qwen/Qwen2.5-14B-Instruct"
ROLLOUT = "actor_rollout_ref.rollout"
LORA_RUN = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=64",
    "data.max_prompt_length=512",
    "data.max_response_length=1024",
    "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.model.lora_rank=32",
    "actor_rollout_ref.model.lora_alpha=32",
    "actor_rollout_ref.actor.strategy=fsdp",
    "actor_rollout_ref.rollout.layered_summon=False",
]


def _sync_parts(session: AuditSession, folder: Path, overrides: list[str]) -> dict[str, int]:
    """The actor's weight-sync parts (name -> bytes) of a LoRA run on 8 H100s."""
    resolved = _resolved(session, folder, overrides, model_entry={"model": LORA_MODEL})
    request = Request(gpu=find_gpu("H100"), facts=release_facts(session.version))
    result = forecast(resolved, request, with_fixes=False)
    sync = [phase for rank in result.ranks for phase in rank.phases if phase.phase == "weight-sync"]
    assert sync, "a hybrid-engine run syncs its weights"
    return {part.key: part.bytes for part in sync[0].parts}


def test_a_lora_sync_without_layered_summon_gathers_the_whole_fsdp1_model(
    upstream_session: AuditSession, folder: Path
) -> None:
    entry = {"model": LORA_MODEL, "gpus": 8}
    parts = _sync_parts(upstream_session, folder, LORA_RUN)
    actor = _role(upstream_session, folder, LORA_RUN, "actor", model_entry=entry)
    assert actor.spec.strategy == "fsdp" and actor.spec.lora_rank == 32
    # summon_full_params unshards every FSDP1 unit in fp32 (FlatParamHandle._force_full_precision),
    # each padded to a multiple of the 8 ranks (tests/test_fit_states.py measures it on verl's engine)
    states = states_of(actor)
    assert parts.get("sync.summoned") == states.summoned, parts
    assert 0 <= states.summoned - states.total * 4 < 2**20, states  # a few bytes a unit
    assert "sync.staging" not in parts


@pytest.mark.parametrize(
    "change",
    [
        "actor_rollout_ref.rollout.layered_summon=True",  # one unit at a time
        "actor_rollout_ref.actor.strategy=fsdp2",  # DTensors gather one adapter at a time
        "actor_rollout_ref.model.lora.merge=True",  # merged weights sync per tensor
        "actor_rollout_ref.model.lora_rank=0",  # full fine-tuning syncs per tensor
    ],
)
def test_a_sync_that_gathers_per_unit_or_per_tensor_stages_one_tensor(
    upstream_session: AuditSession, folder: Path, change: str
) -> None:
    parts = _sync_parts(upstream_session, folder, merged(LORA_RUN, [change]))
    assert "sync.summoned" not in parts, parts
    assert "sync.staging" in parts


def test_an_oom_lora_sync_proposes_layered_summon_first(
    upstream_session: AuditSession, folder: Path
) -> None:
    resolved = _resolved(upstream_session, folder, LORA_RUN, model_entry={"model": LORA_MODEL})
    request = Request(gpu=custom_gpu(60.0), facts=release_facts(upstream_session.version))
    result = forecast(resolved, request)
    sync = [verdict for verdict in result.verdicts if verdict.phase == "weight-sync"]
    assert sync and sync[0].fixes, [v.phase for v in result.verdicts]
    layered = [f for f in sync[0].fixes if f.keys == ((f"{ROLLOUT}.layered_summon", "True"),)]
    assert layered and layered[0].phase_fits, sync[0].fixes


OFFLOAD = "+actor_rollout_ref.actor.optim.override_optimizer_config"
CPU_OPTIMIZER = f"{OFFLOAD}.optimizer_cpu_offload=True"
PRECISION_AWARE = f"{OFFLOAD}.use_precision_aware_optimizer=True"
ALL_ON_HOST = f"{OFFLOAD}.optimizer_offload_fraction=1"


@pytest.mark.parametrize(
    ("overrides", "on_gpu"),
    [
        # AdamW: 4 B of fp32 master and 8 B of moments per parameter of 12 on the GPU
        ([CPU_OPTIMIZER, ALL_ON_HOST], 4),
        ([CPU_OPTIMIZER, f"{OFFLOAD}.optimizer_offload_fraction=0.5"], 8),
        # the precision-aware optimizer's master is the hybrid optimizer's own: it goes along
        ([CPU_OPTIMIZER, ALL_ON_HOST, PRECISION_AWARE], 0),
        # Megatron's default fraction is 0.0: the CPU optimizer alone offloads nothing
        ([CPU_OPTIMIZER], 12),
        # the fraction without the CPU optimizer is not read
        ([ALL_ON_HOST], 12),
    ],
)
def test_megatrons_cpu_optimizer_keeps_its_share_of_the_states_on_the_host(
    upstream_session: AuditSession, folder: Path, overrides: list[str], on_gpu: int
) -> None:
    """override_optimizer_config goes to Megatron's OptimizerConfig as written: with
    optimizer_cpu_offload its HybridDeviceOptimizer keeps the moments of optimizer_offload_
    fraction of the parameters on the host; the fp32 master shards stay on the GPU unless the
    precision-aware optimizer makes the hybrid optimizer's copies the master."""
    base = _role(upstream_session, folder, MEGATRON_RUN, "actor", "ppo_megatron_trainer")
    role = _role(
        upstream_session, folder, [*MEGATRON_RUN, *overrides], "actor", "ppo_megatron_trainer"
    )
    full, kept = states_of(base).optimizer, states_of(role).optimizer
    assert kept == pytest.approx(full * on_gpu / 12, rel=1e-3)


def test_an_oom_megatron_update_proposes_the_cpu_optimizer(
    upstream_session: AuditSession, folder: Path
) -> None:
    resolved = _resolved(
        upstream_session,
        folder,
        [*MEGATRON_RUN, f"{RECOMPUTE}.recompute_granularity=full"],
        "ppo_megatron_trainer",
        model_entry={"model": "Qwen/Qwen2.5-7B"},
    )
    request = Request(gpu=custom_gpu(20.0), facts=release_facts(upstream_session.version))
    result = forecast(resolved, request)
    update = [v for v in result.verdicts if v.phase == "actor-update"]
    assert update and update[0].level == "error", [(v.phase, v.total) for v in result.verdicts]
    proposed = [dict(fix.keys) for fix in update[0].fixes]
    key = f"{OFFLOAD}.optimizer_cpu_offload"
    assert any(fix.get(key) == "True" for fix in proposed), proposed


@pytest.mark.parametrize("offload", [True, False])
def test_megatrons_grad_buffer_comes_back_only_for_the_update_and_the_save(
    upstream_session: AuditSession, folder: Path, offload: bool
) -> None:
    """An offloaded Megatron model is loaded without its grad buffer for a forward
    (engine/base.py:319) and for the weight sync (megatron/transformer_impl.py:1022); a model
    that never leaves the GPU keeps the buffer allocated through both. The checkpoint save
    loads it with the weights (megatron/transformer_impl.py:782-784, load_grad=True), and each
    part cites Megatron's code, not FSDP's."""
    run = [
        *MEGATRON_RUN,
        f"actor_rollout_ref.actor.megatron.param_offload={offload}",
        "trainer.save_freq=10",
    ]
    resolved = _resolved(upstream_session, folder, run, "ppo_megatron_trainer")
    request = Request(gpu=find_gpu("H100"), facts=release_facts(upstream_session.version))
    result = forecast(resolved, request, with_fixes=False)
    parts = {
        phase.phase: {part.key: part for part in phase.parts}
        for rank in result.ranks
        for phase in rank.phases
    }
    for phase in ("old-log-prob", "weight-sync"):
        assert ("actor.grads.buffer" in parts[phase]) is not offload, (phase, sorted(parts[phase]))
    update, save = parts["actor-update"], parts["checkpoint-save"]
    assert "megatron_utils.py:663-722" in update["actor.grads"].evidence
    assert save["actor.grads.buffer"].bytes == update["actor.grads"].bytes
    assert "megatron/transformer_impl.py:782-790" in save["actor.grads.buffer"].evidence
    assert "megatron/transformer_impl.py" in save["actor.params"].evidence


def _megatron_part(
    session: AuditSession, folder: Path, overrides: list[str], phase: str, key: str
) -> Part:
    """One part of one phase of a Megatron run's forecast on 8 H100s."""
    resolved = _resolved(session, folder, overrides, "ppo_megatron_trainer")
    request = Request(gpu=find_gpu("H100"), facts=release_facts(session.version))
    result = forecast(resolved, request, with_fixes=False)
    peak = next(p for rank in result.ranks for p in rank.phases if p.phase == phase)
    return next(part for part in peak.parts if part.key == key)


def _embedding_elements() -> int:
    """MODEL's embedding (tied: its head too), its largest tensor."""
    choice = from_table(MODEL)
    assert choice is not None
    return choice.architecture.vocab_size * choice.architecture.hidden_size


@pytest.mark.parametrize(("tp", "pp", "copies"), [(2, 1, 2), (1, 2, 1), (1, 1, 0)])
def test_megatrons_weight_sync_holds_the_largest_tensor_as_the_bridge_gathers_it(
    upstream_session: AuditSession, folder: Path, tp: int, pp: int, copies: int
) -> None:
    """Megatron-Bridge's export gathers each tensor's shards into tp_size new buffers and
    concatenates them (two bf16 copies of the largest tensor, the embedding here), broadcasts a
    tensor from its pipeline stage (one copy), and exports a tensor as it is on one rank; the
    transfer bucket comes on top. A bucket fix never goes below the tensor the sender must fit."""
    run = [
        *(o for o in MEGATRON_RUN if "tensor_model_parallel_size" not in o),
        f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={tp}",
        f"actor_rollout_ref.actor.megatron.pipeline_model_parallel_size={pp}",
    ]
    staging = _megatron_part(upstream_session, folder, run, "weight-sync", "sync.staging")
    bucket = 2048 << 20  # verl 0.9.0's default update_weights_bucket_megabytes
    assert staging.bytes == copies * _embedding_elements() * 2 + bucket, staging
    assert "Megatron-Bridge" in staging.evidence
    from pytest_verl_compat.memory.fixes import candidates

    big = _layout(upstream_session, folder, merged(run, [f"{BUCKET}=4096"]), "ppo_megatron_trainer")
    # the embedding (0.27 GB in bf16) fits every halving to 512 MB, and no smaller one
    ladders = [ladder for ladder in candidates({}, big, "weight-sync") if ladder[0][0][0] == BUCKET]
    assert [rung[0][1] for rung in ladders[0]] == [2048, 1024, 512], ladders


@pytest.mark.parametrize("save", ["bridge", "dist", "lora"])
def test_megatrons_checkpoint_writes_hugging_face_weights_unless_dist_checkpointing(
    upstream_session: AuditSession, folder: Path, save: str
) -> None:
    """Megatron's checkpoint manager saves ``model`` in Hugging Face format through
    Megatron-Bridge unless use_dist_checkpointing (megatron_checkpoint_manager.py:245-249): its
    staging is the bridge's gather of the largest tensor (two bf16 copies at tensor parallel 2),
    and with LoRA the adapters alone (:1005-1007, save_hf_adapter); the dist-checkpointing save
    keeps the per-unit rule."""
    run = [
        *MEGATRON_RUN,
        "trainer.save_freq=10",
        f"actor_rollout_ref.actor.megatron.use_dist_checkpointing={save == 'dist'}",
        *(["actor_rollout_ref.model.lora.rank=16"] if save == "lora" else []),
    ]
    staging = _megatron_part(upstream_session, folder, run, "checkpoint-save", "checkpoint.staging")
    layout = _layout(upstream_session, folder, run, "ppo_megatron_trainer")
    assert layout.hf_model_in_checkpoint is (save != "dist")
    expected = {
        "bridge": 2 * _embedding_elements() * 2,
        "dist": 2 * states_of(layout.role("actor")).layer_unit,
        "lora": 0,
    }
    assert staging.bytes == expected[save], staging
    if save != "dist":
        assert "megatron_checkpoint_manager.py:245-249" in staging.evidence


LORA_RANK = "actor_rollout_ref.model.lora_rank=16"  # the FSDP engine's spelling
LORA_BLOCK = "actor_rollout_ref.model.lora.rank=16"  # the Megatron engine's
WITH_KL = "actor_rollout_ref.actor.use_kl_loss=True"
FSDP_RUN = [o for o in MEGATRON_RUN if ".megatron." not in o]


def _layout(session: AuditSession, folder: Path, overrides: list[str], config_name: str) -> Any:
    resolved = _resolved(session, folder, overrides, config_name)
    return build_layout(
        resolved, Request(gpu=find_gpu("H100"), facts=release_facts(session.version))
    )


@pytest.mark.parametrize(
    ("config_name", "run", "own", "other"),
    [
        ("", FSDP_RUN, LORA_RANK, LORA_BLOCK),
        ("ppo_megatron_trainer", MEGATRON_RUN, LORA_BLOCK, LORA_RANK),
    ],
    ids=["fsdp", "megatron"],
)
def test_the_actor_trains_an_adapter_only_in_its_engines_spelling(
    upstream_session: AuditSession,
    folder: Path,
    config_name: str,
    run: list[str],
    own: str,
    other: str,
) -> None:
    """The FSDP engine builds LoRA from model.lora_rank, the Megatron engine from model.lora
    (checks/lora.ENGINE_LORA_RANK): a rank in the other spelling trains the whole model, whose
    states the forecast must count, while the trainer, which takes either spelling, still computes
    the reference log-probs on the actor (trainer_base.py:316-323) and starts no reference worker."""
    adapted = _layout(upstream_session, folder, [*run, WITH_KL, own], config_name)
    whole = _layout(upstream_session, folder, [*run, WITH_KL, other], config_name)
    for layout, rank in ((adapted, 16), (whole, 0)):
        actor = layout.role("actor")
        assert actor is not None and actor.spec.lora_rank == rank
        assert layout.reference_from_actor and layout.role("ref") is None
    adapted_states = states_of(adapted.role("actor"))
    whole_states = states_of(whole.role("actor"))
    assert whole_states.trainable == whole_states.total > 50 * adapted_states.trainable > 0


def test_the_reference_pass_on_the_actor_runs_only_with_a_reference_policy(
    upstream_session: AuditSession, folder: Path
) -> None:
    """A LoRA run without a KL term computes no reference log-probs (trainer_base.py:563-565): no
    reference pass on the actor is forecast; with one, it is."""
    with_kl = forecast(
        _resolved(upstream_session, folder, [*FSDP_RUN, WITH_KL, LORA_RANK]),
        Request(gpu=find_gpu("H100"), facts=release_facts(upstream_session.version)),
        with_fixes=False,
    )
    without = forecast(
        _resolved(upstream_session, folder, [*FSDP_RUN, LORA_RANK]),
        Request(gpu=find_gpu("H100"), facts=release_facts(upstream_session.version)),
        with_fixes=False,
    )
    phases = {p.phase for p in with_kl.ranks[0].phases}
    assert "ref-log-prob" in phases
    assert "ref-log-prob" not in {p.phase for p in without.ranks[0].phases}


SFT_MEGATRON = [
    "engine=megatron",
    "data.micro_batch_size_per_gpu=4",
    "data.max_length=2048",
    "engine.override_transformer_config.recompute_granularity=full",
]


@pytest.mark.parametrize(("optim", "proposed"), [("optim=megatron", True), ("optim=fsdp", False)])
def test_an_oom_sft_megatron_update_proposes_the_cpu_optimizer_in_its_top_level_optim(
    upstream_session: AuditSession, folder: Path, optim: str, proposed: bool
) -> None:
    """The SFT trainer's optimizer section is top-level, beside engine (sft_trainer_engine.yaml:12):
    the CPU optimizer fix names optim.override_optimizer_config, not engine.optim (a key the tree
    does not have, which the forecast had named). Under the FSDP optimizer section that key is
    null, which no dotted override can extend: no fix is proposed there, and nothing crashes."""
    resolved = _resolved(
        upstream_session,
        folder,
        [*SFT_MEGATRON, optim],
        model_entry={"model": "Qwen/Qwen2.5-7B", "sft": True},
    )
    request = Request(gpu=custom_gpu(30.0), facts=release_facts(upstream_session.version))
    result = forecast(resolved, request)
    update = [v for v in result.verdicts if v.phase == "sft-update"]
    assert update and update[0].level == "error", [(v.phase, v.total) for v in result.verdicts]
    keys = {key for fix in update[0].fixes for key, _ in fix.keys}
    wanted = "+optim.override_optimizer_config.optimizer_cpu_offload"
    assert (wanted in keys) is proposed, keys
    assert not any(key.lstrip("+").startswith("engine.optim") for key in keys), keys


NO_SYNC_RUN = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=16",
    "data.max_prompt_length=512",
    "data.max_response_length=512",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
]
NO_SYNC_MODEL = {"model": "Qwen/Qwen2.5-7B"}
ACTOR = "actor_rollout_ref.actor"
KEY_IN_TREE = f"+{ACTOR}.fsdp_config.use_no_sync_for_gradient_accumulation=True"
DYNAMIC = [f"{ACTOR}.use_dynamic_bsz=True", f"{ACTOR}.ppo_max_token_len_per_gpu=1024"]


def _update_fixes(
    session: AuditSession, folder: Path, overrides: list[str], gib: float
) -> tuple[Any, list[dict[str, str]]]:
    resolved = _resolved(session, folder, overrides, model_entry=NO_SYNC_MODEL)
    request = Request(gpu=custom_gpu(gib), facts=release_facts(session.version))
    result = forecast(resolved, request)
    update = [v for v in result.verdicts if v.phase == "actor-update"]
    return update[0] if update else None, [
        dict(f.keys) for f in (update[0].fixes if update else ())
    ]


@pytest.mark.parametrize(
    ("extra", "key", "whole"),
    [
        ([], f"{ACTOR}.ppo_micro_batch_size_per_gpu", "2"),  # a rank's 2 sequences
        (DYNAMIC, f"{ACTOR}.ppo_max_token_len_per_gpu", "2048"),  # their 2 x 1,024 tokens
    ],
)
def test_deferred_sync_without_a_key_proposes_one_micro_batch_per_mini_batch(
    upstream_session: AuditSession, folder: Path, extra: list[str], key: str, whole: str
) -> None:
    """0.9.0's FSDP engine defers gradient sync on every micro-batch but a mini-batch's last and
    its tree has no key to stop it (transformer_impl.py:683-698): the fix that drops the unsharded
    gradients is a mini-batch in one micro-batch, which the forecast of the change judges."""
    update, proposed = _update_fixes(upstream_session, folder, [*NO_SYNC_RUN, *extra], 30.0)
    assert update is not None and update.level == "error"
    assert any(fix.get(key) == whole for fix in proposed), proposed
    fixed = _role(
        upstream_session,
        folder,
        [*NO_SYNC_RUN, *extra, f"{key}={whole}"],
        "actor",
        model_entry=NO_SYNC_MODEL,
    )
    assert fixed.micro_batches == 1
    assert fixed.whole_mini_batch == int(whole)


def test_deferred_sync_with_the_key_proposes_the_key_not_the_micro_batch(
    upstream_session: AuditSession, folder: Path
) -> None:
    """Where the tree has use_no_sync_for_gradient_accumulation (0.9.1's), turning it off is the
    fix; the micro-batch stays as the user set it."""
    _, proposed = _update_fixes(upstream_session, folder, [*NO_SYNC_RUN, KEY_IN_TREE], 30.0)
    sync_key = KEY_IN_TREE.split("=", 1)[0].lstrip("+")
    assert any(fix.get(sync_key) == "False" for fix in proposed), proposed
    assert not any(fix.get(f"{ACTOR}.ppo_micro_batch_size_per_gpu") == "2" for fix in proposed)


def test_one_micro_batch_per_mini_batch_proposes_no_larger_micro_batch(
    upstream_session: AuditSession, folder: Path
) -> None:
    """Near-identical, already one micro-batch per mini-batch: no gradient is kept unsharded, and
    no fix raises the micro-batch."""
    run = [*NO_SYNC_RUN, f"{ACTOR}.ppo_micro_batch_size_per_gpu=2"]
    resolved = _resolved(upstream_session, folder, run, model_entry=NO_SYNC_MODEL)
    request = Request(gpu=custom_gpu(12.0), facts=release_facts(upstream_session.version))
    result = forecast(resolved, request)
    update = [p for r in result.ranks for p in r.phases if p.phase == "actor-update"]
    assert update and not [part.key for part in update[0].parts if part.key.endswith("accumulated")]
    verdicts = [v for v in result.verdicts if v.phase == "actor-update"]
    assert verdicts and verdicts[0].level == "error", "12 GiB cannot hold a 7B update"
    raised = [
        dict(fix.keys)
        for fix in verdicts[0].fixes
        if int(dict(fix.keys).get(f"{ACTOR}.ppo_micro_batch_size_per_gpu", 0)) > 2
    ]
    assert not raised, verdicts[0].fixes


MEGATRON = "actor_rollout_ref.actor.megatron"


@pytest.mark.parametrize(
    ("overrides", "split"),
    [
        ([], True),  # engine/megatron.yaml:32
        ([f"{MEGATRON}.sequence_parallel=False"], False),
        # override_transformer_config is applied last (transformer_impl.py:364-365)
        ([f"+{MEGATRON}.override_transformer_config.sequence_parallel=False"], False),
        (
            [
                f"{MEGATRON}.sequence_parallel=True",
                f"+{MEGATRON}.override_transformer_config.sequence_parallel=False",
            ],
            False,
        ),
        # the legacy mbridge reads no engine key: on whenever tensor parallelism is
        ([f"{MEGATRON}.sequence_parallel=False", f"{MEGATRON}.vanilla_mbridge=True"], True),
        (
            [
                f"{MEGATRON}.vanilla_mbridge=True",
                f"+{MEGATRON}.override_transformer_config.sequence_parallel=False",
            ],
            False,
        ),
    ],
)
def test_megatron_sequence_parallel_is_read_as_its_engine_builds_the_model(
    upstream_session: AuditSession, folder: Path, overrides: list[str], split: bool
) -> None:
    actor = _role(
        upstream_session, folder, [*MEGATRON_RUN, *overrides], "actor", "ppo_megatron_trainer"
    )
    assert actor.sequence_parallel is split


def test_megatron_without_sequence_parallel_keeps_more_and_proposes_the_deciding_key(
    upstream_session: AuditSession, folder: Path
) -> None:
    """With sequence parallelism off the update keeps the norms' tensors whole on each tensor-
    parallel rank (more than with it on, the run otherwise the same), and the fix turns it on
    with the key that turned it off."""
    run = merged(MEGATRON_RUN, MEGATRON_MICRO_16)

    def update(extra: list[str]) -> tuple[int, list[dict[str, str]]]:
        resolved = _resolved(upstream_session, folder, [*run, *extra], "ppo_megatron_trainer")
        request = Request(gpu=custom_gpu(12.0), facts=release_facts(upstream_session.version))
        result = forecast(resolved, request)
        phase = next(p for r in result.ranks for p in r.phases if p.phase == "actor-update")
        kept = sum(part.bytes for part in phase.parts if part.key == "actor.activations")
        verdict = next(v for v in result.verdicts if v.phase == "actor-update")
        return kept, [dict(fix.keys) for fix in verdict.fixes]

    on, _ = update([])
    for key in (
        f"{MEGATRON}.sequence_parallel",
        f"{MEGATRON}.override_transformer_config.sequence_parallel",
    ):
        plus = "+" if "override" in key else ""
        off, fixes = update([f"{plus}{key}=False"])
        assert off > on
        assert any(fix.get(key) == "True" for fix in fixes), (key, fixes)


@pytest.mark.parametrize(
    ("overrides", "config_name", "offloaded"),
    [
        (["actor_rollout_ref.model.enable_activation_offload=True"], "", True),
        ([], "", False),
        # Megatron's engine never reads the model's flag (only the FSDP and VeOmni engines do)
        (["actor_rollout_ref.model.enable_activation_offload=True"], "ppo_megatron_trainer", False),
    ],
)
def test_activation_offload_is_the_fsdp_engines_model_flag(
    upstream_session: AuditSession,
    folder: Path,
    overrides: list[str],
    config_name: str,
    offloaded: bool,
) -> None:
    run = MEGATRON_RUN if config_name else [o for o in MEGATRON_RUN if ".megatron." not in o]
    actor = _role(upstream_session, folder, [*run, *overrides], "actor", config_name)
    assert actor.activation_offload is offloaded


def test_activation_offload_keeps_one_layer_on_the_gpu_in_the_update(
    upstream_session: AuditSession, folder: Path
) -> None:
    """The update of a run without checkpointing keeps every layer's activations; with the FSDP
    engine's activation offload, the last layer's (tests/test_fit_activations.py measures it)."""
    run = [o for o in MEGATRON_RUN if ".megatron." not in o]
    run.append("actor_rollout_ref.model.enable_gradient_checkpointing=False")
    parts = {}
    for flag in (False, True):
        resolved = _resolved(
            upstream_session,
            folder,
            [*run, f"actor_rollout_ref.model.enable_activation_offload={flag}"],
        )
        result = forecast(
            resolved, Request(gpu=find_gpu("H100"), facts=release_facts(upstream_session.version))
        )
        update = next(p for r in result.ranks for p in r.phases if p.phase == "actor-update")
        parts[flag] = next(part for part in update.parts if part.key == "actor.activations")
    layers = 24  # Qwen2.5-0.5B
    assert parts[True].bytes < parts[False].bytes / (layers / 3)
    assert "activation offload" in parts[True].formula


def test_an_oom_fsdp_update_proposes_activation_offload_until_it_is_on(
    upstream_session: AuditSession, folder: Path
) -> None:
    run = [o for o in MEGATRON_RUN if ".megatron." not in o]
    run += [
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    ]
    key = "actor_rollout_ref.model.enable_activation_offload"
    for flag, proposed in ((False, True), (True, False)):
        resolved = _resolved(upstream_session, folder, [*run, f"{key}={flag}"])
        request = Request(gpu=custom_gpu(6.0), facts=release_facts(upstream_session.version))
        verdict = next(v for v in forecast(resolved, request).verdicts if v.phase == "actor-update")
        keys = {k for fix in verdict.fixes for k, _ in fix.keys}
        assert (key in keys) is proposed, (flag, verdict.fixes)


@pytest.mark.parametrize("version", ["0.9.0", "0.9.1"])
def test_where_each_entry_point_puts_the_rollout_is_read_from_what_it_calls(version: str) -> None:
    """The separated trainers build their pools with separation's create_resource_pool_manager
    (a rollout pool of their own); fully_async_main alone can put hybrid replicas back on the
    trainer's GPUs; main_ppo and the SFT and serving entry points do neither."""
    from pytest_verl_compat.memory import layout as lay
    from pytest_verl_compat.memory.runs import own_rollout_pool
    from pytest_verl_compat.pipeline.entry_registry import shipped

    modules = shipped(version)
    assert modules is not None
    pools = {entry.module: own_rollout_pool(entry) for entry in modules.entries}
    assert pools.pop("verl.experimental.fully_async_policy.fully_async_main") == lay.POOL_OWN_HYBRID
    assert pools.pop("verl.experimental.one_step_off_policy.main_ppo") == lay.POOL_OWN
    assert pools and set(pools.values()) == {lay.POOL_SHARED}, pools
    assert own_rollout_pool(None) == lay.POOL_SHARED


def test_a_hybrid_key_puts_replicas_on_the_trainer_only_where_the_entry_starts_them() -> None:
    """With a rollout pool of its own, async_training.use_dynamic_resource_scheduling brings
    sleeping replicas to the trainer's GPUs under fully_async_main, and nothing under
    one_step_off_policy, which never starts them."""
    from pytest_verl_compat.memory import layout as lay
    from pytest_verl_compat.memory.reading import _colocated

    facts = release_facts("0.9.0")
    section = "actor_rollout_ref.rollout"
    asked = {"async_training": {"use_dynamic_resource_scheduling": True}}
    assert _colocated(asked, section, 4, facts, lay.POOL_OWN_HYBRID)
    assert not _colocated(asked, section, 4, facts, lay.POOL_OWN)
    assert not _colocated({}, section, 4, facts, lay.POOL_OWN_HYBRID)
    assert _colocated(asked, section, 4, facts, lay.POOL_SHARED)  # main_ppo: one pool


BUCKET = "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"


def test_the_weight_syncs_bucket_is_the_size_the_rollout_section_gives(
    upstream_session: AuditSession, folder: Path
) -> None:
    """The trainer fills one GPU buffer of update_weights_bucket_megabytes for the weight sync
    (bucketed_weight_transfer.py:178): the staging grows by what the key adds; a run whose
    bucket is larger than its largest tensor needs is offered a halved one, never one smaller
    than that tensor (the sender refuses it, :136-139)."""
    from pytest_verl_compat.memory.fixes import candidates

    run = merged(FSDP_RUN, ["actor_rollout_ref.rollout.name=vllm"])
    default = _sync_parts(upstream_session, folder, run)["sync.staging"]
    doubled = _sync_parts(upstream_session, folder, merged(run, [f"{BUCKET}=4096"]))
    assert doubled["sync.staging"] - default == 2048 << 20
    big = _layout(upstream_session, folder, merged(run, [f"{BUCKET}=4096"]), "")
    # Qwen2.5-0.5B's largest tensor (its embedding, 0.27 GB in bf16) fits every halving to 512 MB
    ladders = [ladder for ladder in candidates({}, big, "weight-sync") if ladder[0][0][0] == BUCKET]
    assert [rung[0][1] for rung in ladders[0]] == [2048, 1024, 512], ladders
    tight = _layout(upstream_session, folder, merged(run, [f"{BUCKET}=512"]), "")
    assert not [
        ladder for ladder in candidates({}, tight, "weight-sync") if ladder[0][0][0] == BUCKET
    ]


NO_RESHARD = "actor_rollout_ref.actor.fsdp_config.reshard_after_forward=False"


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_without_reshard_after_forward_every_unit_stays_gathered(
    upstream_session: AuditSession, folder: Path, strategy: str
) -> None:
    """reshard_after_forward=False (FSDP1's SHARD_GRAD_OP, FSDP2's post-forward that skips the
    reshard): every unit gathered by the forward stays, in the compute dtype, in the update and
    in the no-grad log-prob pass; the default keeps two layers (and FSDP1's root); an update
    over the GPU is offered the key back."""
    from pytest_verl_compat.memory.fixes import candidates

    run = merged(FSDP_RUN, [f"actor_rollout_ref.actor.strategy={strategy}"])
    kept = _role(upstream_session, folder, merged(run, [NO_RESHARD]), "actor")
    default = _role(upstream_session, folder, run, "actor")
    assert default.reshard_after_forward and not kept.reshard_after_forward
    states = states_of(kept)
    for training in (True, False):
        gathered = {p.key: p.bytes for p in compute_parts(kept, training, entropy=False)}[
            "actor.gathered"
        ]
        assert gathered == states.total * kept.spec.param_dtype
        usual = {p.key: p.bytes for p in compute_parts(default, training, entropy=False)}
        assert usual["actor.gathered"] == 2 * states.layer_unit + states.root_unit
    layout = _layout(upstream_session, folder, merged(run, [NO_RESHARD]), "")
    ladders = list(candidates({}, layout, "actor-update"))
    key = "actor_rollout_ref.actor.fsdp_config.reshard_after_forward"
    assert [((key, True),)] in ladders
    assert [((key, True),)] not in list(
        candidates({}, _layout(upstream_session, folder, run, ""), "actor-update")
    )


@pytest.mark.parametrize("bucket", [None, 4096])
def test_pad_to_length_rounds_each_micro_batch_up_to_its_bucket(
    upstream_session: AuditSession, folder: Path, bucket: int | None
) -> None:
    """actor.pad_to_length (the engine's fsdp_config.pad_to_length follows it): the packed
    micro-batch right-padded to the next multiple of pad_to_length_bucket (1024 unless set),
    which the layers and the logits carry; off, the tokens are the packed ones."""
    run = merged(
        FSDP_RUN,
        [
            # 3 sequences per rank of 8, micro-batches of 3
            "data.train_batch_size=24",
            "actor_rollout_ref.actor.ppo_mini_batch_size=24",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
        ],
    )
    plain = _role(upstream_session, folder, run, "actor")
    padded_run = merged(run, ["actor_rollout_ref.actor.pad_to_length=True"])
    if bucket is not None:
        padded_run = merged(
            padded_run, [f"actor_rollout_ref.actor.fsdp_config.pad_to_length_bucket={bucket}"]
        )
    padded = _role(upstream_session, folder, padded_run, "actor")
    step = bucket or 1024
    group = plain.train_tokens * plain.sp
    assert group % step, "the case must need padding"
    assert padded.train_tokens * padded.sp == -(-group // step) * step


def test_a_micro_batch_holds_no_more_than_the_ranks_share_of_the_batch(
    upstream_session: AuditSession, folder: Path
) -> None:
    """A small debugging batch (train_batch_size 4, n 8 on 8 GPUs: 4 sequences per rank) with an
    example's micro-batches of 256: every pass holds the rank's 4 sequences, and a mini-batch
    larger than the batch is the batch; the same run with micro-batches of 2 holds 2."""
    small = [
        "algorithm.adv_estimator=grpo",
        "data.train_batch_size=4",
        "data.max_prompt_length=512",
        "data.max_response_length=1024",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1024",
    ]
    sequence = 1536
    big = _role(
        upstream_session,
        folder,
        [
            *small,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=256",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=256",
        ],
        "actor",
    )
    assert (big.train_tokens, big.infer_tokens) == (4 * sequence, 4 * sequence)
    two = _role(
        upstream_session,
        folder,
        [
            *small,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        ],
        "actor",
    )
    assert (two.train_tokens, two.infer_tokens) == (2 * sequence, 2 * sequence)


@pytest.mark.parametrize(
    ("value", "size"),
    [
        *[(None, 4), ("fp32", 4), ("float32", 4), (32, 4), ("32", 4)],
        *[("bf16", 2), ("bfloat16", 2), ("fp16", 2), ("float16", 2), (16, 2), (16.0, 2)],
    ],
)
def test_the_fsdp_engines_dtypes_are_the_names_precision_type_takes(value: Any, size: int) -> None:
    assert precision_bytes({"model_dtype": value}, "model_dtype", 4, "engine") == size


@pytest.mark.parametrize("value", ["half", "float", "bf61", "fp8", True, ["bf16"]])
def test_a_name_precision_type_refuses_is_one_line_at_its_key(value: Any) -> None:
    with pytest.raises(UnreadableRun, match="PrecisionType") as raised:
        precision_bytes({"param_dtype": value}, "param_dtype", 2, "a.fsdp_config.mixed_precision")
    assert raised.value.key == "a.fsdp_config.mixed_precision.param_dtype"


@pytest.mark.parametrize(
    ("value", "size"),
    [
        (None, 2),
        ("auto", 2),
        ("bfloat16", 2),
        ("float16", 2),
        ("half", 2),
        ("float32", 4),
        ("float", 4),
    ],
)
def test_the_rollout_servers_dtype_is_a_name_vllm_takes(value: Any, size: int) -> None:
    assert server_dtype_bytes({"dtype": value}, "r") == size


@pytest.mark.parametrize("value", ["bf16", "fp32", 16, "int8"])
def test_a_dtype_the_server_refuses_is_one_line_at_its_key(value: Any) -> None:
    with pytest.raises(UnreadableRun, match="auto, bfloat16") as raised:
        server_dtype_bytes({"dtype": value}, "actor_rollout_ref.rollout")
    assert raised.value.key == "actor_rollout_ref.rollout.dtype"


ROLLOUT_TP = "actor_rollout_ref.rollout.tensor_model_parallel_size"


@pytest.mark.parametrize(("tp", "dp", "proposed"), [(2, 1, True), (4, 1, True), (4, 2, False)])
def test_a_larger_rollout_tensor_parallel_is_proposed_only_where_replicas_divide_the_gpus(
    upstream_session: AuditSession, folder: Path, tp: int, dp: int, proposed: bool
) -> None:
    """Rollout replicas of tensor x pipeline x data parallel GPUs must divide the run's 8 GPUs
    (engine_workers.py:650-655; check's parallel.rollout-replicas): doubling tp 4 with data
    parallel 2 makes a replica of 16, which verl refuses, so it is not offered."""
    from pytest_verl_compat.memory.fixes import candidates

    run = merged(
        FSDP_RUN, [f"{ROLLOUT_TP}={tp}", f"actor_rollout_ref.rollout.data_parallel_size={dp}"]
    )
    # 32 heads: every tensor-parallel size up to 32 splits them
    resolved = _resolved(upstream_session, folder, run, model_entry={"model": "Qwen/Qwen3-8B"})
    layout = build_layout(
        resolved, Request(gpu=find_gpu("H100"), facts=release_facts(upstream_session.version))
    )
    ladders = list(candidates(resolved, layout, "rollout"))
    assert ([((ROLLOUT_TP, tp * 2),)] in ladders) is proposed


@pytest.mark.parametrize("padding", [True, False])
def test_a_ulysses_fix_turns_remove_padding_on_where_it_is_off(
    upstream_session: AuditSession, folder: Path, padding: bool
) -> None:
    """verl refuses Ulysses sequence parallel without remove-padding (check's
    validate.sequence-parallel-needs-remove-padding): the fix that doubles it sets both."""
    from pytest_verl_compat.memory.fixes import candidates

    run = merged(FSDP_RUN, [f"actor_rollout_ref.model.use_remove_padding={padding}"])
    resolved = _resolved(upstream_session, folder, run)
    layout = build_layout(
        resolved, Request(gpu=find_gpu("H100"), facts=release_facts(upstream_session.version))
    )
    sp = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
    (fix,) = [
        ladder for ladder in candidates(resolved, layout, "actor-update") if ladder[0][0][0] == sp
    ]
    extra = () if padding else (("actor_rollout_ref.model.use_remove_padding", True),)
    assert fix == [((sp, 2), *extra)]


@pytest.mark.parametrize("value", [None, 0.05, 0.5, 1, 1.0, "0.9"])
def test_a_share_of_the_gpu_is_read_in_zero_to_one(value: Any) -> None:
    share = fraction({"gpu_memory_utilization": value}, "gpu_memory_utilization", 0.5, "r")
    assert 0 < share <= 1


@pytest.mark.parametrize("value", [0, 0.0, -0.1, 1.01, 2, 1e300])
def test_a_share_the_server_refuses_is_one_line_at_its_key(value: Any) -> None:
    with pytest.raises(UnreadableRun, match=r"in \(0, 1\]") as raised:
        fraction({"gpu_memory_utilization": value}, "gpu_memory_utilization", 0.5, "a.rollout")
    assert raised.value.key == "a.rollout.gpu_memory_utilization"
