"""What the run-conformance tests (and the whole-run claims) share: questions to a served probe
in the oracle's sandbox, dotted keys of a mapping, a case's checks, and the tiny model folder
both sides of a data conformance load.

A question is its JSON (keys sorted): its id is a hash of that text, so a question asked twice is
submitted once and answered from the same id; the stored request is the JSON's round trip, as
the oracle receives it.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
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


def set_off(cases: Sequence[Mapping[str, Any]], defaults: Mapping[str, Any]) -> set[str]:
    """The leaves some case (``sets``) sets to a value other than ``defaults``' (verl's)."""
    return {
        leaf for case in cases for leaf, value in case["sets"].items() if value != defaults[leaf]
    }


def disagreeing(
    cases: Sequence[Mapping[str, Any]],
    upstream: Mapping[str, Sequence[Any]],
    run: Callable[[Mapping[str, Any], Path], Any],
    folder: Path,
) -> list[str]:
    """The ids of the cases whose result by ours (``run(sets, folder)``, each case in a folder of
    its own) differs from upstream's (the first of each case's answers)."""
    out = []
    for index, case in enumerate(cases):
        own = folder / str(index)
        own.mkdir()
        if run(case["sets"], own) != upstream[case["id"]][0]:
            out.append(case["id"])
    return out


def assert_conforms(
    case: Mapping[str, Any],
    ours: Any,
    expected: Any,
    reset: Sequence[Any],
    defaults: Mapping[str, Any],
    error_key: str,
) -> None:
    """A run-conformance case holds: upstream ran it (no ``error_key``), ours gives upstream's
    result, and each leaf the case sets, back at verl's default (``reset``, in ``sets``' order),
    gives upstream another result (else the case does not show the leaf)."""
    assert error_key not in expected, f"upstream refused the case: {expected}"
    assert ours == expected, case["why"]
    for leaf, changed in zip(case["sets"], reset, strict=True):
        assert changed != expected, (
            f"{leaf} back at verl's default {defaults[leaf]!r} gives upstream the same "
            f"result: the case does not show the leaf [{case['id']}]"
        )


def tiny_chat_model(folder: Path, chat_template: str) -> Path:
    """The tiny policy and its tokenizer with ``chat_template``, saved as a local model folder:
    what both sides of a data conformance load (the sandbox reads its files)."""
    from reference_trainer.tiny import build_tiny_policy, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(folder)
    build_tiny_policy(tokenizer, seed=0).save_pretrained(folder)
    return folder


def model_files(folder: Path) -> dict[str, str]:
    """A model folder's tokenizer files and config.json by name, to send to the sandbox
    (transformers picks the tokenizer's class by the model's type)."""
    return {
        path.name: path.read_text()
        for path in sorted(folder.iterdir())
        if path.name.startswith(("tokenizer", "special_tokens", "chat_template", "config.json"))
    }
