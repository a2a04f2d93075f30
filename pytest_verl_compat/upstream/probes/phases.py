"""The probes' run on one mapping: each phase in ``main_ppo``'s order, its reads recorded.

``run_all`` runs ``config_load``, ``trainer`` and ``first_step`` (or notes the legacy trainer it
does not probe), then the checks of the explicit keys' types and effects, and gathers one answer;
``LineTracer`` says which of the census's watched lines ran (oracle process only).
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_verl_compat.upstream.probes import records
from pytest_verl_compat.upstream.probes.records import (
    KEY_ADMITTED,
    KEY_EFFECTS,
    KEY_NOT_EVALUATED,
    KEY_NOTES,
    KEY_PATH,
    KEY_RAN,
    KEY_TYPES,
    Collector,
    leaves_of,
)

# main_ppo runs the legacy trainer (main_ppo_v0.py) when trainer.use_v1 is false: not probed.
LEGACY_TRAINER = {
    "step": "trainer start: TaskRunner (trainer.use_v1=False)",
    "reason": "the legacy trainer (verl/trainer/main_ppo_v0.py, deprecated) is not probed; only "
    "validate_config and the config sections' conversions ran",
}


def run_all(
    mapping: Mapping[str, Any],
    validate: Callable[[Any], None],
    watch: Mapping[str, Sequence[int]] | None = None,
    explicit: Sequence[str] = (),
    timings: list[tuple[str, float]] | None = None,
) -> dict[str, Any]:
    """Every probe on one resolved mapping: failure records, the steps not evaluated here, and
    the values the config dataclasses' annotations refuse; of the ``explicit`` keys (the ones the
    script set), those without effect (``effects``). With ``watch`` (``verl/…py`` → lines,
    the census's deciding lines) also which of those lines ran (``KEY_RAN``)."""
    from pytest_verl_compat.upstream.probes.config_load import config_load
    from pytest_verl_compat.upstream.probes.first_step import first_step
    from pytest_verl_compat.upstream.probes.trainer import ray_free, trainer_probes
    from pytest_verl_compat.upstream.probes.types import explicit_types, wrong_types

    plain = dict(mapping)
    leaves = leaves_of(plain)
    out = Collector(leaves)
    tracer = LineTracer(records.verl_root().parent, watch) if watch else None
    clock = _Clock(timings)
    with ray_free(plain), tracer or contextlib.nullcontext():
        with clock("config load (validate_config, the dataclasses)"):
            config_load(out, plain, validate)
        if plain["trainer"].get("use_v1", True):
            with clock("trainer and workers (PPOTrainer.__init__, _setup)"):
                trainer = trainer_probes(out, plain)
            with clock("first step (advantages, log-prob, update, losses, optimizer)"):
                first_step(out, plain, trainer)
        else:
            out.not_run.append(LEGACY_TRAINER)
    with clock("types (the dataclasses' annotations)"):
        refused, admitted = explicit_types(plain, leaves, explicit)
        types = wrong_types(out.reads.tagged(), leaves)
        types += [r for r in refused if all(t["key"] != r["key"] for t in types)]
        types.sort(key=lambda record: record["key"])
    with clock("effects (never read, overridden)"):
        without_effect = _without_effect(out, plain, leaves, list(explicit))
    answer: dict[str, Any] = {
        "failures": out.records,
        KEY_NOT_EVALUATED: out.not_run,
        KEY_TYPES: types,
        KEY_ADMITTED: admitted,
        KEY_EFFECTS: without_effect,
        KEY_NOTES: _distinct(out.reads.notes),
        KEY_PATH: records.path_of_run(out.reads, leaves, explicit),
    }
    if tracer is not None:
        answer[KEY_RAN] = tracer.ran()
    return answer


def _distinct(notes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each note once (a worker built twice notes twice), in order."""
    out: list[dict[str, Any]] = []
    for note in notes:
        if note not in out:
            out.append(note)
    return out


class _Clock:
    """Wall seconds per phase into ``timings`` (``benchmarks/bench_check.py --phases``)."""

    def __init__(self, timings: list[tuple[str, float]] | None) -> None:
        self.timings = timings

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.timings is not None:
                self.timings.append((name, time.perf_counter() - start))


def _without_effect(
    out: Collector, plain: Mapping[str, Any], leaves: Mapping[str, Any], explicit: list[str]
) -> list[dict[str, Any]]:
    """The explicit keys that change nothing (``effects``); none when no probe ran the trainer."""
    from pytest_verl_compat.upstream.probes import effects

    if not explicit or not plain["trainer"].get("use_v1", True):
        return []
    keys = [key for key in explicit if key in leaves]
    root = records.verl_root()
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = effects.never_read(out.reads, out.reads.tagged(), keys, root, leaves)
        skip = {record[effects.KEY_KEY] for record in found}
        found += effects.overridden(plain, [k for k in keys if k not in skip], leaves, root)
    return sorted(found, key=lambda record: str(record[effects.KEY_KEY]))


class LineTracer:
    """Which of the watched upstream lines run (``sys.settrace``, only in the watched files)."""

    def __init__(self, parent: Path, watch: Mapping[str, Sequence[int]]) -> None:
        self.watch = {
            str((parent / relative).resolve()): (relative, set(lines))
            for relative, lines in watch.items()
        }
        self.hits: dict[str, set[int]] = {}
        self._previous: Any = None

    def _local(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            relative, lines = self.watch[frame.f_code.co_filename]
            if frame.f_lineno in lines:
                self.hits.setdefault(relative, set()).add(frame.f_lineno)
        return self._local

    def _global(self, frame: Any, event: str, arg: Any) -> Any:
        return self._local if frame.f_code.co_filename in self.watch else None

    def __enter__(self) -> LineTracer:
        self._previous = sys.gettrace()
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(self._previous)

    def ran(self) -> dict[str, list[int]]:
        return {relative: sorted(lines) for relative, lines in sorted(self.hits.items())}
