"""Hydra's own answers for the compositions ``test_fast_compose.py`` holds the fast path to,
recorded by content in ``tests/data/hydra_references.json``.

A plain Hydra compose costs ~0.9 s here against ~0.04 s for the fast path: 96% of that file's
time (measured). Hydra's answer is a function of the config tree's files, Hydra's and OmegaConf's
versions, the resolvers the reference installs (ours, ``pipeline/hydra_internals.py``) and the
question (config name, overrides, variables), so it is recorded under a key that digests all of
them, as the digest of its comparable form. A question whose key is not recorded (another tree or
version, an example hypothesis draws for the first time) is asked of Hydra live, as before; so is
one whose recorded answer the fast path's does not match, so the failure shows where the two
differ. ``test_recorded_answers_are_hydras_answers_now`` re-asks a sample live.

``VERL_RECORD_HYDRA=1 CI=true pytest tests/test_fast_compose.py`` records every answer it asked
live (CI's derandomized examples; xdist workers merge theirs behind a file lock).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from pytest_verl_compat.pipeline import hydra_internals
from pytest_verl_compat.pipeline.compose import tree_digest
from pytest_verl_compat.pipeline.snapshot import write_atomic

RECORD = Path(__file__).resolve().parent / "data" / "hydra_references.json"
RECORDING = os.environ.get("VERL_RECORD_HYDRA") == "1"


# The composer's own digest of a tree (every file's relative path and bytes), once per tree.
_tree_digest = functools.cache(tree_digest)


@functools.cache
def _reference_code() -> str:
    parts = [metadata.version(name) for name in ("hydra-core", "omegaconf", "PyYAML")]
    parts.append(hashlib.sha256(Path(hydra_internals.__file__).read_bytes()).hexdigest())
    return "\0".join(parts)


def question_key(
    config_dir: Path, config_name: str, fields: Sequence[str], variables: Mapping[str, str]
) -> str:
    question = json.dumps([config_name, list(fields), dict(sorted(variables.items()))])
    text = "\0".join((_tree_digest(config_dir), _reference_code(), question))
    return hashlib.sha256(text.encode()).hexdigest()


def answer_digest(comparable: object) -> str:
    """The digest of a composition's comparable form (nested tuples of type names and values,
    whose ``repr`` is exact and ordered)."""
    return hashlib.sha256(repr(comparable).encode()).hexdigest()


@functools.cache
def recorded() -> dict[str, dict[str, Any]]:
    if not RECORD.is_file():
        return {}
    entries: dict[str, dict[str, Any]] = json.loads(RECORD.read_text(encoding="utf-8"))
    return entries


def matches_recorded(key: str, digest: str) -> bool:
    entry = recorded().get(key)
    return entry is not None and entry["answer"] == digest


def record(
    key: str,
    config_name: str,
    fields: Sequence[str],
    variables: Mapping[str, str],
    digest: str,
) -> None:
    """Add an answer asked live to the record, when recording."""
    if not RECORDING:
        return
    from filelock import FileLock

    with FileLock(Path(tempfile.gettempdir()) / "verl-compat-hydra-references.lock"):
        entries = json.loads(RECORD.read_text(encoding="utf-8")) if RECORD.is_file() else {}
        entries[key] = {
            "config": config_name,
            "fields": list(fields),
            "variables": dict(sorted(variables.items())),
            "answer": digest,
        }
        write_atomic(RECORD, json.dumps(entries, indent=1, sort_keys=True) + "\n")


def held_to_hydra(
    config_dir: Path,
    config_name: str,
    fields: Sequence[str],
    variables: Mapping[str, str],
    fast_digest: str,
    ask_hydra: Callable[[], str],
) -> bool:
    """True when the fast path's answer is Hydra's recorded one; else Hydra is asked live
    (``ask_hydra`` compares and returns the live answer's digest) and the answer recorded when
    recording. False: the caller has compared live."""
    key = question_key(config_dir, config_name, fields, variables)
    if matches_recorded(key, fast_digest):
        return True
    record(key, config_name, fields, variables, ask_hydra())
    return False
