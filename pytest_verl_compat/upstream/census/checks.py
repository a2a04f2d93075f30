"""The census of upstream's checks: every ``raise`` and ``assert`` on the ``main_ppo`` V1 path.

Read from the installed verl's source with ``ast`` (nothing is imported): each statement with the
function it sits in, the condition that decides it (an assert's test, the ``if`` a raise sits
under) and what that condition reads:

- ``config``: a configuration value, by what the condition reads (``census_reads``: a field of a
  config object, a local or ``self`` attribute assigned from one, a parameter its callers pass
  one), never by its words;
- ``data``: no configuration value, and it names the batch or the model's tensors;
- ``internal``: no configuration value, upstream's own invariants (an abstract method, a type
  check of its own objects, a registration made twice);
- ``elsewhere``: in a function the V1 path never calls (the V0 trainer's helpers, an engine the
  tree cannot select), set by ``census_reasons.yaml`` with the evidence.

A label other than the reading's comes only from ``census_reasons.yaml``, with its reason.

Which ``config`` entries ``check`` evaluates is measured, not typed: ``coverage`` runs the probes
on a corpus of configurations in the oracle with a line tracer and marks an entry evaluated when
its deciding line ran. An entry not evaluated carries the reason from ``census_reasons.yaml``
(needs a GPU, vLLM, Megatron-Core, the network, the data), matched by file and function.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from pytest_verl_compat.releases.index import RELEASE_DATA
from pytest_verl_compat.upstream.census import call_binding as census_reads
from pytest_verl_compat.upstream.probes import statements

Depends = Literal["config", "data", "internal", "elsewhere"]

# The files of the main_ppo V1 path, relative to the installed ``verl`` package's parent; a
# ``::name`` suffix keeps only those top-level functions or classes of a file that is mostly
# another path's (ray_trainer.py is the V0 trainer; V1 imports apply_kl_penalty from it).
SCOPE = (
    "verl/trainer/main_ppo.py",
    "verl/trainer/ppo/v1/trainer_base.py",
    "verl/trainer/ppo/v1/trainer_sync.py",
    "verl/trainer/ppo/v1/replay_buffer.py",
    "verl/trainer/ppo/v1/utils.py",
    "verl/trainer/ppo/core_algos.py",
    "verl/trainer/ppo/reward.py",
    "verl/trainer/ppo/utils.py",
    "verl/trainer/ppo/ray_trainer.py::apply_kl_penalty",
    "verl/trainer/distillation/losses.py",
    # The trainer's own config dataclasses (AlgoConfig and its sections) and the profiler's
    # config: the probes build and run them (issue 29: the scope grows with what runs).
    "verl/trainer/config/*.py",
    "verl/utils/profiler/config.py",
    "verl/utils/config.py",
    "verl/utils/tensordict_utils.py::make_iterator",
    "verl/base_config.py",
    "verl/workers/engine_workers.py",
    "verl/workers/config/*.py",
    "verl/workers/engine/base.py",
    "verl/workers/engine/utils.py",
    "verl/workers/engine/fsdp/*.py",
    "verl/workers/engine/megatron/*.py",
    "verl/workers/utils/losses.py",
    "verl/workers/utils/padding.py",
    "verl/workers/rollout/base.py",
    "verl/workers/rollout/replica.py",
    "verl/experimental/reward_loop/reward_loop.py",
    "verl/experimental/reward_loop/reward_manager/registry.py",
    "verl/checkpoint_engine/base.py",
)

# Words of a condition that reads no configuration value and names the batch or the model's
# tensors (they sort ``data`` from ``internal``, never ``config`` from the rest).
_DATA_WORDS = (
    "shape",
    "numel",
    "torch.",
    "tensor",
    "logits",
    "mask",
    "batch",
    "micro_batch",
    "data[",
    "data.",
    "output",
    "loss_mat",
    "values",
    "rewards",
    "token",
    "seq",
    "len(data",
    "len(output",
    "indices",
    "offsets",
    "cursor",
    "routes",
    "snap",
    "local",
    "key in non_tensor_batch",
    "input_ids",
    "is_nested",
    "device_mesh",
    "in data",
)


@dataclass(frozen=True)
class Entry:
    """One raise or assert: where, in which function, what decides it, and on what."""

    file: str
    line: int
    function: str
    kind: Literal["assert", "raise"]
    statement: str
    condition: str
    depends: Depends
    # The lines whose running means the condition was evaluated: the assert, the guard's test,
    # or the guarded try body of an ``except … raise``.
    deciding: tuple[int, ...] = field(default=(), compare=False)
    # The configuration values the condition reads (``census_reads``), as source text.
    reads: tuple[str, ...] = field(default=(), compare=False)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def _in_scope(verl_parent: Path) -> Iterator[tuple[Path, str, tuple[str, ...]]]:
    for pattern in SCOPE:
        glob, _, names = pattern.partition("::")
        for path in sorted(verl_parent.glob(glob)):
            if path.suffix == ".py":
                yield (
                    path,
                    path.relative_to(verl_parent).as_posix(),
                    tuple(n for n in names.split(",") if n),
                )


def _top_level_name(source: statements.Source, node: ast.AST) -> str:
    names = [
        a.name
        for a in source.ancestors(node)
        if isinstance(a, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    ]
    return names[-1] if names else ""


def _lines_of(node: ast.AST) -> tuple[int, ...]:
    start = getattr(node, "lineno", 0)
    end = getattr(node, "end_lineno", None) or start
    return tuple(range(start, end + 1))


def _deciding(
    source: statements.Source, statement: ast.stmt
) -> tuple[ast.AST | None, tuple[int, ...]]:
    """The deciding condition (or the guarded try body) and the lines whose running means it was
    evaluated."""
    condition = statements.guard(source, statement)
    if isinstance(statement, ast.Assert):
        return condition, _lines_of(statement)
    if condition is not None:
        return condition, _lines_of(condition)
    for ancestor in source.ancestors(statement):
        if isinstance(ancestor, ast.ExceptHandler):
            try_node = source.parent(ancestor)
            if isinstance(try_node, ast.Try) and try_node.body:
                return try_node.body[0], _lines_of(try_node.body[0])
        if isinstance(ancestor, ast.FunctionDef | ast.AsyncFunctionDef):
            break
    return None, _lines_of(statement)


def _depends(
    source: statements.Source,
    statement: ast.stmt,
    condition: ast.AST | None,
    read: list[str],
) -> Depends:
    """What decides the statement (see the module's docstring): ``config`` when its condition
    reads a configuration value (``census_reads``); otherwise the batch's words tell ``data`` from
    ``internal``: they only ever sort the conditions that read no configuration."""
    if read:
        return "config"
    if condition is None:
        return "internal"  # an abstract method, a fallback that reads nothing of the config
    if ".decorator" in source.qualname(statement) or "register" in source.qualname(statement):
        return "internal"  # a registration, made when upstream's modules are imported
    texts = [ast.unparse(condition)]
    for lo, hi in statements.deciding_lines(source, statement.lineno)[statements.OWN_RANGES :]:
        texts.append(statements.text(source, [(lo, hi)]))
    return "data" if any(word in "\n".join(texts) for word in _DATA_WORDS) else "internal"


def _sources(verl_parent: Path) -> list[tuple[statements.Source, tuple[str, ...]]]:
    out = []
    for path, relative, names in _in_scope(verl_parent):
        source = statements.parse(str(path), relative)
        if source is not None:
            out.append((source, names))
    return out


def _config_class_sources(verl_parent: Path) -> list[statements.Source]:
    found = []
    for folder in census_reads.CONFIG_FOLDERS:
        for path in sorted((verl_parent / folder).glob("*.py")):
            source = statements.parse(str(path), path.relative_to(verl_parent).as_posix())
            if source is not None:
                found.append(source)
    return found


# Traced reads: ``verl/…py`` → line → the configuration keys the probes saw that line read.
Traced = Mapping[str, Mapping[int, list[str]]]


def traced_by_line(reads: Mapping[str, list[str]]) -> dict[str, dict[int, list[str]]]:
    """The read census's traced reads (leaf → ``verl/…py:line``) turned around, by file and line."""
    out: dict[str, dict[int, set[str]]] = {}
    for leaf, places in reads.items():
        for where in places:
            file, _, line = where.rpartition(":")
            out.setdefault(file, {}).setdefault(int(line), set()).add(leaf)
    return {f: {n: sorted(keys) for n, keys in lines.items()} for f, lines in out.items()}


def _traced_reads(source: statements.Source, node: ast.stmt, traced: Traced) -> list[str]:
    """The keys the probes saw read on the lines that decide ``node``'s outcome: a raise's guard
    or an assert's test, and the assignments they use (a raise's own line is its message)."""
    lines = traced.get(source.relative)
    if not lines:
        return []
    ranges = statements.deciding_lines(source, node.lineno)
    # deciding_lines gives the statement, then the ``if`` it sits under (an assert's: the one
    # that decides whether it runs at all, not its outcome), then the assignments.
    if isinstance(node, ast.Assert):
        ranges = ranges[:1] + ranges[2:]
    else:
        ranges = ranges[1:] if statements.guard(source, node) is not None else ranges[2:]
    keys: dict[str, None] = {}
    for lo, hi in ranges:
        for line in range(lo, hi + 1):
            keys.update(dict.fromkeys(lines.get(line, [])))
    return [f"traced: {key}" for key in keys]


def scan(
    verl_parent: Path, traced: Traced | None = None, reasons: Sequence[Reason] = ()
) -> list[Entry]:
    """Every raise and assert of the scope, in file and line order; ``traced``: the lines the
    probes saw read the configuration (``traced_by_line``), which make a condition ``config``
    besides what the reading of its source finds; ``reasons``: a function a reason labels
    ``config`` (its arguments come in a ``**kwargs`` dict) hands its parameters on as
    configuration (``ReplayBuffer.__init__``'s gen_batch_size, kept as ``self.gen_batch_size`` and
    checked in ``ReplayBuffer.sample``, verl/trainer/ppo/v1/replay_buffer.py:463)."""
    scoped = _sources(verl_parent)
    classes = census_reads.config_classes(_config_class_sources(verl_parent))

    def configured(file: str, function: str) -> str:
        rule = next(
            (r for r in reasons if r.depends == "config" and r.matches(file, function)), None
        )
        return "its arguments are configuration (census_reasons.yaml)" if rule else ""

    index = census_reads.build_index([source for source, _ in scoped], classes, configured)
    entries: list[Entry] = []
    for source, names in scoped:
        for node in source.nodes:
            if not isinstance(node, ast.Raise | ast.Assert):
                continue
            if names and _top_level_name(source, node) not in names:
                continue
            condition, deciding = _deciding(source, node)
            context = census_reads.context_of(source, source.function(node), index, classes)
            # An unconditional raise is decided by how it was reached: what its message names.
            read = census_reads.reads(condition if condition is not None else node, context)
            read += [r for r in _traced_reads(source, node, traced or {}) if r not in read]
            entries.append(
                Entry(
                    file=source.relative,
                    line=node.lineno,
                    function=source.qualname(node) or "<module>",
                    kind="assert" if isinstance(node, ast.Assert) else "raise",
                    statement=" ".join(source.lines[node.lineno - 1].split()),
                    condition=" ".join(ast.unparse(condition).split())
                    if condition is not None
                    else "",
                    depends=_depends(source, node, condition, read),
                    deciding=deciding,
                    reads=tuple(read),
                )
            )
    return sorted(entries, key=lambda e: (e.file, e.line))


@dataclass(frozen=True)
class Reason:
    """Why the probes cannot evaluate the entries of one file and function pattern; with
    ``depends``, the label of those entries where the reading of the source cannot tell it, and
    why."""

    file: str
    function: str
    reason: str
    depends: Depends | None = None

    def covers(self, entry: Entry) -> bool:
        return self.matches(entry.file, entry.function)

    def matches(self, file: str, function: str) -> bool:
        return fnmatch.fnmatchcase(file, self.file) and fnmatch.fnmatchcase(function, self.function)


REASONS_NAME = "census_reasons.yaml"


def reasons_file(version: str) -> Path:
    """A release's reasons (``data/releases/<version>/census_reasons.yaml``): written by a person
    for what the reading of the source cannot decide, each naming that release's lines."""
    return RELEASE_DATA / version / REASONS_NAME


def load_reasons(version: str, path: Path | None = None) -> list[Reason]:
    path = path or reasons_file(version)
    if not path.is_file():
        return []
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    return [
        Reason(str(r["file"]), str(r["function"]), str(r["reason"]), r.get("depends")) for r in raw
    ]


def reason_for(entry: Entry, reasons: Iterable[Reason]) -> str:
    return next((r.reason for r in reasons if r.covers(entry)), "")


def relabel_reason(entry: Entry, reasons: Iterable[Reason]) -> str:
    """The written reason behind an entry's label, when a reason's ``depends`` set it."""
    rule = next((r for r in reasons if r.covers(entry)), None)
    return rule.reason if rule is not None and rule.depends is not None else ""


def settled(entries: Iterable[Entry], reasons: list[Reason]) -> list[Entry]:
    """The entries with the reasons' reclassifications applied (``depends`` in the data file)."""
    out = []
    for entry in entries:
        rule = next((r for r in reasons if r.covers(entry)), None)
        if rule is not None and rule.depends is not None and rule.depends != entry.depends:
            entry = dataclasses.replace(entry, depends=rule.depends)
        out.append(entry)
    return out


def watched_lines(entries: Iterable[Entry]) -> dict[str, list[int]]:
    """The deciding lines of every entry, by file: what the coverage run traces."""
    lines: dict[str, set[int]] = {}
    for entry in entries:
        lines.setdefault(entry.file, set()).update(entry.deciding)
    return {file: sorted(numbers) for file, numbers in sorted(lines.items())}


def evaluated(entries: Iterable[Entry], ran: dict[str, set[int]]) -> set[str]:
    """The entries (by ``where``) whose deciding lines ran."""
    return {entry.where for entry in entries if set(entry.deciding) & ran.get(entry.file, set())}


def summary(
    entries: list[Entry], ran: dict[str, set[int]], reasons: list[Reason]
) -> dict[str, Any]:
    """Counts by what an entry depends on, and how many configuration entries are evaluated."""
    done = evaluated(entries, ran)
    config = [e for e in entries if e.depends == "config"]
    unexplained = [e.where for e in config if e.where not in done and not reason_for(e, reasons)]
    return {
        "entries": len(entries),
        "config": len(config),
        "data": sum(1 for e in entries if e.depends == "data"),
        "internal": sum(1 for e in entries if e.depends == "internal"),
        "elsewhere": sum(1 for e in entries if e.depends == "elsewhere"),
        "config_evaluated": sum(1 for e in config if e.where in done),
        "unexplained": unexplained,
    }
