"""Explicit launch fields that no code path of the pinned release reads."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from pytest_verl_compat.checks.lora import ENGINE_LORA_RANK
from pytest_verl_compat.checks.registry import CheckInput, Example, Hit, check
from pytest_verl_compat.checks.roles import need_critic, need_reference_policy
from pytest_verl_compat.checks.upstream_names import LEGACY_REWARD_KEYS
from pytest_verl_compat.model import LeafVerdict


def field_key(field: str) -> str:
    """The dotted key of an override (``+a.b=1`` → ``a.b``)."""
    return field.split("=", 1)[0].lstrip("+~")


# The function that copies the legacy reward keys into reward.*
# (verl/experimental/reward_loop/reward_loop.py:39); an entry point that calls it reads them.
MIGRATES_LEGACY_REWARD = "migrate_legacy_reward_impl"


def legacy_reward_replacement(key: str) -> str | None:
    """The reward.* key a legacy top-level reward key (``reward_model.enable``) would be, or None."""
    return next(
        (new for old, new in LEGACY_REWARD_KEYS.items() if key == old or key.startswith(old + ".")),
        None,
    )


@check(
    "fields.legacy-reward-key",
    level="error",
    # Why "ignored": migrate_legacy_reward_impl would copy these keys into reward.*, but only the
    # fully-async entry point calls it; main_ppo's path reads reward.* alone.
    evidence=(
        "verl/experimental/reward_loop/reward_loop.py:39 (migrate_legacy_reward_impl, called only by "
        "verl/experimental/fully_async_policy/fully_async_main.py:237); main_ppo reads reward.* "
        "(verl/trainer/ppo/reward.py:70, verl/trainer/ppo/v1/trainer_base.py:201); "
        "verl PR #7331, #5558, #6172"
    ),
    summary="An explicit override of a legacy top-level reward key (reward_model.*, custom_reward_function.*) that main_ppo never migrates to reward.*: it is silently ignored.",
    fix="set the reward.* key the finding names instead",
    example=Example(
        fires=("reward_model.reward_manager=dapo",), twin=("reward.reward_manager.name=dapo",)
    ),
)
def legacy_reward_key(inp: CheckInput) -> Iterator[Hit]:
    if MIGRATES_LEGACY_REWARD in inp.entry_calls:
        return  # the entry point migrates them (fully_async_main.py:237)
    for field in inp.explicit_fields:
        key = field_key(field)
        replacement = legacy_reward_replacement(key)
        if replacement:
            yield Hit(
                key,
                f"`{field}` sets a legacy top-level reward key that verl {inp.version} silently ignores "
                "(main_ppo never migrates it to reward.*; only the fully-async entry point does)",
                fix=f"set {replacement} instead",
            )


# The switches that turn a feature block on. A block's fields are read by 0.9.0 whenever its
# switch is on (e.g. distillation.*: verl/trainer/ppo/ray_trainer.py:934 builds DistillationConfig
# when distillation.enabled; model.mtp.*: verl/workers/config/model.py:238 and
# verl/models/mcore/model_forward.py:72 read them when mtp.enable; model.lora.*: sglang_rollout/utils.py:29 and the Megatron engine read them when
# lora.rank > 0), so "no effect" can only be claimed while the switch is off.
_SWITCHES = ("enable", "enabled", "enable_train", "enable_rollout")


def _feature_on(resolved: Mapping[str, Any], key: str) -> bool:
    """Whether an enclosing block of ``key`` is switched on in the resolved config."""
    parts = key.split(".")
    node: Any = resolved
    chain: list[tuple[str, Mapping[str, Any]]] = []
    for part in parts[:-1]:
        if not isinstance(node, Mapping) or part not in node:
            break
        chain.append((part, node))
        node = node[part]
        if isinstance(node, Mapping):
            if any(
                node.get(switch)
                for switch in _SWITCHES
                if not isinstance(node.get(switch), Mapping)
            ):
                return True
            rank = node.get("rank")
            if part == "lora" and isinstance(rank, int) and rank > 0:
                return True
            mode = node.get("mode")
            if part == "router_replay" and mode not in (None, "disabled"):
                return True
    # A `use_<block>` switch beside the block (algorithm.use_pf_ppo for algorithm.pf_ppo.*).
    return any(bool(parent.get(f"use_{part}")) for part, parent in chain)


@check(
    "fields.no-effect",
    level="warning",
    evidence="profile {profile}",
    summary="An explicit override of a field the profile marks as having no effect on training while its feature block is off (e.g. algorithm.pf_ppo.* without algorithm.use_pf_ppo).",
    fix="remove the override, or switch its feature on",
    example=Example(
        fires=("algorithm.pf_ppo.reweight_method=pow",),
        twin=("algorithm.use_pf_ppo=True", "algorithm.pf_ppo.reweight_method=pow"),
    ),
    family=None,
)
def no_effect(inp: CheckInput) -> Iterator[Hit]:
    # Names, output folders and profiler switches are set on purpose; flag only the fields whose
    # setting suggests an intent upstream ignores: the profile marks those rules `no_effect`.
    under = _leaves_under(inp.leaves) if inp.explicit_fields else {}
    for field in inp.explicit_fields:
        key = field_key(field)
        if legacy_reward_replacement(key):
            continue  # the legacy-key error says more
        if _feature_on(inp.resolved, key):
            continue  # its block is switched on, so the selected code path reads it
        # Every leaf the field sets: itself, or the whole section it names (a group selection
        # such as `engine=fsdp` sets every leaf of the section, most of which act).
        landed = under.get(key, [])
        if landed and all(leaf.klass == "inert" and leaf.no_effect for leaf in landed):
            yield Hit(
                key,
                f"`{field}` lands on a field with no effect on training here (profile class inert)",
            )


def _leaves_under(leaves: Iterable[LeafVerdict]) -> dict[str, list[LeafVerdict]]:
    """Each leaf under every key that names it or a section above it (``a.b`` and ``a`` for
    ``a.b[0]``): the leaves a field sets, found once per case, not by a scan of every leaf for
    every field (3.6 of 56 s of a cold ``check`` of the 109 example scripts)."""
    under: dict[str, list[LeafVerdict]] = {}
    for leaf in leaves:
        path = leaf.path
        under.setdefault(path, []).append(leaf)
        for end, char in enumerate(path):
            if char in ".[":
                under.setdefault(path[:end], []).append(leaf)
    return under


_VLLM_SWITCHES = (
    "actor_rollout_ref.rollout.enable_chunked_prefill",
    "actor_rollout_ref.rollout.enable_prefix_caching",
)


@check(
    "rollout.vllm-false-flag-dropped",
    level="warning",
    evidence="verl/workers/rollout/vllm_rollout/utils.py:458-460 (build_cli_args_from_config skips False booleans), used by vllm_async_server.py:409",
    summary="A vLLM boolean (enable_chunked_prefill, enable_prefix_caching, engine_kwargs.vllm.*) set to False: verl passes booleans as bare --flags and drops False ones, so vLLM keeps its default.",
    fix="leave it out; to turn the feature off, pass vLLM's own negative flag",
    example=Example(
        fires=("actor_rollout_ref.rollout.enable_chunked_prefill=False",),
        twin=("actor_rollout_ref.rollout.enable_chunked_prefill=True",),
    ),
)
def vllm_false_flag_dropped(inp: CheckInput) -> Iterator[Hit]:
    if inp.resolved["actor_rollout_ref"]["rollout"].get("name") != "vllm":
        return
    for field in inp.explicit_fields:
        key, _, value = field.partition("=")
        key = key.lstrip("+~")
        vllm_kwarg = key.startswith("actor_rollout_ref.rollout.engine_kwargs.vllm.")
        if (key in _VLLM_SWITCHES or vllm_kwarg) and value.strip().lower() == "false":
            yield Hit(
                key,
                f"`{field}` never reaches vLLM: verl {inp.version} turns booleans into bare "
                "`--flag` arguments and drops False ones, so vLLM keeps its own default",
                fix="leave it out; to turn the feature off, pass vLLM's own negative flag",
            )


@check(
    "entry.forced-value",
    level="warning",
    evidence="the entry point's main overwrites the key before any reader (pipeline/entry_points.py "
    "lists the assignments; e.g. verl/experimental/one_step_off_policy/main_ppo.py:121-122)",
    fix="set the key the entry point copies instead",
    example=Example(
        ("actor_rollout_ref.rollout.nnodes=2",),
        ("rollout.nnodes=2",),
        base="examples/mtp_trainer/run_mimo_7b_mtp_fully_async_megatron_multinode.sh",
    ),
    family=None,
)
def forced_value(inp: CheckInput) -> Iterator[Hit]:
    """An explicit key the entry point's ``main`` overwrites with another key's value before
    anything reads it (the asynchronous trainers copy ``rollout.nnodes`` into
    ``actor_rollout_ref.rollout.nnodes``): the script's value never acts."""
    explicit = {field_key(field): field for field in inp.explicit_fields}
    for target, source, where in inp.forced:
        if target in explicit:
            yield Hit(
                target,
                f"`{explicit[target]}` is overwritten by the entry point at {where} with "
                f"{source}'s value before anything reads it",
                f"set {source} instead",
            )


# The two spellings of an actor's LoRA block and the engines whose training reads each
# (lora.ENGINE_LORA_RANK, with its evidence). The trainer reads either (trainer_base.py:317-320),
# and so does vLLM (vllm_async_server.py:207-210).
_LORA_RANK_KEY = {
    strategy: f"actor_rollout_ref.model.{key}"
    for strategy, key in ENGINE_LORA_RANK.items()
    if strategy != "mindspeed"  # no claim made for it here
}


def _rank(resolved: Mapping[str, Any], dotted: str) -> int:
    node: Any = resolved
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return int(node) if isinstance(node, int) and not isinstance(node, bool) else 0


@check(
    "fields.lora-other-engine-spelling",
    level="warning",
    evidence=(
        "the FSDP engine builds LoRA from model.lora_rank only "
        "(verl/workers/engine/fsdp/transformer_impl.py:143, :340-349), the Megatron engine from "
        "model.lora only (verl/workers/engine/megatron/transformer_impl.py:422-424, "
        "verl/workers/config/megatron_peft.py:22-24); the trainer takes either rank and then "
        "computes the reference policy with the actor's adapter off "
        "(verl/trainer/ppo/v1/trainer_base.py:317-320)"
    ),
    summary="The actor's LoRA rank written in the other engine's spelling (model.lora.rank on "
    "FSDP, model.lora_rank on Megatron): the engine that trains never reads it and trains the "
    "whole model, while the trainer, seeing a rank, drops the reference worker and takes the "
    "reference log-probs from the actor with its (absent) adapter off.",
    fix="write the rank in the spelling of the actor's engine",
    example=Example(
        fires=("actor_rollout_ref.model.lora.rank=16",),
        twin=("actor_rollout_ref.model.lora_rank=16",),
    ),
)
def lora_other_engine_spelling(inp: CheckInput) -> Iterator[Hit]:
    strategy = str(inp.resolved["actor_rollout_ref"]["actor"].get("strategy") or "fsdp")
    read = _LORA_RANK_KEY.get(strategy)
    if read is None or _rank(inp.resolved, read) > 0:
        return  # another engine (no claim), or the engine's own spelling holds a rank
    written = {field_key(f): f for f in inp.explicit_fields}
    for other in sorted(set(_LORA_RANK_KEY.values()) - {read}):
        if other in written and _rank(inp.resolved, other) > 0:
            yield Hit(
                other,
                f"`{written[other]}` is the LoRA rank of another engine: the "
                f"actor_rollout_ref.actor.strategy={strategy!r} engine reads {read} "
                f"(0 here), so it trains the whole model without an adapter, while the trainer "
                "takes the rank, runs no reference worker and computes the reference log-probs "
                "with the actor's adapter off, that is, from the actor being trained",
                fix=f"set {read}={_rank(inp.resolved, other)} instead",
            )


# A role the run never starts: its worker is built only when upstream's decider says so, and
# every other read of its section waits for the same decider (the evidence of each rule). The
# entry point decides with these functions (main_ppo.py:180-181); another entry point's trainer
# may decide otherwise, and is not claimed for.
_DECIDERS = frozenset({"need_critic", "need_reference_policy"})


def _unstarted_role(
    inp: CheckInput, prefix: str, started: bool, switches: tuple[str, ...], why: str, fix: str
) -> Iterator[Hit]:
    """``prefix`` keys the script sets (its role's switches aside) when the role never starts."""
    if started or (inp.entry_calls and not inp.entry_calls & _DECIDERS):
        return  # started, or another entry point (main_ppo, the pinned one, has no calls here)
    for field in inp.explicit_fields:
        key = field_key(field)
        if key.startswith(prefix) and key not in switches:
            yield Hit(
                key,
                f"`{field}` has no effect here: {why.format(version=inp.version)}",
                fix=fix.format(key=key),
            )


@check(
    "effect.no-critic-worker",
    level="warning",
    evidence=(
        "need_critic decides the critic once, from critic.enable, else adv_estimator == 'gae' "
        "(verl/trainer/ppo/utils.py:96-106, called by verl/trainer/main_ppo.py:181 and "
        "verl/trainer/ppo/v1/trainer_base.py:127); with it false no critic worker is built "
        "(trainer_base.py:249, :751-753) and every other read of critic.* sits under "
        "`if self.use_critic` (trainer_base.py:568-579, :1439-1442; ray_trainer.py:798-803, "
        ":1652-1654) or `if use_critic` (verl/utils/config.py:173-175)"
    ),
    summary="An explicit critic.* key in a run that trains no critic (critic.enable unset or "
    "false and an estimator other than gae): no critic worker is built and no code reads the key.",
    fix="remove the critic keys, or train a critic (critic.enable=True, or "
    "algorithm.adv_estimator=gae)",
    example=Example(
        fires=("critic.optim.lr=2e-5",), twin=("critic.enable=True", "critic.optim.lr=2e-5")
    ),
)
def no_critic_worker(inp: CheckInput) -> Iterator[Hit]:
    estimator = inp.resolved["algorithm"]["adv_estimator"]
    enable = inp.resolved["critic"].get("enable")
    yield from _unstarted_role(
        inp,
        "critic.",
        need_critic(inp.resolved),
        ("critic.enable",),
        f"no critic trains (critic.enable={enable!r}, algorithm.adv_estimator={estimator!r}), so "
        "verl {version} builds no critic worker and reads no critic.* key",
        "remove {key}, or train a critic (critic.enable=True)",
    )


@check(
    "effect.no-reference-worker",
    level="warning",
    evidence=(
        "need_reference_policy is use_kl_in_reward or actor.use_kl_loss "
        "(verl/trainer/ppo/utils.py:75-79, called by verl/trainer/main_ppo.py:180 and "
        "verl/trainer/ppo/v1/trainer_base.py:128); with it false the actor's worker is built "
        "without the reference role (trainer_base.py:746) and the reference section is read only "
        "by that role (verl/workers/engine_workers.py:470, :534-583) and under "
        "`if use_reference_policy` (verl/utils/config.py:154-160)"
    ),
    summary="An explicit actor_rollout_ref.ref.* key in a run without a reference policy (no KL "
    "loss, no KL in the reward): no reference worker is built and no code reads the key.",
    fix="remove the reference keys, or use a KL term (actor_rollout_ref.actor.use_kl_loss=True "
    "or algorithm.use_kl_in_reward=True)",
    example=Example(
        fires=(
            "actor_rollout_ref.actor.use_kl_loss=False",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        ),
        twin=("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",),
    ),
)
def no_reference_worker(inp: CheckInput) -> Iterator[Hit]:
    actor = inp.resolved["actor_rollout_ref"]["actor"]
    in_reward = inp.resolved["algorithm"].get("use_kl_in_reward")
    yield from _unstarted_role(
        inp,
        "actor_rollout_ref.ref.",
        need_reference_policy(inp.resolved),
        (),
        f"no reference policy runs (actor_rollout_ref.actor.use_kl_loss={actor.get('use_kl_loss')!r}, "
        f"algorithm.use_kl_in_reward={in_reward!r}), so verl {{version}} builds no reference worker "
        "and reads no actor_rollout_ref.ref.* key",
        "remove {key}, or use a KL term (actor_rollout_ref.actor.use_kl_loss=True)",
    )
