"""Every upstream file:line this package cites exists in the installed verl 0.9.0.

Findings, lowerings and "no effect" claims cite the upstream line that makes them true; a typo or a
line from another release would send the reader to the wrong code. This checks the citation points
inside the file (a file that exists and has that many lines); what the line says is each
finding's own test.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_verl_compat"
CORPUS = PACKAGE.parent / "corpus"
CITATION = re.compile(r"\b(verl/[A-Za-z0-9_/]+\.py):(\d+)(?:-(\d+))?")


def _citations() -> dict[tuple[str, int], str]:
    found: dict[tuple[str, int], str] = {}
    # The corpus's data files too: the step stage's coverage table cites what makes a row true.
    sources = [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.yaml"), *CORPUS.glob("*.yaml")]
    for source in sorted(sources):
        for number, line in enumerate(source.read_text().splitlines(), 1):
            for match in CITATION.finditer(line):
                last = int(match.group(3) or match.group(2))
                where = f"{source.relative_to(PACKAGE.parent)}:{number}"
                found.setdefault((match.group(1), last), where)
    return found


def _installed_verl() -> Path:
    spec = importlib.util.find_spec("verl")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl is not installed (pip install -e '.[upstream]')")
    return Path(next(iter(spec.submodule_search_locations))).parent


def test_the_package_cites_upstream_lines() -> None:
    # Guards the scan itself: a changed citation style would make the next test vacuous.
    assert len(_citations()) > 40


def test_every_cited_upstream_line_exists_in_the_installed_release() -> None:
    root = _installed_verl()
    wrong = []
    for (relative, line), where in sorted(_citations().items()):
        path = root / relative
        if not path.is_file():
            wrong.append(f"{where}: {relative} is not a file of the installed verl")
            continue
        length = len(path.read_text().splitlines())
        if line > length:
            wrong.append(f"{where}: {relative}:{line} is past its last line ({length})")
    assert not wrong, "\n".join(wrong)
