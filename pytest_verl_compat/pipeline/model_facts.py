"""Model facts from local files: a model folder's config.json (and tokenizer.json), read bounded.

The files are data from wherever the user points: read through ``safe_input`` (regular file, size
limit, strict UTF-8), parsed as JSON, never imported, never handed to ``transformers`` (no
``trust_remote_code``, no hub). A model path that is not a local folder with a config.json gives
no facts, and the checks that need them stay quiet.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_verl_compat.checks.model_facts import (
    ACTOR_MODEL,
    CRITIC_MODEL,
    SFT_MODEL,
    ModelFacts,
    facts_from_config,
    tokenizer_ids,
)
from pytest_verl_compat.checks.registry import SFT, family_of
from pytest_verl_compat.files.safe_input import InputError, load_json_file

CONFIG_LIMIT = 1024 * 1024  # config.json files are a few KB
TOKENIZER_LIMIT = 64 * 1024 * 1024  # tokenizer.json of large vocabularies reach ~35 MB


def read_model_facts(path: str | Path) -> ModelFacts:
    """Facts from a config.json file, or a folder holding one (and maybe tokenizer.json).

    Raises ``InputError`` (one line naming the file) when the config is missing or unreadable.
    """
    path = Path(path).expanduser()
    config_path = path / "config.json" if path.is_dir() else path
    config = load_json_file(config_path, CONFIG_LIMIT, "model config")
    if not isinstance(config, Mapping):
        raise InputError(f"{config_path}: the model config is not a JSON object")
    tokenizer_path = config_path.parent / "tokenizer.json"
    ids = None
    if tokenizer_path.is_file():
        try:
            tokenizer = load_json_file(tokenizer_path, TOKENIZER_LIMIT, "tokenizer")
        except InputError:
            tokenizer = None  # a broken tokenizer file only costs the vocabulary check
        if isinstance(tokenizer, Mapping):
            ids = tokenizer_ids(tokenizer)
    return facts_from_config(config, str(config_path), ids)


def _config_source(section: Any) -> Any:
    """Where verl reads a model section's config from: hf_config_path when set, else path."""
    if not isinstance(section, Mapping):
        return None
    return section.get("hf_config_path") or section.get("path")


def _local_model(section: Any) -> Path | None:
    """The local folder of a section's config (``_config_source``), if it holds config.json."""
    value = _config_source(section)
    if isinstance(value, str) and value and (Path(value) / "config.json").is_file():
        return Path(value)
    return None


def local_model_facts(
    resolved: Mapping[str, Any], actor_override: ModelFacts | None = None
) -> dict[str, ModelFacts]:
    """The facts of every model section whose path is a local folder with a config.json.

    ``actor_override`` (``verl-compat check --model-config``) stands for the actor's model (the
    SFT trainer's, in its tree), and for the critic's where it reads the same config. An
    unreadable config found this way is skipped: the run would meet it first, not the checks.
    """
    facts: dict[str, ModelFacts] = {}
    trained = SFT_MODEL if family_of(resolved) == SFT else ACTOR_MODEL
    sections = {
        ACTOR_MODEL: resolved.get("actor_rollout_ref", {}).get("model"),
        CRITIC_MODEL: resolved.get("critic", {}).get("model"),
    }
    if trained == SFT_MODEL:
        sections = {SFT_MODEL: resolved.get("model")}
    for key, section in sections.items():
        source = _config_source(section)
        if actor_override is not None and (
            key == trained or (source is not None and source == _config_source(sections[trained]))
        ):
            # a critic reading the actor's config (critic.model.path=$MODEL in verl's PPO examples)
            facts[key] = actor_override
            continue
        folder = _local_model(section)
        if folder is None:
            continue
        try:
            facts[key] = read_model_facts(folder)
        except InputError:
            continue
    return facts
