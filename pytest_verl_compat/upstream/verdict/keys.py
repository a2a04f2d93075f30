"""Every key the script sets, answered: it acts here, it has no effect here, or it is undecided.

``check`` and ``explain`` answer each explicit key by this one function (``answer_keys``), from
what the case's own verdict holds:

- **no effect**: a finding of a no-effect rule names the key (``NO_EFFECT_RULES``: the read
  index's ``effect.off-path`` and ``effect.forced``, the probes' ``effect.never-read``,
  ``effect.overridden`` and ``effect.forced``, and the static rules that say a value never reaches
  its reader). Each is a warning that names the key as the script wrote it, with its line, and
  says why, citing the upstream lines.
- **acts**: the probes read it on this configuration (``records.path_of_run``: the verl lines,
  through an interpolated copy too); or a place of the read index whose guard holds on these
  values lies in a method of a class the probes built for the key's section (they read that
  section there: ``FSDPEngine._build_fsdp_module`` reads ``reshard_after_forward`` for the actor
  when the actor's engine is an FSDP engine); or it is a config group's choice (Hydra composes by
  it).
- **undecided**: neither, with what keeps it so (places the probes did not run, a name read on
  an object of unknown section, a key no index holds). Counted and listed, never a finding.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_verl_compat.checks import off_path
from pytest_verl_compat.checks.fields import field_key
from pytest_verl_compat.model import Finding
from pytest_verl_compat.upstream.census import static_reads
from pytest_verl_compat.upstream.census.call_binding import attribute_chain
from pytest_verl_compat.upstream.probes import statements
from pytest_verl_compat.upstream.probes.records import (
    KEY_BUILT,
    KEY_OVERWRITTEN,
    KEY_READ_AT,
    KEY_READ_BEFORE,
    KEY_VALUE,
    KEY_WHERE,
)

ACTS = "acts"
NO_EFFECT = "no effect"
UNDECIDED = "undecided"
ANSWERS = (ACTS, NO_EFFECT, UNDECIDED)

# The rules whose finding says the key it names has no effect on this configuration.
NO_EFFECT_RULES = frozenset(
    {
        "effect.off-path",
        "effect.forced",
        "effect.never-read",
        "effect.overridden",
        "fields.no-effect",
        "fields.legacy-reward-key",
        "entry.forced-value",
        "critic.batch-settings-ignored",
        "critic.sequence-parallel-ignored",
        "effect.no-critic-worker",
        "effect.no-reference-worker",
        "filter-groups.max-num-gen-batches-ignored",
        "rollout.vllm-false-flag-dropped",
        "sft.other-entry-key",
        "sft.world-from-torchrun",
        "run.no-effect",
    }
)
# Places named in an answer (the rest counted).
SHOWN = 3


@dataclass(frozen=True)
class KeyAnswer:
    """One explicit key's answer: ``acts``, ``no effect`` or ``undecided``, and why."""

    key: str
    field: str  # as the script wrote it
    answer: str
    why: str
    where: tuple[str, ...] = ()  # upstream lines (verl/…py:line) the answer stands on
    rule: str = ""  # the no-effect finding's rule

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "answer": self.answer, "why": self.why}
        if self.where:
            out["where"] = list(self.where)
        if self.rule:
            out["rule"] = self.rule
        return out


@dataclass(frozen=True)
class PathFacts:
    """What the probes saw of this configuration's path (``EarlyAnswer.path``), or nothing."""

    read_at: Mapping[str, Sequence[str]]  # key → verl lines that read it here
    built: Mapping[str, Sequence[str]]  # section → verl classes whose methods read it here

    @classmethod
    def of(cls, path: Mapping[str, Any] | None) -> PathFacts:
        path = path or {}
        return cls(dict(path.get(KEY_READ_AT) or {}), dict(path.get(KEY_BUILT) or {}))


def _copies_of(sources: Mapping[str, str]) -> dict[str, list[str]]:
    """Key → the leaves the tree interpolates from it (transitively)."""
    direct: dict[str, list[str]] = {}
    for copy, source in sorted(sources.items()):
        direct.setdefault(source, []).append(copy)
    out: dict[str, list[str]] = {}
    for key in direct:
        seen, todo = [], list(direct[key])
        while todo:
            copy = todo.pop(0)
            if copy not in seen:
                seen.append(copy)
                todo.extend(direct.get(copy, []))
        out[key] = seen
    return out


def _traced(key: str, facts: PathFacts, copies: Mapping[str, list[str]]) -> tuple[str, ...]:
    """The verl lines the probes read ``key`` (or a copy the tree makes of it) at, here."""
    found: list[str] = []
    for name in (key, *copies.get(key, [])):
        found += [w for w in facts.read_at.get(name, ()) if w not in found]
    return tuple(found)


def _static_acts(
    key: str, item: off_path.LeafReads, leaves: Mapping[str, Any], facts: PathFacts
) -> tuple[off_path.Place, dict[str, Any]] | None:
    """A place of the index whose guard holds here, in a method of a class the probes built for
    the key's section (its methods read that section on this configuration)."""
    section = key.rpartition(".")[0]
    built = set(facts.built.get(section, ()))
    if not built:
        return None
    for place in item.places:
        if not place.cls or place.cls not in built:
            continue
        read = off_path.holds(place, leaves)
        if read is not None:
            return place, read
    return None


def _undecided_why(item: off_path.LeafReads | None, entry_module: str | None) -> str:
    if item is None:
        if entry_module not in (None, MAIN_ENTRY):
            return (
                f"the read census covers main_ppo's tree; {entry_module}'s probes did not read it"
            )
        return "no place of the read census reads it, and the probes did not read it here"
    places = [p.where for p in item.places]
    shown = ", ".join(places[:SHOWN]) + (
        f" and {len(places) - SHOWN} more" if len(places) > SHOWN else ""
    )
    if not places:
        return "its name is read only on objects whose section the reading cannot tell"
    if item.complete:
        return f"read at {shown}; the probes did not run them here and their guards are not decided"
    return (
        f"read at {shown}, which the probes did not run here, and its name is used where the "
        "reading cannot tell the section"
    )


MAIN_ENTRY = "verl.trainer.main_ppo"


def answer_keys(
    explicit_fields: Sequence[str],
    resolved: Mapping[str, Any],
    findings: Iterable[Finding],
    version: str,
    *,
    path: Mapping[str, Any] | None = None,
    interpolations: Mapping[str, str] | None = None,
    groups: Iterable[str] = (),
    entry_module: str | None = None,
) -> list[KeyAnswer]:
    """Each explicit key's answer, once per key, in the order the script sets them.

    ``findings``: the case's (the no-effect rules among them decide); ``path``: the probes'
    ``EarlyAnswer.path`` (None: upstream's checks were not asked); ``interpolations``: copy →
    the key it interpolates (``Composer.interpolation_sources``); ``groups``: the config groups
    a field may choose; ``entry_module``: the launch's (the read index is main_ppo's)."""
    no_effect: dict[str, Finding] = {}
    for finding in findings:
        # An error too: a legacy reward key main_ppo silently ignores is one
        # (fields.legacy-reward-key); a note (info) claims nothing.
        if finding.check in NO_EFFECT_RULES and finding.level in ("warning", "error"):
            for key in finding.keys:
                no_effect.setdefault(key, finding)
    facts = PathFacts.of(path)
    copies = _copies_of(interpolations or {})
    main = entry_module in (None, MAIN_ENTRY)
    index = off_path.read_index(version).leaves if main else {}
    leaves = off_path.flat(resolved)
    group_names = set(groups)
    out: list[KeyAnswer] = []
    seen: set[str] = set()
    for field in explicit_fields:
        key = field_key(field)
        if key in seen:
            continue
        seen.add(key)
        out.append(
            _answer(key, field, no_effect, facts, copies, index, leaves, group_names, entry_module)
        )
    return out


def _answer(
    key: str,
    field: str,
    no_effect: Mapping[str, Finding],
    facts: PathFacts,
    copies: Mapping[str, list[str]],
    index: Mapping[str, off_path.LeafReads],
    leaves: Mapping[str, Any],
    groups: set[str],
    entry_module: str | None,
) -> KeyAnswer:
    if key in no_effect:
        finding = no_effect[key]
        return KeyAnswer(key, field, NO_EFFECT, finding.message, (), finding.check)
    if key in groups:
        return KeyAnswer(
            key, field, ACTS, "a config group's choice: Hydra composes the files it selects"
        )
    traced = _traced(key, facts, copies)
    if traced:
        return KeyAnswer(key, field, ACTS, "the probes read it on this configuration", traced)
    item = index.get(key)
    if item is not None:
        found = _static_acts(key, item, leaves, facts)
        if found is not None:
            place, read = found
            because = ", ".join(f"{k}={v!r}" for k, v in sorted(read.items()))
            cls = place.cls.rpartition(".")[2]
            return KeyAnswer(
                key,
                field,
                ACTS,
                f"read by {cls}, which the probes built for {key.rpartition('.')[0]} here"
                + (f", where {because} selects that read" if because else ""),
                (place.where,),
            )
    return KeyAnswer(key, field, UNDECIDED, _undecided_why(item, entry_module))


def counts(answers: Iterable[KeyAnswer]) -> dict[str, int]:
    out = dict.fromkeys(ANSWERS, 0)
    for answer in answers:
        out[answer.answer] += 1
    return out


# --- values upstream overwrote while the probes ran ---------------------------------------------

FORCED_RULE = "effect.forced"


def without_contradicted(
    findings: Iterable[Finding],
    path: Mapping[str, Any] | None,
    user_keys: Any,
) -> list[Finding]:
    """``findings`` without a static off-path claim on a key the probes saw read on this very
    configuration (directly, or through a copy the tree makes of it): the reading's guards are
    wrong there, the run is right. ``user_keys``: keys to the keys the script set them by."""
    facts = PathFacts.of(path)
    if not facts.read_at:
        return list(findings)
    read = set(user_keys(facts.read_at))
    return [f for f in findings if not (f.check == "effect.off-path" and set(f.keys) & read)]


def _harmless_before(source: Any, write: ast.stmt, line: int) -> bool:
    """Whether the read at ``line`` before ``write`` only decides what upstream says about it:
    inside the ``if`` block that holds the write, assigning a local that only ``if`` tests over
    logging (expression statements) and expression statements use (``user_gen_batch_size``,
    verl/trainer/ppo/v1/trainer_base.py:678-684)."""
    statement = source.statement_at(line)
    if statement is None or source.function(statement) is not source.function(write):
        return False
    block = next((a for a in source.ancestors(write) if isinstance(a, ast.If)), None)
    if block is None or statement not in list(ast.walk(block)) or line > write.lineno:
        return False
    if not (
        isinstance(statement, ast.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0], ast.Name)
    ):
        return False
    name = statement.targets[0].id
    for node in ast.walk(source.function(write)):
        if not (isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load)):
            continue
        holder = next(
            (a for a in source.ancestors(node) if isinstance(a, ast.If | ast.Expr | ast.stmt)),
            None,
        )
        if isinstance(holder, ast.Expr):
            continue
        if isinstance(holder, ast.If) and _only_says(holder):
            continue
        return False
    return True


def _only_says(node: ast.If) -> bool:
    """An ``if`` whose branches only evaluate expressions (a log call) or more such ``if``s."""
    for statement in [*node.body, *node.orelse]:
        if isinstance(statement, ast.If):
            if not _only_says(statement):
                return False
        elif not isinstance(statement, ast.Expr):
            return False
    return True


def _writes_the_tree(statement: ast.stmt) -> bool:
    """A write to the tree itself (``self.config.data.gen_batch_size = 1``): every later read of
    the key, on the tree or on a dataclass built after, gets upstream's value."""
    targets = statement.targets if isinstance(statement, ast.Assign) else []
    for target in targets:
        chain = attribute_chain(target)
        if chain and (chain[0] in ("config", "cfg") or chain[:2] == ["self", "config"]):
            return True
    return False


def path_findings(
    path: Mapping[str, Any] | None,
    fields: Sequence[str],
    version: str,
    root: Callable[[], Path],
) -> list[Finding]:
    """An ``effect.forced`` warning for each explicit key upstream's code overwrote, as the
    probes saw it, before any read of the script's value but those that only decide what it
    logs: the write is to the tree itself (so every later reader sees upstream's value), its
    value is not the key's own, and each earlier read is harmless (``_harmless_before``).
    ``root()``: the release's files, asked for only when a key was overwritten."""
    overwritten = dict((path or {}).get(KEY_OVERWRITTEN) or {})
    out: list[Finding] = []
    for field in fields:
        key = field_key(field)
        record = overwritten.pop(key, None)
        if record is None or field.startswith("~"):
            continue
        where = str(record[KEY_WHERE])
        relative, _, line = where.rpartition(":")
        source = statements.parse(str(root() / relative), relative)
        write = source.statement_at(int(line)) if source and line.isdigit() else None
        if source is None or write is None or not _writes_the_tree(write):
            continue
        before = [str(w) for w in record.get(KEY_READ_BEFORE) or []]
        if not all(
            w.rpartition(":")[0] == relative
            and w.rpartition(":")[2].isdigit()
            and _harmless_before(source, write, int(w.rpartition(":")[2]))
            for w in before
        ):
            continue
        guard = static_reads.guard(source, write)
        when = f" (under `{guard.split(' ∧ ')[0]}`)" if guard else ""
        out.append(
            Finding(
                "warning",
                key,
                f"`{field}` has no effect here: verl {version} sets {key} = "
                f"{record[KEY_VALUE]} at {where}{when} before its code uses the script's value "
                "(seen running that code on this configuration)",
                "remove it, or change the setting that makes upstream overwrite it",
                evidence=f"{where} writes the key on the configuration tree"
                + (f"; read before only to report it ({', '.join(before)})" if before else ""),
                check=FORCED_RULE,
            )
        )
    return out
