"""Upstream's side of the conformance cases, answered by the oracle process.

The default audit's oracle (``upstream/oracle.py``) has verl imported already; computing
upstream's outputs there spares the pytest process its own ~3 s import of verl (and the second
it takes to tear it down), and its forked workers use the core the audit's other stages leave
idle. The answer is bit-exact: tensors travel as their raw bytes, floats as ``repr``.

The oracle process loads this module by name (``--serve``) and dispatches ``conformance``
questions to ``ORACLE_HANDLERS``; ``ORACLE_WARM`` imports verl's modules before the workers
fork, so they share them.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from pytest_verl_compat.conformance.components import SIDES
from pytest_verl_compat.conformance.inputs import INPUTS, case_generator
from pytest_verl_compat.conformance.plan import ConformanceCase
from pytest_verl_compat.conformance.results import (
    REFERENCE_KIND,
    reference_key,
    reference_request,
)
from pytest_verl_compat.conformance.run import upstream_outputs
from pytest_verl_compat.conformance.sides import upstream_modules
from pytest_verl_compat.pipeline.answers import CONFORMANCE, Answers, answers

KIND = REFERENCE_KIND


class Oracle(Protocol):
    """The slice of ``upstream.oracle.UpstreamOracle`` used here (that layer is not imported)."""

    # The release whose code answers.
    release: str

    def submit(self, request_id: str, request: Mapping[str, Any]) -> None: ...

    def answer(self, request_id: str, request: Mapping[str, Any]) -> dict[str, Any]: ...


def encode(value: Any) -> Any:
    """A JSON value that `decode` turns back into exactly `value` (tensors, floats, containers)."""
    if isinstance(value, torch.Tensor):
        data = value.detach().contiguous().cpu()
        return {
            "tensor": str(data.dtype).removeprefix("torch."),
            "shape": list(data.shape),
            "bytes": base64.b64encode(data.numpy().tobytes()).decode("ascii"),
        }
    if isinstance(value, np.floating):
        return {"numpy": type(value).__name__, "value": float(value)}
    if isinstance(value, dict):
        return {"dict": [[key, encode(item)] for key, item in value.items()]}
    if isinstance(value, list | tuple):
        return {type(value).__name__: [encode(item) for item in value]}
    if value is None or isinstance(value, bool | int | float | str):
        return {"plain": value}
    raise TypeError(f"cannot carry a {type(value).__name__} from the oracle")


def decode(value: Mapping[str, Any]) -> Any:
    (kind,) = set(value) - {"shape", "bytes", "value"}
    if kind == "tensor":
        dtype = getattr(torch, value["tensor"])
        raw = bytearray(base64.b64decode(value["bytes"]))  # writable: torch shares the buffer
        flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        return flat.reshape(value["shape"])
    if kind == "numpy":
        return getattr(np, value["numpy"])(value["value"])
    if kind == "dict":
        return {key: decode(item) for key, item in value["dict"]}
    if kind in ("list", "tuple"):
        items = [decode(item) for item in value[kind]]
        return items if kind == "list" else tuple(items)
    return value["plain"]


# The oracle's question for a case, and its key (``results``: importable without torch).
request = reference_request
answer_key_of = reference_key


def answer(question: Mapping[str, Any]) -> dict[str, Any]:
    """Upstream's outputs for every sample of one case (inside the oracle process), and the
    candidate side's too when it calls none of our functions (it is then upstream's alone)."""
    case = ConformanceCase(**question["case"])
    component = SIDES[case.component]
    samples = []
    for sample in range(case.samples):
        outputs = {"reference": encode(upstream_outputs(case, sample))}
        if not component.uses(case):
            inputs = INPUTS[case.component](case, case_generator(case, sample))
            outputs["candidate"] = encode(component.candidate(case, inputs, {}))
        samples.append(outputs)
    return {"ok": True, "samples": samples}


def warm() -> None:
    upstream_modules()
    # One thread per worker: the oracle's workers and the audit's own process share the cores,
    # and torch's intra-op threads would only contend (these tensors are a few KB).
    torch.set_num_threads(1)


ORACLE_HANDLERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {KIND: answer}
ORACLE_WARM = warm


def oracle_answers(case: ConformanceCase) -> bool:
    """Whether upstream's side of `case` can come from the oracle: not when it uses our own
    functions (the mutation check swaps those, and only this process has the swap)."""
    return not SIDES[case.component].reference_uses_ours(case)


def _entry_shape(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and entry.get("ok") is True
        and isinstance(entry.get("samples"), list)
    )


def reference_answers(golden_dir: Path | None, *, user: bool = True) -> Answers:
    """Where upstream's side of the conformance cases is kept: the user cache, then recorded."""
    return answers(CONFORMANCE, golden_dir, checker=_entry_shape, user=user)


class OracleReferences:
    """A ``run.ReferenceSource`` answered by the oracle process, one question per case, each
    answer kept by content (``upstream.answers``): a warm run imports no verl."""

    def __init__(self, oracle: Oracle, store: Answers | None = None) -> None:
        self.oracle = oracle
        # Without a store, every answer comes from the oracle (and is kept nowhere).
        self.store = store if store is not None else Answers(CONFORMANCE, None)
        self._decoded: dict[str, list[dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def prefetch(self, case: ConformanceCase) -> None:
        """Ask the oracle now, unless the answer is kept (or never comes from the oracle)."""
        if oracle_answers(case):
            key = answer_key_of(case, self.oracle.release)
            if self.store.get(key) is None:
                self.oracle.submit(key, request(case))

    def _sample(self, case: ConformanceCase, sample: int) -> dict[str, Any]:
        key = answer_key_of(case, self.oracle.release)
        with self._lock:
            if key not in self._decoded:
                reply = self.store.get(key)
                if reply is None:
                    reply = self.oracle.answer(key, request(case))
                    if not reply.get("ok"):
                        raise RuntimeError(f"upstream side of {case.id}: {reply.get('error')}")
                    self.store.put(key, reply)
                self._decoded[key] = [
                    {side: decode(value) for side, value in item.items()}
                    for item in reply["samples"]
                ]
            return self._decoded[key][sample]

    def __call__(self, case: ConformanceCase, sample: int) -> dict[str, Any]:
        """The reference side (a ``run.ReferenceSource``)."""
        if not oracle_answers(case):
            return upstream_outputs(case, sample)
        reference: dict[str, Any] = self._sample(case, sample)["reference"]
        return reference

    def candidate(self, case: ConformanceCase, sample: int) -> dict[str, Any]:
        """The candidate side of a case whose candidate calls none of our functions."""
        outputs: dict[str, Any] = self._sample(case, sample)["candidate"]
        return outputs
