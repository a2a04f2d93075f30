"""What the checks know about a model: a few numbers from its ``config.json`` and tokenizer.

Parsing only, from mappings the caller has already read (the pipeline reads the files, bounded,
in ``pipeline/model_facts.py``); nothing here touches the file system or runs model code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Keys under which Hugging Face configs name their routed-expert count (Qwen-MoE, DeepSeek,
# Mixtral, and Megatron-style).
EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts", "num_moe_experts")

# CheckInput.model_facts keys: the model sections whose config a check may know.
ACTOR_MODEL = "actor_rollout_ref.model"
CRITIC_MODEL = "critic.model"
# The SFT trainer's one model (its tree's top-level section).
SFT_MODEL = "model"


@dataclass(frozen=True)
class ModelFacts:
    """Numbers read from one model's config.json (None: the config does not say)."""

    source: str
    # The config's own model_type (a multimodal config's, not its text_config's): what peft and
    # transformers key their per-architecture code on.
    model_type: str | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    num_experts: int | None = None
    max_position_embeddings: int | None = None
    vocab_size: int | None = None
    # Tokens the tokenizer can produce whose id is >= vocab_size (from tokenizer.json), if read.
    tokens_beyond_vocab: tuple[tuple[str, int], ...] | None = None
    # The config's architectures[0], the class a server builds (SGLang's model_arch), and
    # whether it sets a sliding_window_pattern.
    architecture: str | None = None
    sliding_window_pattern: bool = False


@dataclass(frozen=True)
class Citation:
    """A statement of a release environment's installed files at ``where``
    (``path/under/site-packages.py:LINE``)."""

    where: str
    statement: str


def environment_of(versions: Mapping[str, str]) -> str:
    """A release environment's packages as a finding names them ("peft 0.21.2, transformers
    5.10.4")."""
    return ", ".join(f"{name} {version}" for name, version in sorted(versions.items()))


@dataclass(frozen=True)
class WrappedRouter:
    """A model type whose MoE block reads ``attribute`` from its router, which the release
    environment's peft wraps when the LoRA targets name the router (``target``) or its weight
    (``parameter``): found in that environment (``releases/lora_routers.py``)."""

    model_type: str
    parameter: str  # the router's weight as peft's parameter target ("gate.weight")
    attribute: str  # what the block reads from the router and the wrapper lacks
    read: Citation  # the block's read, in transformers' modeling file
    mapped: Citation  # peft's line mapping the v4 target to the parameter
    versions: Mapping[str, str]  # the environment's transformers and peft

    @property
    def target(self) -> str:
        return self.parameter.rsplit(".", 1)[0]

    @property
    def environment(self) -> str:
        return environment_of(self.versions)


@dataclass(frozen=True)
class ValueHeads:
    """The model types a release environment loads as token-classification critics that peft's
    causal-LM wrapper cannot wrap: it reads ``read`` (a generation method) from the model, which
    their classes lack (``releases/value_heads.py``)."""

    model_types: Mapping[str, str]  # model type -> its token-classification class
    read: Citation  # peft's read of the method, in PeftModelForCausalLM.__init__
    versions: Mapping[str, str]  # the environment's transformers and peft

    @property
    def environment(self) -> str:
        return environment_of(self.versions)


@dataclass(frozen=True)
class Rendering:
    """One argument verl hands SGLang: its statement and what it gives for each class of value
    (a value SGLang receives, or ``raises: …``: verl's own refusal)."""

    read: Citation
    renders: Mapping[str, Any]


@dataclass(frozen=True)
class SglangServer:
    """What a release hands SGLang: the actor's LoRA and the attention backend
    (``releases/sglang_server.py``)."""

    rank: Rendering  # max_lora_rank, by the spelling the rank is set in (lora_rank, lora.rank)
    targets: Rendering  # lora_target_modules, by target_class
    sglang: str  # the SGLang release the sglang extra pins
    attention: Citation  # where verl picks an attention backend when engine_kwargs names none
    default_attention: str  # what it picks for that SGLang on a CUDA GPU


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _lookup(config: Mapping[str, Any], key: str) -> Any:
    """A key of the config, else of its ``text_config`` (multimodal configs nest the LM there).

    The same fallback verl uses: verl/models/transformers/monkey_patch.py:330-338 and
    verl/workers/rollout/utils.py:31-37.
    """
    if key in config:
        return config[key]
    text = config.get("text_config")
    return text.get(key) if isinstance(text, Mapping) else None


def facts_from_config(
    config: Mapping[str, Any],
    source: str,
    tokenizer_ids: Mapping[str, int] | None = None,
) -> ModelFacts:
    """The facts of a parsed config.json (and the token → id map of its tokenizer, if read)."""
    heads = _int(_lookup(config, "num_attention_heads"))
    # Llama-style configs default the KV heads to the attention heads when absent.
    kv_heads = _int(_lookup(config, "num_key_value_heads")) or heads
    experts = next(
        (n for n in (_int(_lookup(config, key)) for key in EXPERT_KEYS) if n is not None), None
    )
    vocab = _int(_lookup(config, "vocab_size"))
    beyond = None
    if tokenizer_ids is not None and vocab is not None:
        beyond = tuple(
            sorted(((t, i) for t, i in tokenizer_ids.items() if i >= vocab), key=lambda x: x[1])
        )
    model_type = config.get("model_type")
    architectures = config.get("architectures")
    first = architectures[0] if isinstance(architectures, list) and architectures else None
    return ModelFacts(
        source=source,
        model_type=model_type if isinstance(model_type, str) and model_type else None,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        num_experts=experts,
        max_position_embeddings=_int(_lookup(config, "max_position_embeddings")),
        vocab_size=vocab,
        tokens_beyond_vocab=beyond,
        architecture=first if isinstance(first, str) and first else None,
        sliding_window_pattern=_lookup(config, "sliding_window_pattern") is not None,
    )


def tokenizer_ids(tokenizer: Mapping[str, Any]) -> dict[str, int]:
    """Every token of a parsed tokenizer.json with its id: the model's vocabulary and added tokens."""
    ids: dict[str, int] = {}
    model = tokenizer.get("model")
    vocab = model.get("vocab") if isinstance(model, Mapping) else None
    if isinstance(vocab, Mapping):  # BPE, WordPiece, WordLevel
        ids.update((str(t), i) for t, i in vocab.items() if isinstance(i, int))
    elif isinstance(vocab, list):  # Unigram: [token, score] pairs, the id is the position
        ids.update(
            (str(entry[0]), i) for i, entry in enumerate(vocab) if isinstance(entry, list) and entry
        )
    for added in tokenizer.get("added_tokens") or ():
        if isinstance(added, Mapping) and isinstance(added.get("id"), int):
            ids[str(added.get("content"))] = added["id"]
    return ids
