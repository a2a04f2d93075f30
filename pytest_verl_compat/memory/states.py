"""Model states per rank: the parameters, gradients and optimizer states a training engine holds.

FSDP (1 and 2) is counted tensor by tensor from ``Architecture.tensors()``, as torch shards them,
so that the bytes equal what verl's own engine holds (tests/test_fit_states.py builds it on a
fake process group and compares byte for byte). Megatron follows megatron.core's accounting
(bf16 weights, fp32 main gradients, a distributed optimizer's fp32 master weights and Adam
moments); its engine allocates its buffers on CUDA (param_and_grad_buffer.py), so it is not
measured on a CPU.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

from pytest_verl_compat.checks.lora import ALL_LINEAR
from pytest_verl_compat.checks.roles import FSDP_STRATEGIES, MEGATRON_STRATEGIES
from pytest_verl_compat.files.patterns import fullmatches
from pytest_verl_compat.memory.architecture import Architecture
from pytest_verl_compat.memory.tensor import Tensor
from pytest_verl_compat.memory.vision import in_tower

# verl/workers/engine/fsdp/transformer_impl.py
EV_MODEL_DTYPE = "verl/workers/engine/fsdp/transformer_impl.py:237-242"  # fp32 unless set
EV_MIXED_PRECISION = "verl/workers/engine/fsdp/transformer_impl.py:358-368"
EV_FSDP1 = "verl/workers/engine/fsdp/transformer_impl.py:380-404"
EV_FSDP2 = "verl/workers/engine/fsdp/transformer_impl.py:405-424"
EV_REF_OFFLOAD = "verl/workers/engine/fsdp/transformer_impl.py:389-394, :415-420"
EV_MESH = "verl/workers/engine/fsdp/utils.py:47-52"
EV_OPTIMIZER = "verl/workers/config/optimizer.py:326-351"
# Megatron's CPU optimizer (reading.optimizer_on_host)
EV_OPTIMIZER_ON_HOST = (
    "verl/utils/megatron/optimizer.py:210-213; verl/utils/megatron_utils.py:943-945, "
    "verl/utils/megatron_utils.py:991-992@0.9.1"
)
# verl/utils/fsdp_utils.py:740 (:752@0.9.1): without layered_summon, collecting the LoRA
# adapters opens FSDP.summon_full_params(module) on the whole FSDP1 model, which unshards every
# unit at once and, with mixed precision, at full precision (torch's FlatParamHandle.
# _force_full_precision in SUMMON_FULL_PARAMS); FSDP2's DTensors gather one adapter at a time.
EV_SUMMON_WHOLE = "verl/utils/fsdp_utils.py:740; torch/distributed/fsdp/_flat_param.py FlatParamHandle._force_full_precision"
EV_NO_SYNC = "verl/workers/engine/fsdp/transformer_impl.py:686-698, :727-730"
EV_LORA = "verl/workers/engine/fsdp/transformer_impl.py:303-346"
EV_WRAP = "verl/utils/fsdp_utils.py:80-165, :537-588"
EV_MEGATRON = "verl/workers/engine/megatron/transformer_impl.py:272-345"

# The engines the forecast models: FSDP (1 and 2) counted as torch shards, Megatron (and
# MindSpeed, Megatron on Ascend) as megatron.core does; any other strategy is not forecast.
FORECAST_STRATEGIES = (*FSDP_STRATEGIES, *MEGATRON_STRATEGIES)

DTYPE_BYTES = {
    "fp32": 4, "float32": 4, "float": 4,
    "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2,
}  # fmt: skip


def dtype_bytes(name: object, default: int) -> int:
    """Bytes per element of a dtype named in the config (None: the default)."""
    if name is None:
        return default
    return DTYPE_BYTES.get(str(name).lower(), default)


# optim.optimizer_impl's default: the module verl takes the optimizer class from
TORCH_OPTIM = "torch.optim"


@dataclass(frozen=True)
class EngineSpec:
    """What decides one role's model states on one rank."""

    strategy: str  # fsdp, fsdp2, megatron
    world: int  # ranks the role's engine spans
    fsdp_size: int = -1  # -1: shard over the whole world (HSDP when smaller)
    model_dtype: int = 4  # bytes of the stored (master) weights
    param_dtype: int = 2  # bytes of the compute copy (mixed precision)
    reduce_dtype: int = 4
    forward_only: bool = False
    value_head: bool = False  # the critic's token-classification head instead of lm_head
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ("all-linear",)
    lora_exclude: tuple[str, ...] = ()
    optimizer: str = "AdamW"
    # How the optimizer's step runs (``step_copies``): optim.optimizer_impl, and the foreach and
    # fused switches override_optimizer_config hands the class (None: torch's default)
    optimizer_impl: str = TORCH_OPTIM
    foreach: bool | None = None
    fused: bool | None = None
    # Megatron sizes and its distributed optimizer
    tp: int = 1
    pp: int = 1
    vpp: int = 1  # virtual pipeline stages (model chunks) per pipeline rank
    ep: int = 1
    etp: int = 1
    cp: int = 1
    distributed_optimizer: bool = True
    # Megatron's HybridDeviceOptimizer (override_optimizer_config.optimizer_cpu_offload): the share
    # of the trainable parameters whose optimizer moments live on the host (optimizer_offload_
    # fraction, by numel); the fp32 master shards stay on the GPU
    optimizer_on_host: float = 0.0
    master_on_host: bool = False  # with use_precision_aware_optimizer: the master goes along
    # FSDP skips gradient sync on all but a mini-batch's last micro-batch (no_sync), keeping
    # unsharded gradients between them (use_no_sync_for_gradient_accumulation, read as upstream)
    defer_sync: bool = True
    # An engine read as the strategy it builds (memory/veomni.py): its own name, for the report
    label: str = ""
    # FSDP2's root module (embeddings, final norm, lm_head) kept gathered from forward to
    # backward, as VeOmni wraps it (the strategy's other layers reshard)
    root_gathered: bool = False
    # a forward-only FSDP role's shards live on the host (verl's FSDP engine builds it a
    # CPUOffloadPolicy, transformer_impl.py:440-443); VeOmni's build keeps them on the GPU
    forward_only_on_host: bool = True

    @property
    def shard(self) -> int:
        """The FSDP shard group (verl/workers/engine/fsdp/utils.py:47-52)."""
        if self.fsdp_size < 0 or self.fsdp_size >= self.world:
            return max(self.world, 1)
        return max(self.fsdp_size, 1)


@dataclass(frozen=True)
class ModelStates:
    """Bytes one rank holds for one role (rank 0, whose shards are the largest)."""

    params: int
    grads: int
    optimizer: int
    accumulated: int  # unsharded gradients kept between micro-batches (FSDP no-sync), else 0
    layer_unit: int  # one all-gathered decoder layer in the compute dtype
    layer_grad_unit: int  # one decoder layer's trainable weights' gradient, whole, compute dtype
    root_unit: int  # the unit that stays gathered through forward and backward (FSDP1 root)
    largest_tensor: int  # the largest parameter, gathered whole, in the stored dtype
    trainable: int  # trainable parameters (whole model)
    total: int  # parameters (whole model)
    # FSDP1: the root unit's head gradient, held from the head's backward to the embedding's
    held_head_grad: int = 0
    # FSDP1: every unit unsharded at once, at full precision (summon_full_params on the model)
    summoned: int = 0
    # what the optimizer's step allocates beyond the states it updates (``step_copies``)
    step_transient: int = 0


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


# peft 0.21.2 in the releases' environments (beside transformers 5.10.4) keeps transformers 4's
# meaning of a LoRA target for the MoE model types transformers 5 converts from Qwen2-MoE's
# checkpoint layout (transformers' _MODEL_TO_CONVERSION_PATTERN: qwen3_moe, qwen3_next,
# deepseek_v3, glm4_moe): the v4 names below become parameter targets (peft/utils/
# transformers_weight_conversion.py, _MOE_TARGET_MODULE_MAPPING and _convert_peft_config_moe),
# so the router's gate.weight (rank r) and the routed experts' stacked gate_up_proj (rank 2r, the
# fused gate and up) and down_proj (rank r) are adapted per expert, and an nn.Linear of those
# names (a shared expert's, a dense layer's) is no longer adapted as a module. "all-linear"
# counts every one of those names (their v4 modules were nn.Linear).
PEFT_V4_MOE_MODEL_TYPES = frozenset({"qwen3_moe", "qwen3_next", "deepseek_v3", "glm4_moe"})
PEFT_V4_MOE_NAMES = {
    "gate": "gate.weight",
    "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj",
    "down_proj": "down_proj",
}


def _peft_moe_targets(arch: Architecture, spec: EngineSpec) -> set[str]:
    """The v4 names peft turns into parameter targets for this model (empty: none). Megatron's
    LoRA is Megatron-Bridge's, not peft's: its targets are not these."""
    if spec.strategy == "megatron":
        return set()
    if arch.model_type not in PEFT_V4_MOE_MODEL_TYPES or not arch.is_moe:
        return set()
    if ALL_LINEAR in spec.lora_targets:
        return set(PEFT_V4_MOE_NAMES)
    return set(PEFT_V4_MOE_NAMES) & set(spec.lora_targets)


def _lora_targets(arch: Architecture, spec: EngineSpec) -> list[Tensor]:
    """The linear weights LoRA adapts as modules: peft's "all-linear" is every nn.Linear but the
    output layer; a list names module suffixes (q_proj, ...)."""
    found = []
    as_parameters = _peft_moe_targets(arch, spec)
    for tensor in arch.tensors():
        if tensor.kind != "linear" or not tensor.name.endswith(".weight"):
            continue
        module = tensor.name.rsplit(".", 2)[-2]
        if any(module == ex or tensor.name.find(ex) >= 0 for ex in spec.lora_exclude if ex):
            continue
        if module in as_parameters:
            continue
        if ALL_LINEAR in spec.lora_targets or module in spec.lora_targets:
            found.append(tensor)
    return found


def _parameter_adapters(arch: Architecture, spec: EngineSpec) -> list[Tensor]:
    """peft's ParamWrapper adapters of the router and the stacked experts (PEFT_V4_MOE_NAMES):
    A (experts x rank, in) and B (out, experts x rank) for a stacked (experts, out, in)
    parameter, A (rank, in) and B (out, rank) for the router's weight."""
    names = _peft_moe_targets(arch, spec)
    targets = {PEFT_V4_MOE_NAMES[name] for name in names}
    if not {"gate_proj", "up_proj"} <= names:
        targets.discard("gate_up_proj")  # peft refuses one of the fused pair alone
    out = []
    for tensor in arch.tensors():
        leaf = tensor.name.rsplit(".", 1)[-1]
        if tensor.kind == "router" and tensor.name.endswith("mlp.gate.weight"):
            if "gate.weight" not in targets:
                continue
            experts, cols = tensor.shape
            r, rows, base = spec.lora_rank, experts, tensor.name[: -len(".weight")]
        elif tensor.kind == "experts" and leaf in targets:
            experts, rows, cols = tensor.shape
            r = spec.lora_rank * experts * (2 if leaf == "gate_up_proj" else 1)
            base = tensor.name
        else:
            continue
        out += _lora_pair(base, rows, cols, r)
    return out


def _lora_pair(base: str, rows: int, cols: int, rank: int) -> list[Tensor]:
    """LoRA's A (rank x in) and B (out x rank) of the weight ``base`` (rows x cols), each its own
    FSDP1 unit."""
    return [
        Tensor(f"{base}.lora_A.default.weight", (rank, cols), f"{base}.lora_A", "lora"),
        Tensor(f"{base}.lora_B.default.weight", (rows, rank), f"{base}.lora_B", "lora"),
    ]


# Megatron's LoRA is Megatron-Bridge's (verl/workers/config/megatron_peft.py:23-29 ->
# megatron.bridge.peft.utils.create_peft), which adapts a module whose name equals a target
# (module_matcher.py ModuleMatcher.match@megatron-bridge-0.3.1; lora.py LoRA.transform: one
# adapter per module, A rank x in and B out x rank). The language model is megatron-core's, whose
# fused linear_qkv and linear_fc1 hold transformers' q/k/v and gate/up projections; each target
# names the transformers weights of its module here (model/hf_model.yaml lists the names). A VL
# model's tower stays transformers' module (qwen_vl/modeling_qwen25_vl.py:103,
# modelling_qwen3_vl/model.py:100), matched by its own names. With no target every linear is
# adapted but the excluded (ModuleMatcher.match's last branch), the output layer included.
EV_MEGATRON_LORA = (
    "verl/workers/config/megatron_peft.py:23-29; megatron/bridge/peft/module_matcher.py "
    "(ModuleMatcher.match), lora.py (LoRA.transform)@megatron-bridge-0.3.1"
)
MEGATRON_LORA_MODULES = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj"),
    "linear_proj": ("o_proj",),
    "linear_fc1": ("gate_proj", "up_proj"),
    "linear_fc2": ("down_proj",),
    # canonical LoRA's unfused projections
    "linear_q": ("q_proj",),
    "linear_k": ("k_proj",),
    "linear_v": ("v_proj",),
    "linear_fc1_gate": ("gate_proj",),
    "linear_fc1_up": ("up_proj",),
    # multi-latent attention
    "linear_q_proj": ("q_proj",),
    "linear_q_down_proj": ("q_a_proj",),
    "linear_q_up_proj": ("q_b_proj",),
    "linear_kv_down_proj": ("kv_a_proj_with_mqa",),
    "linear_kv_up_proj": ("kv_b_proj",),
    "output_layer": ("lm_head",),
}
MEGATRON_DEFAULT_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
# the fused modules an untargeted (exclude-only) LoRA adapts, by the transformers weight's name
_MEGATRON_MODULE_OF = {
    name: module
    for module in (
        *MEGATRON_DEFAULT_TARGETS,
        "output_layer",
        "linear_q_down_proj",
        "linear_q_up_proj",
        "linear_kv_down_proj",
        "linear_kv_up_proj",
    )
    for name in MEGATRON_LORA_MODULES[module]
}


def _megatron_name(parent: str, module: str) -> str:
    """megatron-core's name of a module holding a transformers weight of ``parent``
    (``decoder.layers.3.self_attention.linear_qkv``): what a wildcard target is matched against."""
    name = parent.replace("model.layers.", "decoder.layers.").replace(
        ".self_attn", ".self_attention"
    )
    name = re.sub(r"\.shared_experts?$", ".shared_experts", name)
    return f"{name}.{module}" if name else module


def _wildcard(pattern: str, name: str) -> bool:
    """Megatron-Bridge's wildcard_match (peft/utils.py@megatron-bridge-0.3.1): '*' is any run of
    characters, the rest a regular expression as written, anchored at both ends."""
    return fullmatches(pattern.replace("*", "(.*)"), name)


def _megatron_module(
    leaf: str, parent: str, targets: tuple[str, ...], exclude: tuple[str, ...], mla: bool
) -> str:
    """The Megatron module a transformers weight named ``leaf`` under ``parent`` is adapted as
    ("": none), as ModuleMatcher.match decides: a target equal to the module's name, or a wildcard
    target matching its full name; with no target, every linear but those an exclusion names. An
    MLA model's q_proj is its own linear_q_proj, another's is part of linear_qkv."""
    own = "linear_q_proj" if mla and leaf == "q_proj" else _MEGATRON_MODULE_OF.get(leaf, "")
    full = _megatron_name(parent, own) if own else ""
    if not targets:
        excluded = own in exclude or any(_wildcard(p, full) for p in exclude if "*" in p)
        return "" if excluded or not own else own
    if mla and leaf == "q_proj":
        return "linear_q_proj" if "linear_q_proj" in targets else ""
    named = next(
        (t for t in targets if t != "linear_q_proj" and leaf in MEGATRON_LORA_MODULES.get(t, ())),
        "",
    )
    if named or not own:
        return named
    return own if any(_wildcard(p, full) for p in targets if "*" in p or "." in p) else ""


def _megatron_adapters(arch: Architecture, spec: EngineSpec) -> list[Tensor]:
    """Megatron-Bridge's adapters (``EV_MEGATRON_LORA``): one pair per adapted module, a fused
    module's B as tall as the projections it holds; the tower's per transformers nn.Linear."""
    fused: dict[str, list[Tensor]] = {}
    out = []
    # peft's "all-linear" (EngineSpec's default) read as Megatron-Bridge's default list
    targets = MEGATRON_DEFAULT_TARGETS if spec.lora_targets == (ALL_LINEAR,) else spec.lora_targets
    for tensor in arch.tensors():
        if tensor.kind not in ("linear", "lm_head") or not tensor.name.endswith(".weight"):
            continue
        base = tensor.name[: -len(".weight")]
        parent, _, leaf = base.rpartition(".")
        if in_tower(tensor.name):
            wanted = leaf in targets if targets else leaf not in spec.lora_exclude
            if wanted:
                rows, cols = tensor.shape
                out += _lora_pair(base, rows, cols, spec.lora_rank)
            continue
        module = _megatron_module(leaf, parent, targets, spec.lora_exclude, arch.uses_mla)
        if module:
            fused.setdefault(f"{parent}.{module}" if parent else f"{base}.{module}", []).append(
                tensor
            )
    for base, tensors in fused.items():
        rows = sum(t.shape[0] for t in tensors)
        pair = _lora_pair(base, rows, tensors[0].shape[1], spec.lora_rank)
        if tensors[0].unit == "root":  # the output layer's: held where lm_head is, split over TP
            pair = [Tensor(t.name, t.shape, "root", "lm_head") for t in pair]
        out += pair
    return out


def _adapters(arch: Architecture, spec: EngineSpec) -> list[Tensor]:
    """LoRA's A (rank x in) and B (out x rank) per adapted weight, each its own FSDP1 unit
    (verl's lambda wrap policy for modules with trainable weights, fsdp_utils.py:113-125)."""
    if spec.strategy in MEGATRON_STRATEGIES:
        return _megatron_adapters(arch, spec)
    out = []
    for tensor in _lora_targets(arch, spec):
        rows, cols = tensor.shape
        out += _lora_pair(tensor.name[: -len(".weight")], rows, cols, spec.lora_rank)
    return out + _parameter_adapters(arch, spec)


def model_tensors(arch: Architecture, spec: EngineSpec) -> tuple[list[Tensor], list[Tensor]]:
    """(frozen, trainable) parameter tensors of the role's model."""
    body = list(arch.value_head_tensors() if spec.value_head else arch.tensors())
    if spec.lora_rank > 0 and not spec.value_head:
        return body, _adapters(arch, spec)
    if spec.forward_only:
        return body, []
    return [], body


def _fsdp2_shard(tensor: Tensor, shard: int) -> int:
    """Elements of one parameter's rank-0 shard: FSDP2 pads dim 0 to a multiple of the group
    (torch _fsdp_param.py, _init_sharded_param: padded_sharded_param)."""
    rows = _ceil(tensor.shape[0], shard)
    rest = tensor.numel // tensor.shape[0] if tensor.shape[0] else 0
    return rows * rest


def _expert_shard(tensor: Tensor, shard: int, ep: int) -> int:
    """Elements of rank 0's shard of stacked experts split over ``ep`` expert-parallel ranks
    (experts, dim 0) and then over the rest of the shard group on dim 1 (VeOmni's ExtraParallel
    FSDP2: ``Shard(1)`` over the ep_fsdp mesh, veomni/distributed/torch_parallelize.py:535, :554@veomni-0.1.12)."""
    if len(tensor.shape) < 2:
        return _ceil(_ceil(tensor.shape[0], ep), max(shard // ep, 1))
    experts, cols = _ceil(tensor.shape[0], ep), _ceil(tensor.shape[1], max(shard // ep, 1))
    rest = tensor.numel // (tensor.shape[0] * tensor.shape[1]) if tensor.numel else 0
    return experts * cols * rest


def _gathered(tensor: Tensor, ep: int) -> int:
    """Elements a unit gathers of one tensor: a rank's own experts under expert parallel."""
    if ep > 1 and tensor.kind == "experts":
        return _ceil(tensor.shape[0], ep) * (tensor.numel // tensor.shape[0])
    return tensor.numel


def _fsdp1_units(tensors: Iterable[Tensor]) -> dict[str, int]:
    """Elements per FSDP1 unit (one FlatParameter each)."""
    units: dict[str, int] = {}
    for tensor in tensors:
        units[tensor.unit] = units.get(tensor.unit, 0) + tensor.numel
    return units


def sharded_elements(tensors: list[Tensor], spec: EngineSpec) -> int:
    """Elements of rank 0's shards of ``tensors`` under the role's FSDP strategy."""
    shard = spec.shard
    if spec.strategy == "fsdp2":
        return sum(
            _expert_shard(t, shard, spec.ep)
            if spec.ep > 1 and t.kind == "experts"
            else _fsdp2_shard(t, shard)
            for t in tensors
        )
    # FSDP1 flattens each unit and pads it to a multiple of the group (torch _flat_param.py)
    return sum(_ceil(numel, shard) for numel in _fsdp1_units(tensors).values())


def optimizer_states(name: str) -> int:
    """State tensors per parameter of the optimizer (torch.optim's AdamW/Adam: exp_avg and
    exp_avg_sq, zeros_like the parameter; SGD without momentum: none)."""
    lowered = name.lower()
    if "sgd" in lowered:
        return 0
    return 2


# torch.optim's Adam and AdamW (verl builds the class optim.optimizer_impl names with the
# override_optimizer_config's arguments: verl/workers/config/optimizer.py:326-351) default to the
# foreach implementation for parameters on a GPU or NPU (_default_to_fused_or_foreach,
# torch/optim/optimizer.py:161-185@torch-2.13.0), whose step takes the square root of every
# exp_avg_sq at once into new tensors (exp_avg_sq_sqrt = torch._foreach_sqrt(...),
# torch/optim/adam.py:762@torch-2.13.0): one more copy of the rank's trainable shards, in the
# states' dtype, alive until the parameters are updated; the fused kernel updates in place.
EV_STEP_COPY = "torch/optim/adam.py:762@torch-2.13.0 (_multi_tensor_adam: exp_avg_sq_sqrt)"


def step_copies(spec: EngineSpec) -> int:
    """Copies of the rank's trainable shards an optimizer step allocates beyond its states: one
    for torch.optim's Adam/AdamW on foreach (the default on a GPU), none when fused; 0 where the
    forecast does not know the class (another optimizer_impl, a foreach switched off: the
    single-tensor path holds about three of the largest tensor's)."""
    adam = spec.optimizer.lower() in ("adam", "adamw")
    if spec.forward_only or not adam or spec.optimizer_impl != TORCH_OPTIM:
        return 0
    if spec.fused or spec.foreach is False:
        return 0
    return 1


def fsdp_states(arch: Architecture, spec: EngineSpec) -> ModelStates:
    frozen, trainable = model_tensors(arch, spec)
    every = frozen + trainable
    params = sharded_elements(every, spec) * spec.model_dtype
    grads = sharded_elements(trainable, spec) * spec.model_dtype
    optimizer = grads * optimizer_states(spec.optimizer)
    trainable_numel = sum(t.numel for t in trainable)
    # no-sync micro-batches keep each unit's gradient unsharded: FSDP2 upcasts it to the reduce
    # dtype (torch _fsdp_param.py, to_accumulated_grad_if_needed); FSDP1 keeps the compute dtype
    accumulate_dtype = spec.reduce_dtype if spec.strategy == "fsdp2" else spec.param_dtype
    accumulated = trainable_numel * accumulate_dtype
    layer = max(
        (
            sum(_gathered(t, spec.ep) for t in every if t.unit == f"layers.{i}")
            for i in range(arch.num_hidden_layers)
        ),
        default=0,
    )
    # a LoRA adapter is its own unit, named under its layer's module (model.layers.i....lora_A)
    layer_grad = max(
        (
            sum(
                _gathered(t, spec.ep)
                for t in trainable
                if t.unit == f"layers.{i}" or f".layers.{i}." in f".{t.name}"
            )
            for i in range(arch.num_hidden_layers)
        ),
        default=0,
    )
    root = sum(t.numel for t in every if t.unit == "root")
    largest = max((t.numel for t in every), default=0)
    # FSDP1 (use_orig_params false, the engine's default) views a unit's parameters out of one
    # torch.split of its flat parameter; the split's backward waits for every view's gradient, so
    # the head's (lm_head, or the tied embedding used as one) stays until the embedding's, after
    # every layer's backward (tests/test_fit_activations.py measures it)
    head_kind = "embed" if arch.tie_word_embeddings else "lm_head"
    head = sum(t.numel for t in trainable if t.unit == "root" and t.kind == head_kind)
    return ModelStates(
        params=params,
        grads=0 if spec.forward_only else grads,
        optimizer=0 if spec.forward_only else optimizer,
        accumulated=0 if spec.forward_only or not spec.defer_sync else accumulated,
        layer_unit=layer * spec.param_dtype,
        layer_grad_unit=0 if spec.forward_only else layer_grad * spec.param_dtype,
        held_head_grad=head * spec.param_dtype
        if spec.strategy == "fsdp" and not spec.forward_only
        else 0,
        # FSDP1's root unit (embedding, final norm, lm_head) is not resharded after forward; FSDP2
        # wraps embed_tokens and lm_head on their own unless tied (fsdp_utils.py:537-558).
        root_unit=root * spec.param_dtype
        if spec.strategy == "fsdp" or spec.root_gathered or arch.tie_word_embeddings
        else 0,
        largest_tensor=largest * spec.model_dtype,
        trainable=trainable_numel,
        total=sum(t.numel for t in every),
        # summon_full_params unshards each flat parameter whole, padding included, in its stored
        # dtype (torch _flat_param.py, _force_full_precision): rank 0's shards times the group
        summoned=params * spec.shard if spec.strategy == "fsdp" else 0,
        step_transient=grads * step_copies(spec),
    )


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def layer_index(unit: str) -> int:
    """The decoder layer a unit belongs to: ``layers.3`` or a LoRA adapter's own unit inside
    it (``model.layers.3.mlp.gate_proj.lora_A``)."""
    found = _LAYER.search(unit)
    if found is None:
        raise ValueError(f"unit {unit!r} names no decoder layer")
    return int(found[1])


def megatron_states(arch: Architecture, spec: EngineSpec) -> ModelStates:
    """megatron.core's per-rank states: layers split over pipeline stages, each layer's weights
    over tensor parallel (experts over expert x expert-tensor parallel); bf16 weights, fp32 main
    gradients (DistributedDataParallel's grad buffer), and with the distributed optimizer the fp32
    master weights and Adam moments sharded over the data-parallel group."""
    frozen, trainable = model_tensors(arch, spec)
    layers_per_stage = _ceil(arch.num_hidden_layers, spec.pp)

    def per_rank(tensors: list[Tensor], experts: bool | None = None) -> int:
        total = 0
        for t in tensors:
            if experts is not None and (t.kind == "experts") != experts:
                continue
            if t.unit == "root":
                # embedding on the first stage, lm_head on the last; rank 0 holds the embedding
                if t.kind in ("embed", "lm_head") and not (t.kind == "embed" or spec.pp == 1):
                    continue
                total += t.numel // (spec.tp if t.kind in ("embed", "lm_head") else 1)
                continue
            if in_tower(t.name):  # a VL model's tower (its adapters too) is on the first stage
                total += t.numel // (spec.tp if t.kind == "linear" else 1)
                continue
            if layer_index(t.unit) >= layers_per_stage:
                continue
            if t.kind == "experts":
                total += t.numel // (spec.ep * spec.etp)
            elif t.kind in ("norm", "router"):
                total += t.numel
            else:
                total += t.numel // spec.tp
        return total

    held = per_rank(frozen + trainable)
    train = per_rank(trainable)
    # the distributed optimizer shards dense states over data x context parallel and expert
    # states over the expert data-parallel group (megatron.core parallel_state: world / (tp pp)
    # and world / (ep etp pp))
    dense_dp = max(spec.world // (spec.tp * spec.pp), 1)
    expert_dp = max(spec.world // (spec.ep * spec.etp * spec.pp), 1)
    # fp32 master + the moments the GPU keeps (megatron/core/optimizer/cpu_offloading/
    # hybrid_optimizer.py:251-300@megatron-core-0.16.1 clones the offloaded share to the host)
    moments = 4 * optimizer_states(spec.optimizer)
    movable = 4 + moments if spec.master_on_host else moments
    per_param = 4 + moments - int(movable * spec.optimizer_on_host)
    dense, expert = per_rank(trainable, False), per_rank(trainable, True)
    master = (
        dense * per_param // dense_dp + expert * per_param // expert_dp
        if spec.distributed_optimizer
        else train * per_param
    )
    layer = sum(t.numel for t in arch.layer_tensors(0)) // max(spec.tp, 1)
    return ModelStates(
        params=held * spec.param_dtype,
        grads=0 if spec.forward_only else train * 4,
        optimizer=0 if spec.forward_only else master,
        accumulated=0,
        layer_unit=layer * spec.param_dtype,
        layer_grad_unit=0,
        root_unit=0,
        largest_tensor=_largest_exported(frozen + trainable) * spec.param_dtype,
        trainable=sum(t.numel for t in trainable),
        total=sum(t.numel for t in frozen + trainable),
    )


def _largest_exported(tensors: list[Tensor]) -> int:
    """The most elements of one tensor Megatron-Bridge's export gathers whole over tensor parallel
    (``EV_BRIDGE_EXPORT``): a Hugging Face tensor, or a layer's gate and up projections together
    (megatron.core's fused linear_fc1, split only once gathered). The routed experts are left out:
    the export gathers one local expert from each expert-parallel rank, smaller than the
    embedding for every model of the table (DeepSeek-V3: 8 x 29M elements, its embedding 927M)."""
    largest = max((t.numel for t in tensors if t.kind != "experts"), default=0)
    fused: dict[str, int] = {}
    for t in tensors:
        if t.kind == "linear" and t.name.endswith(("gate_proj.weight", "up_proj.weight")):
            module = t.name.rsplit(".", 2)[0]
            fused[module] = fused.get(module, 0) + t.numel
    return max(largest, *fused.values()) if fused else largest


@functools.lru_cache(maxsize=256)
def model_states(arch: Architecture, spec: EngineSpec) -> ModelStates:
    """One rank's states for one role (cached: a forecast and its fixes ask the same ones
    hundreds of times)."""
    if spec.strategy in MEGATRON_STRATEGIES:
        return megatron_states(arch, spec)
    return fsdp_states(arch, spec)
