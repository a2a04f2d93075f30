"""Report stage: audit counts in the terminal, JUnit properties, and the JSON audit."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from pytest_verl_compat.model import (
    KEY_AUDIT_ENTRY,
    KEY_CASE,
    KEY_COMPILE_SECONDS,
    KEY_CONFORMANCE,
    KEY_FACTS,
    KEY_STAGE,
)
from pytest_verl_compat.pipeline.report import build_audit, field_lines, summary_lines
from pytest_verl_compat.pipeline.snapshot import dumps, write_atomic
from pytest_verl_compat.plugin.commands import accept_command
from pytest_verl_compat.plugin.keys import (
    KEY_GOLDEN_ORPHANS,
    REPORT_ATTRIBUTE,
    is_xdist_worker,
    payload_key,
)
from pytest_verl_compat.plugin.nodes import NODE_PREFIX
from pytest_verl_compat.plugin.state import AuditState


class AuditReporter:
    """Collects per-case facts from test reports (local or from xdist workers) on the controller."""

    def __init__(self, config: pytest.Config, state: AuditState) -> None:
        self.config = config
        self.state = state
        self.session = state.session
        # case id -> stage -> "passed" | "failed" | "skipped"
        self.status: dict[str, dict[str, str]] = defaultdict(dict)
        self.facts: dict[str, dict[str, Any]] = defaultdict(dict)
        self.conformance: dict[str, dict[str, Any]] = {}
        self.entries: dict[str, dict[str, Any]] = {}
        self.compile_seconds: dict[str, float] = {}
        # Golden files no case owns, from the golden-orphans stage: {"deleted", "paths"}.
        self.golden_orphans: dict[str, Any] = {}

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """Put the test's audit payload on its report (it travels from xdist workers)."""
        report = yield
        payload = item.stash.get(payload_key, None)
        if payload:
            setattr(report, REPORT_ATTRIBUTE, dict(payload))
        return report

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Record each stage's status and facts for its case; name the JUnit classname."""
        self._junit_classname(report)
        payload: dict[str, Any] = getattr(report, REPORT_ATTRIBUTE, None) or {}
        if KEY_CONFORMANCE in payload and report.when == "call":
            result = dict(payload[KEY_CONFORMANCE])
            result["passed"] = result["passed"] and report.passed
            self.conformance[result["case"]] = result
        if KEY_GOLDEN_ORPHANS in payload and report.when == "call":
            self.golden_orphans = dict(payload[KEY_GOLDEN_ORPHANS])
        case_id: str | None = payload.get(KEY_CASE)
        stage: str = payload.get(KEY_STAGE, "")
        if not case_id:
            return
        # A failing setup or teardown also fails the stage; otherwise the call phase decides.
        if report.when == "call" or report.outcome != "passed":
            previous = self.status[case_id].get(stage)
            if previous != "failed":
                self.status[case_id][stage] = report.outcome
        if KEY_COMPILE_SECONDS in payload:
            self.compile_seconds[case_id] = payload[KEY_COMPILE_SECONDS]
        if KEY_FACTS in payload:
            self.facts[case_id].update(payload[KEY_FACTS])
        if KEY_AUDIT_ENTRY in payload:
            self.entries[case_id] = payload[KEY_AUDIT_ENTRY]

    def _junit_classname(self, report: pytest.TestReport) -> None:
        """``verl_corpus.<stage>`` instead of the empty class name of a module outside rootdir."""
        if is_xdist_worker(self.config) or not report.nodeid.startswith(NODE_PREFIX + "::"):
            return
        from _pytest.junitxml import xml_key

        xml = self.config.stash.get(xml_key, None)
        if xml is None:
            return
        function = report.nodeid.split("::")[-1].split("[", 1)[0]
        stage = function.removeprefix("test_")
        # Attributes set before pytest's own reporter runs survive its record_testreport.
        xml.node_reporter(report).add_attribute("classname", f"verl_corpus.{stage}")

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
        if is_xdist_worker(self.config):
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
            # One short property per audited case: the testcases of pytest's default JUnit
            # family (xunit2) have no properties of their own.
            for entry in audit["cases"]:
                xml.add_global_property(f"verl_case:{entry['id']}", entry["outcome"])
        if self.session.options.report:
            write_atomic(Path(self.session.options.report), dumps(audit))
        if self.session.options.conformance_report:
            write_atomic(
                Path(self.session.options.conformance_report), dumps(self.conformance_report())
            )

    def nothing_audited(self) -> str:
        """Why no stage of any corpus case ran to a verdict in this run, or "" when one did."""
        verdicts = [v for stages in self.status.values() for v in stages.values() if v != "skipped"]
        if verdicts:
            return ""
        if not self.status:
            return "no corpus case was selected (check -k, -m or the node ids given)"
        if self.session.upstream is None:
            return f"no upstream config tree ({self.session.upstream_reason})"
        return "every selected stage was skipped"

    def conformance_report(self) -> dict[str, Any]:
        """Conformance results in the stage's case order (stable across runs and -n)."""
        order = {case.id: index for index, case in enumerate(self.state.conformance_cases())}
        results = sorted(self.conformance.values(), key=lambda r: order.get(r["case"], len(order)))
        return {
            "upstream": {"verl": self.session.version if self.session.release else None},
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
            # The step stage: per case and optimizer, the largest difference of each quantity.
            "step": {
                case_id: json.loads(facts["step"])
                for case_id, facts in sorted(self.facts.items())
                if isinstance(facts.get("step"), str)
            },
        }

    def orphan_lines(self) -> list[str]:
        """The golden files no case owns, in syrupy's words for unused snapshots: counted, and
        listed when deleted or with --snapshot-details."""
        paths = self.golden_orphans.get("paths", [])
        if not paths:
            return []
        deleted = self.golden_orphans.get("deleted", False)
        count = len(paths)
        files = "golden file" if count == 1 else "golden files"
        lines = [f"{count} unused {files} deleted." if deleted else f"{count} {files} unused."]
        update = self.config.getoption("update_snapshots", False)
        if update or self.config.getoption("include_snapshot_details", False):
            lines += [f"{'Deleted' if deleted else 'Unused'} {path}" for path in paths]
        if not update:
            lines.append(f"Re-run {accept_command(self.config)} to delete unused golden files.")
        return lines

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
        if is_xdist_worker(self.config):
            return
        terminalreporter.write_sep("=", "verl corpus audit")
        if self.session.manifest_error:
            terminalreporter.write_line(f"manifest error: {self.session.manifest_error}")
            return
        upstream = self.session.upstream
        release = self.session.release
        terminalreporter.write_line(
            f"release: {release.describe() if release else 'none: ' + self.session.release_error}"
        )
        terminalreporter.write_line(
            f"upstream: {upstream.describe() if upstream else 'none: ' + self.session.upstream_reason}"
        )
        audit = self.audit()
        nothing = self.nothing_audited()
        if nothing:
            terminalreporter.write_line(
                f"no corpus case audited: {nothing}", yellow=True, bold=True
            )
        # The step stage's own cases (corpus/step.yaml) are not corpus cases.
        elif (selected := sum(c.id in self.status for c in self.session.cases)) < len(
            self.session.cases
        ):
            terminalreporter.write_line(
                f"partial run: {selected} of {len(self.session.cases)} corpus cases "
                "selected; the totals below count only these",
                yellow=True,
            )
        totals, stages = audit["totals"], self.stage_totals()
        for line in summary_lines(totals, audit.get("example_totals")):
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
        for line in self.orphan_lines():
            terminalreporter.write_line(line, yellow=True)
        checked = [f for f in self.facts.values() if "valid" in f]
        if checked:
            from pytest_verl_compat.upstream.probes.validate import STAND_INS

            valid = sum(1 for f in checked if f["valid"])
            runnable = sum(1 for f in checked if f["runnable"])
            terminalreporter.write_line(
                f"check (static and upstream's own early checks): {len(checked)} cases; "
                f"{valid} valid for verl; {runnable} runnable by the reference trainer"
            )
            terminalreporter.write_line(f"  stand-ins: {'; '.join(STAND_INS)}")
        if self.conformance:
            passed = sum(1 for r in self.conformance.values() if r["passed"])
            terminalreporter.write_line(
                f"conformance with upstream verl: {passed}/{len(self.conformance)} cases within tolerance"
            )
            for line in self.conformance_matrix():
                terminalreporter.write_line(f"  {line}")
