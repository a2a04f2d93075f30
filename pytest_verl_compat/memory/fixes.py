"""Fixes for a phase that does not fit: each a change of keys, judged by forecasting again with
the changed values (nothing here estimates a saving by itself)."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from pytest_verl_compat.checks.roles import FSDP_STRATEGIES, MEGATRON_STRATEGIES
from pytest_verl_compat.memory import layout as lay
from pytest_verl_compat.memory.parts import (
    ACTOR_UPDATE,
    CHECKPOINT,
    CRITIC_UPDATE,
    OLD_LOG_PROB,
    REF_LOG_PROB,
    REWARD,
    ROLLOUT,
    SERVER_START,
    SFT_UPDATE,
    VALUES,
    WEIGHT_SYNC,
    Fix,
    ReleaseRemedy,
)
from pytest_verl_compat.memory.reading import NO_SYNC_KEY
from pytest_verl_compat.memory.release_facts import later_tree_key
from pytest_verl_compat.memory.residency import states_of, stored_bytes
from pytest_verl_compat.memory.runs import (
    NotForecastable,
    build_layout,
    dotted_value,
    phase_total,
)

MAX_FIXES = 3
Change = tuple[tuple[str, Any], ...]


def _set(mapping: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``dotted``, adding missing sections; a section the tree holds as a value (null) takes no
    dotted override under it, so neither does the fix (ValueError)."""
    node: Any = mapping
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"{dotted}: {part} is {node!r}, not a section")
    node[parts[-1]] = value


def _render(resolved: Mapping[str, Any], key: str, value: Any) -> tuple[str, str]:
    """A change as the user writes it: ``+key=value`` for a key the tree does not have."""
    parent, _, leaf = key.rpartition(".")
    node = dotted_value(resolved, parent) if parent else resolved
    present = isinstance(node, Mapping) and leaf in node
    text = str(value) if not isinstance(value, bool) else ("True" if value else "False")
    return (key if present else f"+{key}", text)


def _halvings(key: str, value: Any, floor: int) -> Iterator[list[Change]]:
    """``value`` halved up to five times, never below ``floor``, the floor itself the last rung
    where a halving would pass it."""
    try:
        current = int(value)
    except (TypeError, ValueError):
        return
    ladder: list[Change] = []
    for _ in range(5):
        current //= 2
        if current < floor:
            previous = ladder[-1][0][1] if ladder else int(value)
            if previous > floor:
                ladder.append(((key, floor),))
            break
        ladder.append(((key, current),))
    if ladder:
        yield ladder


def _budget_floor(resolved: Mapping[str, Any], role: lay.RoleLayout) -> int:
    """The least per-GPU token budget verl runs with: rearrange_micro_batches asserts the budget
    times the sequence-parallel size is at least the longest sequence (seqlen_balancing.py:384,
    check's batch.token-budget-below-sequence), a prompt and a response at their limits (an SFT
    sample at data.max_length)."""
    data = dotted_value(resolved, "data")
    data = data if isinstance(data, Mapping) else {}
    if role.section == "engine":
        longest = lay.as_int(data.get("max_length"))
    else:
        longest = lay.as_int(data.get("max_prompt_length")) + lay.as_int(
            data.get("max_response_length")
        )
    return max(lay.ceil_div(longest, max(role.sp, 1)), 1)


def _both_offloads(engine: str) -> list[Change]:
    return [((f"{engine}.param_offload", True), (f"{engine}.optimizer_offload", True))]


def _role_candidates(
    resolved: Mapping[str, Any], role: lay.RoleLayout, training: bool
) -> Iterator[list[Change]]:
    key = role.train_budget_key if training else role.infer_budget_key
    floor = 1 if key.endswith("micro_batch_size_per_gpu") else _budget_floor(resolved, role)
    current = dotted_value(resolved, key) or (role.train_tokens if training else role.infer_tokens)
    yield from _halvings(key, current, floor)
    if role.role == "critic":
        model = "critic.model"
    else:
        model = "model" if role.section == "engine" else "actor_rollout_ref.model"
    megatron, fsdp = (
        role.spec.strategy in MEGATRON_STRATEGIES,
        role.spec.strategy in FSDP_STRATEGIES,
    )
    if training and role.spec.defer_sync and role.micro_batches > 1:
        if role.sync_key:
            # where the release's tree has the key: sync every micro-batch, no unsharded gradients
            yield [((role.sync_key, False),)]
        elif role.whole_mini_batch and fsdp:
            # a release without the key defers on every micro-batch but the last
            # (transformer_impl.py:683-698@0.9.0): a mini-batch in one micro-batch keeps none
            yield [((key, role.whole_mini_batch),)]
    engine = role.engine_section
    if fsdp and not role.reshard_after_forward:
        # free each unit's gathered weights after its forward again (passes.EV_NO_RESHARD)
        yield [((f"{engine}.reshard_after_forward", True),)]
    if training and not role.checkpointing:
        if megatron:
            # what Megatron's engine reads instead of the model's flag (reading._checkpointing)
            recompute = f"{engine}.override_transformer_config"
            yield [
                (
                    (f"{recompute}.recompute_granularity", "full"),
                    (f"{recompute}.recompute_method", "uniform"),
                    (f"{recompute}.recompute_num_layers", 1),
                )
            ]
        else:
            yield [((f"{model}.enable_gradient_checkpointing", True),)]
    if training and megatron and not role.sequence_parallel and role.spec.tp > 1:
        # split the norms' tensors over tensor parallel again, on the key that decided
        # (reading._sequence_parallel: override_transformer_config wins over the engine's key)
        override = f"{engine}.override_transformer_config.sequence_parallel"
        set_by_override = dotted_value(resolved, override) is not None
        yield [((override if set_by_override else f"{engine}.sequence_parallel", True),)]
    if not role.remove_padding and not role.dynamic:
        yield [((f"{model}.use_remove_padding", True),)]
    if training and role.spec.strategy == "megatron" and role.spec.optimizer_on_host < 1:
        # Megatron's CPU optimizer: the moments on the host (reading.optimizer_on_host)
        override = f"{role.optim_section}.override_optimizer_config"
        yield [
            (
                (f"{override}.optimizer_cpu_offload", True),
                (f"{override}.optimizer_offload_fraction", 1.0),
            )
        ]
    if fsdp and role.role != "ref":
        if not (role.param_offload and role.optimizer_offload):
            yield _both_offloads(engine)
        if training and not role.activation_offload and not role.spec.label:
            # the FSDP engine's activation offload (passes._offloads_activations); an engine read
            # as FSDP (VeOmni) offloads its own way, which the forecast does not count
            yield [((f"{model}.enable_activation_offload", True),)]
        in_engine = role.role == "critic" or role.section == "engine"
        sp_key = (
            role.ulysses_key
            or f"{engine if in_engine else role.section}.ulysses_sequence_parallel_size"
        )
        heads = role.model.architecture.num_attention_heads
        sp = role.sp * 2
        if sp <= 8 and heads % sp == 0 and role.spec.world % sp == 0:
            # verl refuses Ulysses without remove-padding (check's
            # validate.sequence-parallel-needs-remove-padding): the fix turns both on
            padding = () if role.remove_padding else ((f"{model}.use_remove_padding", True),)
            yield [((sp_key, sp), *padding)]
    if role.role != "critic" and not role.chunked_entropy and role.spec.strategy in FSDP_STRATEGIES:
        yield [((f"{engine}.entropy_from_logits_with_chunking", True),)]


UTILIZATIONS = (0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5, 0.45, 0.4, 0.35, 0.3, 0.25, 0.2)


def _server_candidates(
    resolved: Mapping[str, Any], layout: lay.RunLayout, which: str
) -> Iterator[list[Change]]:
    server = layout.rollout if which == "rollout" else layout.reward
    if server is None:
        return
    key = f"{server.section}.gpu_memory_utilization"
    ladder: list[Change] = [((key, u),) for u in UTILIZATIONS if u < server.gpu_memory_utilization]
    if ladder:
        yield ladder
    actor = layout.role("actor")
    if (
        actor is not None
        and actor.spec.strategy in FSDP_STRATEGIES
        and not (actor.param_offload and actor.optimizer_offload)
    ):
        yield _both_offloads(actor.engine_section)
    tp = server.tp * 2
    # replicas of tensor x pipeline x data parallel GPUs must divide the run's GPUs (check's
    # parallel.rollout-replicas: engine_workers.py:650-655 asserts it)
    pp = max(
        lay.as_int(dotted_value(resolved, f"{server.section}.pipeline_model_parallel_size"), 1), 1
    )
    replica = tp * pp * server.dp
    if layout.world % replica == 0 and server.model.architecture.num_attention_heads % tp == 0:
        yield [((f"{server.section}.tensor_model_parallel_size", tp),)]


def _bucket_candidates(
    server: lay.ServerLayout, actor: lay.RoleLayout | None
) -> Iterator[list[Change]]:
    """Smaller transfer buckets, halved while a bucket still holds the largest tensor in the
    server's dtype (the sender refuses a tensor larger than its bucket:
    bucketed_weight_transfer.py:136-139)."""
    if actor is None:
        return
    largest = states_of(actor).largest_tensor // max(stored_bytes(actor), 1) * server.dtype
    key = f"{server.section}.{lay.BUCKET_KEY}"
    megabytes = server.bucket_bytes >> 20
    ladder: list[Change] = []
    while megabytes // 2 << 20 >= largest and megabytes > 1:
        megabytes //= 2
        ladder.append(((key, megabytes),))
    if ladder:
        yield ladder


def candidates(
    resolved: Mapping[str, Any], layout: lay.RunLayout, phase: str
) -> Iterator[list[Change]]:
    """Ladders of changes for a phase: the rungs of one key's values (halved budgets, lower
    gpu_memory_utilization) or a single change; the first rung that fits is the fix."""
    actor, critic, ref = layout.role("actor"), layout.role("critic"), layout.role("ref")
    if phase in (ACTOR_UPDATE, SFT_UPDATE) and actor is not None:
        yield from _role_candidates(resolved, actor, training=True)
    elif phase == OLD_LOG_PROB and actor is not None:
        yield from _role_candidates(resolved, actor, training=False)
    elif phase == REF_LOG_PROB and (ref or actor) is not None:
        target = ref or actor
        assert target is not None
        yield from _role_candidates(resolved, target, training=False)
    elif phase in (VALUES, CRITIC_UPDATE) and critic is not None:
        yield from _role_candidates(resolved, critic, training=phase == CRITIC_UPDATE)
    elif phase in (ROLLOUT, SERVER_START, WEIGHT_SYNC):
        if (
            phase == WEIGHT_SYNC
            and layout.rollout is not None
            and layout.rollout.sync_summons_whole
        ):
            # gather the adapters one FSDP unit at a time (fsdp_utils.py:633-700)
            yield [((f"{layout.rollout.section}.layered_summon", True),)]
        if phase == WEIGHT_SYNC and layout.rollout is not None:
            yield from _bucket_candidates(layout.rollout, layout.role("actor"))
        yield from _server_candidates(resolved, layout, "rollout")
    elif phase == REWARD:
        yield from _server_candidates(resolved, layout, "reward")
    elif phase == CHECKPOINT and actor is not None and not actor.param_offload:
        yield _both_offloads(actor.engine_section)


def phase_keys(phase: str, layout: lay.RunLayout) -> tuple[str, ...]:
    """The keys a user can change for a phase (the finding's path)."""
    keys: list[str] = []
    for ladder in candidates({}, layout, phase):
        for key, _ in ladder[0]:
            if key not in keys:
                keys.append(key)
    return tuple(keys) or ("trainer.n_gpus_per_node",)


def fixes_for(
    resolved: Mapping[str, Any], request: Any, rank: str, phase: str, capacity: int, margin: float
) -> tuple[Fix, ...]:
    """Up to three changes that bring the phase under the margin (or lower it most), each with
    the phase's forecast after it: a ladder's first rung that fits, else its last."""
    layout = build_layout(resolved, request)
    judged = replace(request, margin=margin)
    before = phase_total(resolved, judged, rank, phase)[0]
    found: list[Fix] = []
    for ladder in candidates(resolved, layout, phase):
        best: Fix | None = None
        for change in ladder:
            after = _forecast_after(resolved, judged, rank, phase, change)
            if after is None:
                continue
            total, fits = after
            rendered = tuple(_render(resolved, k, v) for k, v in change)
            best = Fix(rendered, total, total <= capacity and fits, total <= capacity)
            if total <= margin * capacity:
                break
        if best is not None and best.after < before:
            found.append(best)
    found.sort(key=lambda f: (not f.fits, f.after))
    return tuple(found[:MAX_FIXES])


def _forecast_after(
    resolved: Mapping[str, Any], judged: Any, rank: str, phase: str, change: Change
) -> tuple[int, bool] | None:
    """The phase's peak with ``change`` applied, and whether the whole run then fits; None where
    the changed configuration is not forecast."""
    changed = copy.deepcopy(dict(resolved))
    try:
        for key, value in change:
            _set(changed, key, value)
            # the leaves that copy the key by interpolation move with it, where they are
            for follower in judged.followers.get(key, ()):
                if dotted_value(changed, follower) is not None:
                    _set(changed, follower, value)
        return phase_total(changed, judged, rank, phase)
    except (NotForecastable, ValueError, KeyError):
        return None


def release_remedy(
    resolved: Mapping[str, Any],
    request: Any,
    layout: lay.RunLayout,
    rank: str,
    phase: str,
    before: int,
    capacity: int,
    margin: float,
) -> ReleaseRemedy | None:
    """Where the release forecast for defers gradient sync without a key (0.9.0's engine) and a
    later supported release's tree gives the key (``release_facts.later_tree_key``): that release,
    with the phase's peak (``before`` now) under the tree's value, when it is lower. No key of the
    release forecast for does it, so it is not a fix: the user upgrades or keeps the peak."""
    facts = request.facts
    later = later_tree_key(facts.release, NO_SYNC_KEY) if facts is not None else None
    if later is None:
        return None
    version, fact = later
    change = tuple(
        (f"{role.engine_section}.{NO_SYNC_KEY}", fact.value)
        for role in layout.roles
        if role.spec.defer_sync and not role.sync_key and role.micro_batches > 1
    )
    if not change:
        return None
    after = _forecast_after(resolved, replace(request, margin=margin), rank, phase, change)
    if after is None or after[0] >= before:
        return None
    total, fits = after
    return ReleaseRemedy(
        (),
        total,
        fits,
        total <= capacity,
        release=version,
        key=NO_SYNC_KEY,
        value=fact.value,
        evidence=fact.evidence(version),
    )
