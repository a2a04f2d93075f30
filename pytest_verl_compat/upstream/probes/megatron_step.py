"""The Megatron engine's own checks of a micro-batch against its configuration (oracle process only).

``MegatronEngineWithLMHead.forward_step`` (verl/workers/engine/megatron/transformer_impl.py:1224-1267)
compares the knobs of the batch its worker hands it with the engine's configuration before it
reads a tensor: per-batch ``use_fused_kernels`` against the engine's (:1233-1238), and
``pad_to_length`` against top-k distillation and against router replay (:1243-1252). The probe
calls that method itself, on the engine its worker built and on the batch that worker handed the
engine (``first_step`` captures it where the engine's step begins), and it stops at the first
tensor the rollout would fill (``prepare_model_inputs`` reads ``input_ids``, :1258): a missing
field is the probe's limit, recorded as a step not evaluated.

Only an engine of verl's Megatron package gets here: the test is its class's module name, so an
FSDP configuration never imports Megatron-Core.
"""

from __future__ import annotations

from typing import Any

from pytest_verl_compat.upstream.probes.patching import patched

MEGATRON_PACKAGE = "verl.workers.engine.megatron."
FORWARD_STEP = "first step: MegatronEngine.forward_step"


def is_megatron(engine: Any) -> bool:
    """An engine of verl's Megatron package (by its class's module: nothing is imported)."""
    return type(engine).__module__.startswith(MEGATRON_PACKAGE)


def engine_knobs(section: str) -> dict[str, tuple[str, ...]]:
    """The engine's attributes its checks read, with the keys ``__init__`` set them from
    (``enable_routing_replay``, transformer_impl.py:220): the method that checks them is not the
    one that read the keys."""
    return {"enable_routing_replay": (f"{section}.router_replay.mode",)}


def forward_step(engine: Any, batch: Any) -> None:
    """The engine's ``forward_step`` on one batch as its worker handed it; the batch stays on this
    machine's CPU (``get_device_id`` would ask for a GPU, transformer_impl.py:1228)."""
    from verl.workers.engine.megatron import transformer_impl

    with patched(transformer_impl, "get_device_id", lambda: "cpu"):
        engine.forward_step(
            iter([batch]), model=None, logits_processor_func=None, postprocess_micro_batch_func=None
        )
