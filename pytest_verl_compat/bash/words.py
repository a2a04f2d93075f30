"""Words: quoting, literal text, ASCII-only value helpers and the field builder.

A word before expansion is a list of items (:data:`Item`): unquoted characters, protected
(:class:`Quoted`) text, or syntax-tree parts still to expand.  :class:`Fields` collects the
expanded text into fields, splitting only unquoted expansion results on IFS whitespace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from pytest_verl_compat.bash.errors import MAX_FIELDS, BudgetExceeded
from pytest_verl_compat.bash.parse import Node

_IFS_WHITESPACE = " \t\n"


ANSI_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "e": "\x1b",
    "E": "\x1b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "?": "?",
}


def single_quoted(text: str) -> str:
    """``text`` single-quoted for a shell command line."""
    return "'" + text.replace("'", "'\\''") + "'"


def is_name(text: str) -> bool:
    """Whether ``text`` is a bash variable name."""
    if not text or not (text[0] == "_" or ("a" <= text[0] <= "z") or ("A" <= text[0] <= "Z")):
        return False
    return all(c == "_" or (c.isascii() and c.isalnum()) for c in text)


def could_be_user(text: str) -> bool:
    """Whether ``text`` is a plausible login name (``[a-z_][a-z0-9_.-]*``, any case)."""
    if not text or not (text[0] == "_" or (text[0].isascii() and text[0].isalpha())):
        return False
    return all(c in "_.-" or (c.isascii() and c.isalnum()) for c in text)


def ascii_digits(text: str) -> bool:
    """Whether ``text`` is a non-empty run of ASCII decimal digits."""
    return bool(text) and all("0" <= c <= "9" for c in text)


def legal_integer(text: str) -> int | None:
    """An operand of ``[ ... -eq ... ]``: optional blanks and sign around decimal digits."""
    body = text.strip(" \t\n")
    sign = 1
    if body[:1] in ("+", "-"):
        sign = -1 if body[0] == "-" else 1
        body = body[1:]
    if not ascii_digits(body):
        return None
    # bash's legal_number is strtoimax: a value outside 64 bits is not a number at all.
    body = body.lstrip("0") or "0"
    if len(body) > 19:
        return None
    value = sign * int(body)
    return value if -(1 << 63) <= value < 1 << 63 else None


_LOWER_ASCII = "abcdefghijklmnopqrstuvwxyz"
_TO_UPPER = str.maketrans(_LOWER_ASCII, _LOWER_ASCII.upper())
_TO_LOWER = str.maketrans(_LOWER_ASCII.upper(), _LOWER_ASCII)


def ascii_case(text: str, op: str) -> str:
    """Bash's ``^^ ^ ,, ,`` case changes; only ASCII letters change in the C locale."""
    upper = op.startswith("^")
    if len(op) == 2:
        return text.translate(_TO_UPPER if upper else _TO_LOWER)
    return ascii_case_char(text[:1], upper) + text[1:] if text else text


def ascii_case_char(c: str, upper: bool) -> str:
    """One character with its ASCII case changed."""
    if upper and "a" <= c <= "z":
        return chr(ord(c) - 32)
    if not upper and "A" <= c <= "Z":
        return chr(ord(c) + 32)
    return c


def unescape_double_quoted(text: str) -> str:
    """Backslash removal inside double quotes: only before ``$ ` " \\`` and newline."""
    if "\\" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text) and text[i + 1] in '$`"\\\n':
            if text[i + 1] != "\n":
                out.append(text[i + 1])
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def literal_chunks(text: str) -> Iterator[tuple[str, bool]]:
    """An unquoted literal as (text, escaped) runs; escaped runs are single characters."""
    start = 0
    i = 0
    while i < len(text):
        if text[i] == "\\":
            if i > start:
                yield text[start:i], False
            # A lone backslash ends a literal only at the end of the script, where bash reads it
            # as a line continuation into nothing: it vanishes (`echo a \` at EOF passes `a`).
            if i + 1 < len(text):
                yield text[i + 1], True
            i += 2
            start = i
        else:
            i += 1
    if start < len(text):
        yield text[start:], False


class Quoted:
    """A run of text inside a word that is protected from brace expansion and splitting."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


# A word before expansion: unquoted characters (str of length 1), protected text, or parts.
Item = str | Quoted | Node


class Fields:
    """Accumulates expansion results into fields, splitting only unquoted expansion results.

    Splitting follows bash's ``list_string`` with any IFS: IFS whitespace (space, tab, newline
    in IFS) separates fields and is trimmed at their ends; every other IFS character ends a
    field, an empty one too (``a,,b`` is three fields with ``IFS=,``), absorbing the IFS
    whitespace around it; a delimiter at the very end makes no empty field.
    """

    def __init__(
        self,
        split: bool,
        ifs: str = _IFS_WHITESPACE,
        certain: Callable[[str], bool] | None = None,
    ) -> None:
        self.split = split
        # Whether a split text's run-time values are certainly one word each (``shapes``).
        self.certain = certain
        self.whitespace = frozenset(c for c in ifs if c in _IFS_WHITESPACE)
        self.delimiters = frozenset(ifs) - self.whitespace
        self.fields: list[str] = []
        self.buf: list[str] = []
        # Whether the field in progress exists even if empty (it holds quoted or literal text).
        self.content = False
        # What ended the last field of this word, while nothing has followed it: "white" (IFS
        # whitespace, which a delimiter after it joins) or "delimiter".
        self.ended_by: str | None = None
        # The first split text that holds a run-time value: how many fields it makes, and
        # where they end, is only known at run time.
        self.uncertain: str | None = None

    def text(self, value: str) -> None:
        """Append text that is never split (literal or quoted)."""
        self.buf.append(value)
        self.content = True
        self.ended_by = None

    def expanded(self, value: str) -> None:
        """Append the result of an unquoted expansion, splitting it on IFS."""
        if not self.split:
            self.buf.append(value)
            return
        if "\0" in value and self.uncertain is None:
            if self.certain is None or not self.certain(value):
                self.uncertain = value
        start = 0
        for i, c in enumerate(value):
            if c in self.whitespace:
                if i > start:
                    self.buf.append(value[start:i])
                    self.content = True
                if self.content:
                    self.end_field()
                    self.ended_by = "white"
                start = i + 1
            elif c in self.delimiters:
                if i > start:
                    self.buf.append(value[start:i])
                    self.content = True
                # A delimiter right after IFS whitespace that ended a field is part of it.
                if self.content or self.ended_by != "white":
                    self.end_field(keep_empty=True)
                self.ended_by = "delimiter"
                start = i + 1
        if start < len(value):
            self.buf.append(value[start:])
            self.content = True
            self.ended_by = None

    def list_separator(self, separator: str, before: str) -> None:
        """The IFS character bash puts between the elements of an unquoted ``$*``/``$@``.

        Unlike in a value, IFS whitespace that leads the word joins the delimiter after it
        (bash: ``set -- " " x; IFS=', '; f $*`` passes one field, ``f " ,x"`` unquoted two).
        """
        leading_white = before and before[-1] in self.whitespace
        if leading_white and self.ended_by is None and not self.content:
            self.ended_by = "white"
        self.expanded(separator)

    def end_field(self, keep_empty: bool = False) -> None:
        """End the field in progress (an empty one only when a delimiter ends it)."""
        if self.content or keep_empty:
            self.fields.append("".join(self.buf))
            if len(self.fields) > MAX_FIELDS:
                raise BudgetExceeded("too many words")
        self.buf = []
        self.content = False

    def delimit(self) -> None:
        """End the word in progress: its field, if it exists."""
        self.end_field()
        self.ended_by = None

    def hard(self) -> None:
        """End the field in progress unconditionally (between the elements of ``"$@"``)."""
        self.content = True
        self.delimit()

    def finish(self) -> list[str]:
        """All fields (split mode)."""
        self.delimit()
        return self.fields

    def joined(self) -> str:
        """The single string (non-split mode)."""
        return "".join(self.buf)


def is_char(item: Item, c: str) -> bool:
    """Whether an item is the unquoted character ``c``."""
    return type(item) is str and item == c
