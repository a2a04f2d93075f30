"""Upstream's lines, found in each release: the project cites one release's lines, every release
reads its own.

The project's texts (a rule's evidence, a finding's message, a profile's reason) cite verl's
source as ``verl/path/file.py:LINE`` or ``:START-END``, written against one release, the index's
``citations`` release. For every other supported release a *line map* says where each of those
lines is in that release's own files: derived from the two releases' files alone (difflib's
matching blocks of each file's lines, as ``git diff`` pairs them), kept in
``data/releases/<version>/lines.json`` and checked against the files by the tests. A line that
the other release changed or removed has no place there: the citation then says so
(the base release's line, ``(verl 0.9.0; changed in 0.9.1)``), never a wrong line.

A citation is read as a person reads it: a full path (``verl/…/file.py:N``), a file's name alone
(``engine_workers.py:617``: the last full path of that name in the same text, else the one file
of that name in the release), or a bare ``:N`` (the last file the text named). ``file.py:N@0.9.1``
cites another release's line, as written.
"""

from __future__ import annotations

import difflib
import functools
import itertools
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from pytest_verl_compat.files.safe_input import InputError, load_yaml_file, read_bytes, read_text
from pytest_verl_compat.releases.index import RELEASE_DATA, load_release_index

LINES_FILE = "lines.json"
# Citations whose lines a release changed, reviewed by a person: where they are in that release,
# and why the claim still holds there (``data/releases/<version>/citations.yaml``).
REVIEWED_FILE = "citations.yaml"
MAX_LINES_BYTES = 8 << 20
_CITATION = re.compile(
    r"(?P<path>(?:[A-Za-z_][\w]*/)*[A-Za-z_][\w]*\.py)?:(?P<start>\d+)(?:-(?P<end>\d+))?"
    r"(?:@(?P<release>\d+\.\d+\.\d+))?"
)


@dataclass(frozen=True)
class Citation:
    """One citation in a text: where it is, the file (a path inside the release) and lines."""

    span: tuple[int, int]
    file: str
    start: int
    end: int
    release: str
    written: str  # as the text writes it


def base_release() -> str:
    """The release whose lines the project's texts cite (the release index says)."""
    return load_release_index().citations


def source_files(root: Path) -> list[str]:
    """Every ``verl/**/*.py`` of a release's files, as paths relative to ``root``."""
    return sorted(p.relative_to(root).as_posix() for p in (root / "verl").rglob("*.py"))


def citations(text: str, files: tuple[str, ...], release: str) -> Iterator[Citation]:
    """The citations of ``text`` (see the module's docstring for the forms), each resolved to a
    file of ``files`` (the cited release's); a file name that names no file is left out."""
    by_name: dict[str, list[str]] = {}
    for path in files:
        by_name.setdefault(PurePosixPath(path).name, []).append(path)
    last: str | None = None
    named: dict[str, str] = {}
    for match in _CITATION.finditer(text):
        written = match.group("path")
        file: str | None
        if written is None:
            # ``:N`` alone, right after a citation or a file's name: that file's line.
            before = text[: match.start()]
            if not before or before[-1].isalnum() or before.endswith((":", "/")):
                continue
            file = last
        elif written in files:
            file = written
        else:
            name = PurePosixPath(written).name
            known = [p for p in by_name.get(name, []) if p.endswith("/" + written)]
            # Of several files of that name, the one nearest the package's top (a reader's
            # ``engine_workers.py`` is verl/workers/, not verl/experimental/separation/).
            depth = min((p.count("/") for p in known), default=0)
            nearest = [p for p in known if p.count("/") == depth]
            file = named.get(written) or (nearest[0] if len(nearest) == 1 else None)
        if file is None:
            continue
        if written is not None:
            named[PurePosixPath(written).name] = file
            named[written] = file
        last = file
        start = int(match.group("start"))
        end = int(match.group("end") or start)
        yield Citation(
            match.span(),
            file,
            start,
            end,
            match.group("release") or release,
            match.group(0),
        )


# --- the line map: one release's lines in another's -------------------------------------------


def _lines(path: Path) -> list[str]:
    try:
        return read_text(path, what="upstream source").splitlines()
    except (InputError, FileNotFoundError):
        return []


def derive_line_map(base_root: Path, other_root: Path) -> dict[str, Any]:
    """Where each line of the base release's files is in the other release's: per file that
    differs, difflib's matching blocks ``[base line, other line, count]`` (1-based); a file the
    other release lacks maps nothing; an identical file maps itself (left out)."""
    base_files = source_files(base_root)
    other = set(source_files(other_root))
    changed: dict[str, list[list[int]]] = {}
    for relative in base_files:
        if relative not in other:
            changed[relative] = []
            continue
        before, after = _lines(base_root / relative), _lines(other_root / relative)
        if before == after:
            continue
        matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
        changed[relative] = [
            [block.a + 1, block.b + 1, block.size]
            for block in matcher.get_matching_blocks()
            if block.size
        ]
    return {"base_files": base_files, "changed": changed}


@dataclass(frozen=True)
class LineMap:
    """The base release's lines in another release (``derive_line_map``'s data)."""

    base: str
    release: str
    base_files: tuple[str, ...]
    changed: Mapping[str, tuple[tuple[int, int, int], ...]]

    def line(self, file: str, number: int) -> int | None:
        """Where the base release's ``file:number`` is in this release, or None."""
        if file not in self.base_files:
            return None
        blocks = self.changed.get(file)
        if blocks is None:
            return number  # the same file in both
        for base, other, size in blocks:
            if base <= number < base + size:
                return other + (number - base)
        return None

    def span(self, file: str, start: int, end: int) -> tuple[int, int] | None:
        """Where the lines ``start..end`` are, when every one of them is there, in order (the
        release may have added lines between them; it changed none of them)."""
        found = [self.line(file, n) for n in range(start, end + 1)]
        if any(n is None for n in found):
            return None
        numbers = [n for n in found if n is not None]
        in_order = all(a < b for a, b in itertools.pairwise(numbers))
        return (numbers[0], numbers[-1]) if in_order else None


def lines_path(version: str) -> Path:
    return RELEASE_DATA / version / LINES_FILE


@functools.cache
def line_map(version: str) -> LineMap | None:
    """The line map of the base release into ``version`` (None for the base itself, or a
    release with none derived)."""
    base = base_release()
    path = lines_path(version)
    if version == base or not path.is_file():
        return None
    try:
        raw: Any = json.loads(read_bytes(path, MAX_LINES_BYTES, "line map"))
        return LineMap(
            base,
            version,
            tuple(raw["base_files"]),
            {f: tuple((a, b, n) for a, b, n in blocks) for f, blocks in raw["changed"].items()},
        )
    except (InputError, ValueError, KeyError, TypeError):
        return None


def dumps_line_map(data: Mapping[str, Any]) -> str:
    """The data file's text: sorted, one file's blocks per line, byte-deterministic."""
    files = json.dumps(list(data["base_files"]))
    changed = ",\n".join(
        f"  {json.dumps(name)}: {json.dumps(blocks)}"
        for name, blocks in sorted(data["changed"].items())
    )
    return f'{{"base_files": {files},\n"changed": {{\n{changed}\n}}}}\n'


@functools.cache
def _base_files() -> tuple[str, ...]:
    """The base release's source files, from any line map (every one lists them)."""
    for version in load_release_index().supported_versions:
        found = line_map(version)
        if found is not None:
            return found.base_files
    return ()


def cite(text: str, version: str) -> str:
    """``text`` with each citation of the base release's lines made ``version``'s: its line
    there, or the base release's line with what became of it."""
    base = base_release()
    if version == base or not text or ":" not in text:
        return text
    mapping = line_map(version)
    files = mapping.base_files if mapping is not None else _base_files()
    out, at = [], 0
    for found in citations(text, files, base):
        if found.release != base:
            continue  # cites its own release's line, as written
        out.append(text[at : found.span[0]])
        out.append(_cited(found, mapping, base, version))
        at = found.span[1]
    out.append(text[at:])
    return "".join(out)


def cites_only_gone(text: str, version: str) -> bool:
    """Whether ``text`` cites the base release's code and ``version`` has none of it: every file
    it cites is gone there (0.8.0 has no ``verl/trainer/ppo/v1/``). A claim standing on that code
    says nothing of such a release."""
    base = base_release()
    mapping = line_map(version)
    if version == base or mapping is None or not text:
        return False
    cited = [f for f in citations(text, mapping.base_files, base) if f.release == base]
    return bool(cited) and all(mapping.changed.get(found.file) == () for found in cited)


@functools.cache
def reviewed(version: str) -> dict[str, str]:
    """A person's reviewed citations of ``version``: the base release's citation (as the texts
    write it, ``file.py:START-END``) and where it is in ``version``."""
    path = RELEASE_DATA / version / REVIEWED_FILE
    if not path.is_file():
        return {}
    raw: Any = load_yaml_file(path, what="reviewed citations") or {}
    return {str(key): str(entry["in"]) for key, entry in raw.items()}


def _cited(found: Citation, mapping: LineMap | None, base: str, version: str) -> str:
    lines = f"{found.start}-{found.end}" if found.end != found.start else f"{found.start}"
    person = reviewed(version).get(f"{found.file}:{lines}")
    if person is not None:
        return found.written.split("@", 1)[0].rsplit(":", 1)[0] + ":" + person
    if mapping is None:
        return f"{found.written} (verl {base}; no line map for {version})"
    moved = mapping.span(found.file, found.start, found.end)
    if moved is None:
        what = "gone" if mapping.changed.get(found.file) == () else "changed"
        return f"{found.written} (verl {base}; {what} in {version})"
    first, last = moved
    lines = f"{first}-{last}" if last != first else f"{first}"
    written = found.written.split("@", 1)[0]
    head = written.rsplit(":", 1)[0]
    return f"{head}:{lines}"
