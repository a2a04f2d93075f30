"""verl's VeOmni engine read as the FSDP2 engine it is built from.

``VeOmniEngine`` subclasses the FSDP engine (verl/workers/engine/veomni/transformer_impl.py)
and keeps its micro-batching, offload, logits and padding (``VeOmniEngineWithLMHead`` takes
``FSDPEngineWithLMHead``'s inputs and outputs); VeOmni builds and shards the model
(``build_foundation_model``, ``build_parallelize_model``: FSDP2's ``fully_shard``). What differs
from verl's own FSDP2 engine, and how each difference is read here:

- the stored weights are fp32 whenever ``mixed_precision`` is on (the default), forward-only roles
  too (veomni's ``model.float()``), else bf16; the compute copy is bf16 and gradients reduce
  in fp32 (VeOmni's ``MixedPrecisionConfig`` defaults);
- the shard group is the data-parallel shards times Ulysses (VeOmni's ``fsdp_mesh`` is
  ``dp_shard_sp``), the whole world unless ``fsdp_size`` is a proper divisor of the
  data-parallel size (``VeOmniEngine.__init__``);
- experts are split over ``expert_parallel_size`` and the rest of the group shards each rank's
  experts (``parallelize_model_fsdp2``'s ExtraParallel steps): the same bytes per rank, but a
  layer gathers only its rank's experts;
- the root module (embeddings, final norm, lm_head) stays gathered from forward to backward
  (``fully_shard(model, ...)`` without reshard_after_forward), the decoder layers reshard (verl
  hands ``enable_full_shard``, which VeOmni's ``build_parallelize_model`` does not read);
- every micro-batch's backward syncs its gradients (``forward_backward_batch`` calls
  ``loss.backward()`` with no no_sync): no unsharded gradients are kept;
- an ``enable_fsdp_offload`` is FSDP2's CPUOffloadPolicy; its own activation offload
  (veomni.distributed.offloading) is not the FSDP engine's and is not counted;
- it builds no LoRA adapters (the model is built without peft): a LoRA rank is not forecast.

The VeOmni side is veomni 0.1.12's (``VEOMNI_RELEASE``): verl pins none, and the newest VeOmni
example of the pinned release names it (examples/grpo_trainer/run_deepseek_v4_veomni.sh:7). The
verl lines are each release's own (its memory facts' ``veomni_engine``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_verl_compat.checks.lora import engine_lora_rank
from pytest_verl_compat.memory.layout import as_int
from pytest_verl_compat.memory.release_facts import ReleaseFacts
from pytest_verl_compat.memory.states import EngineSpec
from pytest_verl_compat.memory.values import UnreadableRun

VEOMNI = "veomni"
VEOMNI_RELEASE = "0.1.12"
# The FSDP2 strategy the forecast reads a VeOmni engine as.
AS_STRATEGY = "fsdp2"
ULYSSES_KEY = "ulysses_parallel_size"
# Each line with its file: a bare ``:N`` would be read as the verl file cited before it
# (releases/lines.py), whose lines each release maps to its own.
EV_VEOMNI = "; ".join(
    f"veomni/distributed/{where}@veomni-{VEOMNI_RELEASE}"
    for where in (
        "torch_parallelize.py:481-487",
        "torch_parallelize.py:646-647",
        "torch_parallelize.py:803",
        "parallel_state.py:231-247",
    )
)


def assumption(release_evidence: str) -> str:
    """The forecast's assumption for a VeOmni role, citing the release's line that has VeOmni
    build the model (its memory facts' ``veomni_engine``)."""
    return (
        f"the VeOmni engine is read as the FSDP2 it builds (veomni {VEOMNI_RELEASE}, which verl "
        f"does not pin; {release_evidence}; {EV_VEOMNI}): fp32 stored weights under "
        "mixed_precision, its shard group, experts over expert parallel, the root module "
        "gathered through backward, gradients synced every micro-batch; the layers' "
        "activations are transformers' model's, not VeOmni's own kernels'"
    )


ACTIVATION_OFFLOAD_ASSUMED = (
    "VeOmni's own activation offload (model.enable_activation_offload, or the engine's "
    "enable_async_activation_offload) is not modelled: the activations are counted as kept on "
    "the GPU"
)
# The VeOmni reading's own key (no FSDP2 engine reads it): its stream-based activation offload.
ASYNC_OFFLOAD = "enable_async_activation_offload"


def is_veomni(strategy: str) -> bool:
    return strategy == VEOMNI


def shard_group_size(engine: Mapping[str, Any], world: int) -> int:
    """The forecast's ``fsdp_size`` for VeOmni's shard group: -1 (the whole world) unless
    ``fsdp_size`` is a proper divisor of the data-parallel size (world over Ulysses), then those
    shards times Ulysses (HSDP over the rest)."""
    sp = max(as_int(engine.get(ULYSSES_KEY), 1), 1)
    dp = max(world // sp, 1)
    fsdp = as_int(engine.get("fsdp_size"), -1)
    if fsdp < 0 or fsdp >= dp or dp % max(fsdp, 1):
        return -1
    return fsdp * sp


def fsdp2_reading(engine: Mapping[str, Any], world: int, where: str = "") -> dict[str, Any]:
    """A VeOmni engine section (at ``where``) spelled as the FSDP2 engine's keys the forecast
    reads (the keys the two engines share are kept; no no-sync key: VeOmni never defers, which
    the caller sets). An fsdp_size that does not divide the data-parallel size is one line, as
    verl's engine raises on it; so is expert parallel that does not divide the shard group: VeOmni
    lays its expert mesh (ep_fsdp, ep) over that group (parallel_state.py, init_parallel_state)."""
    prefix = f"{where}." if where else ""
    sp = max(as_int(engine.get(ULYSSES_KEY), 1), 1)
    dp, fsdp = max(world // sp, 1), as_int(engine.get("fsdp_size"), -1)
    if 0 < fsdp < dp and dp % fsdp:
        # VeOmniEngine.__init__ raises "Data parallel size (..) must be divisible by fsdp_size"
        raise UnreadableRun(
            f"{prefix}fsdp_size={fsdp} does not divide the data-parallel size {dp} (the GPUs "
            f"over {ULYSSES_KEY}): the VeOmni engine raises before it builds the model",
            f"{prefix}fsdp_size",
        )
    group = shard_group_size(engine, world)
    shard = world if group < 0 else group
    ep = max(as_int(engine.get("expert_parallel_size"), 1), 1)
    if shard % ep:
        raise UnreadableRun(
            f"{prefix}expert_parallel_size={ep} does not divide the {shard} ranks of VeOmni's "
            "shard group: its expert mesh cannot be built",
            f"{prefix}expert_parallel_size",
        )
    mixed = engine.get("mixed_precision", True)
    mixed = True if mixed is None else bool(mixed)
    shared = (
        "param_offload",
        "optimizer_offload",
        "entropy_from_logits_with_chunking",
        "use_torch_compile",
        "pad_to_length",
        "pad_to_length_bucket",
        "use_dynamic_bsz",
    )
    view: dict[str, Any] = {key: engine[key] for key in shared if key in engine}
    view.update(
        strategy=AS_STRATEGY,
        fsdp_size=group,
        model_dtype="fp32" if mixed else "bf16",
        mixed_precision={"param_dtype": "bf16", "reduce_dtype": "fp32" if mixed else "bf16"},
        offload_policy=bool(engine.get("enable_fsdp_offload")),
        reshard_after_forward=True,
        ulysses_sequence_parallel_size=max(as_int(engine.get(ULYSSES_KEY), 1), 1),
    )
    view[ASYNC_OFFLOAD] = bool(engine.get(ASYNC_OFFLOAD))
    return view


def read_engine(
    engine: Mapping[str, Any], model: Any, world: int, where: str, strategy_key: str
) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """A VeOmni engine section at ``where`` as the forecast reads it: its FSDP2 reading, the
    strategy it is read as, and EngineSpec's fields of its own; a LoRA rank in the trained
    ``model`` section (None: a model that takes none) is one line at ``strategy_key``."""
    if isinstance(model, Mapping):
        refuse_lora(engine_lora_rank(model, "fsdp"), strategy_key)
    return fsdp2_reading(engine, world, where), AS_STRATEGY, spec_fields(engine)


def refuse_lora(rank: int, key: str) -> None:
    """VeOmni's engine builds the model without peft: a LoRA rank trains nothing the forecast
    can lay out."""
    if rank > 0:
        raise UnreadableRun(
            f"{key}={VEOMNI} with a LoRA rank: this release's VeOmni engine builds no LoRA "
            "adapters (transformer_impl.py builds the model without peft), which the forecast "
            "does not model",
            key,
        )


def spec_fields(engine: Mapping[str, Any]) -> dict[str, Any]:
    """EngineSpec's fields of a VeOmni engine beyond its FSDP2 reading."""
    return {
        "ep": max(as_int(engine.get("expert_parallel_size"), 1), 1),
        "defer_sync": False,
        "label": "VeOmni",
        "root_gathered": True,
        "forward_only_on_host": False,
    }


def role_flags(
    spec: EngineSpec,
    engine: Mapping[str, Any],
    flags: dict[str, Any],
    facts: ReleaseFacts,
    engine_section: str,
    assumed: tuple[str, ...] = (),
) -> dict[str, Any]:
    """RoleLayout's engine flags and assumptions, with what an engine read as another strategy
    (``spec.label``: VeOmni, its section at ``engine_section``, ``engine`` as read) does not
    share with it; the release's facts say it has that engine."""
    if not spec.label:
        return {**flags, "assumed": assumed}
    evidence = facts.veomni_evidence
    if evidence is None:
        key = f"{engine_section}.strategy"
        raise UnreadableRun(
            f"{key}={VEOMNI}: the memory facts of verl {facts.release} have no VeOmni engine",
            key,
        )
    assumed = (*assumed, assumption(evidence))
    if flags["activation_offload"] or engine.get(ASYNC_OFFLOAD):
        assumed = (*assumed, ACTIVATION_OFFLOAD_ASSUMED)
    return {
        **flags,
        "activation_offload": False,
        "assumed": assumed,
        "ulysses_key": f"{engine_section}.{ULYSSES_KEY}",
    }
