"""One forecast run without verdicts' fixes: the layout of a configuration, its ranks, and the
checks a re-forecast needs (``fixes`` forecasts again through here)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_verl_compat.checks.registry import RL, SFT, family_of
from pytest_verl_compat.memory import layout as lay
from pytest_verl_compat.memory import passes, reading
from pytest_verl_compat.memory import phases as ph
from pytest_verl_compat.memory import rollout as srv
from pytest_verl_compat.memory.gpus import Gpu
from pytest_verl_compat.memory.models import ModelChoice, UnknownModel, choose_model
from pytest_verl_compat.memory.parts import SERVER_START, RankKind, Verdict, gib
from pytest_verl_compat.memory.release_facts import ReleaseFacts, ReleaseFactsError
from pytest_verl_compat.memory.values import UnreadableRun

# the one dotted lookup, defined with the shared words; the forecast's modules import it from here
from pytest_verl_compat.model import dotted_value as dotted_value

if TYPE_CHECKING:
    from pytest_verl_compat.pipeline.entry_points import EntryPoint

MARGIN = 0.90  # a phase above this share of the capacity is a warning (allocator fragmentation)


class NotForecastable(ValueError):
    """A configuration the forecast cannot read (one line: which key, which value); ``key``: that
    key, dotted, where one decides it (what check --gpu's note is located at)."""

    def __init__(self, message: str, key: str = "") -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class Request:
    """What a forecast is asked for, besides the configuration."""

    gpu: Gpu | None = None
    model_config: str | None = None
    lengths: tuple[int, int] | None = None
    world: int | None = None  # torchrun's world for SFT
    script: str = ""
    margin: float = MARGIN
    # what the release forecast for does where no key decides (``release_facts``)
    facts: ReleaseFacts | None = None
    # False: the launch's entry point never trains (verl.trainer.main_generation_server): its
    # rollout servers alone, on every GPU
    trains: bool = True
    # where the entry point puts the rollout (``own_rollout_pool``)
    rollout_pool: str = lay.POOL_SHARED
    # each key and the leaves of the composition that copy it by interpolation (the session's
    # Composer.key_followers): a fix that sets the key sets them too, as composing it again would
    followers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def _model_path(resolved: Mapping[str, Any], section: str) -> str | None:
    node = dotted_value(resolved, section)
    if not isinstance(node, Mapping):
        return None
    value = node.get("hf_config_path") or node.get("path")
    return str(value) if value else None


def build_layout(resolved: Mapping[str, Any], request: Request) -> lay.RunLayout:
    try:
        return _build_layout(resolved, request)
    except (UnreadableRun, ReleaseFactsError) as exc:
        raise NotForecastable(str(exc), getattr(exc, "key", "")) from exc


def _model_at(path: str | None, key: str, given: str | None = None) -> ModelChoice:
    """The model ``key`` names; an unknown one says which key named it."""
    try:
        return choose_model(path, given)
    except UnknownModel as exc:
        raise UnknownModel(str(exc), key) from exc


def _build_layout(resolved: Mapping[str, Any], request: Request) -> lay.RunLayout:
    if request.facts is None:
        raise ReleaseFactsError("a forecast is for one release: the request names no facts")
    facts = request.facts
    bad = lay.first_bad_count(resolved)
    if bad is not None:
        # an empty value is most often a variable the script reads and the run would set
        unset = (
            " (an unset variable in the script? bind it: --env NAME=VALUE)" if bad[1] == "" else ""
        )
        raise NotForecastable(f"{bad[0]}: expected {bad[2]}, got {bad[1]!r}{unset}", bad[0])
    family = family_of(resolved)
    if family == SFT:
        model = _model_at(_model_path(resolved, "model"), "model.path", request.model_config)
        world = request.world or 1
        return reading.sft_layout(
            resolved, model, lay.sft_lengths(resolved, request.lengths), world, facts
        )
    if family != RL:
        raise NotForecastable(
            "not a verl trainer configuration (no actor_rollout_ref, no SFT engine)"
        )
    actor_path = _model_path(resolved, "actor_rollout_ref.model")
    actor = _model_at(actor_path, "actor_rollout_ref.model.path", request.model_config)
    if not request.trains:
        return reading.serve_layout(
            resolved, actor, lay.rl_lengths(resolved, request.lengths), facts
        )
    critic_path = _model_path(resolved, "critic.model")
    critic = (
        actor if critic_path in (None, actor_path) else _model_at(critic_path, "critic.model.path")
    )
    reward = None
    if dotted_value(resolved, "reward.reward_model.enable"):
        reward_path = dotted_value(resolved, "reward.reward_model.model_path")
        reward_key = "reward.reward_model.model_path"
        reward = _model_at(str(reward_path), reward_key) if reward_path else None
    return reading.rl_layout(
        resolved,
        actor,
        critic,
        reward,
        lay.rl_lengths(resolved, request.lengths),
        facts,
        request.rollout_pool,
    )


def ranks_for(layout: lay.RunLayout, capacity: int) -> tuple[RankKind, ...]:
    if layout.kind == lay.SFT:
        return ph.sft_ranks(layout)
    if layout.kind == lay.SERVE:
        return ph.serve_ranks(layout, capacity)
    return ph.rl_ranks(layout, capacity)


def server_cannot_start(layout: lay.RunLayout, capacity: int, where: str) -> list[Verdict]:
    """The servers' own refusals at start: vLLM's when its weights and profile exceed its share
    or what is left cannot hold one max_model_len sequence (check_enough_kv_cache_memory);
    SGLang's when its share of the free memory leaves its pool no token (``srv.ServerEngine``;
    a sequence longer than the pool is refused per request, not at start)."""
    out = []
    memories = passes.server_memories(layout, capacity)
    for name, server in (("rollout", layout.rollout), ("reward", layout.reward)):
        if server is None:
            continue
        mem = memories[name]
        key = f"{server.section}.gpu_memory_utilization"
        tp_key = f"{server.section}.tensor_model_parallel_size"
        if mem.weights + mem.overhead >= mem.share:
            out.append(
                Verdict(
                    "error",
                    "trainer" if server.colocated else "rollout",
                    SERVER_START,
                    mem.weights,
                    mem.share,
                    f"the {name} server cannot start{where}: its weights per tensor-parallel rank "
                    f"({gib(mem.weights):.2f} GiB at tp {server.tp}) and its profiled overhead "
                    f"({gib(mem.overhead):.2f} GiB) exceed gpu_memory_utilization {server.gpu_memory_utilization} "
                    f"{_share_of(server, mem)} ({gib(mem.share):.2f} GiB)",
                    (key, tp_key),
                )
            )
        elif (
            srv.engine_of(server).refuses_short_of_one_sequence
            and mem.kv_bytes < mem.one_sequence_bytes
        ):
            out.append(
                Verdict(
                    "error",
                    "trainer" if server.colocated else "rollout",
                    SERVER_START,
                    mem.kv_bytes,
                    mem.one_sequence_bytes,
                    f"the {name} server cannot start{where}: the KV cache gpu_memory_utilization "
                    f"{server.gpu_memory_utilization} leaves ({gib(mem.kv_bytes):.2f} GiB) cannot hold one "
                    f"max_model_len sequence of {server.max_model_len:,} tokens ({gib(mem.one_sequence_bytes):.2f} GiB); "
                    "vLLM raises at start (check_enough_kv_cache_memory)",
                    (key, f"{server.section}.max_model_len", tp_key),
                )
            )
    return out


def _share_of(server: lay.ServerLayout, mem: srv.ServerMemory) -> str:
    engine = srv.engine_of(server)
    if engine.share_of_free:
        return f"of the {gib(mem.free_at_start):.2f} GiB free at its start; {engine.no_pool_error}"
    return "of the GPU"


def verdicts_only(
    layout: lay.RunLayout, ranks: tuple[RankKind, ...], capacity: int, margin: float
) -> list[Verdict]:
    """The verdicts without fixes (what a fix's own re-forecast needs)."""
    out = server_cannot_start(layout, capacity, "")
    for rank in ranks:
        for phase in rank.phases:
            if phase.total > margin * capacity:
                level = "error" if phase.total > capacity else "warning"
                out.append(Verdict(level, rank.name, phase.phase, phase.total, capacity, "", ()))
    return out


def phase_total(
    resolved: Mapping[str, Any], request: Request, rank: str, phase: str
) -> tuple[int, bool]:
    """One phase's peak after a change, and whether the whole run then fits."""
    layout = build_layout(resolved, request)
    assert request.gpu is not None
    capacity = request.gpu.usable_bytes
    ranks = ranks_for(layout, capacity)
    total = 0
    for kind in ranks:
        if kind.name == rank:
            total = next((p.total for p in kind.phases if p.phase == phase), 0)
    fits = not any(
        v.level == "error" for v in verdicts_only(layout, ranks, capacity, request.margin)
    )
    return total, fits


# The function verl's separated trainers (fully_async_policy, one_step_off_policy) build their
# pools with: the Rollout role gets a pool of its own, rollout.nnodes x rollout.n_gpus_per_node
# (verl/experimental/separation/utils.py:49-52), which their main copies into
# actor_rollout_ref.rollout (fully_async_main.py:235-236, one_step_off_policy/main_ppo.py:121-122).
OWN_ROLLOUT_POOL = "create_resource_pool_manager"
# The method with which fully_async_main also starts sleeping replicas on the trainer's GPUs when
# a key asks for them (reading.HYBRID_REPLICA_KEYS; fully_async_main.py:159-172).
HYBRID_REPLICA_SETUP = "_setup_hybrid_worker_group"


def own_rollout_pool(entry: EntryPoint | None) -> str:
    """Where the launch's entry point puts the rollout: lay.POOL_SHARED (the trainer's GPUs),
    lay.POOL_OWN (GPUs of its own: it calls ``OWN_ROLLOUT_POOL``) or lay.POOL_OWN_HYBRID (of its
    own, and on the trainer's too when a key asks: it calls ``HYBRID_REPLICA_SETUP`` as well)."""
    if entry is None or OWN_ROLLOUT_POOL not in entry.calls:
        return lay.POOL_SHARED
    return lay.POOL_OWN_HYBRID if HYBRID_REPLICA_SETUP in entry.calls else lay.POOL_OWN


def trains(entry: EntryPoint | None) -> bool:
    """Whether the launch's entry point trains: the pinned one does; one from which no
    trainer's fit is reached (``trains_at`` empty: main_generation_server) only serves."""
    return entry is None or bool(entry.trains_at)
