"""Release matrix: each script's explicit fields on every release, a verdict where supported.

A cell is one script on one release. On a supported release it is the full verdict of
``verl-compat check`` on that release (kind ``check``: valid for verl, with its findings, upstream's
own checks run in that release's own environment, each finding citing that release's lines); on
any other release it is whether Hydra composes the fields on that release's tree, with Hydra's
reason when not (kind ``compose``: the tree is data, its ``_target_`` values are never
instantiated, no code of that release runs). Each script also lists the keys it sets whose
resolved value is not the same on every release: a key the tree does not have, a default an
interpolation pulls in, a type the release coerces.

The fields are read once, with the session's bindings, so every difference comes from the
releases alone. ``pinned``: the session's own release (the one ``check`` would check).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hydra.errors import OverrideParseException

from pytest_verl_compat.model import Case, Composition, StageFailed, StageUnavailable
from pytest_verl_compat.pipeline.compose import Composer, split_hydra_argv
from pytest_verl_compat.pipeline.hydra_internals import parse_override
from pytest_verl_compat.releases.index import ReleaseError, ReleaseIndex, load_release_index
from pytest_verl_compat.releases.wheels import release_tree
from pytest_verl_compat.upstream.drift.cells import CellCache, cell_key
from pytest_verl_compat.upstream.verdict.case import PinnedVerdict, pinned_verdicts

if TYPE_CHECKING:
    from pytest_verl_compat.pipeline.audit import AuditSession

CHECK = "check"
COMPOSE = "compose"
# A key the release's tree does not have (and the field does not add with `+`).
NOT_IN_TREE = "(not in tree)"
# What a cell's kind means, for the report's readers.
KIND_NOTES = {
    CHECK: "the full verdict of `verl-compat check` on a supported release (its own code, in its "
    "own environment)",
    COMPOSE: "Hydra's composition of the release's config tree only (data: no code of that "
    "release runs)",
}


class MatrixError(Exception):
    """The matrix cannot run: an unknown release, a tree that cannot be fetched."""


@dataclass(frozen=True)
class ExplicitKey:
    """A key an override sets: its dotted key, its prefix (``+``, ``++``, ``~``), its position."""

    key: str
    prefix: str
    index: int
    group: bool  # a config-group selection (``model_engine=megatron``), not a value


def selection(fields: Sequence[str]) -> list[str]:
    """The fields that pick the config rather than set values in it: Hydra's own flags and the
    overrides of a top-level key (``model_engine=megatron`` selects a config group)."""
    overrides = set(split_hydra_argv(fields).overrides)
    return [
        field for field in fields if field not in overrides or "." not in field.split("=", 1)[0]
    ]


def explicit_keys(fields: Sequence[str]) -> list[ExplicitKey]:
    """The keys the fields set, in order (Hydra's own flags left out, a repeated key once)."""
    overrides = set(split_hydra_argv(fields).overrides)
    keys: dict[str, ExplicitKey] = {}
    for index, field in enumerate(fields):
        if field not in overrides:
            continue
        try:
            override = parse_override(field)
        except OverrideParseException:
            continue  # not an override Hydra reads; composition reports it
        key = override.key_or_group
        prefix = field[: len(field) - len(field.lstrip("+~"))]
        # A top-level key selects a config group (or replaces a whole section): not a value.
        group = "/" in key or "." not in key or override.package is not None
        keys.setdefault(key, ExplicitKey(key, prefix, index, group))
    return list(keys.values())


def lookup(mapping: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    """(found, value) of a dotted key in a resolved mapping."""
    node: Any = mapping
    for part in key.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False, None
    return True, node


def canonical(value: Any) -> str:
    """A value as compact JSON: 1, 1.0 and true stay apart, key order is kept."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class ReleaseComposers:
    """One Composer per release; the pinned release's is the session's own."""

    def __init__(self, session: AuditSession, index: ReleaseIndex) -> None:
        self.session = session
        self.index = index
        self._composers: dict[str, Composer] = {}

    @property
    def pinned(self) -> str:
        return self.session.pin.version

    def composer(self, version: str, name: str | None = None) -> Composer:
        """The release's composer of the config ``name`` (the pinned one's by default: an entry
        point of the same folder, such as the SFT trainer's, names its own)."""
        name = name or self.session.pin.config_name
        if version == self.pinned and name == self.session.pin.config_name:
            return self.session.composer()
        key = f"{version}\0{name}"
        if key not in self._composers:
            tree = (
                self.session.composer().config_dir
                if version == self.pinned
                else release_tree(version, index=self.index).config_dir
            )
            self._composers[key] = Composer(tree, name)
        return self._composers[key]

    def base(
        self,
        version: str,
        fields: Sequence[str],
        variables: Mapping[str, str],
        name: str | None = None,
    ) -> Composition:
        """The composition of the config the fields select, without their values."""
        return self.composer(version, name).compose(selection(fields), variables)


def check_versions(session: AuditSession, versions: Sequence[str], index: ReleaseIndex) -> None:
    """Refuse unknown releases, and a session whose tree is not the pinned release's."""
    for version in versions:
        try:
            index.release(version)
        except ReleaseError as exc:
            raise MatrixError(str(exc)) from exc
    pinned = session.pin.version
    if pinned in versions and session.upstream is not None:
        expected = index.release(pinned).tree_sha256
        if session.upstream.tree_sha256 != expected:
            raise MatrixError(
                f"the session's tree {session.upstream.config_dir} has sha256 "
                f"{session.upstream.tree_sha256}, not verl {pinned}'s {expected}"
            )


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _check_cell(composition: Composition, verdict: PinnedVerdict | None) -> dict[str, Any]:
    cell: dict[str, Any] = {"kind": CHECK, "composed": composition.composed}
    if not composition.composed or verdict is None:
        cell["reason"] = composition.reason
        return cell
    cell.update(
        reason="",
        valid=verdict.valid,
        runnable=verdict.runnable,
        findings=[finding.line() for finding in verdict.findings],
        upstream_checks="ran"
        if not verdict.upstream_skipped
        else f"skipped: {verdict.upstream_skipped}",
    )
    return cell


def key_values(
    keys: Sequence[ExplicitKey], composition: Composition, base: Composition | None
) -> dict[str, str]:
    """Each value key's resolved value on one release, where it is known.

    Not composed, a value is unknown; but a key the release's tree lacks (and the field does
    not add with ``+``) is a difference, and most often the reason.
    """
    values: dict[str, str] = {}
    for item in keys:
        if item.group or item.prefix.startswith("~"):
            continue
        if composition.composed:
            found, value = lookup(composition.mapping, item.key)
            values[item.key] = canonical(value) if found else NOT_IN_TREE
        elif (
            base is not None
            and base.composed
            and not item.prefix.startswith("+")
            and not lookup(base.mapping, item.key)[0]
        ):
            values[item.key] = NOT_IN_TREE
    return values


def differing(
    keys: Sequence[ExplicitKey], values: Mapping[str, Mapping[str, str]]
) -> dict[str, dict[str, str]]:
    """Per key, its value on each release where known, for the keys whose value differs."""
    rows: dict[str, dict[str, str]] = {}
    for item in keys:
        row = {version: known[item.key] for version, known in values.items() if item.key in known}
        if len(set(row.values())) > 1:
            rows[item.key] = row
    return rows


def _other_release_cell(
    composers: ReleaseComposers,
    cache: CellCache | None,
    version: str,
    fields: Sequence[str],
    variables: Mapping[str, str],
    name: str | None = None,
) -> dict[str, Any]:
    """A compose cell of a release other than the pinned one, from the cache or composed now
    (``variables``: what ``${oc.env:…}`` sees, the launcher's environment; ``name``: the config
    the launch's entry point composes)."""
    release = composers.index.release(version)
    name = name or composers.session.pin.config_name
    key = cell_key(release.tree_sha256, name, fields, variables)
    cached = cache.get(key) if cache is not None else None
    if cached is not None:
        return cached
    composition = composers.composer(version, name).compose(fields, variables)
    base = None if composition.composed else composers.base(version, fields, variables, name)
    cell = {
        "composed": composition.composed,
        "reason": composition.reason,
        "values": key_values(explicit_keys(fields), composition, base),
    }
    if cache is not None:
        cache.put(key, cell)
    return cell


def release_session(session: AuditSession, version: str) -> AuditSession:
    """The same manifest, bindings and scripts, checked against another supported release."""
    import dataclasses

    from pytest_verl_compat.pipeline.audit import AuditSession as Session

    return Session.start(dataclasses.replace(session.options, release=version, release_source=""))


def matrix_report(
    session: AuditSession,
    cases: Iterable[Case],
    versions: Sequence[str] | None = None,
    *,
    upstream_checks: bool = True,
    index: ReleaseIndex | None = None,
    cache: CellCache | None = None,
) -> dict[str, Any]:
    """The matrix as plain JSON data (byte-stable: no paths, no times, no machine facts).

    ``cache`` keeps the other releases' cells between runs (the pinned release's verdict is
    computed every time; upstream's own checks have their own cache).
    """
    index = index or load_release_index()
    versions = list(versions or index.versions)
    check_versions(session, versions, index)
    composers = ReleaseComposers(session, index)
    pinned = session.pin.version
    cases = list(cases)

    read: dict[str, tuple[Case, Any]] = {}
    scripts: list[dict[str, Any]] = []
    for case in cases:
        entry: dict[str, Any] = {"id": case.id, "read": True, "reason": "", "cells": {}, "keys": {}}
        scripts.append(entry)
        try:
            outcome = session.outcome(case)
        except (StageFailed, StageUnavailable) as exc:
            entry.update(read=False, reason=str(exc))
            continue
        if case.resolved is not None:
            entry.update(read=False, reason="a resolved configuration has no fields to compose")
            continue
        read[case.id] = (case, outcome)

    checked = [v for v in versions if v == pinned or index.release(v).supported]
    verdicts: dict[str, dict[str, PinnedVerdict]] = {}
    sessions: dict[str, AuditSession] = {}
    for version in checked:
        sessions[version] = session if version == pinned else release_session(session, version)
        verdicts[version] = pinned_verdicts(
            sessions[version], [case for case, _ in read.values()], upstream_checks=upstream_checks
        )

    for entry in scripts:
        if entry["id"] not in read:
            continue
        case, outcome = read[entry["id"]]
        fields = outcome.fields.fields
        variables = outcome.fields.environment(case.bindings)
        launched = session.entry_point(outcome.fields)
        if launched is not None and launched.config_dir != session.pin.config_dir:
            entry.update(
                read=False,
                reason=f"{launched.module} composes {launched.config_dir}/"
                f"{launched.config_name}.yaml, outside the releases' {session.pin.config_dir}",
            )
            continue
        name = launched.config_name if launched is not None else None
        keys = explicit_keys(fields)
        values: dict[str, dict[str, str]] = {}
        for version in versions:
            if version in sessions:
                composition = sessions[version].outcome(case).composition
                entry["cells"][version] = _check_cell(composition, verdicts[version].get(case.id))
                base = (
                    None
                    if composition.composed
                    else composers.base(version, fields, variables, name)
                )
                values[version] = key_values(keys, composition, base)
            else:
                cell = _other_release_cell(composers, cache, version, fields, variables, name)
                entry["cells"][version] = {
                    "kind": COMPOSE,
                    "composed": cell["composed"],
                    "reason": cell["reason"],
                }
                values[version] = cell["values"]
        entry["keys"] = differing(keys, values)

    return {
        "pinned": pinned,
        "releases": [
            {
                "version": version,
                "tree_sha256": index.release(version).tree_sha256,
                "kind": CHECK if version in sessions else COMPOSE,
            }
            for version in versions
        ],
        "kinds": {kind: KIND_NOTES[kind] for kind in sorted({CHECK, COMPOSE})},
        "scripts": scripts,
    }


# --- rendering ---------------------------------------------------------------------------------


def cell_word(cell: Mapping[str, Any] | None) -> str:
    """One word for a table cell."""
    if cell is None:
        return "not read"
    if not cell["composed"]:
        return "rejected"
    if cell["kind"] == COMPOSE:
        return "composes"
    if "valid" not in cell:
        return "composes"
    warnings = sum(1 for line in cell["findings"] if line.startswith("WARNING"))
    errors = sum(1 for line in cell["findings"] if line.startswith("ERROR"))
    word = "valid" if cell["valid"] else "invalid"
    counts = [f"{errors} error{'s' * (errors != 1)}"] if errors else []
    counts += [f"{warnings} warning{'s' * (warnings != 1)}"] if warnings else []
    return f"{word} ({', '.join(counts)})" if counts else word


def _header(report: Mapping[str, Any]) -> list[str]:
    return [
        f"{release['version']}" + (" (check)" if release["kind"] == CHECK else "")
        for release in report["releases"]
    ]


def _details(script: Mapping[str, Any]) -> list[str]:
    """The lines under a script: why a cell is what it is, and the keys that differ."""
    lines: list[str] = []
    if not script["read"]:
        return [f"not read: {script['reason']}"]
    for version, cell in script["cells"].items():
        if not cell["composed"]:
            lines.append(f"{version}: rejected: {_first_line(cell['reason'])}")
        for finding in cell.get("findings", []):
            lines.append(f"{version}: {finding}")
        if cell.get("upstream_checks", "ran") != "ran":
            lines.append(f"{version}: upstream's own checks {cell['upstream_checks']}")
    for key, row in script["keys"].items():
        values = "; ".join(f"{version} {value}" for version, value in row.items())
        lines.append(f"differs: {key}: {values}")
    return lines


def render_text(report: Mapping[str, Any]) -> str:
    versions = _header(report)
    names = [script["id"] for script in report["scripts"]]
    width = max([len("script"), *map(len, names)])
    rows = [
        [
            cell_word(script["cells"].get(r["version"]) if script["read"] else None)
            for r in report["releases"]
        ]
        for script in report["scripts"]
    ]
    widths = [max([len(v), *(len(row[i]) for row in rows)]) for i, v in enumerate(versions)]
    lines = [
        f"verl release matrix: {len(names)} scripts on {len(versions)} releases "
        f"(pinned {report['pinned']})",
        *(f"  {kind}: {note}" for kind, note in report["kinds"].items()),
        "  config trees: "
        + ", ".join(f"{r['version']} {r['tree_sha256'][:12]}" for r in report["releases"]),
        "",
        "  ".join(
            ["script".ljust(width), *(v.ljust(w) for v, w in zip(versions, widths, strict=True))]
        ).rstrip(),
    ]
    for name, row in zip(names, rows, strict=True):
        cells = (c.ljust(w) for c, w in zip(row, widths, strict=True))
        lines.append("  ".join([name.ljust(width), *cells]).rstrip())
    for script in report["scripts"]:
        details = _details(script)
        if details:
            lines += ["", f"{script['id']}:", *(f"  {line}" for line in details)]
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(report: Mapping[str, Any]) -> str:
    versions = _header(report)
    lines = [
        f"## verl release matrix (pinned {report['pinned']})",
        "",
        *(f"- `{kind}`: {note}" for kind, note in report["kinds"].items()),
        "- config trees: "
        + ", ".join(f"{r['version']} `{r['tree_sha256'][:12]}`" for r in report["releases"]),
        "",
        "| script | " + " | ".join(versions) + " |",
        "|---|" + "---|" * len(versions),
    ]
    for script in report["scripts"]:
        words = [
            cell_word(script["cells"].get(r["version"]) if script["read"] else None)
            for r in report["releases"]
        ]
        lines.append(f"| `{script['id']}` | " + " | ".join(words) + " |")
    for script in report["scripts"]:
        details = _details(script)
        if details:
            lines += ["", f"### `{script['id']}`", "", *(f"- {_md(line)}" for line in details)]
    return "\n".join(lines) + "\n"


def matrix_failed(report: Mapping[str, Any]) -> bool:
    """A script not read, or not valid for the session's release (exit 1, as `check` would)."""
    for script in report["scripts"]:
        if not script["read"]:
            return True
        cell = script["cells"].get(report["pinned"])
        if cell is not None and (not cell["composed"] or cell.get("valid") is False):
            return True
    return False
