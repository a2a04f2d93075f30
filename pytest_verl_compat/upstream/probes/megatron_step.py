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

from collections.abc import Mapping
from typing import Any

from pytest_verl_compat.upstream.probes.patching import all_patched, patched

MEGATRON_PACKAGE = "verl.workers.engine.megatron."
FORWARD_STEP = "first step: MegatronEngine.forward_step"
POSTPROCESS = "first update: MegatronEngine.postprocess_micro_batch_func"


class TransformerConfigStandIn:
    """The engine's Megatron ``TransformerConfig`` as far as the configuration decides it.

    Megatron-Bridge builds it from the model's files and then applies
    ``override_transformer_config`` over every other setting (``_build_tf_config``,
    transformer_impl.py:296, 360-361): a field the override sets has that value here. Any other
    field is the model's or the bridge's own (Megatron-Bridge is not installed here), so reading
    it makes the step not evaluated rather than guessed."""

    def __init__(self, overrides: Mapping[str, Any]) -> None:
        self.__dict__["_overrides"] = dict(overrides)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self._overrides:
            return self._overrides[name]
        raise ImportError(
            f"not evaluated here: the transformer config's {name} is built by Megatron-Bridge "
            "from the model's files"
        )


def is_megatron(engine: Any) -> bool:
    """An engine of verl's Megatron package (by its class's module: nothing is imported)."""
    return type(engine).__module__.startswith(MEGATRON_PACKAGE)


def engine_knobs(section: str) -> dict[str, tuple[str, ...]]:
    """The engine's attributes its checks read, with the keys ``__init__`` set them from
    (``enable_routing_replay``, transformer_impl.py:220): the method that checks them is not the
    one that read the keys."""
    return {"enable_routing_replay": (f"{section}.router_replay.mode",)}


def tf_config_knobs(section: str) -> dict[str, tuple[str, ...]]:
    """The transformer config's fields the engine's checks name, with the override keys that set
    them (``TransformerConfigStandIn``)."""
    return {
        "calculate_per_token_loss": (
            f"{section}.override_transformer_config.calculate_per_token_loss",
        ),
    }


def postprocess(engine: Any, loss_function: Any, output: Any, data: Any) -> None:
    """``postprocess_micro_batch_func`` as ``forward_backward_batch`` hands it a micro-batch in an
    update (transformer_impl.py:921-925, ``forward_only=False``), with the worker's own loss
    function and the loss probe's model output; the micro-batch also holds what the engine adds to
    it: its tokens (``input_ids``, prompt then response) and the micro-batch count (:914-915)."""
    import torch
    from verl.utils import tensordict_utils as tu

    tokens = [
        torch.cat([prompt, response])
        for prompt, response in zip(
            data["prompts"].unbind(), data["responses"].unbind(), strict=True
        )
    ]
    data["input_ids"] = torch.nested.as_nested_tensor(tokens, layout=torch.jagged)
    tu.assign_non_tensor(data, num_micro_batch=1)
    tf_config = TransformerConfigStandIn(engine.engine_config.override_transformer_config or {})
    with all_patched([(engine, "tf_config", tf_config)], provided=True):
        engine.postprocess_micro_batch_func(
            output, data, forward_only=False, loss_function=loss_function
        )


def forward_step(engine: Any, batch: Any) -> None:
    """The engine's ``forward_step`` on one batch as its worker handed it; the batch stays on this
    machine's CPU (``get_device_id`` would ask for a GPU, transformer_impl.py:1228)."""
    from verl.workers.engine.megatron import transformer_impl

    with patched(transformer_impl, "get_device_id", lambda: "cpu"):
        engine.forward_step(
            iter([batch]), model=None, logits_processor_func=None, postprocess_micro_batch_func=None
        )
