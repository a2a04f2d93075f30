"""Trusted composition: upstream's own entry point, in the oracle process, as an independent check."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pytest_verl_compat.pipeline.answers import (
    COMPOSE,
    Answers,
    answer_key,
    answers,
    mapping_digest,
)
from pytest_verl_compat.upstream.oracle.client import (
    ENTRY_MODULE,
    EntryArgvRefused,
    UpstreamOracle,
    compose_request,
)
from pytest_verl_compat.upstream.oracle.runner import referenced_variables


@dataclass(frozen=True)
class TrustedResult:
    """What ``python -m verl.trainer.main_ppo --cfg job --resolve`` printed: the resolved mapping's
    digest (``mapping_digest``: values, types and key order), and the mapping itself when it was
    asked for now rather than kept."""

    ok: bool
    resolved_sha256: str | None
    error: str
    cached: bool
    refused: bool = False  # never sent: the argv carries what upstream's entry point must not see
    resolved: dict[str, Any] | None = None

    def differs_from(self, ours: Mapping[str, Any]) -> bool:
        return self.resolved_sha256 != mapping_digest(ours)


# libyaml's parser with PyYAML's own safe constructor and resolver: the same mapping as
# yaml.safe_load, ~10x faster on the ~880-leaf configs the entry point prints (23 of them took
# ~1.5 s of the default audit's critical path with the pure-Python parser).
_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def printed_config(text: str) -> Any:
    """The mapping ``--cfg job --resolve`` printed (YAML), parsed as ``yaml.safe_load`` would."""
    return yaml.load(text, Loader=_SAFE_LOADER)


def cache_key(
    release: str,
    tree_sha256: str,
    fields: Sequence[str],
    variables: Mapping[str, str],
    module: str | None = None,
) -> str:
    question: dict[str, Any] = {
        "tree": tree_sha256,
        "fields": list(fields),
        "variables": sorted(variables.items()),
    }
    if module and module != ENTRY_MODULE:  # the pinned entry point's keys stay as they were
        question["module"] = module
    return answer_key(COMPOSE, question, release=release)


def _entry_shape(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("ok"), bool)
        and isinstance(entry.get("error"), str)
        and isinstance(entry.get("resolved_sha256"), str | None)
    )


def trusted_answers(golden_dir: Path | None, *, user: bool = True) -> Answers:
    """Where the entry point's answers are kept: the user cache, then those recorded."""
    return answers(COMPOSE, golden_dir, checker=_entry_shape, user=user)


class TrustedCompositions:
    """The entry point's resolved mapping per case, from the oracle process, kept by content
    (``answers``): a warm run, or the embedded default with its recorded answers, starts no
    process at all. A mapping that differs from ours is asked for again, whole, to show where."""

    def __init__(self, oracle: UpstreamOracle, tree_sha256: str, store: Answers | None) -> None:
        self.oracle = oracle
        self.tree_sha256 = tree_sha256
        self.store = store

    def _kept(self, key: str) -> TrustedResult | None:
        hit = self.store.get(key) if self.store is not None else None
        if hit is None:
            return None
        return TrustedResult(hit["ok"], hit["resolved_sha256"], hit["error"], True)

    def prefetch(
        self, fields: Sequence[str], variables: Mapping[str, str], module: str | None = None
    ) -> None:
        """Ask now, so the answer is ready when the trusted stage reads it."""
        variables = referenced_variables(fields, variables)
        key = cache_key(self.oracle.release, self.tree_sha256, fields, variables, module)
        if self._kept(key) is None:
            with contextlib.suppress(EntryArgvRefused):  # result() reports the refusal
                self.oracle.submit(key, compose_request(fields, variables, module))

    def result(
        self,
        fields: Sequence[str],
        variables: Mapping[str, str],
        *,
        whole: bool = False,
        module: str | None = None,
    ) -> TrustedResult:
        """``module``'s entry point's answer for these fields (the pinned one by default);
        ``whole``: with the mapping itself (asked of the oracle when only its digest is kept)."""
        variables = referenced_variables(fields, variables)
        key = cache_key(self.oracle.release, self.tree_sha256, fields, variables, module)
        kept = None if whole else self._kept(key)
        if kept is not None:
            return kept
        try:
            request = compose_request(fields, variables, module)
        except EntryArgvRefused as exc:
            return TrustedResult(False, None, f"not sent to upstream: {exc}", False, refused=True)
        answer = self.oracle.answer(key, request)
        if answer["ok"]:
            resolved = printed_config(answer["stdout"])
            result = TrustedResult(True, mapping_digest(resolved), "", False, resolved=resolved)
        else:
            result = TrustedResult(False, None, answer["error"], False)
        if self.store is not None:
            self.store.put(
                key,
                {"ok": result.ok, "resolved_sha256": result.resolved_sha256, "error": result.error},
            )
        return result
