"""Drift check: how the corpus composes and compiles on another upstream tree than the pinned one.

The pinned side comes from an ``AuditSession`` on the pinned tree (explicit fields from the
launch scripts or, without them, from the golden files); the other side reuses those very
fields, so every difference comes from the config tree alone.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_verl_compat.checks.registry import RL, SFT, family_of
from pytest_verl_compat.files.digests import sha256_file, tree_sha256
from pytest_verl_compat.files.safe_input import load_yaml, read_text
from pytest_verl_compat.model import COMPOSED, Composition
from pytest_verl_compat.pipeline.compile import rejection_reasons
from pytest_verl_compat.pipeline.compose import Composer, iter_leaves

if TYPE_CHECKING:
    from pytest_verl_compat.model import CompileReport
    from pytest_verl_compat.pipeline.audit import AuditSession
    from pytest_verl_compat.pipeline.profile import Profile

OUTCOME_NOTE = (
    "outcome.against compiles the other tree's mapping with the pinned profile, ignoring the "
    "leaves that profile cannot classify (listed as unclassified): counted as unknown, they would "
    "reject every case. Run `verl-compat retarget` to write a profile for the other tree."
)
# Lists longer than this in the Markdown summary are cut, with a count of the rest.
MARKDOWN_CAP = 8


class DriftError(Exception):
    """The drift check cannot run (no pinned tree, or the other folder is not a config tree)."""


def release_trees() -> dict[str, str]:
    """Tree hash -> verl version of the releases the package knows (data/verl_trees.yaml)."""
    from importlib import resources

    text = resources.files("pytest_verl_compat").joinpath("data/verl_trees.yaml").read_text()
    versions = load_yaml(text, "data/verl_trees.yaml")
    return {str(digest): str(version) for version, digest in versions.items()}


def known_tree_versions(session: AuditSession) -> dict[str, str]:
    """Tree hashes with a known verl version: the releases', every shipped profile's and the
    manifest's pin."""
    from pytest_verl_compat.pipeline.profile import load_profile, profile_path

    known: dict[str, str] = release_trees()
    profiles = profile_path("x").parent
    for path in sorted(profiles.glob("*.yaml")):
        try:
            profile = load_profile(str(path))
        except (OSError, KeyError, TypeError, ValueError):
            continue
        known[profile.tree_sha256] = profile.version
    if session.manifest is not None:
        known[session.pin.tree_sha256] = session.pin.version
    return known


def tree_version(root: Path, digest: str, known: Mapping[str, str]) -> str | None:
    """A tree's verl version: its version file, else a known release's hash."""
    version_file = root / "verl" / "version" / "version"
    if version_file.is_file():
        # The other tree is anyone's: a version file is a short bounded text (InputError).
        return read_text(version_file, limit=1024, what="version file").strip() or None
    return known.get(digest)


def _leaves(resolved: Mapping[str, Any]) -> dict[str, Any]:
    return dict(iter_leaves(resolved))


def leaf_changes(
    old: Mapping[str, Any], new: Mapping[str, Any]
) -> tuple[list[str], list[str], dict[str, list[Any]]]:
    """Added paths, removed paths and changed leaves ``{path: [old, new]}``, sorted."""
    before, after = _leaves(old), _leaves(new)
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = {
        path: [before[path], after[path]]
        for path in sorted(set(before) & set(after))
        # 1 == True == 1.0 in Python; a changed type is a changed default.
        if type(before[path]) is not type(after[path]) or before[path] != after[path]
    }
    return added, removed, changed


def unclassified_paths(profile: Profile, resolved: Mapping[str, Any]) -> list[str]:
    return sorted(path for path, _ in iter_leaves(resolved) if profile.rule_for(path) is None)


def outcome_ignoring_unknown(report: CompileReport) -> tuple[str, str]:
    """The compile outcome and reason as if the profile's unknown leaves were not there."""
    reasons = rejection_reasons(report.leaves, report.findings, skip_unknown=True)
    if not reasons:
        return "accepted", "every classified leaf is understood by the reference trainer"
    more = f" (and {len(reasons) - 3} more)" if len(reasons) > 3 else ""
    return "semantic_rejection", "; ".join(reasons[:3]) + more


def _pinned_side(session: AuditSession, case: Any) -> tuple[Any, Composition, str, str, str]:
    """Explicit fields, pinned composition, outcome, its reason and where the fields came from."""
    outcome = session.outcome(case)
    composition = outcome.composition
    if not composition.composed:
        return (
            outcome.fields,
            composition,
            composition.outcome,
            composition.reason,
            outcome.fields_source,
        )
    report = session.compile(case)
    assert report is not None  # composed cases always compile
    return outcome.fields, composition, report.outcome, report.reason, outcome.fields_source


def drift_report(session: AuditSession, against_root: Path) -> dict[str, Any]:
    """Compare every case of a session on its pinned tree with the same case on ``against_root``."""
    from pytest_verl_compat.model import StageFailed, StageUnavailable
    from pytest_verl_compat.pipeline.compile import compile_resolved
    from pytest_verl_compat.pipeline.profile import default_sft_profile, load_profile

    if session.manifest is None:
        raise DriftError(session.manifest_error or "no manifest")
    pin = session.pin
    if session.upstream is None:
        raise DriftError(f"no pinned config tree: {session.upstream_reason}")
    if session.upstream.tree_sha256 != pin.tree_sha256:
        raise DriftError(
            f"the session's tree {session.upstream.config_dir} has sha256 "
            f"{session.upstream.tree_sha256}, not the pinned {pin.tree_sha256}; run the drift "
            f"check from the pinned verl {pin.version} tree"
        )
    against_root = Path(against_root).expanduser().resolve()
    config_dir = against_root / pin.config_dir
    if not (config_dir / f"{pin.config_name}.yaml").is_file():
        raise DriftError(
            f"{against_root} has no {pin.config_dir}/{pin.config_name}.yaml: not a verl tree"
        )
    digest = tree_sha256(config_dir)
    profiles = {RL: load_profile(session.profile_name), SFT: load_profile(default_sft_profile())}
    composer = Composer(config_dir, pin.config_name)
    composer.check_tree()  # a hostile file in the other tree is unreadable input (InputError)
    # The other configs of the same folder an entry point composes (sft_trainer_engine).
    composers = {pin.config_name: composer}

    files = {}
    for case in session.cases:
        for input_pin in case.inputs:
            found = against_root / input_pin.path
            files[input_pin.path] = {
                "path": input_pin.path,
                "pinned": input_pin.sha256,
                "found": sha256_file(found) if found.is_file() else None,
            }

    cases: list[dict[str, Any]] = []
    reasons: dict[str, dict[str, str]] = {}
    default: Composition | None = None
    for case in session.cases:
        entry: dict[str, Any] = {
            "id": case.id,
            "added": [],
            "removed": [],
            "changed": {},
            "unclassified": [],
            "outcome": {"pinned": None, "against": None},
            "composition_error": None,
        }
        cases.append(entry)
        try:
            fields, pinned, pinned_outcome, pinned_reason, source = _pinned_side(session, case)
        except (StageFailed, StageUnavailable) as exc:
            entry["composition_error"] = f"pinned side unavailable: {exc}"
            continue
        entry["outcome"]["pinned"] = pinned_outcome
        if source == "resolved":
            # A run's resolved file has no overrides to recompose: report which of its leaves
            # the other tree no longer has (removed) and which new ones it lacks (added).
            entry["outcome"]["against"] = pinned_outcome
            if pinned.composed:
                default = default or composer.compose([], session.manifest.bindings.variables)
                if default.composed:
                    entry["added"] = sorted(
                        set(_leaves(default.mapping)) - set(_leaves(pinned.mapping))
                    )
                    entry["removed"] = sorted(
                        set(_leaves(pinned.mapping)) - set(_leaves(default.mapping))
                    )
            continue
        launched = session.entry_point(fields)
        name = launched.config_name if launched is not None else pin.config_name
        if launched is not None and launched.config_dir != pin.config_dir:
            entry["composition_error"] = (
                f"{launched.module} composes {launched.config_dir}/{name}.yaml, which is not "
                f"part of the compared tree ({pin.config_dir})"
            )
            continue
        if name not in composers:
            composers[name] = Composer(config_dir, name)
        against = composers[name].compose(fields.fields, fields.environment(case.bindings))
        if not against.composed:
            entry["outcome"]["against"] = against.outcome
            against_reason = against.reason
            # Only a new rejection is drift; one the pinned tree shares is the case's own.
            if pinned.composed or pinned.reason != against.reason:
                entry["composition_error"] = against.reason
        else:
            if pinned.composed:
                entry["added"], entry["removed"], entry["changed"] = leaf_changes(
                    pinned.mapping, against.mapping
                )
            family = family_of(against.mapping) or RL
            profile = profiles.get(family, profiles[RL])
            entry["profile"] = profile.name
            entry["unclassified"] = unclassified_paths(profile, against.mapping)
            try:
                report = compile_resolved(
                    against.mapping,
                    case_id=case.id,
                    profile=profile,
                    explicit_fields=fields.fields,
                    family=family,
                    world_size=fields.world_size,
                    launcher=fields.launcher,
                )
            except (KeyError, TypeError) as exc:
                # The pinned release's checks read its mapping's shape; an older release's tree
                # may lack a section they read (0.8.0 has no algorithm.filter_groups).
                entry["outcome"]["against"] = COMPOSED
                against_reason = (
                    f"composed; not compiled: the pinned checks read {exc} (a {type(exc).__name__}"
                    " on this tree's mapping), which only the pinned tree's shape has"
                )
            else:
                entry["outcome"]["against"], against_reason = outcome_ignoring_unknown(report)
        if entry["outcome"]["against"] != pinned_outcome:
            reasons[case.id] = {"pinned": pinned_reason, "against": against_reason}

    return {
        "pinned": {
            "version": pin.version,
            "commit": pin.commit,
            "tree_sha256": pin.tree_sha256,
            "profile": session.profile_name,
        },
        "against": {
            "path": str(against_root),
            "tree_sha256": digest,
            "version": tree_version(against_root, digest, known_tree_versions(session)),
        },
        "files": sorted(files.values(), key=lambda f: f["path"]),
        "cases": sorted(cases, key=lambda c: c["id"]),
        "outcome_note": OUTCOME_NOTE,
        "outcome_reasons": dict(sorted(reasons.items())),
    }


def case_has_drift(case: Mapping[str, Any]) -> bool:
    outcome = case["outcome"]
    return bool(
        case["added"]
        or case["removed"]
        or case["changed"]
        or case["unclassified"]
        or case["composition_error"]
        or outcome["pinned"] != outcome["against"]
    )


def has_drift(report: Mapping[str, Any]) -> bool:
    """Drift: another tree, a changed input file, or any case that composes or compiles differently.

    An input file missing from the other folder (a config-only tree) is not drift by itself.
    """
    if report["pinned"]["tree_sha256"] != report["against"]["tree_sha256"]:
        return True
    if any(f["found"] is not None and f["found"] != f["pinned"] for f in report["files"]):
        return True
    return any(case_has_drift(case) for case in report["cases"])


def section_of(path: str) -> str:
    """Top-level section of a dotted path; ``actor_rollout_ref`` and ``reward`` split one more level."""
    parts = path.split("[", 1)[0].split(".")
    if parts[0] in ("actor_rollout_ref", "reward") and len(parts) > 2:
        return ".".join(parts[:2])
    return parts[0]


def _short(value: Any, limit: int = 40) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _capped(items: list[str], cap: int = MARKDOWN_CAP) -> list[str]:
    if len(items) <= cap:
        return items
    return [*items[:cap], f"… and {len(items) - cap} more"]


def _by_section(paths: Iterable[str]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = defaultdict(list)
    for path in sorted(paths):
        grouped[section_of(path)].append(path)
    return dict(sorted(grouped.items()))


def render_markdown(report: Mapping[str, Any]) -> str:
    """A summary short enough for a pull request: per case, per config section, outcome changes."""
    pinned, against = report["pinned"], report["against"]
    version = against["version"] or "unknown version"
    lines = [
        f"## verl config drift: {pinned['version']} → {version}",
        "",
        f"Pinned verl {pinned['version']} (`{pinned['commit'][:12]}`, tree "
        f"`{pinned['tree_sha256'][:12]}`, profile `{pinned['profile']}`) against "
        f"`{against['path']}` (tree `{against['tree_sha256'][:12]}`).",
        "",
    ]
    if not has_drift(report):
        lines.append("No drift: every case composes and compiles as on the pinned tree.")
        return "\n".join(lines) + "\n"

    changed_files = [
        f for f in report["files"] if f["found"] is not None and f["found"] != f["pinned"]
    ]
    missing = [f for f in report["files"] if f["found"] is None]
    if changed_files or missing:
        lines.append("### Input files")
        for item in _capped([f"- `{f['path']}` changed" for f in changed_files]):
            lines.append(item)
        if missing:
            lines.append(f"- {len(missing)} pinned input files are not in the other folder")
        lines.append("")

    lines += [
        "### Cases",
        "",
        "| case | added | removed | changed | unclassified | outcome |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for case in report["cases"]:
        outcome = case["outcome"]
        shown = (
            outcome["pinned"]
            if outcome["pinned"] == outcome["against"]
            else f"**{outcome['pinned']} → {outcome['against']}**"
        )
        lines.append(
            f"| `{case['id']}` | {len(case['added'])} | {len(case['removed'])} | "
            f"{len(case['changed'])} | {len(case['unclassified'])} | {shown} |"
        )
    lines.append("")

    flips = [c for c in report["cases"] if c["outcome"]["pinned"] != c["outcome"]["against"]]
    if flips:
        lines.append("### Outcome changes")
        reasons = report.get("outcome_reasons", {})
        for case in flips:
            why = reasons.get(case["id"], {})
            lines.append(
                f"- `{case['id']}`: {case['outcome']['pinned']} → {case['outcome']['against']}"
            )
            if why.get("pinned"):
                lines.append(f"  - pinned: {why['pinned']}")
            if why.get("against"):
                lines.append(f"  - against: {why['against']}")
            for path, (old, new) in list(case["changed"].items())[:3]:
                lines.append(f"  - `{path}`: {_short(old)} → {_short(new)}")
        lines.append("")

    errors = [c for c in report["cases"] if c["composition_error"]]
    if errors:
        lines.append("### Overrides that no longer compose")
        for case in errors[:MARKDOWN_CAP]:
            lines.append(f"- `{case['id']}`: {_short(case['composition_error'], 200)}")
        if len(errors) > MARKDOWN_CAP:
            lines.append(f"- … and {len(errors) - MARKDOWN_CAP} more")
        lines.append("")

    # Leaf changes across all cases, grouped by config section; a path counts once.
    added: set[str] = set()
    removed: set[str] = set()
    changed: dict[str, list[Any]] = {}
    unclassified: set[str] = set()
    for case in report["cases"]:
        added.update(case["added"])
        removed.update(case["removed"])
        changed.update(case["changed"])
        unclassified.update(case["unclassified"])
    sections = sorted(
        set(_by_section(added)) | set(_by_section(removed)) | set(_by_section(changed))
    )
    if sections:
        lines.append("### Leaves by config section (union over cases)")
        for section in sections:
            in_added = [p for p in sorted(added) if section_of(p) == section]
            in_removed = [p for p in sorted(removed) if section_of(p) == section]
            in_changed = [p for p in sorted(changed) if section_of(p) == section]
            lines.append("")
            lines.append(
                f"#### `{section}`: {len(in_added)} added, {len(in_removed)} removed, "
                f"{len(in_changed)} changed"
            )
            for path in _capped(in_changed):
                if path in changed:
                    old, new = changed[path]
                    lines.append(f"- ~ `{path}`: {_short(old)} → {_short(new)}")
                else:
                    lines.append(f"- ~ {path}")
            lines += [f"- + `{p}`" if p in added else f"- + {p}" for p in _capped(in_added, 4)]
            lines += [f"- − `{p}`" if p in removed else f"- − {p}" for p in _capped(in_removed, 4)]
        lines.append("")
    if unclassified:
        lines.append(
            f"{len(unclassified)} leaves of the other tree have no rule in `{pinned['profile']}`; "
            "`verl-compat retarget` writes a profile that marks them for review."
        )
        lines.append("")
    lines.append(f"_{report.get('outcome_note', OUTCOME_NOTE)}_")
    return "\n".join(lines) + "\n"
