"""A vision-language model's vision tower, as its parameter tensors (the weights, gradients and
optimizer states every role of a VL run holds, the vLLM server's weights per rank).

Qwen2.5-VL's tower (transformers' ``Qwen2_5_VisionTransformerPretrainedModel``, built from
``vision_config``): a Conv3d patch embedding without bias (``hidden_size`` x ``in_channels`` x
``temporal_patch_size`` x ``patch_size``²), ``depth`` blocks of two RMSNorms, a fused ``qkv`` and
a ``proj`` with biases and a gated MLP of ``intermediate_size`` with biases, and a merger (an
RMSNorm over ``hidden_size``, then ``hidden_size`` x ``spatial_merge_size``² to itself and to
``out_hidden_size``, with biases). Each block is an FSDP unit (the model's ``_no_split_modules``
names ``Qwen2_5_VLVisionBlock``); the embedding and the merger sit in the root unit.
tests/test_fit_architecture.py checks every tensor against the model transformers builds.

What the tower keeps for backward depends on the images (their patches), which a launch script
does not say: its activations are not forecast, and the forecast says so.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

# Families with a vision tower the forecast counts, by model_type.
VISION_FAMILIES = frozenset({"qwen2_5_vl"})
PREFIX = "model.visual"
UNIT = "visual.blocks."  # a block's FSDP unit: visual.blocks.<i>


class VisionTensor(NamedTuple):
    name: str
    shape: tuple[int, ...]
    unit: str
    kind: str


@dataclass(frozen=True)
class VisionTower:
    """The numbers of ``vision_config`` that decide the tower's parameters."""

    depth: int
    hidden_size: int
    intermediate_size: int
    out_hidden_size: int
    patch_size: int
    temporal_patch_size: int
    in_channels: int
    spatial_merge_size: int

    def tensors(self) -> Iterator[VisionTensor]:
        h, width = self.hidden_size, self.intermediate_size
        kernel = (self.in_channels, self.temporal_patch_size, self.patch_size, self.patch_size)
        yield VisionTensor(f"{PREFIX}.patch_embed.proj.weight", (h, *kernel), "root", "conv")
        for index in range(self.depth):
            unit = f"{UNIT}{index}"
            block = f"{PREFIX}.blocks.{index}"
            yield VisionTensor(f"{block}.norm1.weight", (h,), unit, "norm")
            yield VisionTensor(f"{block}.norm2.weight", (h,), unit, "norm")
            for name, rows, cols in (
                ("attn.qkv", 3 * h, h),
                ("attn.proj", h, h),
                ("mlp.gate_proj", width, h),
                ("mlp.up_proj", width, h),
                ("mlp.down_proj", h, width),
            ):
                yield VisionTensor(f"{block}.{name}.weight", (rows, cols), unit, "linear")
                yield VisionTensor(f"{block}.{name}.bias", (rows,), unit, "bias")
        merged = h * self.spatial_merge_size**2
        yield VisionTensor(f"{PREFIX}.merger.ln_q.weight", (h,), "root", "norm")
        for name, rows, cols in (
            ("mlp.0", merged, merged),
            ("mlp.2", self.out_hidden_size, merged),
        ):
            yield VisionTensor(f"{PREFIX}.merger.{name}.weight", (rows, cols), "root", "linear")
            yield VisionTensor(f"{PREFIX}.merger.{name}.bias", (rows,), "root", "bias")


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
        for name in (key, *aliases):
            value = vision.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        if default is not None:
            return default
        raise VisionConfigError(f"{source}: vision_config.{key} must be a positive integer")

    return VisionTower(
        depth=number("depth"),
        hidden_size=number("hidden_size", "embed_dim"),
        intermediate_size=number("intermediate_size"),
        out_hidden_size=number("out_hidden_size"),
        patch_size=number("patch_size", "spatial_patch_size"),
        temporal_patch_size=number("temporal_patch_size", default=2),
        in_channels=number("in_channels", "in_chans", default=3),
        spatial_merge_size=number("spatial_merge_size", default=2),
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
