"""The plugin's stash key: the typed state one pytest run shares between its hooks and tests."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_verl_compat.plugin.state import AuditState

# The annotation, not a subscript, carries the type: a subscript would import the heavy state here.
audit_state_key: pytest.StashKey[AuditState] = pytest.StashKey()
