"""Model facts from the Hugging Face cache, read offline through huggingface_hub's own lookup: a
model the shipped table does not know is found in a cache laid out as huggingface_hub writes it,
and without a cache (none at all, or one without the model) the forecast asks for --model-config;
the cache is consulted before the table (a cached config.json is the user's own model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from huggingface_hub import constants

from pytest_verl_compat.memory.models import HF_CACHE, TABLE, UnknownModel, _table, choose_model

REVISION = "0123456789abcdef0123456789abcdef01234567"


def _cache(root: Path, repo: str, config: dict[str, object]) -> Path:
    """A hub cache holding ``repo``'s config.json at its main revision (huggingface_hub's layout:
    models--ORG--NAME/refs/main names the snapshot that holds the file)."""
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(REVISION)
    snapshot = folder / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    return root


def test_a_model_in_the_hub_cache_is_read_from_it_and_without_a_cache_is_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, qwen, _ = _table()["qwen/qwen2.5-0.5b"]
    repo = "acme/tiny-qwen"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "absent"))
    with pytest.raises(UnknownModel, match="not in the Hugging Face cache"):
        choose_model(repo)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(_cache(tmp_path / "hub", repo, dict(qwen))))
    found = choose_model(repo)
    assert found.origin == HF_CACHE and found.where.endswith(f"{REVISION}/config.json")
    assert found.architecture.hidden_size == qwen["hidden_size"]
    # a cache without the model: the table still answers for a model it knows
    assert choose_model("Qwen/Qwen2.5-0.5B").origin == TABLE
    with pytest.raises(UnknownModel):
        choose_model("acme/not-cached")
