"""What a resolved verl configuration asks of each GPU: the roles, their engines, the token
budgets of their micro-batches, and the rollout servers. Read from the mapping only.

Each number cites the verl 0.9.0 line that decides it; ``checks/roles.py`` answers which roles
run, the sizes of their parallelism, and the world.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_verl_compat.memory.models import ModelChoice
from pytest_verl_compat.memory.states import EngineSpec

RL = "rl"
SFT = "sft"
# Where the micro-batch budgets are wired (verl/workers/engine_workers.py)
EV_ACTOR_BUDGETS = "verl/workers/engine_workers.py:606-624"
EV_REF_BUDGETS = "verl/workers/engine_workers.py:537-578"
EV_CRITIC_BUDGETS = "verl/trainer/ppo/v1/trainer_base.py:249-252"
EV_MICRO_BATCHES = "verl/workers/engine/utils.py:92-130"
EV_ENTROPY_PASSES = "verl/trainer/ppo/v1/trainer_base.py:1495-1500,1676-1693"
CRITIC_DEFAULT_BUDGET = 32768  # CriticConfig.ppo_infer_max_token_len_per_gpu, critic.py:91


@dataclass(frozen=True)
class Lengths:
    """Tokens per sequence: the prompt and the response, and where the numbers come from."""

    prompt: int
    response: int
    source: str

    @property
    def sequence(self) -> int:
        return self.prompt + self.response


@dataclass(frozen=True)
class RoleLayout:
    """One role's engine on one rank and the micro-batches it runs."""

    role: str  # actor, ref, critic (SFT: actor)
    section: str  # dotted path of the role's section
    engine_section: str  # dotted path of its engine section
    spec: EngineSpec
    model: ModelChoice
    param_offload: bool
    optimizer_offload: bool
    offload_policy: bool  # FSDP2 CPUOffloadPolicy: the engine never holds its shards
    checkpointing: bool
    remove_padding: bool
    sp: int  # Ulysses (FSDP) or context parallel (Megatron)
    train_tokens: int  # tokens of one training micro-batch on one GPU
    infer_tokens: int  # tokens of one forward-only micro-batch on one GPU
    micro_batches: int  # micro-batches of one mini-batch on one GPU
    entropy_train: bool
    chunked_entropy: bool
    fused_kernels: bool
    compiled: bool  # the engine's use_torch_compile (entropy compiled)
    train_budget_key: str  # the key that sets train_tokens (for fixes)
    infer_budget_key: str
    dynamic: bool


@dataclass(frozen=True)
class ServerLayout:
    """A rollout (or reward-model) server: its engine, parallel sizes and memory share."""

    name: str  # vllm, sglang, trtllm, hf
    section: str
    model: ModelChoice
    tp: int
    dp: int
    ep: int
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enforce_eager: bool
    free_cache_engine: bool
    dtype: int
    kv_dtype: int
    standalone: bool  # on GPUs of its own (not colocated with the trainer)
    gpus: int  # GPUs the servers span


@dataclass(frozen=True)
class RunLayout:
    kind: str  # rl or sft
    world: int  # trainer GPUs
    roles: tuple[RoleLayout, ...]
    rollout: ServerLayout | None
    reward: ServerLayout | None
    lengths: Lengths
    n: int  # responses per prompt
    saves_checkpoints: bool
    hf_model_in_checkpoint: bool
    notes: tuple[str, ...] = ()

    def role(self, name: str) -> RoleLayout | None:
        return next((r for r in self.roles if r.role == name), None)


def value_at(mapping: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    node: Any = mapping
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


# Keys the forecast reads as counts, wherever they sit in the mapping (by their last name).
COUNT_KEYS = frozenset(
    {
        "n",
        "nnodes",
        "n_gpus_per_node",
        "train_batch_size",
        "ppo_mini_batch_size",
        "ppo_micro_batch_size_per_gpu",
        "ppo_max_token_len_per_gpu",
        "ppo_infer_max_token_len_per_gpu",
        "log_prob_micro_batch_size_per_gpu",
        "log_prob_max_token_len_per_gpu",
        "micro_batch_size_per_gpu",
        "max_token_len_per_gpu",
        "max_prompt_length",
        "max_response_length",
        "max_length",
        "max_model_len",
        "max_num_seqs",
        "max_num_batched_tokens",
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "context_parallel_size",
        "expert_model_parallel_size",
        "expert_tensor_parallel_size",
        "data_parallel_size",
        "expert_parallel_size",
        "ulysses_sequence_parallel_size",
        "fsdp_size",
        "lora_rank",
        "save_freq",
    }
)


def first_bad_count(mapping: Mapping[str, Any], prefix: str = "") -> tuple[str, Any] | None:
    """The first count key (dotted path, value) that holds something not an integer: the one
    line a forecast of that mapping reports instead of reading a default in its place."""
    for key, value in mapping.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            found = first_bad_count(value, dotted + ".")
            if found is not None:
                return found
        elif key in COUNT_KEYS and value is not None and not _integral(value):
            return dotted, value
    return None


def _integral(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, str) and value.strip().lstrip("+-").isdigit()


def as_int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def ceil_div(a: int, b: int) -> int:
    return -(-a // max(b, 1))


def micro_batch_tokens(dynamic: bool, budget: int, mbs: int, sequence: int, sp: int) -> int:
    """Tokens of one micro-batch on one GPU (engine/utils.py:92-130): the token budget (one
    sequence longer than it goes alone), or micro-batch size x sequence length; Ulysses or
    context parallelism splits each micro-batch's tokens over its ranks."""
    if dynamic:
        return max(budget, ceil_div(sequence, sp))
    return ceil_div(max(mbs, 1) * sequence, sp)


def micro_batch_count(
    dynamic: bool, budget: int, mbs: int, per_rank: int, sequence: int, sp: int
) -> int:
    if per_rank <= 0:
        return 1
    if dynamic:
        return max(1, ceil_div(per_rank * sequence, max(budget, 1) * sp))
    return max(1, ceil_div(per_rank, max(mbs, 1)))


def rl_lengths(resolved: Mapping[str, Any], given: tuple[int, int] | None) -> Lengths:
    if given is not None:
        return Lengths(given[0], given[1], "given with --lengths")
    prompt = as_int(value_at(resolved, "data.max_prompt_length"), 512)
    response = as_int(value_at(resolved, "data.max_response_length"), 512)
    return Lengths(
        prompt,
        response,
        "data.max_prompt_length + data.max_response_length (every response at its limit)",
    )


def sft_lengths(resolved: Mapping[str, Any], given: tuple[int, int] | None) -> Lengths:
    if given is not None:
        return Lengths(given[0], given[1], "given with --lengths")
    return Lengths(
        as_int(value_at(resolved, "data.max_length"), 1024),
        0,
        "data.max_length (every sample at its limit)",
    )
