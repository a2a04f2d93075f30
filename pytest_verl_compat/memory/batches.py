"""How a role's micro-batches are set: dynamic or static, the keys and budgets that bound each
pass, the per-GPU sizes (a deprecated global size read as the workers that took it divided it)
and the mini-batch, per role and as the release's critic splits its passes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_verl_compat.memory.layout import CRITIC_DEFAULT_BUDGET, as_int, value_at
from pytest_verl_compat.memory.release_facts import ReleaseFacts


@dataclass(frozen=True)
class RoleBatches:
    """The micro-batching of one role's passes (the update's and the forward-only one)."""

    dynamic: bool
    train_key: str  # the key that bounds a training micro-batch (for fixes)
    infer_key: str
    train_budget: int  # tokens per GPU, when dynamic
    infer_budget: int
    mbs: int  # sequences per GPU, when static
    infer_mbs: int
    mini: int  # sequences of one mini-batch over the whole run (0: forward only)
    assumed: tuple[str, ...] = ()


def _budget_key(section: str, pass_name: str, dynamic: bool) -> str:
    """The key that bounds a pass's micro-batches: its token budget when dynamic, else its
    per-GPU micro-batch size (``ppo``, ``log_prob`` or ``forward`` keys of ``section``)."""
    kind = "max_token_len_per_gpu" if dynamic else "micro_batch_size_per_gpu"
    return f"{section}.{pass_name}_{kind}"


# verl's FSDP workers until mid-2025 divided a global micro-batch size by the data-parallel ranks
# (GPUs over Ulysses size) into the *_per_gpu key: ActorRolloutRefWorker.__init__ and
# CriticWorker.__init__, "normalize config", of
# https://github.com/volcengine/verl/blob/004c888001c88628b98fbc5fdee9c3e9b8898800/verl/workers/fsdp_workers.py
EV_GLOBAL_MICRO_BATCH = (
    "verl's FSDP workers before the engine workers (volcengine/verl@004c888 "
    "verl/workers/fsdp_workers.py, ActorRolloutRefWorker.__init__: ppo_micro_batch_size //= "
    "world_size // ulysses_sequence_parallel_size)"
)


@dataclass
class _Sizes:
    """A role's per-GPU micro-batch sizes as it reads them (``of``), and what it assumed."""

    dynamic: bool
    data_parallel: int  # the older workers' divisor of a global size: GPUs over Ulysses size
    assumed: list[str]

    def of(self, section: Mapping[str, Any], prefix: str, key: str, default: int) -> int:
        """``{key}_per_gpu`` of the section, else ``default``; in static mode, where only the
        deprecated global ``key`` is set, the global size over the data-parallel ranks, as the
        workers that read it divided it (said in ``assumed``: the release itself asserts the
        per-GPU key at start, a check error)."""
        per_gpu = section.get(f"{key}_per_gpu")
        given = section.get(key)
        if per_gpu is not None or given is None or self.dynamic:
            return as_int(per_gpu, default)
        value = max(as_int(given, 1) // max(self.data_parallel, 1), 1)
        said = (
            f"{prefix}.{key}={given} is a global size, which verl's engine workers never divide "
            f"(they need {prefix}.{key}_per_gpu: an error of check); read as {value} per GPU, "
            f"{given} over {self.data_parallel} data-parallel rank(s), as {EV_GLOBAL_MICRO_BATCH}"
        )
        if said not in self.assumed:
            self.assumed.append(said)
        return value


def role_batches(
    resolved: Mapping[str, Any],
    role: str,
    section: Mapping[str, Any],
    engine: Mapping[str, Any],
    data_parallel: int,
    n: int,
    facts: ReleaseFacts,
) -> RoleBatches:
    """``role``'s micro-batching; ``data_parallel`` is the older workers' divisor of a global
    size (GPUs over Ulysses size)."""
    prefix = "critic" if role == "critic" else f"actor_rollout_ref.{role}"
    rollout = "actor_rollout_ref.rollout"
    assumed: list[str] = []
    if role == "actor":
        dynamic = bool(section.get("use_dynamic_bsz"))
        train_key = _budget_key(prefix, "ppo", dynamic)
        infer_key = _budget_key(rollout, "log_prob", dynamic)
        train_budget = as_int(section.get("ppo_max_token_len_per_gpu"), 16384)
        infer_budget = as_int(
            value_at(resolved, f"{rollout}.log_prob_max_token_len_per_gpu"), train_budget
        )
        sizes = _Sizes(dynamic, data_parallel, assumed)
        mbs = sizes.of(section, prefix, "ppo_micro_batch_size", 1)
        rollout_section = value_at(resolved, rollout, {})
        infer_mbs = sizes.of(rollout_section, rollout, "log_prob_micro_batch_size", mbs)
        mini = as_int(section.get("ppo_mini_batch_size"), 1) * n
    elif role == "ref":
        dynamic = bool(section.get("log_prob_use_dynamic_bsz"))
        train_key = infer_key = _budget_key(prefix, "log_prob", dynamic)
        train_budget = infer_budget = as_int(section.get("log_prob_max_token_len_per_gpu"), 16384)
        sizes = _Sizes(dynamic, data_parallel, assumed)
        mbs = infer_mbs = sizes.of(section, prefix, "log_prob_micro_batch_size", 1)
        mini = 0
    elif facts.critic_splits_per_pass:
        # each pass on its own keys, as a release's fact says its critic splits them
        dynamic = bool(section.get("use_dynamic_bsz"))
        train_key = _budget_key(prefix, "ppo", dynamic)
        infer_key = _budget_key(prefix, "forward", dynamic)
        train_budget = as_int(section.get("ppo_max_token_len_per_gpu"), CRITIC_DEFAULT_BUDGET)
        infer_budget = as_int(section.get("forward_max_token_len_per_gpu"), train_budget)
        sizes = _Sizes(dynamic, data_parallel, assumed)
        mbs = sizes.of(section, prefix, "ppo_micro_batch_size", 1)
        infer_mbs = sizes.of(section, prefix, "forward_micro_batch_size", mbs)
        mini = as_int(section.get("ppo_mini_batch_size"), 1) * n
    else:  # the V1 critic runs both passes on ppo_infer_max_token_len_per_gpu (trainer_base.py:251-252)
        engine_dynamic = engine.get("use_dynamic_bsz")
        dynamic = True if engine_dynamic is None else bool(engine_dynamic)
        train_key = infer_key = "critic.ppo_infer_max_token_len_per_gpu"
        train_budget = infer_budget = as_int(
            section.get("ppo_infer_max_token_len_per_gpu"), CRITIC_DEFAULT_BUDGET
        )
        mbs = infer_mbs = as_int(section.get("ppo_micro_batch_size_per_gpu"), 1)
        mini = as_int(section.get("ppo_mini_batch_size"), 1) * n
    return RoleBatches(
        dynamic,
        train_key,
        infer_key,
        train_budget,
        infer_budget,
        mbs,
        infer_mbs,
        mini,
        tuple(assumed),
    )
