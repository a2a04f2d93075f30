"""What one pytest run keeps: the audit session and the caches of the layers above it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_verl_compat.conformance.plan import conformance_cases, load_tolerances
from pytest_verl_compat.pipeline.audit import AuditSession
from pytest_verl_compat.upstream.validate import UpstreamVerdicts

if TYPE_CHECKING:
    from pytest_verl_compat.conformance.plan import ConformanceCase


@dataclass
class AuditState:
    """The session, the conformance stage's cases and upstream's validate_config verdicts."""

    session: AuditSession
    verdicts: UpstreamVerdicts
    conformance_error: str = ""
    _conformance: list[ConformanceCase] | None = field(default=None, repr=False)

    @classmethod
    def start(cls, session: AuditSession) -> AuditState:
        return cls(session, UpstreamVerdicts(session))

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
