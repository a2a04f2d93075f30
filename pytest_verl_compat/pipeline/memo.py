"""Our own stages' results, kept by content between runs: the composition, the compile report
and the verdict of a case, and what Hydra answers once per tree and group selections (the
override-free composition the fast path starts from, the config files it merges; ~0.8 s each).

Each is a pure function of its inputs and of the code that computes it, so a result is kept under
a key that digests all of them (``StageMemo.key``): the stage's own inputs (the tree's digest and
the fields for a composition; the composition, the profile and the model facts for a report;
the report and upstream's answer for a verdict), every file of this package and of
``reference_trainer`` (``package_sha256``), and the installed packages that take part
(Hydra, OmegaConf, PyYAML, verl, …). A changed script, tree, profile, model config, code or
package is a new key, never a stale result; the golden files are always compared anew. As ruff
keeps each file's diagnostics, a second ``check`` of an unchanged script, or a second audit, reads
its results instead of composing with Hydra again.

``VERL_COMPAT_NO_CACHE=1`` turns the memo off (a test that patches our code in its own process
would otherwise read results of the unpatched code).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from pytest_verl_compat.files.cache import user_cache_root
from pytest_verl_compat.model import (
    CompileReport,
    Composition,
    Finding,
    LeafVerdict,
    Location,
)
from pytest_verl_compat.pipeline.answers import UserAnswers, platform_versions

NO_CACHE_ENV = "VERL_COMPAT_NO_CACHE"
MEMO_FORMAT = 1
COMPOSITION = "composition"
COMPILE = "compile"
VERDICT = "verdict"
CONFIG_FILES = "config-files"
TREE = "tree"
BASE = "base"
# Besides the platform's: the packages whose code computes our stages.
_STAGE_PACKAGES = (("pyyaml", "PyYAML"),)
# Never part of the digest: caches and the corpus and golden files a wheel embeds (the golden
# files are compared, never remembered).
_NOT_CODE = frozenset({"__pycache__", "_embedded"})


@functools.cache
def package_sha256() -> str:
    """sha256 of every file of this package and of ``reference_trainer``: code and data alike."""
    base = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for package in ("pytest_verl_compat", "reference_trainer"):
        for path in sorted((base / package).rglob("*")):
            relative = path.relative_to(base)
            if path.is_dir() or _NOT_CODE & set(relative.parts) or path.suffix == ".pyc":
                continue
            digest.update(relative.as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def digest(value: Any) -> str:
    """sha256 of a JSON value (its key order kept)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


class StageMemo:
    """The kept results of one process's stages (off when ``enabled`` is false)."""

    def __init__(self, folder: Path | None = None, *, enabled: bool | None = None) -> None:
        self.folder = folder if folder is not None else user_cache_root() / "results"
        self.enabled = (not os.environ.get(NO_CACHE_ENV)) if enabled is None else enabled
        self._stores: dict[str, UserAnswers] = {}

    def key(self, kind: str, payload: Any) -> str:
        return digest(
            {
                "format": MEMO_FORMAT,
                "kind": kind,
                "code": package_sha256(),
                "platform": platform_versions(),
                "payload": payload,
            }
        )

    def _store(self, kind: str) -> UserAnswers:
        if kind not in self._stores:
            self._stores[kind] = UserAnswers(kind, self.folder / kind)
        return self._stores[kind]

    def get(self, kind: str, key: str) -> Any | None:
        return self._store(kind).get(key) if self.enabled else None

    def put(self, kind: str, key: str, value: Any) -> None:
        if self.enabled:
            self._store(kind).put(key, value)


# --- the results as JSON, and back ------------------------------------------------------------


def json_exact(value: Any) -> bool:
    """Whether JSON gives ``value`` back exactly: every mapping inside has string keys (JSON
    keeps no other) and no tuple hides in it."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and json_exact(v) for k, v in value.items())
    if isinstance(value, list):
        return all(json_exact(item) for item in value)
    return not isinstance(value, tuple)


def _fields(value: Any) -> dict[str, Any]:
    """A dataclass's fields, not copied: each result goes straight to ``json.dumps``, and
    ``dataclasses.asdict`` deep-copied every resolved mapping and every leaf (7 of 56 s of a cold
    ``check`` of the 109 example scripts)."""
    return {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}


def composition_json(composition: Composition) -> dict[str, Any] | None:
    """A composition as JSON, or None when JSON would not give it back exactly."""
    if composition.resolved is not None and not json_exact(composition.resolved):
        return None
    return _fields(composition)


def composition_from_json(raw: dict[str, Any]) -> Composition:
    return Composition(raw["outcome"], raw["resolved"], raw["reason"], tuple(raw["missing"]))


def finding_json(finding: Finding) -> dict[str, Any]:
    return dataclasses.asdict(finding)


def finding_from_json(raw: dict[str, Any]) -> Finding:
    location = raw.get("location")
    return Finding(
        raw["level"],
        raw["path"],
        raw["message"],
        raw["fix"],
        raw["evidence"],
        check=raw["check"],
        location=Location(**location) if location is not None else None,
    )


def report_json(report: CompileReport) -> dict[str, Any] | None:
    """A compile report as JSON, or None when a leaf's value would not come back exactly."""
    if not json_exact([leaf.value for leaf in report.leaves]):
        return None
    return {
        "case_id": report.case_id,
        "profile": report.profile,
        "outcome": report.outcome,
        "reason": report.reason,
        "leaves": [_fields(leaf) for leaf in report.leaves],
        "findings": [finding_json(f) for f in report.findings],
    }


def report_from_json(raw: dict[str, Any]) -> CompileReport:
    return CompileReport(
        raw["case_id"],
        raw["profile"],
        raw["outcome"],
        raw["reason"],
        tuple(LeafVerdict(**leaf) for leaf in raw["leaves"]),
        tuple(finding_from_json(f) for f in raw["findings"]),
    )
