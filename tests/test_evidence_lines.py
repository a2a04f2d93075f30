"""Every upstream file:line this package cites exists in the release it cites.

A citation is of the release the project's texts are written for (the release index's
``citations``), unless it says its own (``file.py:N@0.9.1``) or sits in a file of another release
(its profile, ``profiles/verl-0.9.1-*.yaml``, whose citations are that release's lines).

Findings, lowerings and "no effect" claims cite the upstream line that makes them true; a typo or a
line from another release would send the reader to the wrong code. This checks the citation points
inside the file (a file that exists and has that many lines); what the line says is each
finding's own test.
"""

from __future__ import annotations

import re
from pathlib import Path

from corpus_facts import release_root

from pytest_verl_compat.releases.index import load_release_index

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_verl_compat"
CORPUS = PACKAGE.parent / "corpus"
CITATION = re.compile(r"\b(verl/[A-Za-z0-9_/]+\.py):(\d+)(?:-(\d+))?(?:@(\d+\.\d+\.\d+))?")
PROFILE_RELEASE = re.compile(r"verl-(\d+\.\d+\.\d+)-")


def _citations() -> dict[tuple[str, str, int], str]:
    """(release, file, last line) of every citation, with where it is written."""
    base = load_release_index().citations
    found: dict[tuple[str, str, int], str] = {}
    # The corpus's data files too: the step stage's coverage table cites what makes a row true.
    sources = [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.yaml"), *CORPUS.glob("*.yaml")]
    for source in sorted(sources):
        of_file = PROFILE_RELEASE.match(source.name)
        release_of_file = of_file.group(1) if of_file else base
        for number, line in enumerate(source.read_text().splitlines(), 1):
            for match in CITATION.finditer(line):
                last = int(match.group(3) or match.group(2))
                where = f"{source.relative_to(PACKAGE.parent)}:{number}"
                release = match.group(4) or release_of_file
                found.setdefault((release, match.group(1), last), where)
    return found


def test_the_package_cites_upstream_lines() -> None:
    # Guards the scan itself: a changed citation style would make the next test vacuous.
    assert len(_citations()) > 40


def test_every_cited_upstream_line_exists_in_the_release_it_cites() -> None:
    wrong = []
    for (release, relative, line), where in sorted(_citations().items()):
        path = release_root(release) / relative
        if not path.is_file():
            wrong.append(f"{where}: {relative} is not a file of verl {release}")
            continue
        length = len(path.read_text().splitlines())
        if line > length:
            wrong.append(f"{where}: {relative}:{line} is past its last line ({length})")
    assert not wrong, "\n".join(wrong)
