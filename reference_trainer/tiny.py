"""A tiny causal LM, value model and reward model built locally, and loading any local HF folder.

No hub access: the tokenizer is a character vocabulary over the prompt set's alphabet built with
the `tokenizers` library, the models are Qwen2 configs a few hundred thousand parameters large
with seeded initialisation. Everything round-trips through `save_pretrained`/`from_pretrained`.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
# The prompt set's alphabet; an unknown character maps to <unk> rather than failing.
ALPHABET = string.ascii_lowercase + string.digits + " +-*=?.,'"
TINY = "tiny"
# torch's fused attention: on the packed training passes (`packing.py`) it measured ~1.5x
# faster than transformers' eager attention here; sampling uses the rollout engine anyway.
ATTENTION = "sdpa"
# A one-output head; without a matching id2label transformers warns about the default two.
ONE_LABEL = {"num_labels": 1, "id2label": {0: "LABEL_0"}, "label2id": {"LABEL_0": 0}}


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character; pad, eos, bos and unk are distinct (pad == eos breaks masks)."""
    vocab = {token: i for i, token in enumerate([PAD, EOS, BOS, UNK, *ALPHABET])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    # Fuse joins the characters back without the WordLevel default of spaces between tokens.
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        unk_token=UNK,
        padding_side="left",
    )


def tiny_config(tokenizer: PreTrainedTokenizerFast) -> Qwen2Config:
    """About 0.35M parameters: big enough to learn a length preference in a few dozen steps."""
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=96,
        intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        # Untied so safetensors never sees shared storage.
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        attention_dropout=0.0,
    )


def _forked_rng():
    # Model constructors draw from the global generator; fork it so building a model neither
    # depends on nor disturbs the caller's global RNG state.
    return torch.random.fork_rng(devices=[])


def build_tiny_policy(tokenizer: PreTrainedTokenizerFast, seed: int) -> PreTrainedModel:
    with _forked_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(
            tiny_config(tokenizer), attn_implementation=ATTENTION
        )
    return model


def build_tiny_value_model(config: Qwen2Config, seed: int) -> PreTrainedModel:
    """A critic: the LM trunk with a one-output token head (one value per position)."""
    with _forked_rng():
        torch.manual_seed(seed)
        # No dropout (verl sets classifier_dropout=0 too): it would draw from the global RNG.
        critic_config = Qwen2Config.from_dict(
            {**config.to_dict(), **ONE_LABEL, "classifier_dropout": 0.0, "hidden_dropout": 0.0}
        )
        model = AutoModelForTokenClassification.from_config(
            critic_config, attn_implementation=ATTENTION
        )
    return model


def build_tiny_reward_model(tokenizer: PreTrainedTokenizerFast, seed: int) -> PreTrainedModel:
    """A scalar sequence scorer; it reads the last non-pad token, so pad_token_id must be set."""
    with _forked_rng():
        torch.manual_seed(seed)
        config = Qwen2Config.from_dict(
            {**tiny_config(tokenizer).to_dict(), **ONE_LABEL, "classifier_dropout": 0.0}
        )
        model = AutoModelForSequenceClassification.from_config(
            config, attn_implementation=ATTENTION
        )
    return model


@dataclass
class LoadedPolicy:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerFast
    source: str
    """``tiny`` or the folder the model came from."""


# A pickle can run code while it loads (torch.load's weights_only narrows that, and has had
# escapes), and a model folder may be a stranger's: weights load from safetensors files only.
PICKLED_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
FROM_PRETRAINED_SAFELY = {"local_files_only": True, "use_safetensors": True}


def refuse_pickled_weights(folder: Path, what: str) -> None:
    """A one-line ValueError naming the file when the folder's weights are pickles only."""
    if any(folder.glob("*.safetensors")):
        return
    pickled = sorted(path for pattern in PICKLED_WEIGHTS for path in folder.glob(pattern))
    if pickled:
        raise ValueError(
            f"{what}: {pickled[0]}: pickled weights are refused (loading a pickle can run code); "
            "save the model as safetensors (model.save_pretrained(folder) writes them)"
        )


def load_policy(model: str, seed: int) -> LoadedPolicy:
    """``tiny`` builds the seeded tiny model; anything else must be a local HF folder."""
    if model == TINY:
        tokenizer = build_tiny_tokenizer()
        return LoadedPolicy(build_tiny_policy(tokenizer, seed), tokenizer, TINY)
    folder = Path(model)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"actor_rollout_ref.model.path: {model!r} is not a local model folder (no config.json)"
        )
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
        # A pad equal to eos would hide the stop token from the response mask (TRL #4970).
        raise ValueError(
            f"actor_rollout_ref.model.path: tokenizer in {model!r} needs a pad token distinct "
            "from eos"
        )
    refuse_pickled_weights(folder, "actor_rollout_ref.model.path")
    policy = AutoModelForCausalLM.from_pretrained(
        folder, **FROM_PRETRAINED_SAFELY, attn_implementation=ATTENTION, dtype=torch.float32
    )
    return LoadedPolicy(policy, tokenizer, str(folder))


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
