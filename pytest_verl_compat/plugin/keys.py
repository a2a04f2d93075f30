"""The plugin's stash key: the typed state one pytest run shares between its hooks and tests."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_verl_compat.plugin.state import AuditState

# The annotation, not a subscript, carries the type: a subscript would import the heavy state here.
audit_state_key: pytest.StashKey[AuditState] = pytest.StashKey()

# Per-test facts for the audit (case, stage, facts, audit entry, conformance result): builtin
# values that ride on the test report as ``report.verl_corpus`` (also from xdist workers), so
# JUnit's per-case properties stay short.
payload_key: pytest.StashKey[dict[str, Any]] = pytest.StashKey()
REPORT_ATTRIBUTE = "verl_corpus"
# The golden-orphans stage's payload: {"deleted": bool, "paths": [str]} (plugin/report.py lists it).
KEY_GOLDEN_ORPHANS = "golden_orphans"


def is_xdist_worker(config: pytest.Config) -> bool:
    """Whether this process is a pytest-xdist worker (which sets ``config.workerinput``)."""
    return hasattr(config, "workerinput")
