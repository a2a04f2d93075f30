"""What a resolved verl configuration asks of each GPU: the roles, their engines, the token
budgets of their micro-batches, and the rollout servers. Read from the mapping only.

Each number cites the verl 0.9.0 line that decides it (``releases.lines`` finds it in another
release); where a release's code decides differently the release's facts say so
(``release_facts``); ``checks/roles.py`` answers which roles run, their parallel sizes, the world.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_verl_compat.memory.models import ModelChoice
from pytest_verl_compat.memory.states import EngineSpec

RL = "rl"
SFT = "sft"
# an entry point that never trains (it generates or serves): its rollout servers alone
SERVE = "serve"
# Where an entry point puts the rollout (runs.own_rollout_pool): on the trainer's GPUs; on GPUs
# of its own; on its own, and on the trainer's too when a key asks for hybrid replicas.
POOL_SHARED = ""
POOL_OWN = "own"
POOL_OWN_HYBRID = "own, hybrid by key"
# Where the micro-batch budgets are wired (verl/workers/engine_workers.py)
EV_ACTOR_BUDGETS = "verl/workers/engine_workers.py:606-624"
EV_REF_BUDGETS = "verl/workers/engine_workers.py:537-578"
EV_CRITIC_BUDGETS = "verl/trainer/ppo/v1/trainer_base.py:249-252"
EV_MICRO_BATCHES = "verl/workers/engine/utils.py:92-130"
EV_ENTROPY_PASSES = "verl/trainer/ppo/v1/trainer_base.py:1495-1500, :1676-1693"
# The weight sync's transfer bucket, under the rollout section (CheckpointEngineConfig's default,
# verl/workers/config/rollout.py:135).
BUCKET_KEY = "checkpoint_engine.update_weights_bucket_megabytes"
BUCKET_DEFAULT_MB = 2048
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
    optim_section: str  # dotted path of its optimizer section (the SFT trainer's is top-level)
    spec: EngineSpec
    model: ModelChoice
    param_offload: bool
    optimizer_offload: bool
    offload_policy: bool  # FSDP2 CPUOffloadPolicy: the engine never holds its shards
    checkpointing: bool
    remove_padding: bool
    # Megatron's sequence parallelism: the norms' tensors split over the tensor-parallel ranks
    sequence_parallel: bool
    activation_offload: bool  # the FSDP engine's: each layer's saved tensors to the host
    # FSDP frees a unit's gathered weights after its forward (fsdp_config.reshard_after_forward);
    # false keeps every unit gathered until its backward, or to the end of a no-grad pass
    reshard_after_forward: bool
    sp: int  # Ulysses (FSDP) or context parallel (Megatron)
    train_tokens: int  # tokens of one training micro-batch on one GPU
    infer_tokens: int  # tokens of one forward-only micro-batch on one GPU
    micro_batches: int  # micro-batches of one mini-batch on one GPU
    entropy_train: bool
    chunked_entropy: bool
    fused_kernels: bool
    compiled: bool  # the engine's use_torch_compile (entropy compiled)
    temperature_copy: bool  # the log-prob pass divides the logits into a second tensor
    entropy_every_pass: bool  # the entropy is computed in every pass, asked for or not
    train_budget_key: str  # the key that sets train_tokens (for fixes)
    infer_budget_key: str
    dynamic: bool
    # the release's lines behind the logits' copies and the micro-batches' tokens
    logits_evidence: str = ""
    tokens_evidence: str = ""
    # the key that turns deferred gradient sync off, where the release's tree has it
    sync_key: str = ""
    # the log-probs' backward writes into the saved logits when no entropy is taken
    logprob_grad_in_place: bool = False
    # the loss is torch's cross entropy under bf16 autocast: an fp32 log_softmax saved and fp32
    # gradients beside it (the old SFT trainer's), not flash-attn's
    fp32_loss: bool = False
    # the train budget (train_budget_key's value) that makes a rank's mini-batch one micro-batch:
    # its sequences (static) or their tokens per GPU (dynamic); 0 where not known
    whole_mini_batch: int = 0
    # what the forecast read in place of a key the release needs (a deprecated global size)
    assumed: tuple[str, ...] = ()
    # the key that sets the role's Ulysses size where it is not the FSDP engine's (VeOmni's
    # ulysses_parallel_size); empty: the FSDP key (fixes.py)
    ulysses_key: str = ""


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
    colocated: bool  # replicas on the trainer's GPUs (the hybrid engine)
    standalone_gpus: int  # GPUs of standalone replicas besides (0: none)
    keeps_weights_asleep: bool  # asleep, the server keeps its weights (SGLang's LoRA adapters)
    graphs_in_share: bool = False  # vLLM's CUDA graphs come out of its share (release's facts)
    # the actor's LoRA weight sync gathers its whole FSDP1 model (layered_summon off)
    sync_summons_whole: bool = False
    prefix_caching: bool = True  # enable_prefix_caching (a hybrid model's state blocks)
    # the trainer's GPU buffer the weight sync fills and hands over by IPC, in bytes
    # (checkpoint_engine.update_weights_bucket_megabytes, phases.EV_BUCKET)
    bucket_bytes: int = BUCKET_DEFAULT_MB << 20
    # rollout.quantization: the engine's online fp8 (rollout.FP8_WEIGHTS) or another method the
    # forecast counts in the rollout dtype (rollout.quantization_assumption says so); None: none
    quantization: str | None = None
    # the rank of the server's LoRA slots for the actor's adapter (0: none; server_lora), whether
    # vLLM's are fully sharded (lora.fully_sharded_loras), and SGLang's targets (what verl hands
    # it as lora_target_modules) and slots (max_loras_per_batch)
    lora_rank: int = 0
    lora_sharded: bool = False
    lora_targets: tuple[str, ...] = ()
    lora_pool_slots: int = 0
    lora_experts: bool = (
        True  # SGLang's pool holds per-expert slots (server_lora.SGLANG_EXPERT_SLOTS)
    )


@dataclass(frozen=True)
class RunLayout:
    kind: str  # rl, sft or serve
    world: int  # trainer GPUs
    roles: tuple[RoleLayout, ...]
    rollout: ServerLayout | None
    reward: ServerLayout | None
    lengths: Lengths
    n: int  # responses per prompt
    saves_checkpoints: bool
    hf_model_in_checkpoint: bool
    # the trainer takes the reference log-probs from the actor with its adapter off
    # (trainer_base.py:316-323, :563-565, :1548-1552): a reference policy and a LoRA rank in either
    # spelling, which the actor's engine may not read (checks/lora.ENGINE_LORA_RANK)
    reference_from_actor: bool = False
    notes: tuple[str, ...] = ()

    def role(self, name: str) -> RoleLayout | None:
        return next((r for r in self.roles if r.role == name), None)

    def rollout_model(self) -> ModelChoice:
        """The model a run without training roles serves."""
        assert self.rollout is not None, "a run without roles serves a model"
        return self.rollout.model


def value_at(mapping: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    node: Any = mapping
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


# Counts that divide a world or a model: a parallel size below one is not a configuration any
# engine starts (unset, null, is the section's own default).
POSITIVE_KEYS = frozenset(
    {
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "virtual_pipeline_model_parallel_size",
        "context_parallel_size",
        "expert_model_parallel_size",
        "expert_tensor_parallel_size",
        "data_parallel_size",
        "expert_parallel_size",
        "ulysses_sequence_parallel_size",
        "ulysses_parallel_size",  # the VeOmni engine's Ulysses size
    }
)
# Keys the forecast reads as counts, wherever they sit in the mapping (by their last name).
COUNT_KEYS = POSITIVE_KEYS | frozenset(
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
        "fsdp_size",
        "lora_rank",
        "rank",  # model.lora.rank, the tree's only key of that name
        "save_freq",
    }
)
# The trainer's GPUs, which every layout divides; other sections' nnodes are 0 or null by default
# (a rollout's own pool).
TRAINER_GPUS = frozenset({"trainer.nnodes", "trainer.n_gpus_per_node"})


def first_bad_count(mapping: Mapping[str, Any], prefix: str = "") -> tuple[str, Any, str] | None:
    """The first count key (dotted path, value, what was expected) that holds something not an
    integer, a parallel size below one, or no GPU count: the one line a forecast of that mapping
    reports instead of reading a default in its place (or dividing by it)."""
    for key, value in mapping.items():
        dotted = f"{prefix}{key}"
        if key in COUNT_KEYS:
            if value is None:
                if dotted in TRAINER_GPUS:
                    return dotted, value, "a positive integer"
                continue
            if not _integral(value):
                return dotted, value, "an integer"
            if (key in POSITIVE_KEYS or dotted in TRAINER_GPUS) and int(float(value)) < 1:
                return dotted, value, "a positive integer"
        elif isinstance(value, Mapping):
            found = first_bad_count(value, dotted + ".")
            if found is not None:
                return found
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


def micro_batches(
    dynamic: bool,
    budget: int,
    mbs: int,
    count: int,
    sequence: int,
    sp: int,
    within_budget: bool,
) -> tuple[int, int]:
    """(micro-batches of one pass on one GPU, tokens of the largest of them on one GPU) for
    ``count`` sequences of ``sequence`` tokens on one data-parallel rank (engine/utils.py:92-130).

    Static: micro-batches of ``mbs`` sequences (all of them when fewer). Dynamic (verl/utils/seqlen_balancing.py,
    rearrange_micro_batches): ``ceil(tokens / (budget x Ulysses size))`` micro-batches balanced by
    workload, which for sequences of one length splits them as evenly as counts allow; a release
    whose partition keeps every micro-batch within the budget (the release's facts) raises the
    count until it does. Ulysses or context parallelism splits each micro-batch's tokens over its
    ranks. Without a count (a role with no batch of its own) the budget is the micro-batch.
    """
    sp = max(sp, 1)
    if not dynamic:
        size = max(mbs, 1)
        # a split never holds more sequences than the rank has (DataProto.split, protocol.py:914;
        # 0.9.0's engine asserts the count divides by the size, engine/utils.py:123-128)
        held = min(size, count) if count > 0 else size
        return (max(1, ceil_div(count, size)) if count > 0 else 1), ceil_div(held * sequence, sp)
    limit = max(budget, 1) * sp
    if count <= 0 or sequence <= 0:
        return 1, max(budget, ceil_div(sequence, sp))
    k = max(1, min(count, ceil_div(count * sequence, limit)))
    while within_budget and k < count and ceil_div(count, k) * sequence > limit:
        k += 1
    return k, ceil_div(ceil_div(count, k) * sequence, sp)


def whole_mini_batch(dynamic: bool, count: int, sequence: int, sp: int) -> int:
    """The budget under which ``count`` sequences of ``sequence`` tokens on one data-parallel rank
    are one micro-batch (``micro_batches`` gives 1): the sequences themselves with a static
    micro-batch, their tokens over the Ulysses or context-parallel ranks with a dynamic one."""
    if count <= 0:
        return 0
    return ceil_div(count * sequence, max(sp, 1)) if dynamic else count


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
