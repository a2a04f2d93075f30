"""The audit JSON (``golden/audit.json``) and its summary lines, from the compile stage's entries.

The same bytes come from ``pytest --verl-corpus --verl-corpus-report`` and ``verl-compat audit``.
"""

from __future__ import annotations

import json
from typing import Any

from pytest_verl_compat.model import (
    ACCEPTED,
    COMPOSITION_REJECTION,
    SEMANTIC_REJECTION,
)
from pytest_verl_compat.pipeline.audit import AuditSession


def build_audit(session: AuditSession, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The audit JSON: the same bytes from pytest and from ``verl-compat audit``."""
    manifest = session.manifest
    return {
        "upstream": {
            "version": manifest.upstream.version if manifest else None,
            "commit": manifest.upstream.commit if manifest else None,
            "tree_sha256": manifest.upstream.tree_sha256 if manifest else None,
        },
        "profile": session.profile_name,
        "cases": entries,
        # The field corpus has its own totals, so the official + derived audit reads the same.
        "totals": audit_totals([e for e in entries if e["kind"] != "field"]),
        "field_totals": audit_totals([e for e in entries if e["kind"] == "field"]),
        # Upstream's example scripts: totals recorded by tests/test_examples.py (composing all
        # of them takes longer than the corpus audit itself).
        "example_totals": recorded_example_totals(session),
    }


def audit_totals(entries: list[dict[str, Any]]) -> dict[str, Any]:
    outcomes = [entry["outcome"] for entry in entries]
    leaf_classes: dict[str, int] = {}
    for entry in entries:
        for klass, count in entry["leaf_classes"].items():
            leaf_classes[klass] = leaf_classes.get(klass, 0) + count
    return {
        "cases": len(entries),
        "official": sum(1 for e in entries if e["kind"] == "official"),
        "derived": sum(1 for e in entries if e["kind"] == "derived"),
        "composed": sum(1 for o in outcomes if o != COMPOSITION_REJECTION),
        "accepted": outcomes.count(ACCEPTED),
        "semantic_rejections": outcomes.count(SEMANTIC_REJECTION),
        "composition_rejections": outcomes.count(COMPOSITION_REJECTION),
        "warnings": sum(1 for e in entries for f in e["findings"] if f["level"] == "warning"),
        "leaf_classes": leaf_classes,
    }


def summary_lines(totals: dict[str, Any], examples: dict[str, int] | None = None) -> list[str]:
    classes = ", ".join(f"{klass} {count}" for klass, count in totals["leaf_classes"].items())
    example = example_line(examples)
    return ([example] if example else []) + [
        f"{totals['cases']} cases; {totals['composed']} composed; {totals['accepted']} accepted; "
        f"{totals['semantic_rejections']} semantic rejections; "
        f"{totals['composition_rejections']} composition rejections",
        f"resolved leaves by class: {classes or 'none compiled'}",
    ]


def field_lines(
    session: AuditSession, entries: list[dict[str, Any]], seconds: dict[str, float]
) -> list[str]:
    """One line per field case: the pinned upstream's behaviour next to ours."""
    assert session.manifest is not None
    version = session.manifest.upstream.version
    totals = audit_totals(entries)
    errors = sum(1 for e in entries if any(f["level"] == "error" for f in e["findings"]))
    # A rejection without an error finding is one verl runs and the reference trainer refuses.
    refused = totals["semantic_rejections"] - errors
    lines = [
        f"field corpus: {totals['cases']} cases; {errors} errors caught; "
        + (f"{refused} refused by the reference trainer only; " if refused else "")
        + f"{totals['accepted']} accepted with {totals['warnings']} warnings"
    ]
    for entry in entries:
        case = session.manifest.case(entry["id"])
        upstream = case.upstream or {}
        levels = [f["level"] for f in entry["findings"]]
        verdict = "error" if "error" in levels else ("warning" if "warning" in levels else "clean")
        took = f" in {seconds[entry['id']]:.1f} s" if entry["id"] in seconds else ""
        lines.append(
            f"  {entry['id']}: verl {version}: {upstream.get('behaviour', '?')}; here: {verdict}{took}"
        )
    return lines


# --- upstream's example scripts (corpus/examples.yaml) ------------------------------------------

EXAMPLES_AUDIT = "examples/audit.json"


def example_totals(entries: list[dict[str, Any]]) -> dict[str, int]:
    return {
        "scripts": len(entries),
        "read": sum(1 for e in entries if e["read"]),
        "composed": sum(1 for e in entries if e.get("composed")),
        "valid": sum(1 for e in entries if e.get("valid")),
        "runnable": sum(1 for e in entries if e.get("runnable")),
        "warnings": sum(e.get("warnings", 0) for e in entries),
    }


def recorded_example_totals(session: AuditSession) -> dict[str, int] | None:
    """The example totals from ``golden/examples/audit.json`` (tests/test_examples.py keeps it true)."""
    path = session.golden_dir / EXAMPLES_AUDIT
    if not path.is_file():
        return None
    totals: dict[str, int] = json.loads(path.read_text(encoding="utf-8"))["totals"]
    return totals


def example_line(totals: dict[str, int] | None) -> str | None:
    if not totals:
        return None
    return (
        f"upstream example scripts: {totals['scripts']}; {totals['read']} read; "
        f"{totals['composed']} composed; {totals['valid']} valid for verl; "
        f"{totals['runnable']} runnable by the reference trainer; {totals['warnings']} warnings"
    )
