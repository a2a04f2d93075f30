"""Trusted composition: upstream's own entry point, in the oracle process, as an independent check."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import yaml

from pytest_verl_compat.upstream.oracle import EntryArgvRefused, UpstreamOracle, compose_request
from pytest_verl_compat.upstream.runner import referenced_variables


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
    refused: bool = False  # never sent: the argv carries what upstream's entry point must not see


# libyaml's parser with PyYAML's own safe constructor and resolver: the same mapping as
# yaml.safe_load, ~10x faster on the ~880-leaf configs the entry point prints (23 of them took
# ~1.5 s of the default audit's critical path with the pure-Python parser).
_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def printed_config(text: str) -> Any:
    """The mapping ``--cfg job --resolve`` printed (YAML), parsed as ``yaml.safe_load`` would."""
    return yaml.load(text, Loader=_SAFE_LOADER)


def cache_key(tree_sha256: str, fields: Sequence[str], variables: Mapping[str, str]) -> str:
    payload = json.dumps([tree_sha256, list(fields), sorted(variables.items())])
    return "verl_corpus/trusted/" + hashlib.sha256(payload.encode()).hexdigest()


class TrustedCompositions:
    """The entry point's resolved mapping per case, from the oracle process, cached by
    (tree hash, fields, variables) in pytest's cache so a warm run starts no process at all."""

    def __init__(self, oracle: UpstreamOracle, tree_sha256: str, cache: Cache | None) -> None:
        self.oracle = oracle
        self.tree_sha256 = tree_sha256
        self.cache = cache

    def _cached(self, key: str) -> TrustedResult | None:
        hit = self.cache.get(key, None) if self.cache is not None else None
        if isinstance(hit, dict) and "ok" in hit:
            return TrustedResult(hit["ok"], hit["resolved"], hit["error"], True)
        return None

    def prefetch(self, fields: Sequence[str], variables: Mapping[str, str]) -> None:
        """Ask now, so the answer is ready when the trusted stage reads it."""
        variables = referenced_variables(fields, variables)
        key = cache_key(self.tree_sha256, fields, variables)
        if self._cached(key) is None:
            with contextlib.suppress(EntryArgvRefused):  # result() reports the refusal
                self.oracle.submit(key, compose_request(fields, variables))

    def result(self, fields: Sequence[str], variables: Mapping[str, str]) -> TrustedResult:
        variables = referenced_variables(fields, variables)
        key = cache_key(self.tree_sha256, fields, variables)
        cached = self._cached(key)
        if cached is not None:
            return cached
        try:
            request = compose_request(fields, variables)
        except EntryArgvRefused as exc:
            return TrustedResult(False, None, f"not sent to upstream: {exc}", False, refused=True)
        answer = self.oracle.answer(key, request)
        if answer["ok"]:
            result = TrustedResult(True, printed_config(answer["stdout"]), "", False)
        else:
            result = TrustedResult(False, None, answer["error"], False)
        if self.cache is not None:
            self.cache.set(
                key, {"ok": result.ok, "resolved": result.resolved, "error": result.error}
            )
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
