"""The memory forecast (issue 47): what each rank of a verl run holds, per role and phase.

Only ``cli``, ``plugin`` and the tests import this layer; it imports ``model``, ``checks`` and
``pipeline``. This face names what they may use (below); each name loads its module on first
use, so ``import pytest_verl_compat.memory`` costs nothing and registers no rule page (``check``
without a GPU never loads the layer). The modules hold one concern each:

- ``gpus``, ``tensor``, ``architecture``, ``vision``, ``models``: the GPU table, a model's
  tensors (a VL model's vision tower among them), where its numbers come from (a config.json,
  the Hugging Face cache, the shipped table);
- ``states``, ``activations``, ``rollout``: model states per engine, what a pass keeps, the
  rollout server's share and KV cache;
- ``release_facts``: what a release's code decides where no key does (data per release);
- ``layout``, ``reading``, ``engine_flags``, ``veomni``, ``residency``, ``passes``, ``phases``: a
  run as roles and ranks (an engine's flags, VeOmni read as the FSDP2 it builds), and each
  phase's parts;
- ``runs``, ``fixes``, ``forecast``: verdicts against the GPU and changes forecast again;
- ``findings``, ``report``, ``plot``: memory.* findings, text and JSON, the picture.
"""

from __future__ import annotations

import importlib
from typing import Any

_FACE = {
    "forecast": "forecast",
    "Request": "runs",
    "ReleaseFacts": "release_facts",
    "ReleaseFactsError": "release_facts",
    "release_facts": "release_facts",
    "NotForecastable": "runs",
    "Forecast": "parts",
    "PHASES": "parts",
    "PHASE_TITLES": "parts",
    "Gpu": "gpus",
    "find_gpu": "gpus",
    "custom_gpu": "gpus",
    "gpu_table": "gpus",
    "UnknownGpu": "gpus",
    "choose_model": "models",
    "UnknownModel": "models",
    "UnsupportedModel": "architecture",
    "as_findings": "findings",
    "rule_id": "findings",
    "SOURCE": "findings",
    "text_lines": "report",
    "json_payload": "report",
    "dumps": "report",
    "write_plot": "plot",
}

__all__ = sorted(_FACE)


def __getattr__(name: str) -> Any:
    module = _FACE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
