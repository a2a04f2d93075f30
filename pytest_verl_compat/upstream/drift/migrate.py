"""Migrate a launch script from one release to another, only where upstream gives evidence.

For each key the script sets, a move (``evidence``) with evidence names its successor when
the target release lacks the key or ignores it; the override is then rewritten at the source text
that builds it (``pipeline.script_edits``), the ``+`` prefix following whether the target's tree
has the new key. A key the target lacks with no evidence of a successor is reported as removed,
with the source tree's line that defined it, and left as it is. Every edit is verified: the
migrated script is read again (the argv changes exactly in the edited fields), composed on the
target release, and the resolved value of every key the user set compared with its value on the
source release. Values that differ for a key no edit touched are listed: the release itself
changed them.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_verl_compat.bash import LaunchReadError, read_launch
from pytest_verl_compat.checks.fields import field_key
from pytest_verl_compat.files.safe_input import BoundedLoader, InputError, read_text
from pytest_verl_compat.model import Case, Composition
from pytest_verl_compat.pipeline.compile import compile_resolved
from pytest_verl_compat.pipeline.compose import Composer, split_hydra_argv
from pytest_verl_compat.pipeline.profile import load_profile
from pytest_verl_compat.pipeline.script_edits import FieldEdit, locate_edits, verify_edits
from pytest_verl_compat.releases.index import ReleaseError, ReleaseIndex, load_release_index
from pytest_verl_compat.releases.wheels import release_tree
from pytest_verl_compat.upstream.drift.evidence import (
    DEPRECATION_MESSAGE,
    MOVED_MOUNT,
    Move,
    MoveContext,
    moves_between,
)
from pytest_verl_compat.upstream.drift.matrix import (
    ExplicitKey,
    canonical,
    explicit_keys,
    lookup,
    selection,
)

if TYPE_CHECKING:
    from pytest_verl_compat.pipeline.audit import AuditSession


class MigrateError(Exception):
    """The migration cannot run: the script is unreadable, a release unknown or unfetchable."""


@dataclass(frozen=True)
class Migration:
    """The report (plain JSON data) and, when there are edits, the migrated text."""

    report: dict[str, Any]
    original: str
    migrated: str | None

    def diff(self, label: str) -> str:
        if self.migrated is None:
            return ""
        return "".join(
            difflib.unified_diff(
                self.original.splitlines(keepends=True),
                self.migrated.splitlines(keepends=True),
                fromfile=f"a/{label}",
                tofile=f"b/{label}",
            )
        )

    @property
    def blocked(self) -> bool:
        """A key still blocks the script on the target release, or an edit failed its check."""
        report = self.report
        return bool(
            report["blocked"]
            or not report["target"]["composed"]
            or any(not edit["verified"] for edit in report["edits"])
        )


def _composition_json(composition: Composition) -> dict[str, Any]:
    return {"composed": composition.composed, "reason": composition.reason}


def _yaml_key_line(path: Path, key: str) -> int | None:
    """The line of a dotted key in a YAML file (the source tree's generated full config)."""
    import yaml

    try:
        node = yaml.compose(read_text(path, what="config file"), Loader=BoundedLoader)
    except (InputError, yaml.YAMLError, RecursionError):
        return None
    for part in key.split("."):
        if not isinstance(node, yaml.MappingNode):
            return None
        match = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
        if match is None:
            return None
        line = int(next(k for k, v in node.value if v is match).start_mark.line) + 1
        node = match
    return line


def _removal_evidence(key: str, sides: _Sides) -> str:
    generated = f"{sides.config_dir}/_generated_{sides.config_name}.yaml"
    line = _yaml_key_line(sides.source_root / generated, key)
    where = (
        f"{generated}:{line} in {sides.source}'s wheel" if line else f"verl {sides.source}'s tree"
    )
    return (
        f"`{key}` is in {where} and not in verl {sides.target}'s tree; no migration function, "
        "deprecation message or subtree with equal defaults names a successor"
    )


class _Releases:
    """The source and target releases' composers and base compositions."""

    def __init__(self, session: AuditSession, index: ReleaseIndex, versions: Sequence[str]) -> None:
        self.session = session
        self.trees = {version: release_tree(version, index=index) for version in versions}
        self.composers: dict[str, Composer] = {}

    def composer(self, version: str) -> Composer:
        if version not in self.composers:
            if version == self.session.pin.version and self.session.upstream is not None:
                self.composers[version] = self.session.composer()
            else:
                tree = self.trees[version]
                self.composers[version] = Composer(tree.config_dir, self.session.pin.config_name)
        return self.composers[version]


def _move_for(
    item: ExplicitKey, moves: Sequence[Move], in_target: bool
) -> tuple[Move | None, Move | None]:
    """(the move that applies, a deprecation the target still honours) for one key."""
    applies = None
    honoured = None
    for move in moves:
        if move.successor(item.key) is None:
            continue
        if move.ignored_by_target or not in_target:
            applies = applies or move
        elif move.kind == DEPRECATION_MESSAGE:
            honoured = honoured or move
    return applies, honoured


@dataclass
class _Plan:
    """What to edit, and what blocks or needs saying, before any edit is placed."""

    edits: list[FieldEdit] = field(default_factory=list)
    planned: dict[int, dict[str, Any]] = field(default_factory=dict)
    blocked: list[dict[str, Any]] = field(default_factory=list)
    # Keys the source has and the target's tree lacks: they block only if the target rejects
    # the script (an open mapping such as engine_kwargs.sglang takes new keys in any release).
    removed: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Sides:
    """The script's argv composed on the source release, and both releases' selected bases."""

    source: str
    target: str
    argv: tuple[str, ...]
    before: Composition
    source_base: Composition
    target_base: Composition
    source_root: Path
    config_dir: str
    config_name: str


def _plan(sides: _Sides, moves: list[Move], notes: list[str]) -> _Plan:
    """For each key the script sets: the move with evidence that applies, or why none does."""
    plan = _Plan(notes=list(notes))
    keys = explicit_keys(sides.argv)
    set_keys = {item.key for item in keys}
    before, target_base = sides.before, sides.target_base.mapping
    for item in keys:
        if item.group or item.prefix.startswith("~"):
            continue
        in_target = lookup(target_base, item.key)[0]
        move, honoured = _move_for(item, moves, in_target)
        field_ = sides.argv[item.index]
        if move is None:
            if honoured is not None:
                plan.notes.append(
                    f"`{item.key}` is deprecated in verl {sides.target}, which still reads it: "
                    f"{honoured.evidence}"
                )
            elif (
                not in_target
                and not item.prefix.startswith("+")
                and (lookup(sides.source_base.mapping, item.key)[0] or _has(before, item.key))
            ):
                plan.removed.append(
                    {
                        "key": item.key,
                        "field": field_,
                        "why": "removed",
                        "evidence": _removal_evidence(item.key, sides),
                    }
                )
            continue
        successor = move.successor(item.key)
        assert successor is not None
        if move.kind == MOVED_MOUNT and not lookup(target_base, successor)[0]:
            # the section moved, but its new config has no such key (0.7's fsdp_config.grad_offload)
            plan.removed.append(
                {
                    "key": item.key,
                    "field": field_,
                    "why": "removed",
                    "evidence": f"{move.evidence}; `{successor}` is not in verl {sides.target}'s tree",
                }
            )
            continue
        unset = [
            k
            for k in move.required_keys(item.key)
            if before.composed and lookup(before.mapping, k)[1] is None
        ]
        if unset:
            plan.notes.append(
                f"`{field_}` had no effect on verl {sides.source} either ({', '.join(unset)} "
                f"unset: {move.evidence}); left as it is"
            )
            continue
        if successor in set_keys:
            plan.blocked.append(
                {
                    "key": item.key,
                    "field": field_,
                    "why": f"its successor `{successor}` is set too; decide which value to keep",
                    "evidence": move.evidence,
                }
            )
            continue
        # `+` adds a key the target's tree lacks; `++` works either way and is kept.
        if item.prefix == "++":
            prefix = "++"
        else:
            prefix = "" if lookup(target_base, successor)[0] else "+"
        edit = FieldEdit(item.index, item.prefix + item.key, prefix + successor)
        plan.edits.append(edit)
        plan.planned[item.index] = {
            "key": item.key,
            "new_key": successor,
            "field": field_,
            "migrated": edit.apply(field_),
            "kind": move.kind,
            "evidence": move.evidence,
        }
    return plan


def _place(
    plan: _Plan, path: Path, text: str, bindings: Any, argv: tuple[str, ...]
) -> tuple[str | None, tuple[str, ...], dict[int, int]]:
    """Locate and apply the planned edits: (migrated text, its argv, line of each edit)."""
    located = locate_edits(path, text, bindings, argv, plan.edits)
    for index, lines in sorted(located.unedited.items()):
        plan.notes.append(
            f"`{plan.planned[index]['key']}` is also written on line(s) "
            f"{', '.join(map(str, lines))}, where editing it does not change the argv (a "
            "comment, or a branch these bindings do not take): not edited"
        )
    failures = dict(located.failures)
    verified = (
        verify_edits(path, text, bindings, argv, plan.edits, located) if located.edits else None
    )
    if located.edits and verified is None:
        # Each edit alone changes only its field; together they change more: none is made.
        for index in located.edits:
            failures[index] = "the edits together change more than their fields; edit by hand"
    for index, why in sorted(failures.items()):
        entry = plan.planned.pop(index)
        plan.blocked.append(
            {
                "key": entry["key"],
                "field": entry["field"],
                "why": why,
                "evidence": entry["evidence"],
            }
        )
    if verified is None:
        return None, argv, {}
    return verified[0], verified[1], {i: e.line for i, e in located.edits.items()}


def migrate_script(
    session: AuditSession,
    case: Case,
    source: str,
    target: str,
    *,
    index: ReleaseIndex | None = None,
) -> Migration:
    """Plan, locate, apply (in memory) and verify the migration of one launch script."""
    index = index or load_release_index()
    for version in (source, target):
        try:
            index.release(version)
        except ReleaseError as exc:
            raise MigrateError(str(exc)) from exc
    assert case.launch is not None
    path = Path(case.launch)
    bindings = case.bindings
    try:
        text = read_text(path, what="launch script")
        argv = read_launch(path, bindings, text=text).argv
    except (InputError, LaunchReadError) as exc:
        raise MigrateError(str(exc)) from exc
    releases = _Releases(session, index, (source, target))
    variables = bindings.variables
    flags = _selecting(argv, releases.composer(source), releases.composer(target))
    source_base = releases.composer(source).compose(flags, variables)
    target_base = releases.composer(target).compose(flags, variables)
    if not source_base.composed or not target_base.composed:
        failed = source_base if not source_base.composed else target_base
        raise MigrateError(
            f"{path}: the config its Hydra flags select does not compose: {failed.reason}"
        )
    sides = _Sides(
        source,
        target,
        argv,
        releases.composer(source).compose(argv, variables),
        source_base,
        target_base,
        releases.trees[source].root,
        index.config_dir,
        (split_hydra_argv(argv).config_name or session.pin.config_name).removesuffix(".yaml"),
    )
    context = MoveContext(
        index.release(source),
        index.release(target),
        source_base.mapping,
        target_base.mapping,
        index,
        session.release_files().root,
        session.pin.version,
    )
    if any(
        not item.group and not lookup(target_base.mapping, item.key)[0]
        for item in explicit_keys(argv)
    ):  # a key left the target's tree: where each tree mounts its configs may say where to
        context.source_mounts = releases.composer(source).config_mounts(flags)
        context.target_mounts = releases.composer(target).config_mounts(flags)
    moves = moves_between(context)
    plan = _plan(sides, moves, context.notes)
    migrated_text, new_argv, lines = _place(plan, path, text, bindings, argv)
    after = releases.composer(target).compose(new_argv, variables)
    report = _report(sides, plan, after, lines)
    report["script"] = str(path)
    if target == session.pin.version:
        report["findings"] = {
            "before": _errors(
                session, case, releases.composer(target).compose(argv, variables), argv
            ),
            "after": _errors(session, case, after, new_argv),
        }
    return Migration(report, text, migrated_text)


def _report(
    sides: _Sides, plan: _Plan, after: Composition, lines: dict[int, int]
) -> dict[str, Any]:
    """The verification: every edit's value on both sides, every other key's, what blocks."""
    before = sides.before
    blocked = plan.blocked if after.composed else plan.removed + plan.blocked
    if not after.composed and not blocked:
        # Nothing moved explains it: Hydra's own reason (the key it names) is what blocks.
        also = (
            f", as does {sides.source}'s, where the script was written"
            if not before.composed
            else ""
        )
        blocked.append(
            {
                "key": _quoted_key(after.reason),
                "field": "",
                "why": f"verl {sides.target}'s tree rejects it{also}; no key of it moved",
                "evidence": f"Hydra: {after.reason.strip().splitlines()[0]}",
            }
        )
    edits = []
    for index, entry in sorted(plan.planned.items()):
        entry["line"] = lines[index]
        entry["verified"] = _same_value(before, entry["key"], after, entry["new_key"])
        entry["value"] = _value(before, entry["key"])
        edits.append(entry)
    renamed = {entry["key"] for entry in edits}
    changed = []
    for item in explicit_keys(sides.argv):
        if item.group or item.key in renamed or not (before.composed and after.composed):
            continue
        old, new = _value(before, item.key), _value(after, item.key)
        if old != new:
            changed.append({"key": item.key, "from": old, "to": new})
    return {
        "from": sides.source,
        "to": sides.target,
        "source": _composition_json(before),
        "target": _composition_json(after),
        "edits": edits,
        "blocked": blocked,
        "changed_by_release": changed,
        "notes": plan.notes,
    }


def _selecting(argv: Sequence[str], *composers: Composer) -> list[str]:
    """The fields that pick the config (``selection``), less a top-level key that names no
    config group of either tree (a fork's ``max_turns=2``): a value, which the base would
    refuse, not a selection."""
    overrides = set(split_hydra_argv(argv).overrides)
    return [
        field
        for field in selection(argv)
        if field not in overrides
        or any(
            composer.is_group(field_key(field).split("@")[0].split("/")[0])
            for composer in composers
        )
    ]


def _value(composition: Composition, key: str) -> str | None:
    if not composition.composed:
        return None
    found, value = lookup(composition.mapping, key)
    return canonical(value) if found else None


def _quoted_key(reason: str) -> str:
    """The first quoted key of a Hydra message (``Could not override 'a.b'``, a top-level
    ``'max_turns'``)."""
    match = re.search(r"'([A-Za-z_][\w\-]*(?:\.[\w\-]+)*)'", reason)
    return match.group(1) if match else ""


def _has(composition: Composition, key: str) -> bool:
    return composition.composed and lookup(composition.mapping, key)[0]


def _same_value(before: Composition, old: str, after: Composition, new: str) -> bool:
    return after.composed and before.composed and _value(before, old) == _value(after, new)


def _errors(
    session: AuditSession, case: Case, composition: Composition, argv: Sequence[str]
) -> list[str]:
    """The error findings of the pinned release's static checks (no upstream process)."""
    if not composition.composed:
        return [f"ERROR <composition>: {composition.reason.splitlines()[0]}"]
    report = compile_resolved(
        composition.mapping,
        case_id=case.id,
        profile=load_profile(session.profile_name),
        explicit_fields=tuple(argv),
    )
    return [f.line() for f in report.findings if f.level == "error"]


def render_lines(report: Mapping[str, Any]) -> list[str]:
    """The migration, one message per line, for stderr."""
    lines = [
        f"{report['script']}: verl {report['from']} → {report['to']}: {len(report['edits'])} "
        f"edit(s), {len(report['blocked'])} key(s) blocking"
    ]
    if not report["source"]["composed"]:
        lines.append(
            f"  verl {report['from']} does not compose it either: {report['source']['reason'].splitlines()[0]}"
        )
    evidence: dict[str, int] = {}
    for edit in report["edits"]:
        number = evidence.setdefault(f"{edit['kind']}: {edit['evidence']}", len(evidence) + 1)
        check = (
            f"verified: {edit['value']} on both"
            if edit["verified"]
            else "NOT verified: the value differs"
        )
        lines.append(
            f"  line {edit['line']}: `{edit['key']}` → `{edit['new_key']}` ({check}) [{number}]"
        )
    lines += [f"  [{number}] {text}" for text, number in evidence.items()]
    for item in report["blocked"]:
        what = f"`{item['field']}`" if item["field"] else f"`{item['key']}`"
        lines.append(f"  blocks: {what}: {item['why']}: {item['evidence']}")
    for item in report["changed_by_release"]:
        lines.append(
            f"  changed by the release: `{item['key']}`: {item['from']} on {report['from']}, "
            f"{item['to']} on {report['to']}"
        )
    for note in report["notes"]:
        lines.append(f"  note: {note}")
    target = report["target"]
    if target["composed"]:
        lines.append(f"  verl {report['to']} composes the migrated script")
    else:
        lines.append(
            f"  verl {report['to']} rejects the migrated script: {target['reason'].splitlines()[0]}"
        )
    findings = report.get("findings")
    if findings is not None:
        lines.append(
            f"  errors of `check` (static) on {report['to']}: {len(findings['before'])} before, "
            f"{len(findings['after'])} after"
        )
    return lines
