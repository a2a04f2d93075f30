"""Edits to a launch script at the source text that builds an override, proven by re-reading it.

The reader gives the launcher's argv, not where each word came from: a field may be written on
the launcher's own line, in an array, in a variable, in a branch. So an edit of one field (a key
renamed, its ``+`` prefix adjusted) is located by trying it: every place in the text where the
old key is written literally (as a whole key, not part of a longer one) is a candidate, and the
candidate is the field's source exactly when the script, edited there and read again with the
same bindings, gives the same argv with that one field changed as intended. A key the script
builds from variables has no such place, and a place that builds several fields fails the test;
both are reported rather than guessed. Every edit of a script is then applied at once and the
whole argv checked again.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_verl_compat.bash import LaunchReadError, read_launch
from pytest_verl_compat.model import Bindings

# Characters that may continue a dotted key: a match must not sit inside a longer key.
_KEY_CHAR = re.compile(r"[A-Za-z0-9_.\-]")
_PREFIX_CHARS = "+~"


@dataclass(frozen=True)
class FieldEdit:
    """Replace the key of argv field ``index``: ``old`` (prefix and key, as in the field) by ``new``."""

    index: int
    old: str
    new: str

    def apply(self, field: str) -> str:
        assert field.startswith(self.old), (field, self.old)
        return self.new + field[len(self.old) :]


@dataclass(frozen=True)
class SourceEdit:
    """A byte range of the script replaced by new text, and the line it is on."""

    start: int
    end: int
    replacement: str
    line: int


@dataclass(frozen=True)
class Located:
    """Where each field edit was made, and why the others could not be."""

    edits: dict[int, SourceEdit]
    failures: dict[int, str]
    # Lines where an edited key is also written, but editing it there does not change the argv
    # (a comment, a branch these bindings do not take): left as they are.
    unedited: dict[int, list[int]]


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _read_argv(path: Path, bindings: Bindings, text: str) -> tuple[str, ...] | None:
    try:
        return read_launch(path, bindings, text=text).argv
    except LaunchReadError:  # LaunchExited too: the edit made the script stop early
        return None


def apply_edits(text: str, edits: Sequence[SourceEdit]) -> str:
    """The text with every (non-overlapping) edit made."""
    out = text
    for edit in sorted(edits, key=lambda e: e.start, reverse=True):
        out = out[: edit.start] + edit.replacement + out[edit.end :]
    return out


def candidates(text: str, key: str) -> list[tuple[int, int]]:
    """(start, end) of every literal occurrence of ``key`` as a whole key, with the ``+``/``~``
    prefix written right before it included."""
    found = []
    for match in re.finditer(re.escape(key), text):
        start, end = match.start(), match.end()
        before = text[start - 1] if start > 0 else ""
        after = text[end] if end < len(text) else ""
        if (before and _KEY_CHAR.match(before)) or (after and _KEY_CHAR.match(after)):
            continue
        while start > 0 and text[start - 1] in _PREFIX_CHARS:
            start -= 1
        found.append((start, end))
    return found


def locate_edits(
    path: Path,
    text: str,
    bindings: Bindings,
    argv: Sequence[str],
    edits: Sequence[FieldEdit],
) -> Located:
    """Find, for each field edit, the one place in ``text`` that builds that field's key."""
    located: dict[int, SourceEdit] = {}
    failures: dict[int, str] = {}
    unedited: dict[int, list[int]] = {}
    for edit in edits:
        field = argv[edit.index]
        key = edit.old.lstrip(_PREFIX_CHARS)
        expected = list(argv)
        expected[edit.index] = edit.apply(field)
        hits: list[SourceEdit] = []
        unreached: list[int] = []
        for start, end in candidates(text, key):
            source = SourceEdit(start, end, edit.new, _line_of(text, start))
            if _read_argv(path, bindings, apply_edits(text, [source])) == tuple(expected):
                hits.append(source)
            else:
                unreached.append(source.line)
        if len(hits) == 1:
            located[edit.index] = hits[0]
            if unreached:
                unedited[edit.index] = sorted(set(unreached))
        elif hits:
            lines = ", ".join(str(hit.line) for hit in hits)
            failures[edit.index] = (
                f"`{key}` is written on several lines that each build it ({lines})"
            )
        elif unreached:
            lines = ", ".join(str(line) for line in sorted(set(unreached)))
            failures[edit.index] = (
                f"`{key}` is written on line {lines}, but editing it there does not change only "
                f"this field (`{field}`): the text builds other fields too, or is not reached"
            )
        else:
            failures[edit.index] = (
                f"`{key}` is not written literally in the script (the field `{field}` is built "
                "from variables): edit it by hand"
            )
    return Located(located, failures, unedited)


def verify_edits(
    path: Path,
    text: str,
    bindings: Bindings,
    argv: Sequence[str],
    edits: Sequence[FieldEdit],
    located: Located,
) -> tuple[str, tuple[str, ...]] | None:
    """The edited text and its argv when every located edit together gives the expected argv."""
    by_index = {edit.index: edit for edit in edits}
    expected = list(argv)
    for index in located.edits:
        expected[index] = by_index[index].apply(argv[index])
    new_text = apply_edits(text, list(located.edits.values()))
    new_argv = _read_argv(path, bindings, new_text)
    if new_argv != tuple(expected):
        return None
    return new_text, new_argv
