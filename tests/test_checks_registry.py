"""The finding registry: ids unique, levels from the model, evidence filled from the profile."""

from __future__ import annotations

import pytest

from pytest_verl_compat.checks import CHECKS, CheckInput, Hit, check
from pytest_verl_compat.checks.registry import Check, ProfileInfo
from pytest_verl_compat.model import LEVELS


def test_every_check_has_a_known_level_and_a_family_prefix() -> None:
    assert len(CHECKS) > 20
    for check_id, entry in CHECKS.items():
        assert entry.level in LEVELS, check_id
        assert "." in check_id, f"check id {check_id!r} names no family"


def test_registering_an_id_twice_is_refused() -> None:
    some_id = next(iter(CHECKS))
    with pytest.raises(ValueError, match="registered twice"):
        check(some_id, level="error")(lambda inp: iter(()))


def test_evidence_names_the_profile_and_version_it_ran_with() -> None:
    entry = Check(
        "demo.check",
        "warning",
        "profile {profile} of verl {version}",
        lambda inp: iter([Hit("a.b", "m")]),
    )
    inp = CheckInput({}, (), (), ProfileInfo("p-9.9.9", "9.9.9"))
    (finding,) = entry.findings(inp)
    assert finding.evidence == "profile p-9.9.9 of verl 9.9.9"
    assert (finding.level, finding.path, finding.message) == ("warning", "a.b", "m")
