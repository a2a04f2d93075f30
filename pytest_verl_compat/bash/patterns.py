"""Patterns: bash globs as regular expressions, case patterns and ``${X#p}``/``${X/p/r}``."""

from __future__ import annotations

import re
from collections.abc import Iterator

from pytest_verl_compat.bash.arithmetic import _Arithmetic
from pytest_verl_compat.bash.errors import _MAX_PATTERN_SUBJECT
from pytest_verl_compat.bash.parse import Node, _line
from pytest_verl_compat.bash.words import _Fields, _lit_chunks

_CHAR_CLASSES = {
    "alpha": "a-zA-Z",
    "digit": "0-9",
    "alnum": "a-zA-Z0-9",
    "upper": "A-Z",
    "lower": "a-z",
    "space": " \\t\\n\\r\\f\\v",
    "blank": " \\t",
    "punct": re.escape("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
    "xdigit": "0-9A-Fa-f",
    "cntrl": "\\x00-\\x1f\\x7f",
    "print": "\\x20-\\x7e",
    "graph": "\\x21-\\x7e",
    "word": "a-zA-Z0-9_",
}


class _GlobClassError(Exception):
    """An unknown ``[:class:]`` in a bracket expression."""


def _glob_regex(chars: list[tuple[str, bool]]) -> str:
    """Translate bash glob characters (special or literal) into a regular expression."""
    out: list[str] = []
    i = 0
    n = len(chars)
    while i < n:
        c, special = chars[i]
        if not special:
            out.append(re.escape(c))
            i += 1
            continue
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "\\":
            # In an expanded pattern a backslash quotes the next character.
            if i + 1 < n:
                out.append(re.escape(chars[i + 1][0]))
                i += 1
            else:
                out.append(re.escape(c))
        elif c == "[":
            bracket = _glob_bracket(chars, i)
            if bracket is None:
                out.append(re.escape(c))
            else:
                regex, i = bracket
                out.append(regex)
                continue
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _glob_bracket(chars: list[tuple[str, bool]], start: int) -> tuple[str, int] | None:
    """A ``[...]`` bracket expression at ``start`` as a regex class and the index after it."""
    n = len(chars)
    i = start + 1
    negate = False
    if i < n and chars[i][1] and chars[i][0] in "!^":
        negate = True
        i += 1
    members: list[str] = []
    first = True
    while i < n:
        c, special = chars[i]
        if c == "]" and special and not first:
            body = "".join(members)
            if not body:
                return None
            return f"[{'^' if negate else ''}{body}]", i + 1
        first = False
        if c == "[" and special and i + 1 < n and chars[i + 1] == (":", True):
            end = i + 2
            while end + 1 < n and not (chars[end] == (":", True) and chars[end + 1] == ("]", True)):
                end += 1
            if end + 1 < n:
                name = "".join(ch for ch, _ in chars[i + 2 : end])
                if name not in _CHAR_CLASSES:
                    raise _GlobClassError(f"unknown character class [:{name}:]")
                members.append(_CHAR_CLASSES[name])
                i = end + 2
                continue
        if (
            i + 2 < n
            and chars[i + 1] == ("-", True)
            and not (chars[i + 2][0] == "]" and chars[i + 2][1])
        ):
            low, high = c, chars[i + 2][0]
            if low <= high:
                members.append(f"{_class_escape(low)}-{_class_escape(high)}")
            i += 3
            continue
        members.append(_class_escape(c))
        i += 1
    return None


def _class_escape(c: str) -> str:
    """Escape one character for use inside a regex character class."""
    return "\\" + c if c in "\\]^-[" else c


class _Patterns(_Arithmetic):
    """Pattern words, matching and the pattern operators of parameter expansion."""

    def pattern_chars(self, word: Node | None) -> list[tuple[str, bool]]:
        """A pattern word as (character, is-special) pairs; quoted characters are literal."""
        chars: list[tuple[str, bool]] = []
        for part in (word or {}).get("Parts") or []:
            kind = part.get("Type")
            if kind == "Lit":
                for chunk, escaped in _lit_chunks(part.get("Value", "")):
                    chars.extend((c, not escaped) for c in chunk)
            elif kind == "SglQuoted":
                value = part.get("Value", "")
                if part.get("Dollar"):
                    value = self.ansi_c(value, _line(part))
                chars.extend((c, False) for c in value)
            elif kind == "DblQuoted":
                fb = _Fields(split=False)
                self.part(part, fb, quoted=False, pword=False)
                chars.extend((c, False) for c in fb.joined())
            else:
                # Unquoted expansions keep their pattern characters active.
                fb = _Fields(split=False)
                self.part(part, fb, quoted=False, pword=False)
                chars.extend((c, True) for c in fb.joined())
        return chars

    def compile_pattern(self, word: Node | None, line: int) -> re.Pattern[str]:
        """A bash glob pattern word as a regular expression matching whole strings."""
        try:
            return re.compile(_glob_regex(self.pattern_chars(word)), re.DOTALL)
        except (re.error, _GlobClassError) as exc:
            self.fail(line, "pattern", f"unsupported pattern: {exc}")

    def match(self, word: Node, subject: str) -> bool:
        """Whether ``subject`` matches a case pattern."""
        return self.compile_pattern(word, _line(word)).fullmatch(subject) is not None

    def remove_affix(self, value: str, op: str, word: Node | None, line: int) -> str:
        """``${X#p} ${X##p} ${X%p} ${X%%p}``."""
        self.check_pattern_subject(value, line)
        rx = self.compile_pattern(word, line)
        n = len(value)
        if op == "#":
            cuts: Iterator[int] = iter(range(0, n + 1))
        elif op == "##":
            cuts = iter(range(n, -1, -1))
        elif op == "%":
            cuts = iter(range(n, -1, -1))
        else:
            cuts = iter(range(0, n + 1))
        for cut in cuts:
            if op.startswith("#"):
                if rx.fullmatch(value, 0, cut):
                    return value[cut:]
            elif rx.fullmatch(value, cut, n):
                return value[:cut]
        return value

    def replace(self, value: str, repl: Node, line: int) -> str:
        """``${X/p/r} ${X//p/r} ${X/#p/r} ${X/%p/r}`` (bash 5.2: unquoted ``&`` is the match)."""
        self.check_pattern_subject(value, line)
        orig = repl.get("Orig") or {}
        parts = list(orig.get("Parts") or [])
        anchor = ""
        if parts and parts[0].get("Type") == "Lit" and parts[0].get("Value", "")[:1] in ("#", "%"):
            anchor = parts[0]["Value"][0]
            parts[0] = {**parts[0], "Value": parts[0]["Value"][1:]}
        pattern_word = {**orig, "Parts": parts}
        chars = self.pattern_chars(pattern_word)
        with_pieces = self.replacement_pieces(repl.get("With"), line)

        def render(matched: str) -> str:
            return "".join(matched if piece is None else piece for piece in with_pieces)

        if not chars:
            if anchor == "#":
                return render("") + value
            if anchor == "%":
                return value + render("")
            return value
        try:
            rx = re.compile(_glob_regex(chars), re.DOTALL)
        except (re.error, _GlobClassError) as exc:
            self.fail(line, "pattern", f"unsupported pattern: {exc}")
        n = len(value)
        if anchor == "#":
            for end in range(n, -1, -1):
                if rx.fullmatch(value, 0, end):
                    return render(value[:end]) + value[end:]
            return value
        if anchor == "%":
            for start in range(0, n + 1):
                if rx.fullmatch(value, start, n):
                    return value[:start] + render(value[start:])
            return value
        out: list[str] = []
        i = 0
        replaced = False
        while i < n:
            if replaced and not repl.get("All"):
                break
            found = next((e for e in range(n, i, -1) if rx.fullmatch(value, i, e)), None)
            if found is None:
                out.append(value[i])
                i += 1
                continue
            out.append(render(value[i:found]))
            i = found
            replaced = True
        out.append(value[i:])
        if n == 0 and rx.fullmatch(""):
            return render("")
        return "".join(out)

    def replacement_pieces(self, word: Node | None, line: int) -> list[str | None]:
        """The replacement of ``${X/p/r}`` as text pieces, None standing for the match."""
        pieces: list[str | None] = []
        for part in (word or {}).get("Parts") or []:
            kind = part.get("Type")
            if kind == "Lit":
                for chunk, escaped in _lit_chunks(part.get("Value", "")):
                    if escaped:
                        pieces.append(chunk)
                        continue
                    for segment_index, segment in enumerate(chunk.split("&")):
                        if segment_index:
                            pieces.append(None)
                        pieces.append(segment)
            elif kind in ("SglQuoted", "DblQuoted"):
                fb = _Fields(split=False)
                self.part(part, fb, quoted=False, pword=False)
                pieces.append(fb.joined())
            else:
                fb = _Fields(split=False)
                self.part(part, fb, quoted=False, pword=False)
                text = fb.joined()
                if "&" in text:
                    self.fail(
                        line, "parameter expansion", "an unquoted expansion with & in ${X/p/r}"
                    )
                pieces.append(text)
        return pieces

    def check_pattern_subject(self, value: str, line: int) -> None:
        """Pattern operations are quadratic and locale-dependent beyond ASCII."""
        if len(value) > _MAX_PATTERN_SUBJECT:
            self.fail(line, "limit", "pattern operation on a very long value")
        if not value.isascii():
            self.fail(
                line,
                "parameter expansion",
                "pattern operation on non-ASCII text depends on the locale",
            )
