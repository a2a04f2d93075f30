"""One parameter tensor of a model, the word the language model (architecture.py) and a VL
model's vision tower (vision.py) both speak."""

from __future__ import annotations

import math
from typing import Any, NamedTuple, TypeGuard

# Bounds on the counts a config.json gives the shapes: a hostile or mistyped file is one line, not
# a forecast that lays out 10**12 layers (the deepest published decoders have a few hundred).
LARGEST_DIMENSION = 1 << 26
MOST_LAYERS = 4096
LAYER_COUNTS = frozenset({"num_hidden_layers", "depth"})  # a decoder's layers, a tower's blocks


def most_of(key: str) -> int:
    """The largest value a config.json count of this name may hold."""
    return MOST_LAYERS if key in LAYER_COUNTS else LARGEST_DIMENSION


def is_count(value: Any, key: str, least: int) -> TypeGuard[int]:
    """Whether ``value`` is an integer from ``least`` to ``most_of(key)`` (a bool is not)."""
    return isinstance(value, int) and not isinstance(value, bool) and least <= value <= most_of(key)


class Tensor(NamedTuple):
    """One parameter tensor: its name, shape, the FSDP unit it belongs to, and what it is."""

    name: str
    shape: tuple[int, ...]
    unit: str  # "root", "layers.<i>" or a vision block's "visual.blocks.<i>"
    kind: str  # embed, lm_head, norm, linear, conv, bias, experts, router, vision_embed

    @property
    def numel(self) -> int:
        return math.prod(self.shape)
