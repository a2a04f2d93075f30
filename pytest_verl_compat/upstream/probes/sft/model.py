"""A model that stands in for the user's, so that the FSDP engine's own build and step run here.

``FSDPEngine.initialize`` (verl/workers/engine/fsdp/transformer_impl.py:188-214) builds the model
from its files, wraps it with LoRA, shards it with FSDP over a process group, and builds the
optimizer, the schedule and the checkpoint manager. Inside ``stand_in_model`` every line of it
runs but those that need the model's files or a process group: ``from_pretrained`` gives
``StandInForCausalLM`` (an embedding, one decoder layer of the usual projection names and a head,
a few hundred parameters: what the step's loss and gradient need), the FSDP wrappers return the
module unwrapped, the attention patches (``apply_monkey_patch``, written for each real
architecture) are not applied, and a pre-trained adapter's files are never read. LoRA's own
configuration (``LoraConfig``) and its application to the projections run with peft; a module
name only the real model has, or a wrap class only it defines, is not evaluated here.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any, ClassVar

from pytest_verl_compat.upstream.probes.patching import all_patched
from pytest_verl_compat.upstream.probes.records import KEY_REASON, KEY_STEP

# Token ids the stand-in tokenizer and model agree on (a tiny vocabulary).
VOCAB = 16
PAD, EOS, BOS = 0, 1, 2
_HIDDEN = 4
# The optimizer modules the probe builds from (``build_optimizer`` imports ``optimizer_impl`` by
# name, verl/workers/config/optimizer.py:341): any other name is not imported here.
SAFE_OPTIMIZER_MODULES = frozenset({"torch.optim"})
# peft's refusals that depend on the real model: its module names, or the default targets peft
# keeps per model type (peft/utils/constants.py) when target_modules is left unset.
MODEL_DEPENDENT_LORA = (
    "not found in the base model",
    "No modules were targeted",
    "Please specify `target_modules`",
)
ATTENTION_STEP = "trainer init: FSDPEngine._build_module (apply_monkey_patch)"
WRAP_STEP = "trainer init: FSDPEngine._build_fsdp_module (get_fsdp_wrap_policy)"
LORA_STEP = "trainer init: FSDPEngine._build_lora_module (get_peft_model)"
MTP_STEP = "trainer init: MegatronEngine (check_mtp_config)"


class StandInModelOutput:
    """What the stand-in model's forward returns: logits only. An output a patched forward would
    add (the fused kernels' ``log_probs``) is the stand-in's limit, never the configuration's."""

    def __init__(self, logits: Any) -> None:
        self.logits = logits

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"StandInModelOutput has no {name!r}: the real model's forward makes it"
        )


def _model_class() -> type:
    import torch

    class StandInDecoderLayer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            attention = ("q_proj", "k_proj", "v_proj", "o_proj")
            self.self_attn = torch.nn.ModuleDict(
                {name: torch.nn.Linear(_HIDDEN, _HIDDEN) for name in attention}
            )
            mlp = ("gate_proj", "up_proj", "down_proj")
            self.mlp = torch.nn.ModuleDict(
                {name: torch.nn.Linear(_HIDDEN, _HIDDEN) for name in mlp}
            )

        def forward(self, hidden: Any) -> Any:
            attention = self.self_attn
            hidden = hidden + attention["o_proj"](attention["v_proj"](hidden))
            mlp = self.mlp
            return hidden + mlp["down_proj"](mlp["gate_proj"](hidden) * mlp["up_proj"](hidden))

    class StandInForCausalLM(torch.nn.Module):
        """One decoder layer between an embedding and a head; the engine's calls answered."""

        _no_split_modules: ClassVar[list[str]] = ["StandInDecoderLayer"]

        def __init__(self, config: Any) -> None:
            super().__init__()
            self.config = config
            self.embed_tokens = torch.nn.Embedding(VOCAB, _HIDDEN)
            self.layers = torch.nn.ModuleList([StandInDecoderLayer()])
            self.lm_head = torch.nn.Linear(_HIDDEN, VOCAB)

        def forward(self, input_ids: Any, **_: Any) -> StandInModelOutput:
            hidden = self.embed_tokens(input_ids.clamp(0, VOCAB - 1))
            for layer in self.layers:
                hidden = layer(hidden)
            return StandInModelOutput(self.lm_head(hidden))

        def prepare_inputs_for_generation(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return kwargs  # peft's causal-LM wrapper keeps a reference to it

        def get_input_embeddings(self) -> Any:
            return self.embed_tokens

        def enable_input_require_grads(self) -> None:
            return None

        def gradient_checkpointing_enable(self, **_: Any) -> None:
            return None

    return StandInForCausalLM


class StandInAutoModel:
    """``get_hf_auto_model_class``'s answer: ``from_pretrained`` reads no file."""

    @staticmethod
    def from_pretrained(*_: Any, config: Any = None, torch_dtype: Any = None, **__: Any) -> Any:
        import torch

        torch.manual_seed(0)
        module = _model_class()(config)
        return module.to(torch_dtype) if torch_dtype is not None else module


class StandInTokenizer:
    """The tokenizer's ids a step reads (``pad_token_id`` into the batch's meta info)."""

    pad_token_id, eos_token_id, bos_token_id = PAD, EOS, BOS
    chat_template = None

    def __getattr__(self, name: str) -> Any:
        from pytest_verl_compat.upstream.probes.boundary import StandIn

        return StandIn()


def _auto_config(*_: Any, **__: Any) -> Any:
    """The model's config as ``AutoConfig.from_pretrained`` gives it (no file read): one
    architecture, the tiny vocabulary, untied embeddings."""
    from transformers import PretrainedConfig

    config = PretrainedConfig()
    config.architectures = ["StandInForCausalLM"]
    config.vocab_size = VOCAB
    config.tie_word_embeddings = False
    return config


class _CPUDevice:
    """``torch.cuda`` as a CPU answers it: no memory in use, nothing to synchronise."""

    @staticmethod
    def mem_get_info(*_: Any) -> tuple[int, int]:
        return (0, 0)

    def __getattr__(self, name: str) -> Any:
        import torch

        if name in ("manual_seed", "manual_seed_all", "get_rng_state", "set_rng_state"):
            return getattr(torch, name.removesuffix("_all"))
        return lambda *_, **__: 0


class CPUPlatform:
    """verl's platform (verl/plugin/platform/platform_manager.py:139) on a CPU: tensors on the
    CPU, the device's memory counters zero; anything else as the detected platform answers."""

    device_name = "cpu"
    device_module = _CPUDevice()

    def __init__(self, detected: Any) -> None:
        self.detected = detected

    def current_device(self) -> str:
        return "cpu"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.detected, name)


class UnshardedFSDP:
    """``FullyShardedDataParallel`` without a process group: the module itself, unwrapped (so
    ``isinstance(module, FSDP)`` is false and the engine clips as for a plain module)."""

    def __new__(cls, module: Any, *_: Any, **__: Any) -> Any:
        return module


def _nothing(*_: Any, **__: Any) -> None:
    return None


def _no_attention_patch(
    notes: list[dict[str, str]], *_: Any, ulysses_sp_size: int = 1, **__: Any
) -> None:
    """``apply_monkey_patch`` (verl/models/transformers/monkey_patch.py) patches the real
    architecture's attention; with sequence parallel it also checks that the model's heads split
    over the ranks (:340-345), which only the real model's config can answer."""
    if ulysses_sp_size > 1:
        _note(
            notes,
            ATTENTION_STEP,
            "the attention heads' split over the sequence-parallel "
            "ranks is the real model's (monkey_patch.py:340-345)",
        )


def _no_weight_context(*_: Any, **__: Any) -> Any:
    return contextlib.nullcontext


def _note(notes: list[dict[str, str]], step: str, reason: str) -> None:
    note = {KEY_STEP: step, KEY_REASON: reason}
    if note not in notes:
        notes.append(note)


def _wrap_policy(real: Any, notes: list[dict[str, str]]) -> Any:
    def get_fsdp_wrap_policy(module: Any, config: Any = None, is_lora: bool = False) -> Any:
        """verl/utils/fsdp_utils.py:80, whose class names are the real model's to resolve: a
        name the stand-in lacks leaves the module unwrapped, noted."""
        try:
            return real(module, config=config, is_lora=is_lora)
        except Exception as exc:
            if "Could not find any of the transformer layer classes" not in str(exc):
                raise
            _note(notes, WRAP_STEP, f"the layer classes to wrap are the real model's: {exc}")
            return None

    return get_fsdp_wrap_policy


def _peft(real: Any, notes: list[dict[str, str]]) -> Any:
    def get_peft_model(module: Any, config: Any, *args: Any, **kwargs: Any) -> Any:
        """peft's own application (transformer_impl.py:349); the stand-in has the usual
        projection names, and a name only the real model has is noted, the module kept."""
        try:
            return real(module, config, *args, **kwargs)
        except ValueError as exc:
            text = str(exc)
            if not any(words in text for words in MODEL_DEPENDENT_LORA):
                raise
            _note(notes, LORA_STEP, f"LoRA's target modules are the real model's: {text[:200]}")
            return module

    return get_peft_model


def _mtp(real: Any, notes: list[dict[str, str]]) -> Any:
    def check_mtp_config(model_config: Any, engine_config: Any) -> Any:
        """verl/utils/megatron_utils.py:1814-1836 raises when model.mtp.enable asks for MTP
        layers the model's config lacks (:1828-1829): the real model's to answer. The stand-in
        answers as a model with one MTP layer, so the settings it then reads are checked, and
        the question is noted."""
        hf_config = model_config.hf_config
        if model_config.mtp.enable and not getattr(hf_config, "num_nextn_predict_layers", 0):
            _note(
                notes,
                MTP_STEP,
                "whether the model has MTP layers (model.mtp.enable=True) is the real model's "
                "config: verl/utils/megatron_utils.py:1828-1829 raises without them",
            )
            hf_config.num_nextn_predict_layers = 1
        return real(model_config, engine_config)

    return check_mtp_config


def _refuse_adapter(*_: Any, **__: Any) -> Any:
    raise ImportError("not evaluated here: it would read the pre-trained LoRA adapter's files")


def _optimizer(real: Any) -> Any:
    def build_optimizer(parameters: Any, config: Any) -> Any:
        module_name = str(config.optimizer_impl)
        if module_name not in SAFE_OPTIMIZER_MODULES:
            raise ImportError(
                f"not evaluated here: optim.optimizer_impl={module_name!r} is not imported"
            )
        return real(parameters, config)

    return build_optimizer


@contextlib.contextmanager
def stand_in_model() -> Iterator[list[dict[str, str]]]:
    """The engine's build without the model's files, FSDP's process group or the user's code;
    yields the notes of what the stand-in model could not answer (``records.KEY_STEP``, …)."""
    import peft
    import verl.utils.fs
    import verl.utils.model
    from verl.plugin.platform import platform_manager
    from verl.workers.config import model, optimizer
    from verl.workers.engine.fsdp import transformer_impl as engine
    from verl.workers.engine.megatron import transformer_impl as megatron_engine

    # Names these modules import rather than export, patched where they are looked up.
    model_config: Any = model
    transformer_impl: Any = engine

    notes: list[dict[str, str]] = []
    patches = [
        (platform_manager, "_current_platform", CPUPlatform(platform_manager.get_platform())),
        (model_config, "hf_tokenizer", lambda *a, **k: StandInTokenizer()),
        (model_config.AutoConfig, "from_pretrained", staticmethod(_auto_config)),
        (verl.utils.model, "get_hf_auto_model_class", lambda *a, **k: StandInAutoModel),
        (transformer_impl, "get_init_weight_context_manager", _no_weight_context),
        (transformer_impl, "apply_monkey_patch", functools.partial(_no_attention_patch, notes)),
        (
            transformer_impl,
            "get_fsdp_wrap_policy",
            _wrap_policy(transformer_impl.get_fsdp_wrap_policy, notes),
        ),
        (transformer_impl, "get_peft_model", _peft(transformer_impl.get_peft_model, notes)),
        (transformer_impl, "FSDP", UnshardedFSDP),
        (transformer_impl, "apply_fsdp2", _nothing),
        (transformer_impl, "fsdp2_load_full_state_dict", _nothing),
        (transformer_impl, "enable_activation_offloading", _nothing),
        (transformer_impl.FSDPEngine, "to", _nothing),
        (verl.utils.fs, "copy_to_local", lambda path, *a, **k: path),
        (peft.PeftModel, "from_pretrained", staticmethod(_refuse_adapter)),
        (optimizer, "build_optimizer", _optimizer(optimizer.build_optimizer)),
        (
            megatron_engine,
            "check_mtp_config",
            _mtp(megatron_engine.check_mtp_config, notes),
        ),
    ]
    with all_patched(patches):
        yield notes
