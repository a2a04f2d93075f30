"""The census of upstream's checks (issue 22): docs/upstream-checks.md is what the installed verl
and census_reasons.yaml give, no configuration entry is unexplained, at least 90% are evaluated.

The page's "evaluated" column comes from a coverage run of the probes (``verl-compat census``,
~20 min on two cores), too slow for every run; this test re-renders the page from the scan of the
installed verl, the reasons and the page's own "yes" rows, so a new `raise` upstream, a changed
reason or a hand edit fails here at once, naming the command that regenerates the page. The slow
test re-runs the coverage itself (``VERL_COMPAT_CENSUS=1``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_verl_compat.pipeline.pins import installed_verl_root
from pytest_verl_compat.upstream import census, census_run

PAGE = Path(__file__).resolve().parents[1] / "docs" / "upstream-checks.md"
REGENERATE = "verl-compat --upstream PATH census --write docs/upstream-checks.md"
MINIMUM_SHARE = 0.90
CLI = (sys.executable, "-m", "pytest_verl_compat.cli")

pytestmark = pytest.mark.skipif(installed_verl_root() is None, reason="verl is not installed")


def _page_rows(text: str) -> dict[str, str]:
    """``file:line`` → the evaluated column, for every row of the page."""
    rows: dict[str, str] = {}
    file = ""
    for line in text.splitlines():
        heading = re.fullmatch(r"## `(.+)`", line)
        if heading:
            file = heading.group(1)
            continue
        row = re.fullmatch(r"\| (\d+) \| .* \| (config|data|internal|elsewhere) \| (.*) \|", line)
        if row and file:
            rows[f"{file}:{row.group(1)}"] = row.group(3)
    return rows


def test_the_page_is_the_census_of_the_installed_verl() -> None:
    installed = installed_verl_root()
    assert installed is not None
    text = PAGE.read_text(encoding="utf-8")
    reasons = census.load_reasons()
    entries = census.settled(census.scan(installed[0]), reasons)
    rows = _page_rows(text)
    evaluated = {where for where, status in rows.items() if status == "yes"}
    ran: dict[str, set[int]] = {}
    for entry in entries:
        if entry.where in evaluated:
            ran.setdefault(entry.file, set()).update(entry.deciding)
    found = re.search(r"at least one of (\d+) configurations", text)
    assert found, "the page does not say how many configurations the coverage ran"
    version = installed[1]
    rendered = census_run.render(version, entries, ran, reasons, int(found.group(1)))
    assert rendered == text, f"docs/upstream-checks.md is out of date: regenerate it ({REGENERATE})"

    counts = census.summary(entries, ran, reasons)
    assert not counts["unexplained"], f"neither evaluated nor explained: {counts['unexplained']}"
    share = counts["config_evaluated"] / counts["config"]
    assert share >= MINIMUM_SHARE, f"{share:.1%} of the configuration checks evaluated"


def test_every_reason_matches_an_entry_and_none_is_a_to_do() -> None:
    """A reason no entry needs is stale; a reason names what this machine lacks."""
    installed = installed_verl_root()
    assert installed is not None
    reasons = census.load_reasons()
    entries = census.scan(installed[0])
    for reason in reasons:
        assert any(reason.covers(entry) for entry in entries), f"matches no entry: {reason}"
        assert not re.search(r"\b(todo|later|not yet|not implemented)\b", reason.reason, re.I), (
            reason
        )


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("VERL_COMPAT_CENSUS"),
    reason="the coverage run takes ~20 min on two cores; VERL_COMPAT_CENSUS=1 runs it",
)
def test_the_coverage_run_gives_the_committed_page(upstream_checkout: Path) -> None:
    run = subprocess.run(
        [*CLI, "--upstream", str(upstream_checkout), "census", "--check", str(PAGE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-4000:]
