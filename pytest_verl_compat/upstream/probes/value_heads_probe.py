"""Which critics' LoRA cannot be built in a release's environment: the value models peft's
causal-LM wrapper reads a generation method from, found in that environment's own peft and
transformers.

Run as ``python -I -m pytest_verl_compat.upstream.probes.value_heads_probe`` in a release's
environment (``verl-compat release derive VERSION --only value-heads``); prints JSON.

verl's FSDP engine loads a critic as ``AutoModelForTokenClassification`` (verl/utils/model.py
load_valuehead_model) and wraps a LoRA critic with ``LoraConfig(task_type=CAUSAL_LM)``
(verl/workers/engine/fsdp/transformer_impl.py:340-349), so peft builds a
``PeftModelForCausalLM``, whose ``__init__`` reads the base model's
``prepare_inputs_for_generation``. A token-classification model has none (it is not a
``GenerationMixin``): an ``AttributeError`` when the critic's engine starts. The answer lists the
model types the environment's transformers loads as token-classification models whose class
lacks the method, and peft's line that reads it.
"""

from __future__ import annotations

import inspect
from typing import Any

from pytest_verl_compat.upstream.probes.lora_routers_probe import (
    PACKAGES,
    print_answer,
    site_path,
)

# The JSON keys of the answer (pytest_verl_compat/releases/value_heads.py reads them).
KEY_VERSIONS = "versions"
KEY_READ = "peft_reads"
KEY_TYPES = "model_types"
METHOD = "prepare_inputs_for_generation"


def derive() -> dict[str, Any]:
    from importlib.metadata import version

    import transformers
    from peft.peft_model import PeftModelForCausalLM
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES as TOKEN_CLASSIFICATION,
    )

    lines, start = inspect.getsourcelines(PeftModelForCausalLM.__init__)
    offset = next(i for i, line in enumerate(lines) if f".{METHOD}" in line)
    path = inspect.getsourcefile(PeftModelForCausalLM) or ""
    types = {}
    for model_type, class_name in sorted(TOKEN_CLASSIFICATION.items()):
        try:
            model_class = getattr(transformers, class_name)
        except (AttributeError, ImportError):
            continue  # a class this environment cannot import: not a model it loads
        if not hasattr(model_class, METHOD):
            types[model_type] = class_name
    return {
        KEY_VERSIONS: {package: version(package) for package in PACKAGES},
        KEY_READ: {
            "where": f"{site_path(path)}:{start + offset}",
            "statement": lines[offset].strip(),
        },
        KEY_TYPES: types,
    }


def main() -> int:
    return print_answer(derive())


if __name__ == "__main__":
    raise SystemExit(main())
