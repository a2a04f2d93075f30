"""One parameter tensor of a model, the word the language model (architecture.py) and a VL
model's vision tower (vision.py) both speak."""

from __future__ import annotations

import math
from typing import NamedTuple

# Bounds on the counts a config.json gives the shapes: a hostile or mistyped file is one line, not
# a forecast that lays out 10**12 layers (the deepest published decoders have a few hundred).
LARGEST_DIMENSION = 1 << 26
MOST_LAYERS = 4096


class Tensor(NamedTuple):
    """One parameter tensor: its name, shape, the FSDP unit it belongs to, and what it is."""

    name: str
    shape: tuple[int, ...]
    unit: str  # "root", "layers.<i>" or a vision block's "visual.blocks.<i>"
    kind: str  # embed, lm_head, norm, linear, conv, bias, experts, router, vision_embed

    @property
    def numel(self) -> int:
        return math.prod(self.shape)
