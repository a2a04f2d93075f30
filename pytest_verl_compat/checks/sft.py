"""The SFT trainer's arithmetic (``verl.trainer.sft_trainer``, config ``sft_trainer_engine``).

verl's SFT trainer runs one process per rank under torchrun: its world is torchrun's
(``nproc_per_node`` x ``nnodes``, ``CheckInput.world_size``; ``initialize_global_process_group``
reads it, verl/utils/distributed.py:62-74), and its FSDP engine splits that world into
``world // ulysses_sequence_parallel_size`` data-parallel ranks
(verl/workers/engine/fsdp/transformer_impl.py:632-633). Each rank's data loader takes
``train_batch_size // dp_size`` sequences a step (verl/trainer/sft_trainer.py:234-249), which the
engine cuts into micro-batches (verl/workers/engine/utils.py:107-127). A launch whose world the
script does not fix (``--nproc_per_node=gpu``) is checked only where the world does not matter.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pytest_verl_compat.checks.fields import field_key
from pytest_verl_compat.checks.registry import SFT, CheckInput, Example, Hit, check

# The embedded manifest's SFT case every example starts from (an official gsm8k script on 8
# ranks).
SFT_BASE = "sft_gsm8k"
_ENGINE = "engine.ulysses_sequence_parallel_size"


# The sizes Megatron-Core divides the world by before data parallelism (expert parallelism is
# laid out inside the data-parallel ranks).
_MEGATRON_MODEL_PARALLEL = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
)


# An engine group without a ``strategy`` key takes its dataclass's default (megatron.yaml has none:
# McoreEngineConfig.strategy = "megatron", verl/workers/config/engine.py:214).
_STRATEGY_OF_TARGET = {"verl.workers.config.McoreEngineConfig": "megatron"}


def engine_strategy(engine: Mapping[str, Any]) -> str:
    """The SFT engine's strategy: its ``strategy`` key, else its dataclass's default ("" when
    neither says)."""
    return str(engine.get("strategy") or _STRATEGY_OF_TARGET.get(str(engine.get("_target_")), ""))


def _sizes(inp: CheckInput) -> tuple[int, int] | None:
    """(world, data-parallel ranks), when the launch fixes the world and the engine's data-parallel
    size follows from the configuration alone: FSDP's is world // ulysses_sequence_parallel_size
    (verl/workers/engine/fsdp/transformer_impl.py:632-633); Megatron's is Megatron-Core's data
    parallel world, world // (tensor x pipeline x context parallel), or 1 with a dynamic context
    parallel (megatron/transformer_impl.py:747-751). Other engines lay out a device mesh the
    configuration does not fix here (automodel, veomni, torchtitan): None."""
    if inp.world_size is None:
        return None
    world = inp.world_size
    engine = inp.resolved["engine"]
    strategy = engine_strategy(engine)
    if strategy.startswith("fsdp"):
        sp = int(engine.get("ulysses_sequence_parallel_size") or 1)
        return world, max(world // max(sp, 1), 1)
    if strategy == "megatron":
        if engine.get("dynamic_context_parallel"):
            return world, 1
        model = 1
        for key in _MEGATRON_MODEL_PARALLEL:
            model *= int(engine.get(key) or 1)
        return (world, world // model) if model > 0 and world % model == 0 else None
    return None


def _data(inp: CheckInput) -> Mapping[str, Any]:
    data: Mapping[str, Any] = inp.resolved["data"]
    return data


@check(
    "sft.batch-per-rank",
    level="error",
    evidence="verl/trainer/sft_trainer.py:234-249 (batch_size = train_batch_size // dp_size, "
    "given to StatefulDataLoader, which refuses 0)",
    fix="set data.train_batch_size to at least the data-parallel size (a multiple of it)",
    example=Example(("data.train_batch_size=4",), ("data.train_batch_size=8",), base=SFT_BASE),
    family=SFT,
)
def batch_per_rank(inp: CheckInput) -> Iterator[Hit]:
    """Each data-parallel rank's loader takes ``train_batch_size // dp_size`` sequences a step;
    fewer sequences than ranks gives it a batch of 0, which the data loader refuses."""
    sizes = _sizes(inp)
    if sizes is None:
        return
    _, dp = sizes
    batch = int(_data(inp)["train_batch_size"])
    if batch // dp == 0:
        yield Hit(
            "data.train_batch_size",
            f"data.train_batch_size={batch} over {dp} data-parallel ranks gives each rank a batch "
            "of 0 sequences",
        )


@check(
    "sft.batch-not-divisible",
    level="warning",
    evidence="verl/trainer/sft_trainer.py:241 (train_batch_size // dp_size per rank, the "
    "remainder dropped)",
    fix="set data.train_batch_size to a multiple of the data-parallel size",
    example=Example(("data.train_batch_size=260",), ("data.train_batch_size=264",), base=SFT_BASE),
    family=SFT,
)
def batch_not_divisible(inp: CheckInput) -> Iterator[Hit]:
    """A global batch that does not divide over the data-parallel ranks trains fewer sequences a
    step than ``train_batch_size`` says: each rank takes the floor and the rest is never seen."""
    sizes = _sizes(inp)
    if sizes is None:
        return
    _, dp = sizes
    batch = int(_data(inp)["train_batch_size"])
    per_rank = batch // dp
    if per_rank and batch % dp:
        yield Hit(
            "data.train_batch_size",
            f"data.train_batch_size={batch} over {dp} data-parallel ranks: each takes {per_rank}, "
            f"so a step trains {per_rank * dp} sequences, not {batch}; verl {inp.version} does "
            "not fail",
        )


@check(
    "sft.static-micro-batch",
    level="error",
    evidence="verl/workers/engine/utils.py:122-127 (prepare_micro_batches asserts a rank's rows "
    "divide into micro_batch_size_per_gpu)",
    fix="make train_batch_size // dp_size a multiple of data.micro_batch_size_per_gpu, or set "
    "data.use_dynamic_bsz=True",
    example=Example(
        ("data.use_dynamic_bsz=False", "data.micro_batch_size_per_gpu=3"),
        ("data.use_dynamic_bsz=False", "data.micro_batch_size_per_gpu=4"),
        base=SFT_BASE,
    ),
    family=SFT,
)
def static_micro_batch(inp: CheckInput) -> Iterator[Hit]:
    """Without a dynamic batch size, each rank's sequences of a step are cut into micro-batches of
    ``micro_batch_size_per_gpu``, and the engine asserts they divide exactly."""
    sizes = _sizes(inp)
    data = _data(inp)
    if sizes is None or data.get("use_dynamic_bsz"):
        return
    _, dp = sizes
    per_rank = int(data["train_batch_size"]) // dp
    micro = int(data["micro_batch_size_per_gpu"])
    if per_rank and (micro <= 0 or per_rank % micro):
        yield Hit(
            "data.micro_batch_size_per_gpu, data.train_batch_size",
            f"each of the {dp} data-parallel ranks takes {per_rank} sequences a step, which do "
            f"not split into micro-batches of {micro}",
        )


@check(
    "sft.sequence-parallel-divides-world",
    level="error",
    evidence="verl/workers/engine/fsdp/transformer_impl.py:216-231 (init_device_mesh of "
    "(world // sp, sp) ranks)",
    fix="set engine.ulysses_sequence_parallel_size to a divisor of the launch's world size",
    example=Example((f"{_ENGINE}=3",), (f"{_ENGINE}=2",), base=SFT_BASE),
    family=SFT,
)
def sequence_parallel_divides_world(inp: CheckInput) -> Iterator[Hit]:
    """Ulysses sequence parallelism lays the world out as a (dp, sp) device mesh; a size that
    does not divide the world leaves ranks out of the mesh and the engine fails at start."""
    sizes = _sizes(inp)
    if sizes is None:
        return
    world, _ = sizes
    sp = int(inp.resolved["engine"].get("ulysses_sequence_parallel_size") or 1)
    if sp > 1 and world % sp:
        yield Hit(
            _ENGINE,
            f"{_ENGINE}={sp} does not divide the launch's {world} processes",
        )


@check(
    "sft.sequence-parallel-needs-remove-padding",
    level="error",
    evidence="verl/workers/engine/fsdp/transformer_impl.py:129-133 (raises ValueError)",
    fix="set model.use_remove_padding=True, or engine.ulysses_sequence_parallel_size=1",
    example=Example(
        (f"{_ENGINE}=2", "model.use_remove_padding=False"),
        (f"{_ENGINE}=2", "model.use_remove_padding=True"),
        base=SFT_BASE,
    ),
    family=SFT,
)
def sequence_parallel_needs_remove_padding(inp: CheckInput) -> Iterator[Hit]:
    """The FSDP engine refuses sequence parallelism on padded sequences."""
    sp = int(inp.resolved["engine"].get("ulysses_sequence_parallel_size") or 1)
    strategy = str(inp.resolved["engine"].get("strategy") or "")
    if sp > 1 and strategy.startswith("fsdp") and not inp.resolved["model"]["use_remove_padding"]:
        yield Hit(
            f"{_ENGINE}, model.use_remove_padding",
            f"{_ENGINE}={sp} needs model.use_remove_padding=True: the FSDP engine raises at start",
        )


@check(
    "sft.token-budget-below-max-length",
    level="error",
    evidence="verl/utils/seqlen_balancing.py:384 (rearrange_micro_batches asserts the budget "
    "holds the longest sequence), with the budget max_token_len_per_gpu x sp "
    "(verl/workers/engine/utils.py:107-111)",
    fix="raise data.max_token_len_per_gpu to at least data.max_length (over the sequence-parallel "
    "size), or lower data.max_length",
    example=Example(
        ("data.use_dynamic_bsz=True", "data.max_token_len_per_gpu=512", "data.max_length=1024"),
        ("data.use_dynamic_bsz=True", "data.max_token_len_per_gpu=1024", "data.max_length=1024"),
        base=SFT_BASE,
    ),
    family=SFT,
)
def token_budget_below_max_length(inp: CheckInput) -> Iterator[Hit]:
    """With a dynamic batch size, a micro-batch holds at most ``max_token_len_per_gpu x sp``
    tokens, and a sequence longer than that cannot be placed: the engine asserts."""
    data = _data(inp)
    if not data.get("use_dynamic_bsz"):
        return
    sp = int(inp.resolved["engine"].get("ulysses_sequence_parallel_size") or 1)
    budget = int(data["max_token_len_per_gpu"]) * max(sp, 1)
    longest = int(data["max_length"])
    if budget < longest:
        yield Hit(
            "data.max_token_len_per_gpu, data.max_length",
            f"a micro-batch holds {budget} tokens (max_token_len_per_gpu x sp) but sequences "
            f"reach data.max_length={longest}",
        )


_LORA_ONLY = ("lora_alpha", "target_modules", "exclude_modules", "target_parameters")


@check(
    "sft.lora-settings-without-rank",
    level="warning",
    evidence="verl/workers/engine/fsdp/transformer_impl.py:143, 579-580 (the adapter is built, "
    "and these read, only when model.lora_rank > 0), 320-349",
    fix="set model.lora_rank to the adapter's rank, or remove the LoRA settings",
    example=Example(
        ("model.lora_alpha=32",), ("model.lora_alpha=32", "model.lora_rank=16"), base=SFT_BASE
    ),
    family=SFT,
)
def lora_settings_without_rank(inp: CheckInput) -> Iterator[Hit]:
    """LoRA's alpha and target modules are read only when ``model.lora_rank`` is above 0: without
    it the whole model trains and the settings change nothing."""
    model = inp.resolved["model"]
    if int(model.get("lora_rank") or 0) > 0 or model.get("lora_adapter_path"):
        return
    set_here = {field_key(f) for f in inp.explicit_fields}
    named = [f"model.{key}" for key in _LORA_ONLY if f"model.{key}" in set_here]
    if named:
        yield Hit(
            ", ".join(named),
            f"{', '.join(named)} set while model.lora_rank=0: no adapter is built, so "
            f"{'they change' if len(named) > 1 else 'it changes'} nothing",
        )


@check(
    "sft.needs-torchrun",
    level="error",
    evidence="verl/utils/distributed.py:62-70 (initialize_global_process_group reads RANK, "
    "WORLD_SIZE and LOCAL_RANK from the environment torchrun sets), called by "
    "verl/trainer/sft_trainer.py:451-454",
    fix="launch it with torchrun --nnodes=N --nproc_per_node=M -m verl.trainer.sft_trainer",
    family=SFT,
)
def needs_torchrun(inp: CheckInput) -> Iterator[Hit]:
    """An entry point that starts its world from torchrun's environment, run by plain Python:
    the process group finds no rank and world size, and the trainer fails at start."""
    if inp.world_source != "torchrun" or inp.launcher != "python":
        return
    yield Hit(
        "<launch>",
        "the entry point initialises its process group from torchrun's environment (RANK, "
        "WORLD_SIZE, LOCAL_RANK), but the script runs it with python",
    )


@check(
    "sft.micro-batch-with-dynamic-batch",
    level="warning",
    evidence="verl/workers/engine/utils.py:107-128 (prepare_micro_batches reads "
    "micro_batch_size_per_gpu only when use_dynamic_bsz is false); sft_trainer_engine.yaml "
    "defaults data.use_dynamic_bsz to true",
    fix="set data.use_dynamic_bsz=False for micro-batches of that many sequences, or remove it "
    "(the token budget data.max_token_len_per_gpu decides)",
    example=Example(
        ("data.micro_batch_size_per_gpu=2",),
        ("data.micro_batch_size_per_gpu=2", "data.use_dynamic_bsz=False"),
        base=SFT_BASE,
    ),
    family=SFT,
)
def micro_batch_with_dynamic_batch(inp: CheckInput) -> Iterator[Hit]:
    """With a dynamic batch size (the SFT trainer's default), micro-batches are cut by the token
    budget: an explicit ``micro_batch_size_per_gpu`` is never read by training."""
    data = _data(inp)
    if not data.get("use_dynamic_bsz"):
        return
    if "data.micro_batch_size_per_gpu" in {field_key(f) for f in inp.explicit_fields}:
        yield Hit(
            "data.micro_batch_size_per_gpu",
            f"data.micro_batch_size_per_gpu={data['micro_batch_size_per_gpu']} is not read while "
            "data.use_dynamic_bsz is true: micro-batches hold up to data.max_token_len_per_gpu="
            f"{data['max_token_len_per_gpu']} tokens instead",
        )


@check(
    "sft.other-entry-key",
    level="warning",
    evidence="verl/trainer/sft_trainer.py:460 (the SFT trainer composes its own tree, "
    "sft_trainer_engine, whose sections are data, model, engine, optim, checkpoint, profiler and "
    "trainer; its code reads self.config only in those sections)",
    summary="A key added with `+` to an SFT run in a section the SFT trainer's tree does not "
    "have, such as main_ppo's `algorithm` or `actor_rollout_ref`: Hydra accepts the new key, and "
    "no code of the SFT trainer reads it.",
    fix="remove it: it belongs to another entry point (verl.trainer.main_ppo)",
    example=Example(
        ("+algorithm.adv_estimator=grpo",),
        ("+model.override_config.attn_implementation=eager",),
        base=SFT_BASE,
    ),
    family=SFT,
)
def other_entry_key(inp: CheckInput) -> Iterator[Hit]:
    """A key the run adds with ``+`` in a top-level section the SFT tree lacks: the SFT
    trainer's code reads only its own sections, so the key is another entry point's."""
    seen: set[str] = set()
    for field in inp.explicit_fields:
        if not field.startswith("+"):
            continue
        key = field_key(field)
        section = key.split(".", 1)[0]
        if key in seen or not inp.defaults or section in inp.defaults:
            continue
        seen.add(key)
        yield Hit(
            key,
            f"`{field}` has no effect here: verl {inp.version}'s SFT trainer never reads {key}: "
            f"its tree (sft_trainer_engine) has no section {section} and its code reads only its "
            "own sections; it is a key of another entry point",
        )


# The trainer keys of the SFT tree that size a Ray resource pool: only the Ray SFT entry point
# reads them (verl/trainer/sft_trainer_ray.py:135-137); under torchrun the world is the launcher's.
_RAY_WORLD_KEYS = ("trainer.n_gpus_per_node", "trainer.nnodes")


@check(
    "sft.world-from-torchrun",
    level="warning",
    evidence="verl/trainer/sft_trainer.py:451-454 (run_sft starts its process group from "
    "torchrun's RANK, WORLD_SIZE and LOCAL_RANK, verl/utils/distributed.py:62-70); only the Ray "
    "SFT entry point reads trainer.n_gpus_per_node and trainer.nnodes "
    "(verl/trainer/sft_trainer_ray.py:135-137)",
    summary="trainer.n_gpus_per_node or trainer.nnodes set for the SFT trainer launched by "
    "torchrun: the world is torchrun's --nproc_per_node and --nnodes, and no code of "
    "verl.trainer.sft_trainer reads these keys.",
    fix="size the world with torchrun's --nproc_per_node and --nnodes, and remove the key",
    example=Example(("trainer.n_gpus_per_node=8",), ("trainer.total_epochs=2",), base=SFT_BASE),
    family=SFT,
)
def world_from_torchrun(inp: CheckInput) -> Iterator[Hit]:
    if inp.world_source != "torchrun":
        return
    for field in inp.explicit_fields:
        key = field_key(field)
        if key in _RAY_WORLD_KEYS:
            yield Hit(
                key,
                f"`{field}` has no effect here: verl {inp.version}'s SFT trainer takes its world "
                f"from torchrun (nproc_per_node x nnodes = {inp.world_size}) and never reads {key}",
            )
