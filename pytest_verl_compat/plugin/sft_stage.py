"""The SFT step stage: the reference trainer's SFT steps against verl's, one test per SFT case.

Kept apart from `stages.py` (which imports the class so that pytest collects it there, under
the `verl-corpus` node id): the cases are `corpus/sft_step.yaml`'s, run with the step stage's
option `--verl-corpus-step`, verl imported once per session for every SFT case
(`once_per_session`, also under xdist).
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_verl_compat.pipeline.sft import sft_case_overrides
from pytest_verl_compat.plugin.keys import audit_state_key
from pytest_verl_compat.plugin.shared import once_per_session, result_name


def _sft_outcome(release: str) -> dict[str, Any]:
    from pytest_verl_compat.conformance.step.sft import (
        SFTOracleError,
        load_sft_step_plan,
        run_sft_steps,
    )
    from pytest_verl_compat.pipeline.lower import NotAccepted
    from pytest_verl_compat.releases.index import ReleaseError
    from pytest_verl_compat.upstream.oracle.runner import release_runner

    try:
        report = run_sft_steps(load_sft_step_plan(), release_runner(release))
    except (SFTOracleError, NotAccepted, ReleaseError) as exc:
        return {"error": str(exc)}
    return {"report": report}


class TestSFTStepConformance:
    """verl's SFT trainer steps (`conformance/step/sft.py`): each case of `corpus/sft_step.yaml`
    in SGD and AdamW, compared after each of two steps."""

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """The SFT cases; a user's corpus (no conformance file) has none: one skipped placeholder."""
        session = metafunc.config.stash[audit_state_key].session
        if session.manifest is not None and session.manifest.conformance:
            ids = list(sft_case_overrides())
            metafunc.parametrize("sft_step_case", [pytest.param(i, id=i) for i in ids])
            return
        skip = pytest.mark.skip(reason="the manifest names no conformance file")
        metafunc.parametrize("sft_step_case", [pytest.param(None, id="none", marks=skip)])

    def test_sft_step(
        self,
        sft_step_case: str,
        request: pytest.FixtureRequest,
        tmp_path_factory: pytest.TempPathFactory,
    ) -> None:
        """The reference trainer's SFT steps equal verl's SFT trainer's."""
        from pytest_verl_compat.conformance.plan import comparison_missing_reason
        from pytest_verl_compat.conformance.step.run import case_failures

        if not request.config.getoption("verl_corpus_step"):
            pytest.skip("the step stage runs with --verl-corpus-step")
        missing = comparison_missing_reason(request.config.stash[audit_state_key].session.version)
        if missing:
            pytest.skip(missing)
        cases = sorted(sft_case_overrides())
        outcome = once_per_session(
            request.config,
            tmp_path_factory,
            result_name("sft-step", cases),
            lambda: _sft_outcome(request.config.stash[audit_state_key].session.version),
        )
        if outcome.get("error"):
            pytest.fail(outcome["error"], pytrace=False)
        failures = case_failures(outcome["report"][sft_step_case])
        assert not failures, (
            f"SFT step differs from upstream: {'; '.join(failures)} [{sft_step_case}]"
        )
