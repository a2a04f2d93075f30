"""One record per upstream failure: its message, the verl line that raised it, when, and the keys.

A probe step runs inside ``Collector.run``: its own try (one failure never hides the next phase's),
stdout and warnings swallowed, every configuration read recorded (``recorder``). A failure is
upstream's when upstream's code raised it (a frame inside the installed verl package), or a
library rule a stand-in checks for it (``boundary.LibraryCheck``); then it becomes a record with
upstream's message, the ``verl/…py:line`` of the deepest verl frame, that line's source, the phase,
and the configuration leaves read on the lines that decided it. A failure for want of something
this machine lacks (a module that is not installed, a stand-in that cannot answer) is not the
configuration's: it is kept apart as a step not evaluated, with its reason. Anything else is a bug
here and propagates.
"""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import re
import traceback
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pytest_verl_compat.upstream.probes import stand_ins, statements, tiny_batch
from pytest_verl_compat.upstream.probes.boundary import LibraryCheck
from pytest_verl_compat.upstream.probes.patching import PatchPointMissing
from pytest_verl_compat.upstream.probes.recorder import ConfigReads, recording

# What an answer holds besides the failures: the steps that could not run on this machine, and
# the values upstream's config dataclasses' annotations refuse.
KEY_NOT_EVALUATED = "not_evaluated"
KEY_TYPES = "types"
KEY_ADMITTED = "admitted_types"  # explicit keys whose annotation admits their value
KEY_RAN = "ran"  # the census's watched lines that ran (a census question only)
KEY_EFFECTS = "without_effect"  # explicit keys never read, or read and overridden (``effects``)
KEY_NOTES = "notes"  # what this machine decided, not the configuration (``optional``)
# Where the run went (``path_of_run``): the verl lines that read each explicit key (or a copy of
# it), and the classes whose methods read each of their sections.
KEY_PATH = "path"
KEY_READ_AT = "read_at"
KEY_BUILT = "built"
# An explicit key upstream overwrote: the first write's line, its value, and the lines that read
# the key before it.
KEY_OVERWRITTEN = "overwritten"
KEY_VALUE = "value"
KEY_READ_BEFORE = "read_before"
# Lines kept per key read (the first ones, in file order).
_LINES_KEPT = 3


# JSON keys of one failure record (they travel from the oracle process to the caller's cache).
KEY_PHASE = "phase"
KEY_MESSAGE = "message"
KEY_WHERE = "where"
KEY_SOURCE = "source"
KEY_STAND_IN = "stand_in"
KEY_CHECK = "check"  # the upstream function the probe called, or "stand-in"
KEY_KEYS = "keys"  # the configuration leaves read on the lines that decided the failure
KEY_CONDITION = "condition"  # what upstream requires: an assert's test, or "not (<if test>)"
# A step that could not run here: {"step": …, "reason": …}.
KEY_STEP = "step"
KEY_REASON = "reason"

# Exceptions that say this machine lacks something, not that the configuration is wrong.
_ENVIRONMENT = (ImportError,)


def leaves_of(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every leaf of a resolved mapping by its dotted key (an empty section is a leaf)."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(leaves_of(value, path + "."))
        else:
            out[path] = value
    return out


@functools.cache
def verl_root() -> Path:
    import verl

    return Path(verl.__file__).resolve().parent


def _relative(filename: str) -> str | None:
    try:
        return "verl/" + Path(filename).resolve().relative_to(verl_root()).as_posix()
    except ValueError:
        return None


def source_line(where: str) -> str:
    path, _, line = where.rpartition(":")
    try:
        text = (verl_root().parent / path).read_text(encoding="utf-8").splitlines()
        return text[int(line) - 1].strip()
    except (OSError, ValueError, IndexError):
        return ""


def message(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
    return text.splitlines()[0] if text else type(exc).__name__


def _deepest_verl_frame(exc: BaseException) -> tuple[str, str]:
    """(``verl/…:line``, the function's qualified owner) of the deepest frame inside verl."""
    where, owner = "", ""
    for frame, line in traceback.walk_tb(exc.__traceback__):
        relative = _relative(frame.f_code.co_filename)
        if relative is None:
            continue
        where = f"{relative}:{line}"
        self = frame.f_locals.get("self")
        name = frame.f_code.co_name
        owner = f"{type(self).__name__}.{name}" if self is not None else name
    return where, owner


def unwrap(exc: BaseException) -> BaseException:
    """What a dataclass raised, out of Hydra's InstantiationException (its first line names only
    the class)."""
    while type(exc).__name__ == "InstantiationException" and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def condition(where: str) -> str:
    """What upstream requires at ``where``: an assert's test, or ``not (<if test>)`` for a raise
    under an ``if``; "" when the raise has no guard (an ``except`` re-raise, a registry miss)."""
    relative, _, line = where.rpartition(":")
    source = statements.parse(str(verl_root().parent / relative), relative)
    if source is None or not line.isdigit():
        return ""
    statement = source.statement_at(int(line))
    if statement is None:
        return ""
    test = statements.guard(source, statement)
    if test is None:
        return ""
    import ast

    text = " ".join(ast.unparse(test).split())
    return text if isinstance(statement, ast.Assert) else f"not ({text})"


def _owner(frame: Any) -> str:
    self = frame.f_locals.get("self")
    cls = frame.f_locals.get("cls")
    holder = type(self).__name__ if self is not None else getattr(cls, "__name__", "")
    return f"{holder}.{frame.f_code.co_name}" if holder else frame.f_code.co_name


def _phase(phase: str, exc: BaseException) -> str:
    """The step's phase; inside the trainer's ``_setup``, the call ``_setup`` made that raised: a
    worker's (``engine_workers.py``) is worker start, the rest trainer init."""
    if not phase.startswith("trainer init"):
        return phase
    frames = [
        f
        for f, _ in traceback.walk_tb(exc.__traceback__)
        if (_relative(f.f_code.co_filename) or "").startswith(("verl/trainer", "verl/workers"))
    ]
    for outer, inner in itertools.pairwise(frames):
        if outer.f_code.co_name == "_setup":
            relative = _relative(inner.f_code.co_filename) or ""
            when = "worker start" if relative.startswith("verl/workers/engine") else "trainer init"
            return f"{when}: {_owner(inner)}"
    return phase


def _missing_field(exc: BaseException) -> bool:
    """A batch field or model output the step's input lacks (TensorDict's own KeyError for a
    missing key, the stand-in model output's ``MissingModelOutput``)."""
    if isinstance(unwrap(exc), tiny_batch.MissingModelOutput):
        return True
    return isinstance(exc, KeyError) and "not found in TensorDict" in str(exc)


def _importing(exc: BaseException) -> bool:
    """Raised while a verl module ran its top level, that is, while it was imported: verl's own
    import-time checks of an optional dependency (``verl/third_party/vllm`` refuses a missing vLLM
    with a ValueError), never a configuration's."""
    return any(
        frame.f_code.co_name == "<module>" and _relative(frame.f_code.co_filename)
        for frame, _ in traceback.walk_tb(exc.__traceback__)
    )


def failure(phase: str, exc: BaseException, check: str, keys: list[str]) -> dict[str, Any]:
    """One record for an exception upstream's own code raised in ``check``."""
    cause = unwrap(exc)
    where, owner = _deepest_verl_frame(cause)
    if not where:  # raised by the generated __init__ a wrapper called: the wrapper's verl frame
        where, owner = _deepest_verl_frame(exc)
    phase = _phase(phase, exc)
    if owner.endswith(".__post_init__") and not phase.startswith("config load"):
        phase = f"config load: {owner} ({phase})"
    return {
        KEY_PHASE: phase,
        KEY_MESSAGE: message(cause),
        KEY_WHERE: where,
        KEY_SOURCE: source_line(where) if where else "",
        KEY_STAND_IN: "",
        KEY_CHECK: check,
        KEY_KEYS: keys,
        KEY_CONDITION: condition(where) if where else "",
    }


def _caused_by_import(exc: BaseException) -> bool:
    """An error upstream raises *because* an import failed (``raise RuntimeError("Dynamic CP
    requires a Megatron-Core build …") from exc``, verl/utils/dynamic_cp_scheduler.py:37): the
    installed libraries here decided it, not the configuration."""
    seen: set[int] = set()
    link = exc.__cause__ or exc.__context__
    while link is not None and id(link) not in seen:
        if isinstance(link, _ENVIRONMENT):
            return True
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return False


class Collector:
    """Runs each probe step in its own try, recording what upstream reads; keeps each distinct
    failure once (first phase first) and each step that could not run here with its reason."""

    def __init__(self, leaves: Mapping[str, Any]) -> None:
        self.leaves = leaves
        self.records: list[dict[str, Any]] = []
        self.not_run: list[dict[str, str]] = []
        self.reads = ConfigReads(verl_root(), leaves)

    def add(self, record: dict[str, Any]) -> None:
        same = (record[KEY_WHERE], record[KEY_MESSAGE])
        if not any((r[KEY_WHERE], r[KEY_MESSAGE]) == same for r in self.records):
            self.records.append(record)

    def run(
        self,
        phase: str,
        step: Callable[[], Any],
        name: str,
        knobs: Mapping[str, tuple[str, ...]] | None = None,
        *,
        partial_batch: bool = False,
    ) -> Any:
        """``step()``'s value, or None when it failed (recorded) or could not run here.

        ``knobs``: values the probe computed from the configuration and handed to upstream in a
        batch (``mini_batch_size`` from ``ppo_mini_batch_size`` × ``n``), by the name upstream
        reads them under, with the keys they came from; a failure whose statement names one is
        also that knob's keys'. ``partial_batch``: the step feeds upstream a batch with only the
        fields the probe builds (a loss's inputs come from the rollout, the reference, the
        teacher): a missing field is the probe's limit, not the configuration's."""
        printed = io.StringIO()
        try:
            with (
                contextlib.redirect_stdout(printed),
                warnings.catch_warnings(),
                recording(self.reads),
            ):
                warnings.simplefilter("ignore")
                return step()
        except LibraryCheck as exc:
            self._library_check(phase, exc, name)
        except PatchPointMissing:
            raise  # the release, not the configuration: the command says so, loudly
        except Exception as exc:
            if partial_batch and _missing_field(exc):
                self.not_run.append({KEY_STEP: f"{phase}: {name}", KEY_REASON: message(exc)})
                return None
            self._failed(phase, exc, name, knobs or {})
        return None

    def _keys(self, exc: BaseException, knobs: Mapping[str, tuple[str, ...]]) -> list[str]:
        keys = set(self.reads.keys_for(exc, self.leaves))
        if knobs:
            text = self.reads.statement_text(exc)
            named = [keys_ for knob, keys_ in knobs.items() if re.search(rf"\b{knob}\b", text)]
            keys.update(k for group in named for k in group if k in self.leaves)
        return sorted(keys)

    def _failed(
        self, phase: str, exc: BaseException, name: str, knobs: Mapping[str, tuple[str, ...]]
    ) -> None:
        cause = unwrap(exc)
        where, _ = _deepest_verl_frame(cause)
        if not where:
            where, _ = _deepest_verl_frame(exc)
        environment = (
            isinstance(cause, _ENVIRONMENT)
            or _importing(exc)
            or "StandIn" in str(cause)
            or _caused_by_import(cause)
        )
        if environment or not where:
            if not environment:
                raise exc  # not raised by upstream's code: a bug here, never a finding
            self.not_run.append({KEY_STEP: f"{phase}: {name}", KEY_REASON: message(cause)})
            return
        sandbox = stand_ins.sandbox_failure(cause)
        if sandbox:  # the sandbox's, not the configuration's: a note (an info), never an error
            self.not_run.append({KEY_STEP: f"{phase}: {name}", KEY_REASON: sandbox})
            keys = self._keys(exc, knobs)
            self.reads.notes.append(stand_ins.note(f"{phase}: {name}", where, sandbox, keys))
            return
        self.add(failure(phase, exc, name, self._keys(exc, knobs)))

    def _library_check(self, phase: str, exc: LibraryCheck, name: str) -> None:
        where, _ = _deepest_verl_frame(exc)
        record = failure(phase, exc, name, self.reads.keys_for(exc, self.leaves))
        record[KEY_MESSAGE] = str(exc)
        record[KEY_STAND_IN] = (
            "a library rule checked by its stand-in at the verl line that calls it"
        )
        record[KEY_WHERE] = where
        record[KEY_SOURCE] = source_line(where) if where else ""
        self.add(record)


def path_of_run(
    reads: ConfigReads, leaves: Mapping[str, Any], explicit: Iterable[str]
) -> dict[str, Any]:
    """Where the run went, for the ``explicit`` keys: the verl lines that read each of them or a
    key holding the same value (an interpolated copy: the caller knows which copies are), and
    for their sections the verl classes whose methods read them (``ConfigReads.readers``)."""
    wanted = {key for key in explicit if key in leaves}
    # A copy's value is its source's; values as common as a flag or a small count would bring
    # half the tree, so such a copy is left to the static reading.
    values = {
        repr(v)
        for v in (leaves[key] for key in wanted)
        if isinstance(v, str)
        or (isinstance(v, int | float) and not isinstance(v, bool) and abs(v) > 1)
    }
    lines: dict[str, set[tuple[str, int]]] = {}
    for (relative, line), keys in reads.by_line.items():
        if not relative.startswith("verl/"):
            continue
        for key in keys:
            if key in wanted or (key in leaves and repr(leaves[key]) in values):
                lines.setdefault(key, set()).add((relative, line))
    sections = {key.rpartition(".")[0] for key in [*wanted, *lines]}
    return {
        KEY_READ_AT: {
            key: [f"{file}:{line}" for file, line in sorted(found)[:_LINES_KEPT]]
            for key, found in sorted(lines.items())
        },
        KEY_BUILT: {
            section: sorted(reads.readers[section])
            for section in sorted(sections)
            if reads.readers.get(section)
        },
        KEY_OVERWRITTEN: {
            key: {
                KEY_WHERE: reads.writes[key][0][0],
                KEY_VALUE: repr(reads.writes[key][0][1]),
                KEY_READ_BEFORE: reads.read_before_write.get(key, [])[:_LINES_KEPT],
            }
            for key in sorted(wanted)
            if reads.writes.get(key) and key not in reads.writes[key][0][2]
        },
    }
