"""The tests' questions to a served probe in the oracle's sandbox, and dotted keys of a mapping.

A question is its JSON (keys sorted): its id is a hash of that text, so a question asked twice is
submitted once and answered from the same id; the stored request is the JSON's round trip, as
the oracle receives it.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any


class SandboxQuestions:
    """An oracle process serving ``served`` (probe modules' ``ORACLE_HANDLERS``) in a release's
    environment, each distinct question submitted once."""

    def __init__(
        self, served: Sequence[str], release: str, *, workers: int = 1, prefix: str = ""
    ) -> None:
        from pytest_verl_compat.upstream.oracle.client import UpstreamOracle

        self.oracle = UpstreamOracle(workers=workers, served=tuple(served), release=release)
        self.prefix = prefix
        self.asked: dict[str, dict[str, Any]] = {}

    def submit(self, request: Mapping[str, Any]) -> str:
        """Queue the question (once); its id."""
        text = json.dumps(request, sort_keys=True, default=str)
        request_id = self.prefix + hashlib.sha256(text.encode()).hexdigest()[:20]
        if request_id not in self.asked:
            self.asked[request_id] = json.loads(text)
            self.oracle.submit(request_id, self.asked[request_id])
        return request_id

    def answer(self, request_id: str, timeout: float = 600) -> dict[str, Any]:
        return self.oracle.answer(request_id, self.asked[request_id], timeout=timeout)

    def ask(self, request: Mapping[str, Any], timeout: float = 600) -> dict[str, Any]:
        return self.answer(self.submit(request), timeout)

    def close(self) -> None:
        self.oracle.close()


def leaf(mapping: Mapping[str, Any], dotted: str) -> Any:
    """The value at a dotted key (``KeyError`` when a part is missing)."""
    value: Any = mapping
    for part in dotted.split("."):
        value = value[part]
    return value


def with_sets(mapping: Mapping[str, Any], sets: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``mapping`` with each dotted key of ``sets`` set to its value."""
    changed = copy.deepcopy(dict(mapping))
    for dotted, value in sets.items():
        *parents, name = dotted.split(".")
        node = leaf(changed, ".".join(parents)) if parents else changed
        node[name] = value
    return changed
