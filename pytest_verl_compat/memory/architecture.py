"""A model's shape as the forecast needs it: every parameter tensor, read from config.json numbers.

``Architecture.tensors()`` lists the parameter tensors that transformers builds for the model
(the 5.x layout verl 0.9.0 requires: fused MoE experts, tied embeddings left out), each with the
FSDP unit it belongs to. Parameter counts, FSDP shards, LoRA adapters and the KV cache are all
computed from that one list; tests/test_fit_architecture.py checks it tensor by tensor against
models transformers builds on the meta device.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pytest_verl_compat.memory.tensor import Tensor, is_count, most_of
from pytest_verl_compat.memory.vision import VisionConfigError, VisionTower, vision_from_config

# Families whose decoder layer is the Llama layout (q/k/v/o, gated MLP, RMSNorm).
DENSE_FAMILIES = frozenset(
    {
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "gemma",
        "gemma2",
        "gemma3_text",
        "mimo",
        "seed_oss",
        "qwen3_5_text",
        "glm4",
        "glm4v_text",
    }
)
MOE_FAMILIES = frozenset(
    {
        "qwen3_moe",
        "deepseek_v3",
        "kimi_k2",
        "qwen3_next",
        "qwen3_5_moe_text",
        "gpt_oss",
        "glm4_moe",
        "hy_v3",
    }
)
FAMILIES = DENSE_FAMILIES | MOE_FAMILIES
# Hybrid families: most layers are Gated DeltaNet linear attention (layer_types, or every
# full_attention_interval-th layer full), the rest gated full attention (q_proj twice as wide: the
# query and its output gate). transformers' Qwen3Next*/Qwen3_5* classes.
HYBRID = frozenset({"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"})
# Hybrid families whose linear attention splits its input projection (in_proj_qkv, _z, _b, _a);
# Qwen3-Next fuses them (in_proj_qkvz, in_proj_ba).
SPLIT_IN_PROJ = frozenset({"qwen3_5_text", "qwen3_5_moe_text"})
# Hy3 (transformers' HYV3ForCausalLM): a Llama attention with q/k norms whose o_proj follows
# attention_bias; each layer's MLP dense or a MoE block as mlp_layer_types says (the first layer
# dense when it does not: HYV3Config.__post_init__), the block built router first (the sigmoid
# router's correction bias a buffer of the block), then its stacked experts and
# num_shared_experts shared experts of moe_intermediate_size each, added to the routed output in
# fp32 (enable_moe_fp32_combine). Its MTP layer is not built by transformers, nor trained by verl.
HY_V3 = frozenset({"hy_v3"})
# MoE families whose block builds its router before its experts.
ROUTER_FIRST = frozenset({"qwen3_next", "qwen3_5_moe_text"}) | HY_V3
# gpt-oss (transformers' GptOss*): every layer a MoE of experts with biases, stored (experts, in,
# out) as GptOssExperts builds them (gate_up_proj interleaves gate and up), routed by a
# GptOssTopKRouter (weight and bias, built before the experts); the experts' width is
# intermediate_size and their count num_local_experts; each attention head has a learned sink
# (self_attn.sinks)
GPT_OSS = frozenset({"gpt_oss"})
# GLM-4 (transformers' Glm4DecoderLayer, and GLM-4.1V's language model, Glm4vTextDecoderLayer):
# one fused gate_up_proj (2 x intermediate_size wide) where Llama has gate_proj and up_proj, four
# norms per layer (input_layernorm, post_attention_layernorm, post_self_attn_layernorm,
# post_mlp_layernorm, in that order), an o_proj without a bias whatever attention_bias says, and
# a partial rotary embedding applied interleaved (partial_rotary_factor of each head).
GLM_LAYER = frozenset({"glm4", "glm4v_text"})
# GLM-4.5/4.6/4.7 (transformers' Glm4MoeForCausalLM): DeepSeek V3's MoE block (leading dense
# layers, routed experts with a sigmoid router, shared experts) under a Llama attention whose
# q/k/v follow attention_bias, o_proj unbiased, an optional q/k norm (use_qk_norm) and half of
# each head rotated (not interleaved); two norms per layer. Its MTP layer
# (num_nextn_predict_layers) is not built by transformers, nor trained by verl.
GLM_MOE = frozenset({"glm4_moe"})
# Families whose router is DeepSeek V3's (transformers' DeepseekV3TopkRouter, Glm4MoeTopkRouter):
# a linear of the fp32 hidden state, sigmoid scores with a correction bias, top-k within the best
# topk_group of n_group expert groups, fp32 routing weights; and Hy3's (HYV3TopKRouter), the same
# without expert groups (GROUPLESS_ROUTER).
GROUPLESS_ROUTER = HY_V3
SIGMOID_ROUTER = frozenset({"deepseek_v3", "kimi_k2"}) | GLM_MOE | GROUPLESS_ROUTER
# Families whose o_proj has no bias whatever attention_bias says.
UNBIASED_OUT = GLM_LAYER | GLM_MOE
# Checkpoint quantizations whose weights the forecast does not count (MXFP4's four-bit blocks):
# a config.json declaring one is refused in one line, never counted at the compute dtype.
UNCOUNTED_QUANTIZATION = frozenset({"mxfp4"})
# What a family's config class gives a key config.json leaves out, where it is not the generic
# default (GptOssConfig: biased attention, 128 experts, 4 per token)
CONFIG_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt_oss": {"attention_bias": True, "num_local_experts": 128, "num_experts_per_tok": 4},
    "glm4": {"attention_bias": True},  # Glm4Config
    "hy_v3": {
        "num_experts": 192,
        "num_experts_per_tok": 8,
        "num_shared_experts": 1,
        "moe_intermediate_size": 1536,
    },
}
# The key of a family's shared-expert count where it is not DeepSeek V3's n_shared_experts.
SHARED_EXPERTS_KEY = {"hy_v3": "num_shared_experts"}
# Families whose MLP per layer is config.json's mlp_layer_types ("dense" or "sparse"), not
# first_k_dense_replace, with this many leading dense layers when it gives none.
MLP_LAYER_TYPES_DENSE = {"hy_v3": 1}
# The share of each head the rotary embedding turns, where config.json does not say
# (Glm4Config's rope_parameters: 0.5; Glm4vTextConfig gives none, 1.0, and GLM-4.1V's config.json
# says 0.5; Glm4MoeConfig 0.5). Read for these families only: the others' rotary widths are fixed
# in activations.py.
PARTIAL_ROTARY_BY_DEFAULT = {"glm4": 0.5, "glm4v_text": 1.0, "glm4_moe": 0.5}
LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
# Which layers attend in a sliding window, as transformers' config classes lay them out when
# config.json gives no layer_types (vLLM reads the layer_types they build: models/gemma2.py:159,
# gemma3.py:158, llama.py:185-204@vllm-0.24.0): Gemma 2 and gpt-oss every other layer from the
# first (Gemma2Config, GptOssConfig; vLLM's gpt_oss.py slides on even layers), Gemma 3 all but
# every sliding_window_pattern-th (Gemma3TextConfig, default 6),
# Qwen's from max_window_layers on when use_sliding_window (Qwen2Config, Qwen3Config); a
# Mistral config has no layer_types and vLLM gives every layer the model's window
# (cache_config.sliding_window, layers/attention/attention.py:229-234@vllm-0.24.0).
# The config classes' sliding_window.
WINDOW_BY_DEFAULT = {"gemma2": 4096, "gemma3_text": 4096, "gpt_oss": 128}
EVERY_OTHER_SLIDES = frozenset({"gemma2", "gpt_oss"})
PATTERN_SLIDES = frozenset({"gemma3_text"})
QWEN_SLIDES = frozenset({"qwen2", "qwen3", "mimo"})
ALL_SLIDE = frozenset({"mistral"})
# Families with an RMSNorm on each head's queries and keys.
QK_NORM = frozenset({"qwen3", "qwen3_moe", "gemma3_text"}) | HYBRID | HY_V3
# Families with the q/k norms where a config key asks for them (Glm4MoeConfig.use_qk_norm).
QK_NORM_KEY = {"glm4_moe": "use_qk_norm"}
# Families with four norms per decoder layer (around attention and around the MLP): the two
# beyond input_layernorm and post_attention_layernorm, in the order the layer registers them.
NORM_NAMES = {
    **dict.fromkeys(
        ("gemma2", "gemma3_text"), ("pre_feedforward_layernorm", "post_feedforward_layernorm")
    ),
    **dict.fromkeys(GLM_LAYER, ("post_self_attn_layernorm", "post_mlp_layernorm")),
}
SANDWICH_NORM = frozenset(NORM_NAMES)
# Families whose model class builds num_nextn_predict_layers multi-token-prediction layers beside
# the decoder (XiaomiMiMo's remote MiMoModel: a Qwen2 attention and MLP, four norms and a 2h x h
# input projection each); the forecast does not count them and says so.
MTP_UNCOUNTED = frozenset({"mimo"})
# Families whose q/k/v projections carry a bias whatever the config says (MiMo's remote model
# class builds transformers' Qwen2Attention: modeling_mimo.py imports it from modeling_qwen2;
# Glm4vTextAttention builds them with bias=True).
QKV_BIAS = frozenset({"qwen2", "mimo", "glm4v_text"})
# Families whose o_proj bias has a key of its own (Seed-OSS: attention_bias is q/k/v's only,
# transformers' SeedOssAttention builds o_proj with attention_out_bias); elsewhere o_proj
# follows attention_bias (Llama) or has none (QKV_BIAS).
OUT_BIAS_KEY = {"seed_oss": "attention_out_bias"}
# Families whose gated MLP reads config.mlp_bias (transformers' LlamaMLP, SeedOssMLP).
MLP_BIAS = frozenset({"llama", "seed_oss"})
# Families whose config class ties the embeddings when config.json does not say.
TIED_BY_DEFAULT = frozenset({"gemma", "gemma2", "gemma3_text"})
# Families whose config class has a head_dim of its own when config.json does not say (elsewhere
# hidden_size // num_attention_heads): transformers' Qwen3Config and SeedOssConfig 128, Gemma's 256.
HEAD_DIM_BY_DEFAULT = {
    "qwen3": 128,
    "seed_oss": 128,
    "gemma": 256,
    "gemma2": 256,
    "gemma3_text": 256,
    "gpt_oss": 64,
    "glm4": 128,
    "hy_v3": 128,
}
# Multimodal configs keep the language model's numbers under text_config.
TEXT_KEYS = ("text_config", "llm_config")
# model_type aliases: configs transformers builds with another family's classes.
ALIASES = {
    "gemma3": "gemma3_text",
    "qwen2_vl": "qwen2",
    "qwen2_5_vl": "qwen2",
    "qwen3_vl": "qwen3",
    "qwen3_vl_moe": "qwen3_moe",
    "qwen3_5": "qwen3_5_text",
    "qwen3_5_moe": "qwen3_5_moe_text",
    "glm4v": "glm4v_text",
}


class UnsupportedModel(ValueError):
    """A config.json the forecast cannot read (the message says which key or family)."""


@dataclass(frozen=True)
class Architecture:
    """The numbers of a decoder-only model that decide its memory (config.json names)."""

    name: str
    family: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    max_position_embeddings: int | None = None
    attention_bias: bool = False
    out_bias: bool = False  # o_proj's bias
    mlp_bias: bool = False  # gate/up/down projections' biases
    # MoE: routed experts, experts per token, their width, shared experts, leading dense layers.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    n_shared_experts: int = 0
    first_k_dense_replace: int = 0
    # DeepSeek V3's grouped routing (SIGMOID_ROUTER): expert groups, and the groups a token picks
    n_group: int = 1
    topk_group: int = 1
    # Qwen3-Next/Qwen3.5: one shared expert of this width, scaled by a sigmoid gate (0: none)
    shared_expert_intermediate_size: int = 0
    # Hybrid families: each layer's attention ("linear_attention" or "full_attention"; empty: all
    # full) and the Gated DeltaNet's heads, head widths and causal convolution's kernel.
    layer_types: tuple[str, ...] = ()
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    mamba_ssm_dtype: int = 0  # bytes of the recurrent state vLLM caches (0: the KV cache dtype)
    # Multi-head latent attention (DeepSeek V3): the ranks and head widths of its projections.
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # Sliding-window attention on some layers (Gemma 2/3, Mistral v0.1): the window and the
    # layers that use it (the rest attend to the whole sequence)
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] = ()
    # A vision-language model's vision tower (its parameters; vision.py), None for a text model.
    vision: VisionTower | None = None
    # A VL family whose tower the forecast does not model: its model_type (language model only).
    vision_uncounted: str = ""
    # The head width the rotary embedding turns (PARTIAL_ROTARY_BY_DEFAULT's families; 0: the
    # whole head)
    rotary_dim: int = 0
    qk_norm: bool = False  # an RMSNorm on each head's queries and keys (QK_NORM, QK_NORM_KEY)
    # Multi-token-prediction layers the model class builds beside its decoder (MiMo's
    # num_nextn_predict_layers): not counted (MTP_UNCOUNTED)
    mtp_uncounted: int = 0
    source: str = ""
    model_type: str = ""  # as config.json declares it (family is what it is built as)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def uses_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def mtp_parameters(self) -> int:
        """About what the uncounted MTP layers hold: a decoder layer and the 2h x h input
        projection each (MTP_UNCOUNTED; their three extra norms are left out)."""
        layer = sum(t.numel for t in self.layer_tensors(0))
        return self.mtp_uncounted * (layer + 2 * self.hidden_size**2)

    def is_moe_layer(self, index: int) -> bool:
        return self.is_moe and index >= self.first_k_dense_replace

    def is_linear_layer(self, index: int) -> bool:
        """A Gated DeltaNet layer (no KV cache; a fixed recurrent state per sequence)."""
        return bool(self.layer_types) and self.layer_types[index] == LINEAR_ATTENTION

    @property
    def full_attention_layers(self) -> int:
        """Layers with a KV cache (softmax attention)."""
        return sum(not self.is_linear_layer(i) for i in range(self.num_hidden_layers))

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    def _linear_attention(self, prefix: str, unit: str) -> Iterator[Tensor]:
        """Gated DeltaNet (transformers' Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet)."""
        h, heads = self.hidden_size, self.linear_num_value_heads
        keys, values = self.linear_key_dim, self.linear_value_dim
        conv = (2 * keys + values, 1, self.linear_conv_kernel_dim)
        yield Tensor(f"{prefix}.dt_bias", (heads,), unit, "norm")
        yield Tensor(f"{prefix}.A_log", (heads,), unit, "norm")
        yield Tensor(f"{prefix}.conv1d.weight", conv, unit, "conv")
        split = self.family in SPLIT_IN_PROJ
        if not split:
            qkvz = (2 * keys + 2 * values, h)
            yield Tensor(f"{prefix}.in_proj_qkvz.weight", qkvz, unit, "linear")
            yield Tensor(f"{prefix}.in_proj_ba.weight", (2 * heads, h), unit, "linear")
        yield Tensor(f"{prefix}.norm.weight", (self.linear_value_head_dim,), unit, "norm")
        yield Tensor(f"{prefix}.out_proj.weight", (h, values), unit, "linear")
        if split:
            yield Tensor(f"{prefix}.in_proj_qkv.weight", (2 * keys + values, h), unit, "linear")
            yield Tensor(f"{prefix}.in_proj_z.weight", (values, h), unit, "linear")
            yield Tensor(f"{prefix}.in_proj_b.weight", (heads, h), unit, "linear")
            yield Tensor(f"{prefix}.in_proj_a.weight", (heads, h), unit, "linear")

    # --- the parameter tensors --------------------------------------------------------------

    def _attention(self, prefix: str, unit: str) -> Iterator[Tensor]:
        h = self.hidden_size
        heads = self.num_attention_heads
        if self.uses_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                yield Tensor(f"{prefix}.q_a_proj.weight", (self.q_lora_rank, h), unit, "linear")
                yield Tensor(f"{prefix}.q_a_layernorm.weight", (self.q_lora_rank,), unit, "norm")
                yield Tensor(
                    f"{prefix}.q_b_proj.weight", (heads * qk, self.q_lora_rank), unit, "linear"
                )
            else:
                yield Tensor(f"{prefix}.q_proj.weight", (heads * qk, h), unit, "linear")
            yield Tensor(
                f"{prefix}.kv_a_proj_with_mqa.weight",
                (self.kv_lora_rank + self.qk_rope_head_dim, h),
                unit,
                "linear",
            )
            yield Tensor(f"{prefix}.kv_a_layernorm.weight", (self.kv_lora_rank,), unit, "norm")
            yield Tensor(
                f"{prefix}.kv_b_proj.weight",
                (heads * (self.qk_nope_head_dim + self.v_head_dim), self.kv_lora_rank),
                unit,
                "linear",
            )
            yield Tensor(f"{prefix}.o_proj.weight", (h, heads * self.v_head_dim), unit, "linear")
            return
        if self.family in GPT_OSS:  # the attention's own parameter, before its projections
            yield Tensor(f"{prefix}.sinks", (heads,), unit, "bias")
        q = heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        bias = self.attention_bias or self.family in QKV_BIAS
        gated = 2 if self.family in HYBRID else 1  # the query and its output gate
        for proj, rows in (("q_proj", gated * q), ("k_proj", kv), ("v_proj", kv)):
            yield Tensor(f"{prefix}.{proj}.weight", (rows, h), unit, "linear")
            if bias:
                yield Tensor(f"{prefix}.{proj}.bias", (rows,), unit, "bias")
        yield Tensor(f"{prefix}.o_proj.weight", (h, q), unit, "linear")
        if self.out_bias:
            yield Tensor(f"{prefix}.o_proj.bias", (h,), unit, "bias")
        if self.qk_norm:
            yield Tensor(f"{prefix}.q_norm.weight", (self.head_dim,), unit, "norm")
            yield Tensor(f"{prefix}.k_norm.weight", (self.head_dim,), unit, "norm")

    def _mlp(self, prefix: str, unit: str, index: int) -> Iterator[Tensor]:
        h = self.hidden_size
        if not self.is_moe_layer(index):
            width = self.intermediate_size
            if self.family in GLM_LAYER:
                yield Tensor(f"{prefix}.gate_up_proj.weight", (2 * width, h), unit, "linear")
                yield Tensor(f"{prefix}.down_proj.weight", (h, width), unit, "linear")
                return
            for proj, shape in (("gate_proj", (width, h)), ("up_proj", (width, h))):
                yield Tensor(f"{prefix}.{proj}.weight", shape, unit, "linear")
                if self.mlp_bias:
                    yield Tensor(f"{prefix}.{proj}.bias", (width,), unit, "bias")
            yield Tensor(f"{prefix}.down_proj.weight", (h, width), unit, "linear")
            if self.mlp_bias:
                yield Tensor(f"{prefix}.down_proj.bias", (h,), unit, "bias")
            return
        experts, width = self.num_experts, self.moe_intermediate_size
        if self.family in GPT_OSS:
            yield Tensor(f"{prefix}.router.weight", (experts, h), unit, "router")
            yield Tensor(f"{prefix}.router.bias", (experts,), unit, "router")
            yield Tensor(f"{prefix}.experts.gate_up_proj", (experts, h, 2 * width), unit, "experts")
            yield Tensor(
                f"{prefix}.experts.gate_up_proj_bias", (experts, 2 * width), unit, "experts"
            )
            yield Tensor(f"{prefix}.experts.down_proj", (experts, width, h), unit, "experts")
            yield Tensor(f"{prefix}.experts.down_proj_bias", (experts, h), unit, "experts")
            return
        router = Tensor(f"{prefix}.gate.weight", (experts, h), unit, "router")
        if self.family in ROUTER_FIRST:
            yield router
        yield Tensor(f"{prefix}.experts.gate_up_proj", (experts, 2 * width, h), unit, "experts")
        yield Tensor(f"{prefix}.experts.down_proj", (experts, h, width), unit, "experts")
        if self.family not in ROUTER_FIRST:
            yield router
        if self.shared_expert_intermediate_size:
            shared = self.shared_expert_intermediate_size
            yield Tensor(f"{prefix}.shared_expert.gate_proj.weight", (shared, h), unit, "linear")
            yield Tensor(f"{prefix}.shared_expert.up_proj.weight", (shared, h), unit, "linear")
            yield Tensor(f"{prefix}.shared_expert.down_proj.weight", (h, shared), unit, "linear")
            # an nn.Linear (peft's all-linear adapts it), unlike the routed experts' router
            yield Tensor(f"{prefix}.shared_expert_gate.weight", (1, h), unit, "linear")
        if self.n_shared_experts:
            shared = width * self.n_shared_experts
            yield Tensor(f"{prefix}.shared_experts.gate_proj.weight", (shared, h), unit, "linear")
            yield Tensor(f"{prefix}.shared_experts.up_proj.weight", (shared, h), unit, "linear")
            yield Tensor(f"{prefix}.shared_experts.down_proj.weight", (h, shared), unit, "linear")

    def layer_tensors(self, index: int) -> Iterator[Tensor]:
        """The parameter tensors of decoder layer ``index``, in transformers' order."""
        h = self.hidden_size
        unit = f"layers.{index}"
        prefix = f"model.layers.{index}"
        if self.is_linear_layer(index):
            yield from self._linear_attention(f"{prefix}.linear_attn", unit)
        else:
            yield from self._attention(f"{prefix}.self_attn", unit)
        yield from self._mlp(f"{prefix}.mlp", unit, index)
        norms = ("input_layernorm", "post_attention_layernorm", *NORM_NAMES.get(self.family, ()))
        for norm in norms:
            yield Tensor(f"{prefix}.{norm}.weight", (h,), unit, "norm")

    def tensors(self) -> Iterator[Tensor]:
        """Every parameter tensor of the causal-LM model (a tied lm_head is the embedding), a VL
        model's vision tower first, as transformers builds it."""
        if self.vision is not None:
            yield from self.vision.tensors()
        yield Tensor(
            "model.embed_tokens.weight", (self.vocab_size, self.hidden_size), "root", "embed"
        )
        for index in range(self.num_hidden_layers):
            yield from self.layer_tensors(index)
        yield Tensor("model.norm.weight", (self.hidden_size,), "root", "norm")
        if not self.tie_word_embeddings:
            yield Tensor("lm_head.weight", (self.vocab_size, self.hidden_size), "root", "lm_head")

    def value_head_tensors(self) -> Iterator[Tensor]:
        """The critic's model: the same body with a one-output score head instead of lm_head
        (AutoModelForTokenClassification, num_labels=1: verl/utils/model.py load_valuehead_model)."""
        for tensor in self.tensors():
            if tensor.kind != "lm_head":
                yield tensor
        yield Tensor("score.weight", (1, self.hidden_size), "root", "lm_head")
        yield Tensor("score.bias", (1,), "root", "bias")

    @property
    def num_parameters(self) -> int:
        return sum(t.numel for t in self.tensors())

    def active_parameters(self) -> int:
        """Parameters one token passes through (MoE: only its experts)."""
        total = 0
        for tensor in self.tensors():
            if tensor.kind == "experts":
                total += tensor.numel * self.num_experts_per_tok // self.num_experts
            else:
                total += tensor.numel
        return total

    # --- the KV cache -----------------------------------------------------------------------

    def kv_heads_per_rank(self, tensor_parallel: int) -> int:
        """KV heads one tensor-parallel rank keeps, replicated when TP exceeds them (vLLM's
        ModelConfig.get_num_kv_heads: max(1, total_num_kv_heads // tensor_parallel_size))."""
        return max(1, self.num_key_value_heads // max(tensor_parallel, 1))

    def kv_bytes_per_token_layer(self, tensor_parallel: int, dtype_bytes: int) -> int:
        """KV-cache bytes one token needs in one layer on one TP rank (vLLM's page per token).

        Full attention: 2 (K and V) x kv heads x head_dim x dtype (vllm/v1/kv_cache_interface.py,
        AttentionSpec.real_page_size_bytes); MLA: one latent of kv_lora_rank + qk_rope_head_dim,
        not split by TP (MLAAttentionSpec.real_page_size_bytes, num_kv_heads = 1).
        """
        if self.uses_mla:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * dtype_bytes
        return 2 * self.kv_heads_per_rank(tensor_parallel) * self.head_dim * dtype_bytes


def _value(config: Mapping[str, Any], key: str, default: Any = None) -> Any:
    if key in config:
        return config[key]
    for nested in TEXT_KEYS:
        inner = config.get(nested)
        if isinstance(inner, Mapping) and key in inner:
            return inner[key]
    return default


# The counts a decoder needs at least one of (tensor.py bounds them all from above).
AT_LEAST_ONE = frozenset(
    {"num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "vocab_size"}
)


def bounded(value: Any, key: str, where: str) -> int:
    """A config.json count within its bounds; anything else an UnsupportedModel naming it."""
    least = 1 if key in AT_LEAST_ONE else 0
    if not is_count(value, key, least):
        raise UnsupportedModel(
            f"{where}: {key} must be an integer from {least} to {most_of(key):,}, got {value!r}"
        )
    return value


def _int(config: Mapping[str, Any], key: str, source: str, default: int | None = None) -> int:
    # null takes the default as absent does: transformers' configs write
    # `if num_key_value_heads is None: num_key_value_heads = num_attention_heads`
    value = _value(config, key)
    value = default if value is None else value
    if value is None:
        raise UnsupportedModel(f"{source}: config.json has no {key}")
    return bounded(value, key, source)


def _count(config: Mapping[str, Any], key: str, source: str, default: int = 0) -> int:
    """An optional count: absent or null is ``default``."""
    value = _value(config, key)
    return default if value is None else bounded(value, key, source)


def _layer_types(
    config: Mapping[str, Any], family: str, layers: int, source: str
) -> tuple[str, ...]:
    """A hybrid family's attention per layer: config.json's layer_types, else every
    full_attention_interval-th layer full (transformers' Qwen3NextConfig default 4)."""
    if family not in HYBRID:
        return ()
    given = _value(config, "layer_types")
    if given is None:
        interval = _int(config, "full_attention_interval", source, 4) or 4
        return tuple(
            FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(layers)
        )
    if not isinstance(given, list) or len(given) != layers:
        raise UnsupportedModel(f"{source}: layer_types must list the {layers} layers' attention")
    unknown = sorted({str(kind) for kind in given} - {LINEAR_ATTENTION, FULL_ATTENTION})
    if unknown:
        raise UnsupportedModel(f"{source}: layer_types has {unknown[0]!r}, not an attention here")
    return tuple(str(kind) for kind in given)


def _sliding_layers(
    config: Mapping[str, Any], family: str, layers: int, window: int | None, source: str
) -> tuple[int, ...]:
    """The layers with a sliding window (SLIDING_ATTENTION's rules; config.json's layer_types
    where it gives them)."""
    if window is None or family in HYBRID:
        return ()
    given = _value(config, "layer_types")
    if given is not None:
        if not isinstance(given, list) or len(given) != layers:
            raise UnsupportedModel(
                f"{source}: layer_types must list the {layers} layers' attention"
            )
        return tuple(i for i, kind in enumerate(given) if kind == SLIDING_ATTENTION)
    if family in EVERY_OTHER_SLIDES:
        return tuple(range(0, layers, 2))
    if family in PATTERN_SLIDES:
        pattern = _int(config, "sliding_window_pattern", source, 6) or 6
        return tuple(i for i in range(layers) if (i + 1) % pattern)
    if family in QWEN_SLIDES:
        if not _value(config, "use_sliding_window", False):
            return ()
        start = _int(config, "max_window_layers", source, layers)
        return tuple(range(min(start, layers), layers))
    return tuple(range(layers)) if family in ALL_SLIDE else ()


def _leading_dense(config: Mapping[str, Any], family: str, layers: int, source: str) -> int:
    """The dense layers before the first MoE layer: first_k_dense_replace, or for the families
    that read mlp_layer_types (MLP_LAYER_TYPES_DENSE) its leading "dense" entries, which must be
    all its dense ones (a dense layer between MoE layers is not a layout the forecast counts)."""
    if family not in MLP_LAYER_TYPES_DENSE:
        return _count(config, "first_k_dense_replace", source)
    given = _value(config, "mlp_layer_types")
    if given is None:
        return min(MLP_LAYER_TYPES_DENSE[family], layers)
    if not (
        isinstance(given, list)
        and len(given) == layers
        and all(kind in ("dense", "sparse") for kind in given)
    ):
        raise UnsupportedModel(
            f"{source}: mlp_layer_types must list the {layers} layers' MLP, each dense or sparse"
        )
    dense = given.index("sparse") if "sparse" in given else layers
    if "dense" in given[dense:]:
        raise UnsupportedModel(
            f"{source}: mlp_layer_types has a dense layer after a sparse one (layer "
            f"{given.index('dense', dense)}): the forecast counts leading dense layers only"
        )
    return dense


def _linear_dims(config: Mapping[str, Any], family: str, source: str) -> dict[str, int]:
    """The Gated DeltaNet's heads and widths (a hybrid family's config.json must give them)."""
    if family not in HYBRID:
        return {}
    keys = (
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
    )
    dims = {key: _int(config, key, source) for key in keys}
    ssm = _value(config, "mamba_ssm_dtype")
    dims["mamba_ssm_dtype"] = {"float32": 4, "bfloat16": 2, "float16": 2}.get(str(ssm), 0)
    return dims


def _rotary_dim(config: Mapping[str, Any], family: str, head_dim: int, source: str) -> int:
    """The rotary width of PARTIAL_ROTARY_BY_DEFAULT's families: int(head_dim x
    partial_rotary_factor), the factor from config.json (top level, text_config, or their
    rope_parameters / rope_scaling) or the config class's (transformers'
    compute_default_rope_parameters); 0 for the other families."""
    if family not in PARTIAL_ROTARY_BY_DEFAULT:
        return 0
    factor = _value(config, "partial_rotary_factor")
    for key in ("rope_parameters", "rope_scaling"):
        rope = _value(config, key)
        if factor is None and isinstance(rope, Mapping):
            factor = rope.get("partial_rotary_factor")
    factor = PARTIAL_ROTARY_BY_DEFAULT[family] if factor is None else factor
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor <= 1:
        raise UnsupportedModel(f"{source}: partial_rotary_factor must be in (0, 1], got {factor!r}")
    return int(head_dim * factor)


def architecture_from_config(config: Mapping[str, Any], name: str, source: str) -> Architecture:
    """The architecture of a parsed config.json; raises ``UnsupportedModel`` naming the key."""
    declared = str(_value(config, "model_type", "") or "")
    family = ALIASES.get(declared, declared)
    try:
        vision = vision_from_config(config, declared, source)
    except VisionConfigError as exc:
        raise UnsupportedModel(str(exc)) from exc
    quantized = _value(config, "quantization_config")
    method = quantized.get("quant_method") if isinstance(quantized, Mapping) else None
    if method in UNCOUNTED_QUANTIZATION:
        # openai's gpt-oss checkpoints: MXFP4 experts, which vLLM serves at about half a byte and
        # verl's example dequantizes before it trains (run_gpt_oss_20b_fsdp.sh:37-60@0.9.0)
        raise UnsupportedModel(
            f"{source}: quantization_config.quant_method={method}: the forecast counts a "
            "dequantized model, not MXFP4 weights; give its bf16 copy's config.json with "
            "--model-config (the table lists lmsys/gpt-oss-20b-bf16 and -120b-bf16)"
        )
    if family in CONFIG_DEFAULTS:
        config = {**CONFIG_DEFAULTS[family], **config}
    if family not in FAMILIES:
        known = ", ".join(sorted(FAMILIES))
        raise UnsupportedModel(
            f"{source}: model_type {family or '(none)'!r} is not a family the forecast knows "
            f"({known})"
        )
    heads = _int(config, "num_attention_heads", source)
    hidden = _int(config, "hidden_size", source)
    kv_heads = _int(config, "num_key_value_heads", source, heads)
    head_dim = _count(config, "head_dim", source) or HEAD_DIM_BY_DEFAULT.get(
        family, hidden // heads
    )
    experts = (
        _count(config, "num_experts", source)
        or _count(config, "n_routed_experts", source)
        or _count(config, "num_local_experts", source)
    )
    window = _count(config, "sliding_window", source, WINDOW_BY_DEFAULT.get(family, 0)) or None
    attention_bias = bool(_value(config, "attention_bias", False))
    layers = _int(config, "num_hidden_layers", source)
    layer_types = _layer_types(config, family, layers, source)
    return Architecture(
        name=name,
        family=family,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        # a MoE config without dense layers may give none (transformers' Qwen3_5MoeTextConfig)
        intermediate_size=_int(config, "intermediate_size", source, 0 if experts else None),
        vocab_size=_int(config, "vocab_size", source),
        # transformers' config classes default to tied embeddings for Gemma, untied for the rest
        tie_word_embeddings=bool(_value(config, "tie_word_embeddings", family in TIED_BY_DEFAULT)),
        max_position_embeddings=_count(config, "max_position_embeddings", source) or None,
        attention_bias=attention_bias,
        out_bias=bool(_value(config, OUT_BIAS_KEY[family], False))
        if family in OUT_BIAS_KEY
        else attention_bias and family not in QKV_BIAS | UNBIASED_OUT,
        mlp_bias=family in MLP_BIAS and bool(_value(config, "mlp_bias", False)),
        num_experts=experts,
        num_experts_per_tok=_count(config, "num_experts_per_tok", source),
        moe_intermediate_size=_count(config, "intermediate_size", source)
        if family in GPT_OSS
        else _count(config, "moe_intermediate_size", source),
        n_shared_experts=_count(config, SHARED_EXPERTS_KEY.get(family, "n_shared_experts"), source),
        first_k_dense_replace=_leading_dense(config, family, layers, source),
        n_group=_count(config, "n_group", source, 1) or 1,
        topk_group=_count(config, "topk_group", source, 1) or 1,
        q_lora_rank=_count(config, "q_lora_rank", source) or None,
        kv_lora_rank=_count(config, "kv_lora_rank", source),
        qk_nope_head_dim=_count(config, "qk_nope_head_dim", source),
        qk_rope_head_dim=_count(config, "qk_rope_head_dim", source),
        v_head_dim=_count(config, "v_head_dim", source),
        sliding_window=window,
        sliding_layers=_sliding_layers(config, family, layers, window, source),
        shared_expert_intermediate_size=_count(config, "shared_expert_intermediate_size", source),
        layer_types=layer_types,
        **_linear_dims(config, family, source),
        vision=vision,
        vision_uncounted=declared if vision is None and "vision_config" in config else "",
        rotary_dim=_rotary_dim(config, family, head_dim, source),
        qk_norm=family in QK_NORM
        or (family in QK_NORM_KEY and _value(config, QK_NORM_KEY[family]) is True),
        mtp_uncounted=_count(config, "num_nextn_predict_layers", source)
        if family in MTP_UNCOUNTED
        else 0,
        source=source,
        model_type=declared,
    )
