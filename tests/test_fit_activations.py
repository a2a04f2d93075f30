"""Activations: the bytes a training forward keeps for backward, measured on CPU on tiny models of
each family built locally from a config (transformers, no hub), against the forecast's formula
(``memory/activations.py``) within 10%.

Without checkpointing the measure is ``torch.autograd.graph.saved_tensors_hooks``, every saved
tensor's storage counted once (parameters left out). Under gradient checkpointing what stays is
held by the checkpoint's closures, not only saved for autograd, so the measure is every storage
still alive when the forward returns (a TorchDispatchMode that follows each op's outputs).
Remove-padding changes the token count the formula is given: a packed sequence of the real
tokens against a padded batch. torch's CPU flash kernel keeps what flash attention keeps on a
GPU (q, k, v, the output and the log-sum-exp, grouped KV heads not repeated); the GPU kernels'
own workspaces are the forecast's stated allowance (``WORKSPACE_ALLOWANCE``), not measured here.

Peaks of a pass are measured by the same dispatch mode, summing after every op the storages some
tensor still uses (``_Live``): a training pass's backward through the decoder layers (from the
moment the final norm's output gets its gradient, with a head of a large vocabulary whose tensors
must be gone by then), and a forward under no_grad through the layers. The weights' gradients are
states, not activations: the backward asks only for the input embeddings' gradient, so the
weights' gradients are never made while the forward saves what full training saves.

DeepSeek V3's multi-head latent attention is not measured: its value head width differs from the
query's, so torch's CPU attention falls back to the math kernel and keeps the tokens x tokens
probabilities that flash attention on a GPU does not.
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any

import pytest
from tiny_configs import DEEPSEEK_V3_MLA

from pytest_verl_compat.memory.activations import (
    inference_bytes,
    kept_bytes,
    layers_backward_bytes,
)
from pytest_verl_compat.memory.architecture import architecture_from_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOLERANCE = 0.10
BASE = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
}
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {},
    "qwen2": {},
    "qwen3": {"head_dim": 16},
    "qwen3_moe": {
        "head_dim": 16,
        "moe_intermediate_size": 48,
        "num_experts": 4,
        "num_experts_per_tok": 2,
    },
    "gemma": {"head_dim": 16},
    "gemma2": {"head_dim": 16},
    "gemma3_text": {"head_dim": 16},
    # GLM-4: a fused gate_up_proj, four norms, a rotary of half of each head applied interleaved
    "glm4": {"head_dim": 16, "pad_token_id": 0},
    # DeepSeek V3: multi-head latent attention, its MoE block after a leading dense layer
    "deepseek_v3": {**DEEPSEEK_V3_MLA, "moe_intermediate_size": 48, "pad_token_id": 0},
    # GLM-4.5: DeepSeek V3's MoE (sigmoid router, a shared expert, a leading dense layer) under a
    # biased attention with q/k norms and half of each head rotated
    "glm4_moe": {
        "head_dim": 16,
        "moe_intermediate_size": 48,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "attention_bias": True,
        "use_qk_norm": True,
        "pad_token_id": 0,
    },
    # Hy3: a sigmoid router over the fp32 hidden state, its weights fp32, a shared expert added
    # in fp32, q/k norms, the first layer dense
    "hy_v3": {
        "head_dim": 16,
        "moe_intermediate_size": 48,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "num_shared_experts": 1,
    },
    # the shared experts wider than the routed one: their MLP's moment is the no-grad peak
    "hy_v3-shared": {
        "model_type": "hy_v3",
        "head_dim": 16,
        "moe_intermediate_size": 96,
        "num_experts": 8,
        "num_experts_per_tok": 1,
        "num_shared_experts": 2,
        "mlp_layer_types": ["sparse", "sparse"],
    },
    "glm4_moe-shared": {
        "model_type": "glm4_moe",
        "head_dim": 16,
        "moe_intermediate_size": 96,
        "n_routed_experts": 8,
        "n_shared_experts": 2,
        "num_experts_per_tok": 1,
        "first_k_dense_replace": 0,
        "pad_token_id": 0,
    },
    # a window wider than the sequences, as flash attention keeps the same tensors either way
    "gpt_oss": {
        "head_dim": 16,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 4096,
    },
}
LENGTHS = (64, 192)


def _attention_without_sinks(module: Any, q: Any, k: Any, v: Any, mask: Any, **kwargs: Any) -> Any:
    """gpt-oss's attention as flash attention keeps it: verl asks for flash_attention_2
    (model.override_config's default, verl/workers/config/model.py:185), which transformers
    replaces for gpt-oss with the vllm-flash-attn3 kernel that takes the heads' sinks
    (_compatible_flash_implementations, modeling_utils.py:1903-1917 and
    modeling_flash_attention_utils.py:649-653@transformers-5.10.4). Its backward keeps q, k, v,
    the output and the log-sum-exp, the sinks a parameter; torch's attention keeps the same
    tensors on a CPU, without the sinks, as for the other families."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    kwargs.pop("s_aux", None)
    return sdpa_attention_forward(module, q, k, v, mask, **kwargs)


# gpt-oss's model class refuses "sdpa" by name (it would drop the sinks): the same function,
# registered under a name of its own with sdpa's masks
NO_SINK = "attention_without_sinks"
transformers.AttentionInterface.register(NO_SINK, _attention_without_sinks)
transformers.AttentionMaskInterface.register(NO_SINK, transformers.masking_utils.sdpa_mask)


def _attention_sequence_major(module: Any, q: Any, k: Any, v: Any, mask: Any, **kwargs: Any) -> Any:
    """Torch's attention on q, k and v laid out as flash attention takes them: transformers'
    flash path hands the kernel (batch, sequence, heads, dim) tensors made contiguous
    (integrations/flash_attention.py:56-58, modeling_flash_attention_utils.py:511-513@
    transformers-5.10.4; verl's GLM-4.1V patch the same, verl/models/transformers/glm4v.py:188-190).
    GLM's rotary concatenates each head's rotated and passed halves, laying q and k out head
    first: the kernel keeps their contiguous copies, and its output is o_proj's input itself.
    Torch's CPU kernel on the head-first tensors would keep another copy for o_proj instead."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    return sdpa_attention_forward(module, q, k, v, mask, **kwargs)


SEQUENCE_MAJOR = "attention_sequence_major"  # a name with "flash" in it is taken for a kernel
transformers.AttentionInterface.register(SEQUENCE_MAJOR, _attention_sequence_major)
transformers.AttentionMaskInterface.register(SEQUENCE_MAJOR, transformers.masking_utils.sdpa_mask)


def _attention_values_padded(module: Any, q: Any, k: Any, v: Any, mask: Any, **kwargs: Any) -> Any:
    """DeepSeek V3's multi-head latent attention as its flash path runs it: its values, narrower
    than its queries and keys, padded to their width before the kernel and its output cut back
    after (modeling_deepseek_v3.py:456-475@transformers-5.10.4, under flash attention only), q,
    k and v laid out as the flash path hands them (``_attention_sequence_major``). Torch's CPU
    kernel on unequal widths would fall back to the math path and keep the fp32 score matrix,
    which flash attention never holds."""
    width = v.shape[-1]
    v = torch.nn.functional.pad(v, [0, q.shape[-1] - width])
    out, weights = _attention_sequence_major(module, q, k, v, mask, **kwargs)
    return out[..., :width], weights


VALUES_PADDED = "attention_values_padded"
transformers.AttentionInterface.register(VALUES_PADDED, _attention_values_padded)
transformers.AttentionMaskInterface.register(VALUES_PADDED, transformers.masking_utils.sdpa_mask)
ATTENTION = {
    "gpt_oss": NO_SINK,
    "glm4": SEQUENCE_MAJOR,
    "glm4_moe": SEQUENCE_MAJOR,
    "deepseek_v3": VALUES_PADDED,
}
ERRORS: dict[str, float] = {}


def _model(case: str, checkpointing: bool, vocab: int | None = None) -> tuple[Any, dict[str, Any]]:
    config = dict(BASE, **FAMILIES[case])
    family = config.pop("model_type", case)  # a case of another shape names its family
    if vocab is not None:
        config["vocab_size"] = vocab
    hf = transformers.AutoConfig.for_model(family, **config)
    torch.manual_seed(0)
    attention = ATTENTION.get(family, "sdpa")
    model = transformers.AutoModelForCausalLM.from_config(hf, attn_implementation=attention)
    model = model.to(torch.bfloat16).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    return model, {"model_type": family, **config}


def _saved_bytes(model: Any, ids: Any) -> int:
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(tensor: Any) -> Any:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(input_ids=ids)
    return sum(seen.values())


class _Alive(torch.utils._python_dispatch.TorchDispatchMode):  # type: ignore[misc]
    """Every storage an op creates, alive while any tensor on it is."""

    def __init__(self) -> None:
        super().__init__()
        self.groups: dict[int, tuple[int, list[Any]]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in torch.utils._pytree.tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr():
                storage = tensor.untyped_storage()
                group = self.groups.get(storage.data_ptr())
                if group is None or not any(ref() is not None for ref in group[1]):
                    self.groups[storage.data_ptr()] = (storage.nbytes(), [weakref.ref(tensor)])
                else:
                    group[1].append(weakref.ref(tensor))
        return out

    def alive(self, leave_out: set[int]) -> int:
        return sum(
            size
            for ptr, (size, refs) in self.groups.items()
            if ptr not in leave_out and any(ref() is not None for ref in refs)
        )


def _alive_after_forward(model: Any, ids: Any) -> int:
    """Storages alive when the forward returns, the logits and parameters left out, the token
    ids (made before the forward) added."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    meter = _Alive()
    with meter:
        out = model(input_ids=ids)
        logits = out.logits.untyped_storage().data_ptr()
        kept = meter.alive(params | {logits})
    return kept + ids.numel() * ids.element_size()


class _Live(torch.utils._python_dispatch.TorchDispatchMode):  # type: ignore[misc]
    """After every op, the bytes of every storage an op made that a tensor still uses (the
    storages' use counts; the meter's own reference is the one use it leaves out)."""

    def __init__(self, leave_out: set[int]) -> None:
        super().__init__()
        self.storages: dict[int, Any] = {}
        self.leave_out = leave_out
        self.timeline: list[int] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in torch.utils._pytree.tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                if storage.data_ptr() and storage.data_ptr() not in self.leave_out:
                    self.storages.setdefault(storage._cdata, storage)
        self.timeline.append(
            sum(
                s.nbytes()
                for s in self.storages.values()
                if torch._C._storage_Use_Count(s._cdata) > 1
            )
        )
        return out


def _layers_backward_peak(model: Any, ids: Any, vocab: int) -> int:
    """The most bytes alive while backward runs through the decoder layers: from the moment the
    final norm's output receives its gradient (the head's backward done) to the end."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    meter = _Live(params)
    layers_start: list[int] = []

    def mark(grad: Any) -> None:
        layers_start.append(len(meter.timeline))

    def on_norm(module: Any, inputs: Any, output: Any) -> None:
        output.register_hook(mark)

    hook = model.model.norm.register_forward_hook(on_norm)
    labels = torch.randint(0, vocab, (ids.shape[1],))
    try:
        with meter:
            embeds = model.get_input_embeddings()(ids).detach().requires_grad_()
            logits = model(inputs_embeds=embeds).logits.squeeze(0)
            log_probs = torch.log_softmax(logits.float(), -1).gather(-1, labels[:, None])
            del logits
            torch.autograd.grad(log_probs.sum(), [embeds])
    finally:
        hook.remove()
    return max(meter.timeline[layers_start[0] :]) + ids.numel() * ids.element_size()


def _no_grad_layers_peak(model: Any, ids: Any) -> int:
    """The most bytes alive in a forward under no_grad, up to the final norm (the logits are
    the forecast's own part), without a KV cache (verl's log-prob passes pass use_cache=False)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    meter = _Live(params)
    head_start: list[int] = []
    hook = model.model.norm.register_forward_pre_hook(
        lambda module, inputs: head_start.append(len(meter.timeline))
    )
    try:
        with torch.no_grad(), meter:
            model(input_ids=ids, use_cache=False)
    finally:
        hook.remove()
    return max(meter.timeline[: head_start[0]]) + ids.numel() * ids.element_size()


def _check(observed: int, expected: int, case: str) -> None:
    __tracebackhide__ = True
    error = expected / observed - 1
    ERRORS[case] = error
    assert abs(error) <= TOLERANCE, (
        f"bytes={expected}, but should be {observed} within {TOLERANCE:.0%} "
        f"(forecast error {error:+.2%}) [{case}]"
    )


@pytest.mark.parametrize("tokens", LENGTHS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_saved_for_backward_matches_the_formula(family: str, tokens: int) -> None:
    model, config = _model(family, checkpointing=False)
    arch = architecture_from_config(config, family, "tiny config")
    observed = _saved_bytes(model, torch.randint(0, BASE["vocab_size"], (1, tokens)))
    _check(observed, kept_bytes(arch, tokens, checkpointing=False), f"{family}-{tokens}")


@pytest.mark.parametrize("tokens", LENGTHS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_checkpointed_forward_keeps_the_layer_inputs(family: str, tokens: int) -> None:
    model, config = _model(family, checkpointing=True)
    arch = architecture_from_config(config, family, "tiny config")
    observed = _alive_after_forward(model, torch.randint(0, BASE["vocab_size"], (1, tokens)))
    _check(
        observed, kept_bytes(arch, tokens, checkpointing=True), f"{family}-{tokens}-checkpointed"
    )


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_remove_padding_counts_real_tokens(family: str) -> None:
    """Three sequences of 40, 100 and 64 tokens: packed (remove-padding, one row of 204 tokens)
    the layers keep what 204 tokens keep; padded to the longest (3 x 100) what 300 keep."""
    model, config = _model(family, checkpointing=False)
    arch = architecture_from_config(config, family, "tiny config")
    lengths = (40, 100, 64)
    packed = torch.randint(0, BASE["vocab_size"], (1, sum(lengths)))
    padded = torch.randint(0, BASE["vocab_size"], (len(lengths), max(lengths)))
    _check(_saved_bytes(model, packed), kept_bytes(arch, sum(lengths), False), f"{family}-packed")
    _check(_saved_bytes(model, padded), kept_bytes(arch, padded.numel(), False), f"{family}-padded")


HEAD_VOCAB = 4096  # logits far larger than a layer: were they alive in the layers, it would show


@pytest.mark.parametrize("checkpointing", [False, True], ids=["kept", "checkpointed"])
@pytest.mark.parametrize("tokens", LENGTHS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_backward_through_the_layers_matches_the_formula(
    family: str, tokens: int, checkpointing: bool
) -> None:
    """The layers' backward peaks at what the forward kept but the head's, plus one layer
    (recomputed when checkpointed) and its gradients in flight; the head's tensors and the
    logits are freed before it, so a pass's peak is the larger of the two, never their sum."""
    model, config = _model(family, checkpointing, vocab=HEAD_VOCAB)
    arch = architecture_from_config(config, family, "tiny config")
    ids = torch.randint(0, HEAD_VOCAB, (1, tokens))
    observed = _layers_backward_peak(model, ids, HEAD_VOCAB)
    one_logits_copy = tokens * HEAD_VOCAB * 2
    assert one_logits_copy > 2 * TOLERANCE * observed, "logits alive here would not show"
    _check(
        observed,
        layers_backward_bytes(arch, tokens, checkpointing),
        f"{family}-{tokens}-backward-{'checkpointed' if checkpointing else 'kept'}",
    )


@pytest.mark.parametrize("tokens", LENGTHS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_no_grad_forward_peak_matches_the_formula(family: str, tokens: int) -> None:
    model, config = _model(family, checkpointing=False)
    arch = architecture_from_config(config, family, "tiny config")
    ids = torch.randint(0, BASE["vocab_size"], (1, tokens))
    _check(
        _no_grad_layers_peak(model, ids),
        inference_bytes(arch, tokens),
        f"{family}-{tokens}-no-grad",
    )


def _measure(case: str) -> str:
    for measure in ("backward", "no-grad"):
        if f"-{measure}" in case:
            return measure
    return "saved"


def test_report_the_errors(capsys: pytest.CaptureFixture[str]) -> None:
    """The largest forecast error per family and per measure (printed with -s or in the
    summary of -rA)."""
    by_family: dict[str, float] = {}
    by_measure: dict[str, float] = {}
    for case, error in ERRORS.items():
        family = case.split("-")[0]
        by_family[family] = max(by_family.get(family, 0.0), abs(error))
        by_measure[_measure(case)] = max(by_measure.get(_measure(case), 0.0), abs(error))
    with capsys.disabled():
        print(
            "\nactivation forecast, largest error per family: "
            + ", ".join(f"{family} {error:.2%}" for family, error in sorted(by_family.items()))
            + "; per measure: "
            + ", ".join(f"{measure} {error:.2%}" for measure, error in sorted(by_measure.items()))
        )


def test_megatron_layers_keep_what_the_published_count_says() -> None:
    """Megatron's layers cannot run here (Transformer Engine needs a GPU), so their formula is
    checked against the published count instead: Korthikanti et al. 2022 ("Reducing Activation
    Recomputation in Large Transformer Models", section 4.1) give 34 s*b*h bytes per layer in
    16-bit, of which 2 s*b*h are dropout masks (verl trains without dropout) and 16 s*b*h the
    GELU MLP's two 4h-wide tensors; the rest, 16 s*b*h, is the norms' and attention's, which a
    multi-head model without q/k norms must equal here. The SwiGLU MLP keeps fc1's gate and up
    and fc2's input (3 x intermediate), where GELU kept 2 x 4h."""
    from pytest_verl_compat.memory.activations import megatron_layer_bytes

    h, heads = 512, 8
    config = dict(
        BASE, hidden_size=h, num_attention_heads=heads, num_key_value_heads=heads,
        intermediate_size=1376, model_type="llama",
    )  # fmt: skip
    arch = architecture_from_config(config, "llama", "tiny config")
    rsigmas, lse = 2 * 4, 4 * heads
    mlp = 3 * 2 * arch.intermediate_size
    assert megatron_layer_bytes(arch, 0) - mlp - rsigmas - lse == 16 * h
    assert megatron_layer_bytes(arch, 0) < kept_bytes(arch, 1, False) // arch.num_hidden_layers


def _head_gradient_alive_in_the_layers(one_flat_root: bool) -> int:
    """Bytes alive while backward runs through a layer between the head and the embedding, when
    the embedding and the head are views of one flat parameter split as FSDP1 splits its units
    (torch/distributed/fsdp/_flat_param.py, _get_unflat_views_aligned: torch.split of the flat
    parameter), or two parameters of their own (FSDP2's units, each gradient reduce-scattered
    and freed once accumulated)."""
    vocab, hidden = 4096, 32
    if one_flat_root:
        flat = torch.zeros(2 * vocab * hidden, requires_grad=True)
        embed, head = (t.view(vocab, hidden) for t in torch.split(flat, [vocab * hidden] * 2))
    else:
        embed = torch.zeros(vocab, hidden, requires_grad=True)
        head = torch.zeros(vocab, hidden, requires_grad=True)
        # FSDP2 reduce-scatters a unit's gradient as soon as it is accumulated, and frees it
        head.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
    layer = torch.zeros(hidden, hidden, requires_grad=True)
    params = {t.untyped_storage().data_ptr() for t in (embed, head, layer)}
    meter = _Live(params)
    window: list[int] = []
    ids = torch.randint(0, vocab, (8,))
    with meter:
        x = torch.nn.functional.embedding(ids, embed)
        x.register_hook(lambda grad: window.append(len(meter.timeline)))
        z = x @ layer  # the layer's backward: from z's gradient to x's
        z.register_hook(lambda grad: window.append(len(meter.timeline)))
        (torch.tanh(z) @ head.t()).logsumexp(-1).sum().backward()
    start, end = sorted(window)
    return max(meter.timeline[start:end])


def test_fsdp1_holds_the_head_gradient_through_the_layers() -> None:
    """FSDP1's root unit: the head's gradient waits in the split's backward for the embedding's,
    so it is alive through every layer's backward; FSDP2's own units let it go."""
    head_bytes_ = 4096 * 32 * 4
    assert _head_gradient_alive_in_the_layers(True) >= head_bytes_
    assert _head_gradient_alive_in_the_layers(False) < head_bytes_


@pytest.mark.parametrize("value_heads", [2, 4])
def test_gated_deltanet_keeps_what_flas_kernels_save(value_heads: int) -> None:
    """Gated DeltaNet's kernels (flash-linear-attention) do not run on a CPU, so its layer is
    checked against the tensors their autograd functions save, listed here one by one from
    fla-core 0.6.0 and transformers' Qwen3-Next layer: with as many value heads as key heads
    (nothing repeated) and with twice as many (q and k repeated before the kernel normalises
    them), in bf16."""
    from pytest_verl_compat.memory.activations import linear_attention_bytes

    key_heads, dk, dv, h, c = 2, 8, 12, 64, 2
    config = dict(
        BASE, model_type="qwen3_next", hidden_size=h, linear_num_key_heads=key_heads,
        linear_num_value_heads=value_heads, linear_key_head_dim=dk, linear_value_head_dim=dv,
        linear_conv_kernel_dim=4, head_dim=16, num_hidden_layers=4,
    )  # fmt: skip
    arch = architecture_from_config(config, "qwen3_next", "tiny config")
    keys, values = key_heads * dk, value_heads * dv
    saved = {
        "in_proj_qkvz/in_proj_ba input": c * h,
        "conv1d input": c * (2 * keys + values),
        "silu input (the convolution's output)": c * (2 * keys + values),
        "v made contiguous (input_guard)": c * values,
        "q, k l2-normalised at the value heads": c * 2 * value_heads * dk,
        "q_rstd, k_rstd (fp32)": 2 * 4 * value_heads,
        "softplus input, its output, the decay g (fp32)": 3 * 4 * value_heads,
        "beta (sigmoid's output)": c * value_heads,
        "A, chunk-local (64 per head)": c * value_heads * 64,
        "gated norm: input (the kernel's output), gate": 2 * c * values,
        "gated norm: rstd per head (fp32)": 4 * value_heads,
        "out_proj input": c * values,
    }
    assert linear_attention_bytes(arch, c) == sum(saved.values())


@pytest.mark.parametrize(("micro_batches", "in_flight"), [(8, 4), (4, 4), (2, 2), (1, 1)])
def test_the_first_pipeline_stage_keeps_the_micro_batches_1f1b_runs_ahead(
    micro_batches: int, in_flight: int
) -> None:
    """megatron-core's 1F1B schedule (schedules.py:2093-2097@0.16.1): stage r runs
    min(pp - r - 1, M) warm-up forwards and one more before each backward. Over 4 stages of a
    16-layer model the first keeps min(4, M) micro-batches of its 4 layers and no head; the last
    one micro-batch of its 4 layers and the head. Without a pipeline, the whole model, once."""
    from pytest_verl_compat.memory.activations import Stage, pipeline_stages

    config = dict(BASE, model_type="llama", num_hidden_layers=16)
    arch = architecture_from_config(config, "llama", "tiny config")
    first, last = pipeline_stages(arch, 4, micro_batches)
    assert (first.layers, first.in_flight, first.last) == (range(0, 4), in_flight, False)
    assert (last.layers, last.in_flight, last.last) == (range(12, 16), 1, True)
    whole = kept_bytes(arch, 100, False, megatron=True)
    assert kept_bytes(arch, 100, False, megatron=True, stage=Stage.whole(arch)) == whole
    quarter = kept_bytes(arch, 100, False, megatron=True, stage=last)
    assert kept_bytes(arch, 100, False, megatron=True, stage=first) < in_flight * quarter
    assert quarter < whole // 3


@pytest.mark.parametrize(("micro_batches", "first_units", "last_units"), [(8, 11, 5), (2, 4, 4)])
def test_an_interleaved_pipeline_keeps_korthikantis_extra_share(
    micro_batches: int, first_units: int, last_units: int
) -> None:
    """With 2 model chunks per rank (virtual_pipeline_model_parallel_size) over 4 stages of 16
    layers, a unit is one micro-batch through a chunk of 2 layers; megatron-core's interleaved
    schedule (schedules.py:773-774@0.16.1, microbatch_group_size_per_vp_stage = pp) runs
    2 x 3 + 1 x 4 warm-up units on the first stage and keeps one more: 22 layers' worth, L x (1 +
    (pp - 1) / (pp x vpp)) as Korthikanti et al. count; the last stage 4 + 1. Both at most
    M x vpp units."""
    from pytest_verl_compat.memory.activations import pipeline_stages

    config = dict(BASE, model_type="llama", num_hidden_layers=16)
    arch = architecture_from_config(config, "llama", "tiny config")
    first, last = pipeline_stages(arch, 4, micro_batches, vpp=2)
    assert (first.layers, first.in_flight, first.last) == (range(0, 2), first_units, False)
    assert (last.layers, last.in_flight, last.last) == (range(14, 16), last_units, True)
    if micro_batches == 8:
        assert len(first.layers) * first.in_flight == 16 * (1 + 3 / 8)


_MEGATRON_LOGITS = """
import os, socket, types, torch, torch.distributed as dist
from typing import Any
with socket.socket() as free:
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
from megatron.core import parallel_state
parallel_state.initialize_model_parallel(1, 1)
from verl.workers.engine.megatron.transformer_impl import MegatronEngineWithLMHead

LIVE_CLASS

def peak(entropy, training, chunked):
    tokens, vocab = 512, 4096
    hidden = torch.randn(1, tokens, 16, dtype=torch.bfloat16, requires_grad=training)
    head = torch.randn(vocab, 16, dtype=torch.bfloat16)
    label = torch.randint(0, vocab, (1, tokens))
    config = types.SimpleNamespace(
        entropy_from_logits_with_chunking=chunked, entropy_from_logits_chunk_size=128
    )
    meter = _Live({hidden.untyped_storage().data_ptr(), head.untyped_storage().data_ptr()})
    with (torch.enable_grad() if training else torch.no_grad()), meter:
        logits = hidden @ head.t()
        out = MegatronEngineWithLMHead._lm_head_logits_processor(
            types.SimpleNamespace(engine_config=config), logits, label, torch.ones(1, tokens),
            calculate_sum_pi_squared=False, calculate_entropy=entropy, distillation_use_topk=False,
            distillation_only=False, logits_processor_func=None, batch=None, data_format="thd",
        )
        del logits
        if training:
            loss = out["log_probs"].float().sum()
            if entropy:
                loss = loss + out["entropy"].float().sum()
            del out
            loss.backward()
    return max(meter.timeline) / (tokens * vocab * 2)

result = [[e, t, c, peak(e, t, c)] for e, t, c in CASES]
"""


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.9.0", "0.9.1"])
def test_megatron_logits_cost_is_what_its_engine_holds(version: str) -> None:
    """Megatron's log-prob computation, measured: the release's own
    MegatronEngineWithLMHead._lm_head_logits_processor on CPU (megatron-core's vocab-parallel
    cross entropy over a one-rank gloo group), the peak of live storages in units of tokens x
    vocab in bf16, with and without the entropy and a gradient, against megatron_logits_cost;
    the small tensors beside the logits (log-probs, maxima) within a few percent. Chunked entropy
    is measured forward-only: in an update its chunks' in-place backward (sub_ then add_ on views
    of one tensor) fails autograd's version check, in upstream's code as here."""
    from corpus_facts import release_ready
    from release_python import run_in_release

    from pytest_verl_compat.memory.activations import megatron_logits_cost

    if not release_ready(version):
        pytest.skip(f"the environment of verl {version} is not built")
    cases = [(False, False, False), (False, True, False), (True, False, False)]
    cases += [(True, True, False), (True, False, True)]
    # the same meter as the measures above, its source sent to the release's interpreter
    source = _MEGATRON_LOGITS.replace("LIVE_CLASS", inspect.getsource(_Live))
    measured = run_in_release(source.replace("CASES", repr(cases)), version)
    for entropy, training, chunked, units in measured:
        expected = megatron_logits_cost(training, entropy, False).copies
        assert expected <= units <= expected * 1.03, (entropy, training, chunked, units, expected)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_megatron_without_sequence_parallel_keeps_korthikantis_unsplit_share(tp: int) -> None:
    """Korthikanti et al. 2022, Table 2: per layer and tensor-parallel rank, s*b*h*(10 + 24/t)
    without sequence parallelism against 34/t with it; the 10 s*b*h held whole on every rank are
    the two norms' inputs and the two linear layers' inputs after them, and 2 s*b*h the dropout
    masks verl's models do not keep. Per token on one rank (the caller divides the tokens by tp),
    what sequence parallelism saves is therefore 8h bytes (and the norms' fp32 rsigmas) times
    (tp - 1) / tp."""
    from pytest_verl_compat.memory.activations import megatron_layer_bytes

    h = 512
    config = dict(
        BASE, hidden_size=h, num_attention_heads=8, num_key_value_heads=8,
        intermediate_size=1376, model_type="llama",
    )  # fmt: skip
    arch = architecture_from_config(config, "llama", "tiny config")
    rsigmas = 2 * 4
    saved = megatron_layer_bytes(arch, 0, 2, tp) - megatron_layer_bytes(arch, 0, 2, 1)
    assert saved == (8 * h + rsigmas) * (tp - 1)
    tokens = 1000 * tp
    whole = kept_bytes(arch, tokens // tp, False, 2, True, None, tp)
    split = kept_bytes(arch, tokens // tp, False, 2, True, None, 1)
    assert whole - split == tokens // tp * arch.num_hidden_layers * saved
    # full recompute keeps each layer's input: whole on every rank without sequence parallelism
    recomputed = kept_bytes(arch, 1, True, 2, True, None, tp) - kept_bytes(arch, 1, True, 2, True)
    assert recomputed == (tp - 1) * arch.num_hidden_layers * 2 * h


_OFFLOADED = """
import weakref
from typing import Any
import torch, transformers
from verl.utils import activation_offload as ao

# This machine's "host": a meta tensor, whose storage the meters do not count; reloaded, a tensor
# of the same size on the device again. The streams are the CPU's (verl asks its platform, which
# falls back to CUDA here).
def offload(src_tensor, pin_memory=True):
    return (src_tensor.device, torch.empty(src_tensor.size(), dtype=src_tensor.dtype, device="meta"))

def reload(state, non_blocking=None):
    device, backup = state
    return torch.empty(backup.size(), dtype=backup.dtype, device=device)

ao.get_torch_device = lambda: torch.cpu
ao.SynchronizedGroupOffloadHandler.offload = staticmethod(offload)
ao.SynchronizedGroupOffloadHandler.reload = staticmethod(reload)

BASE = BASE_CONFIG
FAMILIES = FAMILY_CONFIGS
ATTENTION = {}  # every family here takes torch's sdpa
HELPERS

def _offloaded_model(family, checkpointing, vocab=None):
    # the layers verl's enable_activation_offloading finds (the FSDP units, here every decoder
    # layer), wrapped by its own ActivationHandler; with checkpointing, its own per-layer
    # checkpoint in place of transformers' (activation_offload.py:543-558)
    model, config = _model(family, False, vocab)
    model.config.use_cache = False  # verl's forward passes use_cache=False
    layers = list(model.model.layers)
    keep = ao.FSDPParameterFilter()
    context, sync = ao.get_activation_offload_context(len(layers) - 1, len(layers), keep)
    handler = ao.ActivationHandler(context, sync, keep, checkpointing)
    for layer in layers:
        handler.wrap_module_forward_method(layer)
    return model, config

result = []
for family, tokens, checkpointing in CASES:
    torch.manual_seed(1)
    model, _ = _offloaded_model(family, checkpointing)
    kept = _alive_after_forward(model, torch.randint(0, BASE["vocab_size"], (1, tokens)))
    backward = None
    if not checkpointing:  # verl's reentrant checkpoint refuses autograd.grad, which the meter asks
        model, _ = _offloaded_model(family, checkpointing, HEAD_VOCAB)
        ids = torch.randint(0, HEAD_VOCAB, (1, tokens))
        backward = _layers_backward_peak(model, ids, HEAD_VOCAB)
    result.append([family, tokens, checkpointing, kept, backward])
"""
OFFLOAD_LAYERS = 5  # verl offloads only with three FSDP units or more


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.9.0", "0.9.1"])
def test_activation_offload_keeps_what_the_formula_says(version: str) -> None:
    """model.enable_activation_offload, measured: the release's own ActivationHandler and
    double-buffered offload handler around each decoder layer of tiny models on CPU (the host
    copies made on the meta device, so the meters count what stays on the device). When the
    forward returns, only the last layer's saved tensors are on the device (every other layer's
    went to the host), and backward through the layers holds two layers' (the one it runs and the
    one it brings back) beside the recomputed layer and the gradients in flight: within 10%,
    with and without checkpointing."""
    from corpus_facts import release_ready
    from release_python import run_in_release

    if not release_ready(version):
        pytest.skip(f"the environment of verl {version} is not built")
    families = ("llama", "qwen2", "qwen3", "gemma2")
    cases = [(f, t, c) for f in families for t in LENGTHS for c in (False, True)]
    helpers = "\n\n".join(
        inspect.getsource(helper)
        for helper in (_Alive, _Live, _model, _alive_after_forward, _layers_backward_peak)
    )
    base = dict(BASE, num_hidden_layers=OFFLOAD_LAYERS)
    source = (
        _OFFLOADED.replace("BASE_CONFIG", repr(base))
        .replace("FAMILY_CONFIGS", repr(FAMILIES))
        .replace("HELPERS", helpers)
        .replace("HEAD_VOCAB", repr(HEAD_VOCAB))
        .replace("CASES", repr(cases))
    )
    measured = run_in_release(source, version)
    assert len(measured) == len(cases)
    for family, tokens, checkpointing, kept, backward in measured:
        config = dict(base, **FAMILIES[family], model_type=family)
        arch = architecture_from_config(config, family, "tiny config")
        every_layer = kept_bytes(arch, tokens, checkpointing)
        case = f"{family}-{tokens}-{'checkpointed' if checkpointing else 'kept'}-offloaded"
        _check(kept, kept_bytes(arch, tokens, checkpointing, offloaded=True), case)
        assert kept < every_layer or checkpointing, "the offload moved nothing"
        if backward is not None:
            config_head = dict(config, vocab_size=HEAD_VOCAB)
            arch_head = architecture_from_config(config_head, family, "tiny config")
            expected = layers_backward_bytes(arch_head, tokens, checkpointing, offloaded=True)
            _check(backward, expected, f"{case}-backward")


def _loss_peak(shifted: bool, training: bool) -> float:
    """The peak of live storages, in units of the bf16 logits, while torch's cross entropy takes
    a bf16 model's logits under bf16 autocast (as fsdp_sft_trainer.py:381-401@0.7.0 computes its
    loss; CPU autocast casts cross_entropy to fp32 as CUDA's does), shifted first where the
    samples are padded."""
    batch, seq, width, vocab = 2, 256, 16, 4096
    hidden = torch.randn(batch, seq, width, dtype=torch.bfloat16, requires_grad=training)
    head = torch.randn(vocab, width, dtype=torch.bfloat16)
    labels = torch.randint(0, vocab, (batch * (seq - 1 if shifted else seq),))
    meter = _Live({hidden.untyped_storage().data_ptr(), head.untyped_storage().data_ptr()})
    with (
        torch.enable_grad() if training else torch.no_grad(),
        meter,
        torch.autocast("cpu", dtype=torch.bfloat16),
    ):
        logits = hidden @ head.t()
        scored = logits[..., :-1, :].contiguous() if shifted else logits
        loss = torch.nn.CrossEntropyLoss(reduction="none")(scored.view(-1, vocab), labels)
        if training:
            loss.sum().backward()
    return max(meter.timeline) / (batch * seq * vocab * 2)


@pytest.mark.parametrize("shifted", [True, False])
@pytest.mark.parametrize("training", [True, False])
def test_the_fp32_loss_holds_the_copies_the_forecast_counts(shifted: bool, training: bool) -> None:
    from pytest_verl_compat.memory.activations import logits_cost

    expected = logits_cost(training, False, False, False, fp32_loss=True, shifted=shifted).copies
    measured = _loss_peak(shifted, training)
    assert expected * 0.98 <= measured <= expected * 1.02, (measured, expected)
