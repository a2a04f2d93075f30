"""A vision-language model's vision tower, as its parameter tensors (the weights, gradients and
optimizer states every role of a VL run holds, the vLLM server's weights per rank).

Two layouts, as transformers 5 builds them from ``vision_config``:

- Qwen2.5-VL (``Qwen2_5_VisionTransformerPretrainedModel``): a Conv3d patch embedding without
  bias (``hidden_size`` x ``in_channels`` x ``temporal_patch_size`` x ``patch_size``²),
  ``depth`` blocks of two RMSNorms, a fused ``qkv`` and a ``proj`` with biases and a gated MLP
  of ``intermediate_size`` with biases, and a merger (an RMSNorm over ``hidden_size``, then
  ``hidden_size`` x ``spatial_merge_size``² to itself and to ``out_hidden_size``, with biases);
- Qwen3-VL (``Qwen3VLVisionModel``): the patch embedding with a bias, a learned position
  embedding of ``num_position_embeddings``, blocks of two LayerNorms, ``qkv``, ``proj`` and a
  two-layer MLP (``linear_fc1``, ``linear_fc2``) with biases, a merger (a LayerNorm over
  ``hidden_size``, ``linear_fc1``, ``linear_fc2``) and one more merger per
  ``deepstack_visual_indexes`` entry, its LayerNorm after the 2x2 shuffle;
- GLM-4.1V (``Glm4vVisionModel``): a learned position embedding of (``image_size`` /
  ``patch_size``)² positions, the Conv3d patch embedding with a bias, blocks of two RMSNorms, a
  fused ``qkv`` (biased when ``attention_bias``) and a ``proj`` without bias and a gated MLP
  ``out_hidden_size`` wide without biases, then a merger over ``out_hidden_size`` (``proj``, a
  LayerNorm, a gated MLP of ``intermediate_size``, no biases), an RMSNorm after the patch
  embedding, a Conv2d downsample of ``spatial_merge_size``² patches to ``out_hidden_size`` and a
  last RMSNorm, in the order ``Glm4vVisionModel.__init__`` registers them.

Each block is an FSDP unit (the models' ``_no_split_modules`` name their vision blocks); the
embeddings and the mergers sit in the root unit. tests/test_fit_architecture.py checks every
tensor against the model transformers builds.

What the tower keeps for backward depends on the images (their patches), which a launch script
does not say: its activations are not forecast, and the forecast says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pytest_verl_compat.memory.tensor import Tensor, is_count, most_of

# Families with a vision tower the forecast counts, by model_type, and the tower each builds:
# Qwen3-VL's MoE models (qwen3_vl_moe) build Qwen3-VL's tower (transformers'
# Qwen3VLMoeVisionModel is Qwen3VLVisionModel's code).
# Qwen3.5's tower is Qwen3-VL's without deepstack mergers (transformers' Qwen3_5VisionModel).
# Qwen2-VL's (transformers' Qwen2VisionTransformerPretrainedModel): LayerNorms with biases, an
# fc1/fc2 MLP embed_dim x mlp_ratio wide, a LayerNorm merger; its vision_config names the tower's
# width embed_dim and the language model's hidden_size (the merger's output).
# Gemma 3's is SigLIP (transformers' SiglipVisionModel under model.vision_tower: patch and position
# embeddings, encoder layers of LayerNorms, k/v/q/out projections and an fc1/fc2 MLP, a post
# LayerNorm; no pooling head, vision_use_head false in its config.json) and a projector that is
# a plain weight and a norm (Gemma3MultiModalProjector).
TOWER_LAYOUTS = {
    "qwen2_vl": "qwen2_vl",
    "qwen2_5_vl": "qwen2_5_vl",
    "qwen3_vl": "qwen3_vl",
    "qwen3_vl_moe": "qwen3_vl",
    "qwen3_5": "qwen3_vl",
    "qwen3_5_moe": "qwen3_vl",
    "gemma3": "siglip",
    "glm4v": "glm4v",
}
VISION_FAMILIES = frozenset(TOWER_LAYOUTS)
# Towers whose norms are LayerNorms (a weight and a bias; Qwen2.5-VL's are RMSNorms).
LAYER_NORM_LAYOUTS = frozenset({"qwen2_vl", "qwen3_vl"})
# Towers whose block MLP is two linears, by their names (Qwen2.5-VL's is gated: three).
MLP_NAMES = {"qwen2_vl": ("fc1", "fc2"), "qwen3_vl": ("linear_fc1", "linear_fc2")}
PREFIX = "model.visual"
UNIT = "visual.blocks."  # a block's FSDP unit: visual.blocks.<i>
SIGLIP = "model.vision_tower"
SIGLIP_UNIT = "vision_tower.layers."  # an encoder layer's FSDP unit
PROJECTOR = "model.multi_modal_projector"
TOWER_PREFIXES = (f"{PREFIX}.", f"{SIGLIP}.", f"{PROJECTOR}.")
# The patch and position embeddings: no nn.Linear (peft's all-linear leaves them), replicated
# on every tensor-parallel rank of the rollout server.
EMBED = "vision_embed"


@dataclass(frozen=True)
class VisionTower:
    """The numbers of ``vision_config`` that decide the tower's parameters."""

    layout: str  # the tower's design, by the model_type that introduced it (TOWER_LAYOUTS)
    depth: int
    hidden_size: int
    intermediate_size: int
    out_hidden_size: int
    patch_size: int
    temporal_patch_size: int
    in_channels: int
    spatial_merge_size: int
    num_position_embeddings: int = 0  # Qwen3-VL's (GLM-4.1V's) learned position embedding
    attention_bias: bool = False  # GLM-4.1V's qkv bias (vision_config.attention_bias)
    deepstack_mergers: int = 0  # Qwen3-VL: one merger per deepstack_visual_indexes entry

    def tensors(self) -> Iterator[Tensor]:
        if self.layout == "siglip":
            yield from self._siglip()
            return
        if self.layout == "glm4v":
            yield from self._glm4v()
            return
        h = self.hidden_size
        qwen3 = self.layout == "qwen3_vl"
        layer_norms = self.layout in LAYER_NORM_LAYOUTS
        kernel = (self.in_channels, self.temporal_patch_size, self.patch_size, self.patch_size)
        yield Tensor(f"{PREFIX}.patch_embed.proj.weight", (h, *kernel), "root", EMBED)
        if qwen3:
            yield Tensor(f"{PREFIX}.patch_embed.proj.bias", (h,), "root", "bias")
            shape = (self.num_position_embeddings, h)
            yield Tensor(f"{PREFIX}.pos_embed.weight", shape, "root", EMBED)
        for index in range(self.depth):
            yield from self._block(index, layer_norms)
        merged = h * self.spatial_merge_size**2
        if not qwen3:
            yield Tensor(f"{PREFIX}.merger.ln_q.weight", (h,), "root", "norm")
            if layer_norms:
                yield Tensor(f"{PREFIX}.merger.ln_q.bias", (h,), "root", "norm")
            yield from self._linears(f"{PREFIX}.merger", "root", (("mlp.0", merged, merged),))
            yield from self._linears(
                f"{PREFIX}.merger", "root", (("mlp.2", self.out_hidden_size, merged),)
            )
            return
        mergers = [(f"{PREFIX}.merger", h)] + [
            (f"{PREFIX}.deepstack_merger_list.{i}", merged) for i in range(self.deepstack_mergers)
        ]
        for prefix, normed in mergers:
            yield Tensor(f"{prefix}.norm.weight", (normed,), "root", "norm")
            yield Tensor(f"{prefix}.norm.bias", (normed,), "root", "norm")
            yield from self._linears(
                prefix,
                "root",
                (("linear_fc1", merged, merged), ("linear_fc2", self.out_hidden_size, merged)),
            )

    def _block(self, index: int, layer_norms: bool) -> Iterator[Tensor]:
        h, width = self.hidden_size, self.intermediate_size
        unit = f"{UNIT}{index}"
        block = f"{PREFIX}.blocks.{index}"
        for norm in ("norm1", "norm2"):
            yield Tensor(f"{block}.{norm}.weight", (h,), unit, "norm")
            if layer_norms:  # LayerNorm: a bias too
                yield Tensor(f"{block}.{norm}.bias", (h,), unit, "norm")
        fc1, fc2 = MLP_NAMES.get(self.layout, ("", ""))
        mlp = (
            ((f"mlp.{fc1}", width, h), (f"mlp.{fc2}", h, width))
            if fc1
            else (
                ("mlp.gate_proj", width, h),
                ("mlp.up_proj", width, h),
                ("mlp.down_proj", h, width),
            )
        )
        yield from self._linears(block, unit, (("attn.qkv", 3 * h, h), ("attn.proj", h, h), *mlp))

    def _siglip(self) -> Iterator[Tensor]:
        """SigLIP's tower and Gemma 3's projector, in transformers' order (SiglipAttention
        registers k, v, q, then out)."""
        h, width = self.hidden_size, self.intermediate_size
        embeddings = f"{SIGLIP}.embeddings"
        kernel = (self.in_channels, self.patch_size, self.patch_size)
        yield Tensor(f"{embeddings}.patch_embedding.weight", (h, *kernel), "root", EMBED)
        yield Tensor(f"{embeddings}.patch_embedding.bias", (h,), "root", "bias")
        shape = (self.num_position_embeddings, h)
        yield Tensor(f"{embeddings}.position_embedding.weight", shape, "root", EMBED)
        for index in range(self.depth):
            unit, layer = f"{SIGLIP_UNIT}{index}", f"{SIGLIP}.encoder.layers.{index}"
            yield from self._layer_norm(f"{layer}.layer_norm1", unit, h)
            attention = tuple((f"self_attn.{p}", h, h) for p in ("k_proj", "v_proj", "q_proj"))
            yield from self._linears(layer, unit, (*attention, ("self_attn.out_proj", h, h)))
            yield from self._layer_norm(f"{layer}.layer_norm2", unit, h)
            yield from self._linears(layer, unit, (("mlp.fc1", width, h), ("mlp.fc2", h, width)))
        yield from self._layer_norm(f"{SIGLIP}.post_layernorm", "root", h)
        # a plain weight multiplied in (no nn.Linear: peft's all-linear leaves it)
        shape = (h, self.out_hidden_size)
        yield Tensor(f"{PROJECTOR}.mm_input_projection_weight", shape, "root", EMBED)
        yield Tensor(f"{PROJECTOR}.mm_soft_emb_norm.weight", (h,), "root", "norm")

    def _glm4v(self) -> Iterator[Tensor]:
        """GLM-4.1V's tower (``Glm4vVisionModel``; its blocks' MLP is out_hidden_size wide,
        Glm4VisionMlp, and the merger's intermediate_size)."""
        h, out, wide = self.hidden_size, self.out_hidden_size, self.intermediate_size
        shape = (self.num_position_embeddings, h)
        yield Tensor(f"{PREFIX}.embeddings.position_embedding.weight", shape, "root", EMBED)
        kernel = (self.in_channels, self.temporal_patch_size, self.patch_size, self.patch_size)
        yield Tensor(f"{PREFIX}.patch_embed.proj.weight", (h, *kernel), "root", EMBED)
        yield Tensor(f"{PREFIX}.patch_embed.proj.bias", (h,), "root", "bias")
        for index in range(self.depth):
            unit, block = f"{UNIT}{index}", f"{PREFIX}.blocks.{index}"
            for norm in ("norm1", "norm2"):
                yield Tensor(f"{block}.{norm}.weight", (h,), unit, "norm")
            qkv = (("attn.qkv", 3 * h, h),)
            yield from self._linears(block, unit, qkv, bias=self.attention_bias)
            mlp = (("mlp.gate_proj", out, h), ("mlp.up_proj", out, h), ("mlp.down_proj", h, out))
            yield from self._linears(block, unit, (("attn.proj", h, h), *mlp), bias=False)
        merger = f"{PREFIX}.merger"
        yield from self._linears(merger, "root", (("proj", out, out),), bias=False)
        yield from self._layer_norm(f"{merger}.post_projection_norm", "root", out)
        mlp = (("gate_proj", wide, out), ("up_proj", wide, out), ("down_proj", out, wide))
        yield from self._linears(merger, "root", mlp, bias=False)
        yield Tensor(f"{PREFIX}.post_conv_layernorm.weight", (h,), "root", "norm")
        merge = self.spatial_merge_size
        yield Tensor(f"{PREFIX}.downsample.weight", (out, h, merge, merge), "root", EMBED)
        yield Tensor(f"{PREFIX}.downsample.bias", (out,), "root", "bias")
        yield Tensor(f"{PREFIX}.post_layernorm.weight", (h,), "root", "norm")

    @staticmethod
    def _layer_norm(prefix: str, unit: str, width: int) -> Iterator[Tensor]:
        yield Tensor(f"{prefix}.weight", (width,), unit, "norm")
        yield Tensor(f"{prefix}.bias", (width,), unit, "norm")

    @staticmethod
    def _linears(
        prefix: str, unit: str, shapes: tuple[tuple[str, int, int], ...], bias: bool = True
    ) -> Iterator[Tensor]:
        """nn.Linear layers, each its weight then (``bias``) its bias."""
        for name, rows, cols in shapes:
            yield Tensor(f"{prefix}.{name}.weight", (rows, cols), unit, "linear")
            if bias:
                yield Tensor(f"{prefix}.{name}.bias", (rows,), unit, "bias")


def in_tower(name: str) -> bool:
    """Whether a parameter (or a LoRA adapter, named under its weight) is the vision tower's."""
    return name.startswith(TOWER_PREFIXES)


class VisionConfigError(ValueError):
    """A vision_config the forecast cannot read (the message names the key)."""


def vision_from_config(config: Mapping[str, Any], family: str, source: str) -> VisionTower | None:
    """The tower of a VL config.json (None for a text model or a family without a tower here)."""
    if family not in VISION_FAMILIES:
        return None
    vision = config.get("vision_config")
    if not isinstance(vision, Mapping):
        raise VisionConfigError(f"{source}: a {family} config.json needs its vision_config")

    def number(key: str, *aliases: str, default: int | None = None) -> int:
        """The first of the names vision_config gives; the config class's default only where it
        gives none (a value it gives that is no count is refused, never replaced)."""
        given = [vision[name] for name in (key, *aliases) if vision.get(name) is not None]
        if given and is_count(given[0], key, 1):
            return given[0]
        if default is not None and not given:
            return default
        raise VisionConfigError(
            f"{source}: vision_config.{key} must be an integer from 1 to {most_of(key):,}"
        )

    layout = TOWER_LAYOUTS[family]
    qwen3 = layout == "qwen3_vl"
    if layout == "siglip":
        return _siglip_tower(config, vision, number, source)
    if layout == "glm4v":
        return _glm4v_tower(vision, number)
    if layout == "qwen2_vl":
        # the tower is embed_dim wide, its MLP embed_dim x mlp_ratio; hidden_size is the merger's
        # output (transformers' Qwen2VLVisionConfig)
        width, ratio = number("embed_dim"), vision.get("mlp_ratio", 4)
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio < 1e6:
            raise VisionConfigError(f"{source}: vision_config.mlp_ratio must be a positive number")
        wide, out = int(width * ratio), number("hidden_size")  # Qwen2VLVisionBlock's int(...)
    else:
        width, wide = number("hidden_size", "embed_dim"), number("intermediate_size")
        out = number("out_hidden_size")
    deepstack = vision.get("deepstack_visual_indexes") or []
    if not isinstance(deepstack, list):
        raise VisionConfigError(f"{source}: vision_config.deepstack_visual_indexes must be a list")
    return VisionTower(
        layout=layout,
        num_position_embeddings=number("num_position_embeddings") if qwen3 else 0,
        deepstack_mergers=len(deepstack) if qwen3 else 0,
        depth=number("depth"),
        hidden_size=width,
        intermediate_size=wide,
        out_hidden_size=out,
        patch_size=number("patch_size", "spatial_patch_size"),
        temporal_patch_size=number("temporal_patch_size", default=2),
        in_channels=number("in_channels", "in_chans", default=3),
        spatial_merge_size=number("spatial_merge_size", default=2),
    )


def _siglip_tower(
    config: Mapping[str, Any], vision: Mapping[str, Any], number: Callable[..., int], source: str
) -> VisionTower | None:
    """Gemma 3's SigLIP tower (None: a pooling head, vision_use_head true or unset as
    SiglipVisionConfig defaults it, which the forecast does not lay out: the tower is not counted
    and the report says so)."""
    if vision.get("vision_use_head", True) is not False:
        return None
    text = config.get("text_config")
    out = text.get("hidden_size") if isinstance(text, Mapping) else None
    if not is_count(out, "hidden_size", 1):
        raise VisionConfigError(f"{source}: text_config.hidden_size must be a positive integer")
    patch, image = number("patch_size"), number("image_size")
    return VisionTower(
        layout="siglip",
        depth=number("num_hidden_layers"),
        hidden_size=number("hidden_size"),
        intermediate_size=number("intermediate_size"),
        out_hidden_size=out,
        patch_size=patch,
        temporal_patch_size=1,
        in_channels=number("num_channels", default=3),
        spatial_merge_size=1,
        num_position_embeddings=(image // patch) ** 2,  # SiglipVisionEmbeddings.num_patches
    )


def _glm4v_tower(vision: Mapping[str, Any], number: Callable[..., int]) -> VisionTower:
    """GLM-4.1V's tower; Glm4vVisionConfig's defaults for the patch, image and merge sizes where
    vision_config is silent."""
    patch = number("patch_size", default=14)
    return VisionTower(
        layout="glm4v",
        depth=number("depth"),
        hidden_size=number("hidden_size"),
        intermediate_size=number("intermediate_size"),
        out_hidden_size=number("out_hidden_size"),
        patch_size=patch,
        temporal_patch_size=number("temporal_patch_size", default=2),
        in_channels=number("in_channels", default=3),
        spatial_merge_size=number("spatial_merge_size", default=2),
        # Glm4vVisionEmbeddings: num_positions = (image_size // patch_size) ** 2
        num_position_embeddings=(number("image_size", default=336) // patch) ** 2,
        attention_bias=vision.get("attention_bias") is True,
    )


def vision_assumptions(tower: VisionTower | None, uncounted: str) -> list[str]:
    """What the forecast says of a VL model's tower: counted but for its activations, or, for a
    family whose tower it does not model, not counted at all."""
    if tower is not None:
        return [
            "the vision tower's weights, gradients and optimizer states are counted; what it "
            "keeps for backward depends on the images (their patches) and is not forecast; "
            "image tokens count in the prompt's length"
        ]
    if uncounted:
        return [
            f"{uncounted}: the language model alone is forecast; its vision tower is not counted "
            "(its weights and states are missing, about a few percent of the model)"
        ]
    return []
