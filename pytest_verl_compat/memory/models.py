"""Which model a run trains, without the hub: a config.json given or beside the weights, the
Hugging Face cache (read offline through huggingface_hub's own lookup), or the shipped table.

The files are data from wherever the user points: read bounded as JSON (``safe_input``), never
handed to transformers, never fetched.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_verl_compat.files.safe_input import InputError, load_json_file, load_yaml_file
from pytest_verl_compat.memory.architecture import (
    Architecture,
    UnsupportedModel,
    architecture_from_config,
)

TABLE_FILE = Path(__file__).resolve().parents[1] / "data" / "architectures.yaml"
CONFIG_LIMIT = 1024 * 1024  # config.json files are a few KB

# Where a model's numbers came from (the report names it).
GIVEN = "given"
LOCAL = "local config.json"
HF_CACHE = "Hugging Face cache"
TABLE = "shipped table"


class UnknownModel(ValueError):
    """A model the forecast cannot find the numbers of (one line asking for --model-config);
    ``key``: the configuration key that names it, where the caller knows it."""

    def __init__(self, message: str, key: str = "") -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class ModelChoice:
    """A model's architecture and where its numbers came from."""

    architecture: Architecture
    origin: str
    where: str
    verified: str = ""


def _config_file(path: Path) -> Mapping[str, Any]:
    config_path = path / "config.json" if path.is_dir() else path
    config = load_json_file(config_path, CONFIG_LIMIT, "model config")
    if not isinstance(config, Mapping):
        raise InputError(f"{config_path}: the model config is not a JSON object")
    return config


def _architecture(config: Mapping[str, Any], name: str, where: str) -> Architecture:
    try:
        return architecture_from_config(config, name, where)
    except UnsupportedModel as exc:
        raise InputError(str(exc)) from exc


# An entry's `contexts`: models with its numbers but their own max_position_embeddings, which
# verl gives vLLM as max_model_len when the rollout sets none (the only number they may change:
# the tensors, checked against transformers per entry, stay the entry's).
CONTEXT = "max_position_embeddings"


def _variants(entry: Mapping[str, Any]) -> list[tuple[str, tuple[str, Mapping[str, Any], str]]]:
    """An entry's models, each with (the repository whose config.json gives its numbers, the
    numbers, how they were checked): its repository and aliases the entry's, each other-context
    variant its own."""
    primary = str(entry["repo"])
    value = (primary, entry["config"], str(entry.get("verified", False)))
    out = [(str(repo), value) for repo in (primary, *entry.get("also", ()))]
    for variant in entry.get("contexts", ()):
        repo = str(variant["repo"])
        context = {**entry["config"], CONTEXT: int(variant[CONTEXT])}
        out.append((repo, (repo, context, str(variant.get("verified", False)))))
    return out


@functools.cache
def _table_data() -> Any:
    """The shipped table file, read once."""
    return load_yaml_file(TABLE_FILE, "architecture table")


@functools.cache
def _listed() -> tuple[tuple[str, tuple[str, Mapping[str, Any], str]], ...]:
    """Every model the table lists (each entry's repository, aliases and context variants) with
    its numbers, in the table's order."""
    return tuple(model for entry in _table_data()["models"] for model in _variants(entry))


def _config_url(repo: str) -> str:
    return f"https://huggingface.co/{repo}/blob/main/config.json"


@functools.cache
def _table() -> dict[str, tuple[str, Mapping[str, Any], str]]:
    """The shipped table by lower-case repository id and by its last component."""
    found: dict[str, tuple[str, Mapping[str, Any], str]] = {}
    for repo, value in _listed():
        found.setdefault(repo.lower(), value)
        found.setdefault(repo.rsplit("/", 1)[-1].lower(), value)
    return found


@dataclass(frozen=True)
class TableEntry:
    """One model of the shipped table: its config.json numbers and how they were checked."""

    repo: str
    architecture: Architecture
    verified: str
    config: Mapping[str, Any]
    published_params: int | None


def table_entries() -> list[TableEntry]:
    """Every entry of the shipped table, in the table's order."""
    out = []
    for entry in _table_data()["models"]:
        arch = architecture_from_config(
            entry["config"], str(entry["repo"]), _config_url(entry["repo"])
        )
        out.append(
            TableEntry(
                str(entry["repo"]),
                arch,
                str(entry.get("verified", False)),
                dict(entry["config"]),
                entry.get("published_params"),
            )
        )
    return out


# A local folder's name spells a repository's with other separators (qwen2_5_7b_instruct,
# Qwen2.5-7B_Instruct): compared without them, a name matches only where one model has it.
_SEPARATORS = re.compile(r"[._\-\s]+")


def spelled(name: str) -> str:
    """A model name without case or separators, as two spellings of one repository compare."""
    return _SEPARATORS.sub("", name.lower())


@functools.cache
def _names_by_spelling() -> dict[str, tuple[str, tuple[str, Mapping[str, Any], str]]]:
    """The table's model names (as listed) and numbers by their last component's spelling; a
    spelling that models with other numbers share is left out (ambiguous)."""
    found: dict[str, tuple[str, tuple[str, Mapping[str, Any], str]]] = {}
    ambiguous: set[str] = set()
    for repo, value in _listed():
        spelling = spelled(repo.rsplit("/", 1)[-1])
        if spelling in found and found[spelling][1][1] != value[1]:
            ambiguous.add(spelling)
        found.setdefault(spelling, (repo, value))
    return {k: v for k, v in found.items() if k not in ambiguous}


def closest_in_table(name: str, n: int = 3) -> list[str]:
    """The table's models nearest ``name``'s last component, for an unknown model's message:
    those whose name it starts with (a fine-tune's folder: Qwen2.5-7B-Instruct-GRPO-step200),
    longest first, then difflib's close matches. Suggestions, never a choice."""
    parts = _repository_parts(name)
    if not parts:
        return []
    table = _names_by_spelling()
    mine = spelled(parts[-1])
    prefixes = sorted((k for k in table if mine.startswith(k)), key=len, reverse=True)
    near = difflib.get_close_matches(mine, list(table), n=n, cutoff=0.8)
    out: list[str] = []
    for spelling in (*prefixes, *near):
        repo = table[spelling][0]
        if repo not in out:
            out.append(repo)
    return out[:n]


# Hugging Face's cache keeps a repository under models--{org}--{name}/snapshots/{revision}
# (huggingface_hub's repo_folder_name); ModelScope's writes a name's dots as "___"
# (~/.cache/modelscope/hub/Qwen/Qwen2___5-7B-Instruct).
HF_CACHE_FOLDER = "models--"
HF_CACHE_SEPARATOR = "--"
MODELSCOPE_DOT = "___"


def _repository_parts(name: str) -> list[str]:
    """The components of a model path that name its repository: a cache folder's read back."""
    parts = [p for p in str(name).replace("\\", "/").split("/") if p]
    for part in parts:
        if part.startswith(HF_CACHE_FOLDER) and HF_CACHE_SEPARATOR in part[len(HF_CACHE_FOLDER) :]:
            parts = part[len(HF_CACHE_FOLDER) :].split(HF_CACHE_SEPARATOR, 1)
            break
    return [p.replace(MODELSCOPE_DOT, ".") for p in parts]


def from_table(name: str) -> ModelChoice | None:
    """The shipped entry for a model path or repository id (its last one or two components)."""
    hit = _table_hit(name)
    if hit is None:
        return None
    repo, config, verified = hit
    url = _config_url(repo)
    return ModelChoice(architecture_from_config(config, repo, url), TABLE, url, verified)


def _table_hit(name: str) -> tuple[str, Mapping[str, Any], str] | None:
    """The table's (repository, numbers, how checked) for a name: its last two components, its
    last one, then its last one's spelling."""
    parts = _repository_parts(name)
    if not parts:
        return None
    hit = _table().get("/".join(parts[-2:]).lower()) or _table().get(parts[-1].lower())
    if hit is None:  # the spellings are read only when the names miss
        listed = _names_by_spelling().get(spelled(parts[-1]))
        hit = listed[1] if listed else None
    return hit


def _hub_cache_config(repo_id: str) -> Path | None:
    """config.json of ``repo_id`` if the Hugging Face cache holds it; never a network call.

    huggingface_hub.try_to_load_from_cache looks the file up in the local cache only (it returns
    a path, a "known missing" marker, or None); huggingface_hub comes with the [trainer] extra,
    and without it the cache is simply not consulted.
    """
    if repo_id.count("/") != 1 or repo_id.startswith(("/", ".", "~")):
        return None
    try:
        from huggingface_hub import constants
    except ImportError:
        return None
    if not Path(constants.HF_HUB_CACHE).is_dir():
        # no cache at all: the lookup would find nothing, and importing it (httpx and the rest of
        # huggingface_hub's download stack) is ~0.9 s of fit's 2 s warm bar on a 2-core machine,
        # where importing the constants is 0.05 s
        return None
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:  # not a valid repository id
        return None
    return Path(found) if isinstance(found, str) else None


def model_by_name(name: str) -> ModelChoice | None:
    """A model named by repository id (or a path naming one): the Hugging Face cache's
    config.json, else the shipped table's entry; None when neither knows it."""
    cached = _hub_cache_config(name)
    if cached is not None:
        return ModelChoice(
            _architecture(_config_file(cached), name, str(cached)), HF_CACHE, str(cached)
        )
    return from_table(name)


def config_by_name(name: str) -> tuple[str, Mapping[str, Any]] | None:
    """(where, the config.json numbers) of a model named as ``model_by_name`` finds it: for
    ``check --model-config MODEL``, whose checks read a config mapping."""
    cached = _hub_cache_config(name)
    if cached is not None:
        return str(cached), _config_file(cached)
    hit = _table_hit(name)
    if hit is None:
        return None
    return _config_url(hit[0]), hit[1]


def choose_model(path: str | None, given: str | Path | None = None) -> ModelChoice:
    """The model of a run: ``given`` (--model-config), a local folder, the cache, the table.

    Raises ``InputError`` for an unreadable config.json and ``UnknownModel`` (one line) when no
    source knows the model.
    """
    if given is not None:
        where = str(given)
        if not Path(given).expanduser().exists():
            # a model named rather than a file: the one a fine-tune was trained from, say
            named = model_by_name(where)
            if named is not None:
                return named
        config = _config_file(Path(given).expanduser())
        return ModelChoice(_architecture(config, where, where), GIVEN, where)
    if not path:
        raise UnknownModel("the run names no model path; give --model-config PATH (a config.json)")
    local = Path(path).expanduser()
    if (local / "config.json").is_file():
        where = str(local / "config.json")
        return ModelChoice(_architecture(_config_file(local), path, where), LOCAL, where)
    named = model_by_name(path)
    if named is not None:
        return named
    near = closest_in_table(path)
    hint = (
        f" (the table's nearest: {', '.join(near)}; a fine-tune has its base model's numbers: "
        f"--model-config {near[0]})"
        if near
        else ""
    )
    raise UnknownModel(
        f"model {path!r}: no local config.json, not in the Hugging Face cache and not in the "
        f"shipped table; give --model-config PATH (its config.json) or the name of a model the "
        f"table lists{hint}"
    )
