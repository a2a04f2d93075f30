"""What one pytest run keeps: the audit session and the caches of the layers above it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_verl_compat.conformance.plan import (
    comparison_missing_reason,
    conformance_cases,
    load_tolerances,
)
from pytest_verl_compat.conformance.results import ConformanceResults
from pytest_verl_compat.model import Case
from pytest_verl_compat.pipeline.answers import Answers
from pytest_verl_compat.pipeline.audit import AuditSession
from pytest_verl_compat.upstream.oracle.client import UpstreamOracle
from pytest_verl_compat.upstream.oracle.trusted import TrustedCompositions, trusted_answers
from pytest_verl_compat.upstream.verdict.case import (
    CaseCheck,
    check_case,
    live_asker,
    upstream_question,
)
from pytest_verl_compat.upstream.verdict.early import (
    UpstreamGate,
    check_answers,
    prefetch_answer,
    upstream_gate,
)

if TYPE_CHECKING:
    from pytest_verl_compat.conformance.plan import ConformanceCase
    from pytest_verl_compat.conformance.reference_answers import OracleReferences

# Imported by the oracle process, by name: upstream's side of the conformance cases.
REFERENCE_ANSWERS = "pytest_verl_compat.conformance.reference_answers"


@dataclass
class AuditState:
    """The session, the conformance stage's cases and the oracle process that answers for
    upstream (its entry point, its early checks, its math)."""

    session: AuditSession
    oracle: UpstreamOracle
    # The conformance stage's results kept between runs (``conformance.results``).
    conformance_results: ConformanceResults
    conformance_error: str = ""
    _conformance: list[ConformanceCase] | None = field(default=None, repr=False)
    _trusted: TrustedCompositions | str | None = field(default=None, repr=False)
    _gate: UpstreamGate | None = field(default=None, repr=False)
    _references: OracleReferences | None = field(default=None, repr=False)
    _checks: Answers | None = field(default=None, repr=False)
    # The upstream stages selected for each case (``test_verdict``, ``test_trusted``): a case is
    # asked only what a selected stage will read.
    upstream_stages: dict[str, set[str]] = field(default_factory=dict, repr=False)

    @classmethod
    def start(cls, session: AuditSession, oracle_workers: int = 1) -> AuditState:
        oracle = UpstreamOracle(
            oracle_workers, served=(REFERENCE_ANSWERS,), release=session.version
        )
        results = ConformanceResults(session.version, session.memo, session.golden_dir)
        return cls(session, oracle, results)

    def conformance_references(self) -> OracleReferences | None:
        """Upstream's side of the conformance cases from the oracle, when both sides can run."""
        if self._references is None and comparison_missing_reason(self.session.version) is None:
            from pytest_verl_compat.conformance.reference_answers import (
                OracleReferences,
                reference_answers,
            )

            store = reference_answers(self.session.golden_dir)
            self._references = OracleReferences(self.oracle, store)
        return self._references

    def trusted(self) -> TrustedCompositions | str:
        """Upstream's entry point for this session, or why it cannot be the oracle here."""
        if self._trusted is None:
            self._trusted = self._trusted_or_reason()
        return self._trusted

    def _trusted_or_reason(self) -> TrustedCompositions | str:
        if self.session.options.trusted == "off":
            return "trusted composition switched off (--verl-corpus-trusted=off)"
        gate = self.upstream_gate()
        if gate.tree is not None:
            return TrustedCompositions(
                self.oracle, gate.tree, trusted_answers(self.session.golden_dir)
            )
        return gate.reason

    def upstream_gate(self) -> UpstreamGate:
        """The installed tree's hash when upstream's code may see this session's compositions,
        else why not (``upstream.early.upstream_gate``)."""
        if self._gate is None:
            self._gate = upstream_gate(self.session)
        return self._gate

    def prefetch_upstream(self, case: Case) -> None:
        """Send a composed case's questions to the oracle now; the answers are read later.

        The trusted and validate stages run last (see ``pytest_collection_modifyitems``), so the
        oracle process works while the other stages run. Cases our composition rejected are never
        sent: only mappings Hydra's compose API accepted reach upstream's code.
        """
        stages = self.upstream_stages.get(case.id, set())
        outcome = self.session.outcome(case)
        if not stages or not outcome.composition.composed or self.upstream_gate().tree is None:
            return
        trusted = self.trusted()
        if "test_trusted" in stages and isinstance(trusted, TrustedCompositions):
            fields = outcome.fields
            trusted.prefetch(fields.fields, fields.environment(case.bindings), fields.module)
        tree = self.upstream_gate().tree
        assert tree is not None
        question = upstream_question(self.session, case)
        if "test_verdict" not in stages or isinstance(question, str):
            return
        prefetch_answer(self.session, question, tree, self.check_answers(), self.oracle)

    def check(self, case: Case) -> CaseCheck:
        """The case's verdict exactly as ``verl-compat check`` gives it (``upstream.verdict``),
        upstream's answers from this session's oracle process."""
        return check_case(
            self.session,
            case,
            live_asker(self.session, self.check_answers(), self.oracle, self.upstream_gate()),
        )

    def check_answers(self) -> Answers:
        """Upstream's checks kept in the user cache, then those recorded for the golden folder."""
        if self._checks is None:
            self._checks = check_answers(self.session.golden_dir)
        return self._checks

    def close(self) -> None:
        self.oracle.close()

    def conformance_cases(self) -> list[ConformanceCase]:
        """The conformance stage's cases, from the tolerance file the manifest names."""
        if self._conformance is None:
            self._conformance = []
            manifest = self.session.manifest
            if manifest is not None and manifest.conformance is not None:
                try:
                    self._conformance = conformance_cases(load_tolerances(manifest.conformance))
                except (OSError, ValueError, KeyError) as exc:
                    self.conformance_error = f"{manifest.conformance}: {exc}"
        return self._conformance
