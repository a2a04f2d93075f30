"""Patterns: bash globs, case patterns and ``${X#p}``/``${X/p/r}``.

A glob is matched by an automaton over its positions (never by a backtracking regular
expression, where ``*a*a*a*a*b`` on a long value takes exponential time), and every step is
counted against a budget.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pytest_verl_compat.bash.arithmetic import Arithmetic
from pytest_verl_compat.bash.errors import MAX_PATTERN_STEPS, MAX_PATTERN_SUBJECT, BudgetExceeded
from pytest_verl_compat.bash.parse import Node, line_of
from pytest_verl_compat.bash.words import Fields, literal_chunks

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


# One glob element: a literal character, `?`, `*`, or a bracket expression (as a compiled
# one-character regular expression).
_Atom = tuple[str, "str | re.Pattern[str] | None"]


def _glob_atoms(chars: list[tuple[str, bool]]) -> list[_Atom]:
    """Bash glob characters (special or literal) as a list of glob elements."""
    out: list[_Atom] = []
    i = 0
    n = len(chars)
    while i < n:
        c, special = chars[i]
        if not special:
            out.append(("lit", c))
        elif c == "*":
            if not out or out[-1][0] != "star":  # `**` is `*`
                out.append(("star", None))
        elif c == "?":
            out.append(("any", None))
        elif c == "\\":
            # In an expanded pattern a backslash quotes the next character.
            if i + 1 < n:
                out.append(("lit", chars[i + 1][0]))
                i += 1
            else:
                out.append(("lit", c))
        elif c == "[":
            bracket = _glob_bracket(chars, i)
            if bracket is None:
                out.append(("lit", c))
            else:
                regex, i = bracket
                out.append(("class", re.compile(regex, re.DOTALL)))
                continue
        else:
            out.append(("lit", c))
        i += 1
    return out


class _Glob:
    """A glob as a set-of-positions automaton; ``spend`` is charged for every step."""

    def __init__(self, atoms: list[_Atom], spend: Callable[[int], None]) -> None:
        self.atoms = atoms
        self.spend = spend
        size = len(atoms)
        # closure[k]: the positions reachable from k without reading (a `*` may match nothing).
        closure: list[frozenset[int]] = [frozenset({size})]
        for k in range(size - 1, -1, -1):
            here = {k} | (closure[0] if atoms[k][0] == "star" else set())
            closure.insert(0, frozenset(here))
        self.closure = closure
        # Characters every match contains: a text without one of them matches nowhere, which
        # answers the common "no match" case without stepping through the text.
        self.required = frozenset(arg for kind, arg in atoms if kind == "lit")
        self.checked: tuple[str, bool] | None = None

    def reversed(self) -> _Glob:
        """The glob that matches the reversed strings (for suffix operations)."""
        return _Glob(self.atoms[::-1], self.spend)

    def ends(self, text: str, start: int) -> list[int]:
        """Every ``end`` (ascending) such that ``text[start:end]`` matches the whole glob."""
        if self.checked is None or self.checked[0] is not text:
            self.spend(len(text) // 64)  # the scan below runs at C speed
            self.checked = (text, self.required.issubset(text))
        if not self.checked[1]:
            return []
        atoms, closure, final = self.atoms, self.closure, len(self.atoms)
        states = closure[0]
        found = [start] if final in states else []
        for pos in range(start, len(text)):
            self.spend(len(states))
            ch = text[pos]
            following: set[int] = set()
            for k in states:
                if k == final:
                    continue
                kind, arg = atoms[k]
                if kind == "star":
                    following |= closure[k]
                elif (
                    kind == "any"
                    or (kind == "lit" and arg == ch)
                    or (kind == "class" and isinstance(arg, re.Pattern) and arg.fullmatch(ch))
                ):
                    following |= closure[k + 1]
            if not following:
                break
            states = frozenset(following)
            if final in states:
                found.append(pos + 1)
        return found

    def fullmatch(self, text: str) -> bool:
        """Whether the whole of ``text`` matches."""
        ends = self.ends(text, 0)
        return bool(ends) and ends[-1] == len(text)


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


def _pattern_text(chars: list[tuple[str, bool]]) -> str:
    """The text of a pattern's characters (where a run-time marker shows)."""
    return "".join(c for c, _ in chars)


class Patterns(Arithmetic):
    """Pattern words, matching and the pattern operators of parameter expansion."""

    def pattern_chars(self, word: Node | None) -> list[tuple[str, bool]]:
        """A pattern word as (character, is-special) pairs; quoted characters are literal."""
        chars: list[tuple[str, bool]] = []
        for part in (word or {}).get("Parts") or []:
            kind = part.get("Type")
            if kind == "Lit":
                for chunk, escaped in literal_chunks(part.get("Value", "")):
                    chars.extend((c, not escaped) for c in chunk)
            elif kind == "SglQuoted":
                value = part.get("Value", "")
                if part.get("Dollar"):
                    value = self.ansi_c(value, line_of(part))
                chars.extend((c, False) for c in value)
            elif kind == "DblQuoted":
                fb = Fields(split=False)
                self.part(part, fb, quoted=False, pword=False)
                chars.extend((c, False) for c in fb.joined())
            else:
                # Unquoted expansions keep their pattern characters active.
                fb = Fields(split=False)
                self.part(part, fb, quoted=False, pword=False)
                chars.extend((c, True) for c in fb.joined())
        return chars

    def glob(self, chars: list[tuple[str, bool]], line: int) -> _Glob:
        try:
            return _Glob(_glob_atoms(chars), self.spend_pattern_steps)
        except (re.error, _GlobClassError) as exc:
            self.fail(line, "pattern", f"unsupported pattern: {exc}")

    def spend_pattern_steps(self, count: int) -> None:
        self.pattern_steps += count
        if self.pattern_steps > MAX_PATTERN_STEPS:
            raise BudgetExceeded("pattern matching takes too many steps")

    def match(self, word: Node, subject: str) -> bool:
        """Whether ``subject`` matches a case pattern."""
        line = line_of(word)
        self.need(subject, line, "decides which `case` branch runs")
        return self.compile_pattern(word, line, "decides which `case` branch runs").fullmatch(
            subject
        )

    def compile_pattern(self, word: Node | None, line: int, purpose: str) -> _Glob:
        """A bash glob pattern word as a matcher of whole strings; a pattern holding a run-time
        value is refused (it ``purpose``)."""
        chars = self.pattern_chars(word)
        self.need(_pattern_text(chars), line, f"is a pattern that {purpose}")
        return self.glob(chars, line)

    def remove_affix(self, value: str, op: str, word: Node | None, line: int, what: str) -> str:
        """``${X#p} ${X##p} ${X%p} ${X%%p}``: shortest or longest prefix or suffix."""
        chars = self.pattern_chars(word)
        derived = self.derive(line, what, value, _pattern_text(chars))
        if derived is not None:
            return derived
        self.check_pattern_subject(value, line)
        glob = self.glob(chars, line)
        if op.startswith("#"):
            ends = glob.ends(value, 0)
            if not ends:
                return value
            return value[(ends[0] if op == "#" else ends[-1]) :]
        lengths = glob.reversed().ends(value[::-1], 0)
        if not lengths:
            return value
        return value[: len(value) - (lengths[0] if op == "%" else lengths[-1])]

    def replace(self, value: str, repl: Node, line: int, what: str) -> str:
        """``${X/p/r} ${X//p/r} ${X/#p/r} ${X/%p/r}`` (bash 5.2: unquoted ``&`` is the match).

        A run-time value in the replacement is copied like text; one in the value or the
        pattern makes the whole result a run-time value.
        """
        orig = repl.get("Orig") or {}
        parts = list(orig.get("Parts") or [])
        anchor = ""
        if parts and parts[0].get("Type") == "Lit" and parts[0].get("Value", "")[:1] in ("#", "%"):
            anchor = parts[0]["Value"][0]
            parts[0] = {**parts[0], "Value": parts[0]["Value"][1:]}
        pattern_word = {**orig, "Parts": parts}
        chars = self.pattern_chars(pattern_word)
        with_pieces = self.replacement_pieces(repl.get("With"), line)
        derived = self.derive(line, what, value, _pattern_text(chars))
        if derived is not None:
            return derived
        self.check_pattern_subject(value, line)

        def render(matched: str) -> str:
            return "".join(matched if piece is None else piece for piece in with_pieces)

        if not chars:
            if anchor == "#":
                return render("") + value
            if anchor == "%":
                return value + render("")
            return value
        glob = self.glob(chars, line)
        n = len(value)
        if anchor == "#":
            ends = glob.ends(value, 0)
            if not ends:
                return value
            return render(value[: ends[-1]]) + value[ends[-1] :]
        if anchor == "%":
            lengths = glob.reversed().ends(value[::-1], 0)
            if not lengths:
                return value
            start = n - lengths[-1]
            return value[:start] + render(value[start:])
        out: list[str] = []
        i = 0
        replaced = False
        while i < n:
            if replaced and not repl.get("All"):
                break
            ends = glob.ends(value, i)
            found = ends[-1] if ends and ends[-1] > i else None
            if found is None:
                out.append(value[i])
                i += 1
                continue
            out.append(render(value[i:found]))
            i = found
            replaced = True
        out.append(value[i:])
        if n == 0 and glob.fullmatch(""):
            return render("")
        return "".join(out)

    def replacement_pieces(self, word: Node | None, line: int) -> list[str | None]:
        """The replacement of ``${X/p/r}`` as text pieces, None standing for the match."""
        pieces: list[str | None] = []
        for part in (word or {}).get("Parts") or []:
            kind = part.get("Type")
            if kind == "Lit":
                for chunk, escaped in literal_chunks(part.get("Value", "")):
                    if escaped:
                        pieces.append(chunk)
                        continue
                    for segment_index, segment in enumerate(chunk.split("&")):
                        if segment_index:
                            pieces.append(None)
                        pieces.append(segment)
            elif kind in ("SglQuoted", "DblQuoted"):
                fb = Fields(split=False)
                self.part(part, fb, quoted=False, pword=False)
                pieces.append(fb.joined())
            else:
                fb = Fields(split=False)
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
        if len(value) > MAX_PATTERN_SUBJECT:
            self.fail(line, "limit", "pattern operation on a very long value")
        if not value.isascii():
            self.fail(
                line,
                "parameter expansion",
                "pattern operation on non-ASCII text depends on the locale",
            )
