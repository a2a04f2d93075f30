"""Trusted composition: upstream's own entry point, run in a subprocess, as an independent oracle."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import yaml

from pytest_verl_compat.upstream.runner import referenced_variables, run_module


class Cache(Protocol):
    """The slice of pytest's ``config.cache`` this module needs."""

    def get(self, key: str, default: Any) -> Any: ...

    def set(self, key: str, value: Any) -> None: ...


@dataclass(frozen=True)
class TrustedResult:
    """What ``python -m verl.trainer.main_ppo --cfg job --resolve`` printed, parsed."""

    ok: bool
    resolved: dict[str, Any] | None
    error: str
    cached: bool


def cache_key(tree_sha256: str, fields: Sequence[str], variables: Mapping[str, str]) -> str:
    payload = json.dumps([tree_sha256, list(fields), sorted(variables.items())])
    return "verl_corpus/trusted/" + hashlib.sha256(payload.encode()).hexdigest()


def run_entry_point(
    fields: Sequence[str], variables: Mapping[str, str], timeout: float = 300
) -> TrustedResult:
    """Run upstream's entry point; Hydra prints the job config and exits before the task runs."""
    run = run_module(
        "verl.trainer.main_ppo",
        ["--cfg", "job", "--resolve", *fields],
        variables=referenced_variables(fields, variables),
        timeout=timeout,
    )
    if run.returncode != 0:
        return TrustedResult(
            False, None, f"exit status {run.returncode}:\n{run.stderr_tail(12)}", False
        )
    return TrustedResult(True, yaml.safe_load(run.stdout), "", False)


def trusted_composition(
    tree_sha256: str, fields: Sequence[str], variables: Mapping[str, str], cache: Cache | None
) -> TrustedResult:
    """The entry point's resolved mapping, cached by (tree hash, fields, variables)."""
    key = cache_key(tree_sha256, fields, variables)
    if cache is not None:
        hit = cache.get(key, None)
        if isinstance(hit, dict) and "ok" in hit:
            return TrustedResult(hit["ok"], hit["resolved"], hit["error"], True)
    result = run_entry_point(fields, variables)
    if cache is not None:
        cache.set(key, {"ok": result.ok, "resolved": result.resolved, "error": result.error})
    return result


def first_difference(ours: Any, theirs: Any, path: str = "") -> str | None:
    """The first place two mappings differ in value, type or key order, as a readable line."""
    if type(ours) is not type(theirs):
        return f"{path or '<root>'}: type {type(ours).__name__} != {type(theirs).__name__} ({ours!r} vs {theirs!r})"
    if isinstance(ours, dict):
        if list(ours) != list(theirs):
            if set(ours) != set(theirs):
                extra = sorted(set(ours) - set(theirs))
                lacking = sorted(set(theirs) - set(ours))
                return f"{path or '<root>'}: keys only here {extra}, only upstream {lacking}"
            return f"{path or '<root>'}: key order {list(ours)} != {list(theirs)}"
        for key in ours:
            found = first_difference(ours[key], theirs[key], f"{path}.{key}" if path else key)
            if found:
                return found
        return None
    if isinstance(ours, list):
        if len(ours) != len(theirs):
            return f"{path}: list length {len(ours)} != {len(theirs)}"
        for index, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            found = first_difference(a, b, f"{path}[{index}]")
            if found:
                return found
        return None
    if ours != theirs:
        return f"{path}: {ours!r} != {theirs!r}"
    return None
