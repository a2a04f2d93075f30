"""``pytest --verl-corpus --verl-corpus-gpu TYPE``: the memory forecast joins the verdict stage only
when the option is given; an unknown GPU type is a usage error at parse time."""

from __future__ import annotations

import pytest
from corpus_facts import needs_release


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """The audit in a subprocess, fast: no trusted stage, no cache."""
    return pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--verl-corpus-trusted=off", *args
    )


def test_an_unknown_gpu_type_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--verl-corpus", "--verl-corpus-gpu", "B300")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--verl-corpus-gpu: unknown GPU type 'B300'" in result.stderr.str()


@pytest.mark.slow
@needs_release()
@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_the_verdict_fails_a_case_that_does_not_fit_only_when_asked(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, workers: tuple[str, ...]
) -> None:
    monkeypatch.delenv("VERL_UPSTREAM", raising=False)  # the installed verl's tree
    selection = ("--verl-corpus", "verl-corpus::test_verdict[grpo]", *workers)
    plain = run(pytester, *selection)
    plain.assert_outcomes(passed=1)
    small = run(pytester, *selection, "--verl-corpus-gpu", "RTX4090")
    small.assert_outcomes(failed=1)
    assert "does not fit the RTX4090: " in small.stdout.str()
    assert "actor update on the trainer GPUs peaks at" in small.stdout.str()
    large = run(pytester, *selection, "--verl-corpus-gpu", "H200")
    large.assert_outcomes(passed=1)
