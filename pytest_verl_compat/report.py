"""Report stage: audit counts in the terminal, JUnit properties, and the JSON audit."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from pytest_verl_compat.session import AuditSession
from pytest_verl_compat.snapshot import dumps, write_atomic


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


class AuditReporter:
    """Collects per-case facts from test reports (local or from xdist workers) on the controller."""

    def __init__(self, config: pytest.Config, session: AuditSession) -> None:
        self.config = config
        self.session = session
        # case id -> stage -> "passed" | "failed" | "skipped"
        self.status: dict[str, dict[str, str]] = defaultdict(dict)
        self.facts: dict[str, dict[str, Any]] = defaultdict(dict)
        self.conformance: dict[str, dict[str, Any]] = {}
        self.entries: dict[str, dict[str, Any]] = {}
        self.compile_seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Record each stage's status and facts for its case."""
        props = dict(report.user_properties)
        if "verl_conformance" in props and report.when == "call":
            result = json.loads(props["verl_conformance"])
            result["passed"] = result["passed"] and report.passed
            self.conformance[result["case"]] = result
        case_id, stage = props.get("verl_case"), props.get("verl_stage")
        if not case_id:
            return
        # A failing setup or teardown also fails the stage; otherwise the call phase decides.
        if report.when == "call" or report.outcome != "passed":
            previous = self.status[case_id].get(stage)
            if previous != "failed":
                self.status[case_id][stage] = report.outcome
        for name, value in report.user_properties:
            if name == "verl_compile_seconds":
                self.compile_seconds[case_id] = value
            if name == "verl_facts":
                self.facts[case_id].update(json.loads(value))
            elif name == "verl_audit_entry":
                self.entries[case_id] = json.loads(value)

    def audit(self) -> dict[str, Any]:
        """The machine-readable audit, from the compile stage's entries, in manifest order."""
        entries = [self.entries[case.id] for case in self.session.cases if case.id in self.entries]
        return build_audit(self.session, entries)

    def stage_totals(self) -> dict[str, int]:
        """How the stages went in this run (these depend on what ran, so they are not in the JSON)."""

        def count(stage: str, outcome: str) -> int:
            return sum(1 for status in self.status.values() if status.get(stage) == outcome)

        return {
            "read": count("read", "passed"),
            "read_skipped": count("read", "skipped"),
            "trusted_equal": count("trusted", "passed"),
            "trusted_skipped": count("trusted", "skipped"),
            "golden_matched": count("snapshot", "passed"),
            "failed_cases": sum(
                1 for status in self.status.values() if "failed" in status.values()
            ),
        }

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Write the JSON audit and the JUnit suite totals (controller only)."""
        if _is_worker(self.config):
            return
        audit = self.audit()
        from _pytest.junitxml import xml_key

        xml = self.config.stash.get(xml_key, None)
        if xml is not None:
            totals = {**audit["totals"], **self.stage_totals()}
            totals.update({f"field_{k}": v for k, v in audit["field_totals"].items()})
            for name, value in totals.items():
                # Payloads stay flat builtin values: one property per leaf class.
                if isinstance(value, dict):
                    for key, count in value.items():
                        xml.add_global_property(f"verl_corpus_{name}_{key}", count)
                else:
                    xml.add_global_property(f"verl_corpus_{name}", value)
            xml.add_global_property("verl_corpus_profile", audit["profile"])
            xml.add_global_property(
                "verl_corpus_tree_sha256", audit["upstream"]["tree_sha256"] or ""
            )
        if self.session.options.report:
            write_atomic(Path(self.session.options.report), dumps(audit))
        if self.session.options.conformance_report:
            write_atomic(
                Path(self.session.options.conformance_report), dumps(self.conformance_report())
            )

    def conformance_report(self) -> dict[str, Any]:
        """Conformance results in the stage's case order (stable across runs and -n)."""
        from pytest_verl_compat.upstream import installed_verl_root

        installed = installed_verl_root()
        order = {case.id: index for index, case in enumerate(self.session.conformance_cases())}
        results = sorted(self.conformance.values(), key=lambda r: order.get(r["case"], len(order)))
        return {
            "upstream": {"verl": installed[1] if installed else None},
            "results": [
                {
                    "component": r["component"],
                    "variant": r["variant"],
                    "case": r["case"],
                    "samples": r["samples"],
                    "max_abs_err": r["max_abs_err"],
                    "max_grad_abs_err": r["max_grad_abs_err"],
                    "passed": r["passed"],
                }
                for r in results
            ],
        }

    def conformance_matrix(self) -> list[str]:
        """One line per component: each mode with passed/total cases."""
        table: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
        for result in self.conformance.values():
            cell = table[result["component"]][result["variant"]]
            cell[0] += int(result["passed"])
            cell[1] += 1
        width = max((len(c) for c in table), default=0)
        return [
            f"{component:<{width}}  "
            + "  ".join(f"{mode} {ok}/{n}" for mode, (ok, n) in sorted(modes.items()))
            for component, modes in sorted(table.items())
        ]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """One section with the audit counts."""
        if _is_worker(self.config):
            return
        terminalreporter.write_sep("=", "verl corpus audit")
        if self.session.manifest_error:
            terminalreporter.write_line(f"manifest error: {self.session.manifest_error}")
            return
        upstream = self.session.upstream
        terminalreporter.write_line(
            f"upstream: {upstream.describe() if upstream else 'none: ' + self.session.upstream_reason}"
        )
        audit = self.audit()
        totals, stages = audit["totals"], self.stage_totals()
        for line in summary_lines(totals):
            terminalreporter.write_line(line)
        field = [e for e in audit["cases"] if e["kind"] == "field"]
        if field:
            for line in field_lines(self.session, field, self.compile_seconds):
                terminalreporter.write_line(line)
        terminalreporter.write_line(
            f"stages: {stages['read']} read ({stages['read_skipped']} skipped); "
            f"{stages['trusted_equal']} equal to upstream's entry point ({stages['trusted_skipped']} skipped); "
            f"{stages['golden_matched']} match golden; {stages['failed_cases']} cases with a failed stage"
        )
        verdicts = [f for f in self.facts.values() if "upstream_validate" in f]
        if verdicts:
            from pytest_verl_compat.upstream_validate import STAND_INS

            differ = [f for f in verdicts if f["upstream_validate"] != f["ours"]]
            terminalreporter.write_line(
                f"upstream validate_config: {len(verdicts)} cases checked; agrees on {len(verdicts) - len(differ)}; "
                f"differs on {len(differ)} (each explained in the manifest)"
            )
            terminalreporter.write_line(f"  stand-ins: {'; '.join(STAND_INS)}")
        if self.conformance:
            passed = sum(1 for r in self.conformance.values() if r["passed"])
            terminalreporter.write_line(
                f"conformance with upstream verl: {passed}/{len(self.conformance)} cases within tolerance"
            )
            for line in self.conformance_matrix():
                terminalreporter.write_line(f"  {line}")


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
        "composed": sum(1 for o in outcomes if o != "composition_rejection"),
        "accepted": outcomes.count("accepted"),
        "semantic_rejections": outcomes.count("semantic_rejection"),
        "composition_rejections": outcomes.count("composition_rejection"),
        "warnings": sum(1 for e in entries for f in e["findings"] if f["level"] == "warning"),
        "leaf_classes": leaf_classes,
    }


def summary_lines(totals: dict[str, Any]) -> list[str]:
    classes = ", ".join(f"{klass} {count}" for klass, count in totals["leaf_classes"].items())
    return [
        f"{totals['cases']} cases; {totals['composed']} composed; {totals['accepted']} accepted; "
        f"{totals['semantic_rejections']} semantic rejections; "
        f"{totals['composition_rejections']} composition rejections",
        f"resolved leaves by class: {classes or 'none compiled'}",
    ]


def field_lines(
    session: AuditSession, entries: list[dict[str, Any]], seconds: dict[str, float]
) -> list[str]:
    """One line per field case: upstream 0.9.0's behaviour next to ours."""
    totals = audit_totals(entries)
    lines = [
        f"field corpus: {totals['cases']} cases; {totals['semantic_rejections']} errors caught; "
        f"{totals['accepted']} accepted with {totals['warnings']} warnings"
    ]
    for entry in entries:
        case = session.manifest.case(entry["id"])
        upstream = case.upstream or {}
        levels = [f["level"] for f in entry["findings"]]
        verdict = "error" if "error" in levels else ("warning" if "warning" in levels else "clean")
        took = f" in {seconds[entry['id']]:.1f} s" if entry["id"] in seconds else ""
        lines.append(
            f"  {entry['id']}: verl 0.9.0: {upstream.get('behaviour', '?')}; here: {verdict}{took}"
        )
    return lines
