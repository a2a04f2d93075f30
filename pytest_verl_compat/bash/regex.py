"""``[[ TEXT =~ REGEX ]]``: POSIX extended regular expressions, matched as glibc does.

The expression is parsed here (ASCII only; back-references, word anchors and collating
elements are refused) and run as a Thompson NFA, so matching takes time linear in the text
whatever the expression: a hostile pattern cannot make it backtrack. The match is POSIX's:
the leftmost one, and of those the longest (``BASH_REMATCH[0]``). A capture group is known when
it is an element of the expression's top-level sequence, neither repeated nor nested, nor in
an alternative: POSIX gives each element, left to right, the longest text that still lets the
whole match; other captures are left to the running system.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

_CLASSES = {
    "alnum": lambda c: c.isascii() and c.isalnum(),
    "alpha": lambda c: c.isascii() and c.isalpha(),
    "digit": lambda c: "0" <= c <= "9",
    "lower": lambda c: "a" <= c <= "z",
    "upper": lambda c: "A" <= c <= "Z",
    "space": lambda c: c in " \t\n\v\f\r",
    "blank": lambda c: c in " \t",
    "punct": lambda c: c.isascii() and c.isprintable() and not c.isalnum() and c != " ",
    "xdigit": lambda c: c in "0123456789abcdefABCDEF",
    "cntrl": lambda c: ord(c) < 32 or ord(c) == 127,
    "print": lambda c: c.isascii() and c.isprintable(),
    "graph": lambda c: c.isascii() and c.isprintable() and c != " ",
}
_SHORTHANDS = {
    "w": lambda c: (c.isascii() and c.isalnum()) or c == "_",
    "s": _CLASSES["space"],
}
_SPECIAL = ".[]()*+?{}|^$\\"
# Copies an interval {m,n} may make, and states an expression may have.
_MAX_STATES = 20_000


class RegexError(Exception):
    """An expression bash would refuse (status 2), or one this reader does not model."""


Matcher = Callable[[str], bool]


@dataclass
class _Node:
    kind: str  # "char", "cat", "alt", "rep", "group", "bol", "eol", "empty"
    test: Matcher | None = None
    items: list[_Node] | None = None
    low: int = 0
    high: int | None = None
    index: int = 0


def _equal(expected: str) -> Matcher:
    return lambda c: c == expected


def _between(low: str, high: str) -> Matcher:
    return lambda c: low <= c <= high


def _negated(test: Matcher) -> Matcher:
    return lambda c: not test(c)


class _Parser:
    def __init__(self, text: str) -> None:
        if not text.isascii():
            raise RegexError("a non-ASCII expression depends on the locale")
        self.text = text
        self.at = 0
        self.groups = 0

    def parse(self) -> _Node:
        node = self.alternation()
        if self.at != len(self.text):
            raise RegexError(f"unmatched ) at {self.at}")
        return node

    def alternation(self) -> _Node:
        branches = [self.sequence()]
        while self.peek("|"):
            self.at += 1
            branches.append(self.sequence())
        return branches[0] if len(branches) == 1 else _Node("alt", items=branches)

    def sequence(self) -> _Node:
        items: list[_Node] = []
        while self.at < len(self.text) and self.text[self.at] not in "|)":
            items.append(self.repeated(self.atom()))
        if not items:
            raise RegexError("an empty expression or alternative")
        return items[0] if len(items) == 1 else _Node("cat", items=items)

    def repeated(self, node: _Node) -> _Node:
        if self.at < len(self.text) and self.text[self.at] in "*+?{":
            c = self.text[self.at]
            self.at += 1
            if c == "{":
                low, high = self.interval()
            else:
                low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
            if node.kind in ("bol", "eol"):
                raise RegexError("a repeated anchor")
            node = _Node("rep", items=[node], low=low, high=high)
            if self.at < len(self.text) and self.text[self.at] in "*+?{":
                raise RegexError("a repetition of a repetition")
        return node

    def interval(self) -> tuple[int, int | None]:
        end = self.text.find("}", self.at)
        body = self.text[self.at : end] if end >= 0 else ""
        low_text, comma, high_text = body.partition(",")
        if not low_text.isdigit() or (high_text and not high_text.isdigit()):
            raise RegexError(f"an invalid interval {{{body}")
        self.at = end + 1
        low = int(low_text)
        high = (int(high_text) if high_text else None) if comma else low
        if (high is not None and high < low) or low > 255 or (high or 0) > 255:
            raise RegexError(f"an invalid interval {{{body}}}")
        return low, high

    def atom(self) -> _Node:
        c = self.text[self.at]
        self.at += 1
        if c == "(":
            self.groups += 1
            index = self.groups
            inner = self.alternation()
            if not self.peek(")"):
                raise RegexError("an unmatched (")
            self.at += 1
            return _Node("group", items=[inner], index=index)
        if c == "^":
            return _Node("bol")
        if c == "$":
            return _Node("eol")
        if c == ".":
            return _Node("char", test=lambda _: True)
        if c == "[":
            return _Node("char", test=self.bracket())
        if c in "*+?{":
            raise RegexError(f"{c} repeats nothing")
        if c == "\\":
            if self.at >= len(self.text):
                raise RegexError("a trailing backslash")
            escaped = self.text[self.at]
            self.at += 1
            if escaped in _SPECIAL or escaped in "/-_,:;'\"<>=!@#%&~`":
                if escaped in "<>":
                    raise RegexError(f"\\{escaped} word anchors are not modelled")
                return _Node("char", test=_equal(escaped))
            if escaped.lower() in _SHORTHANDS:
                shorthand = _SHORTHANDS[escaped.lower()]
                return _Node("char", test=_negated(shorthand) if escaped.isupper() else shorthand)
            raise RegexError(f"\\{escaped} is not modelled")
        return _Node("char", test=_equal(c))

    def bracket(self) -> Matcher:
        negated = self.peek("^")
        if negated:
            self.at += 1
        tests: list[Matcher] = []
        first = True
        while True:
            if self.at >= len(self.text):
                raise RegexError("an unmatched [")
            c = self.text[self.at]
            if c == "]" and not first:
                self.at += 1
                break
            first = False
            if self.text.startswith("[:", self.at):
                end = self.text.find(":]", self.at + 2)
                name = self.text[self.at + 2 : end] if end >= 0 else ""
                if name not in _CLASSES:
                    raise RegexError(f"an unknown class [:{name}:]")
                tests.append(_CLASSES[name])
                self.at = end + 2
                continue
            if self.text.startswith(("[.", "[="), self.at):
                raise RegexError("collating elements are not modelled")
            self.at += 1
            if self.peek("-") and self.at + 1 < len(self.text) and self.text[self.at + 1] != "]":
                last = self.text[self.at + 1]
                if ord(last) < ord(c):
                    raise RegexError(f"an invalid range {c}-{last}")
                tests.append(_between(c, last))
                self.at += 2
            else:
                tests.append(_equal(c))
        if negated:
            return lambda ch: not any(t(ch) for t in tests)
        return lambda ch: any(t(ch) for t in tests)

    def peek(self, c: str) -> bool:
        return self.text.startswith(c, self.at)


@dataclass
class _State:
    """One NFA state: "char" (reads one character passing ``test``), "split" (goes on at both
    ``following`` and ``other``), "bol"/"eol" (only at the text's start/end), "match"."""

    kind: str
    following: int = -1
    other: int = -1
    test: Matcher | None = None


class _Program:
    """A Thompson NFA of an expression."""

    def __init__(self, node: _Node) -> None:
        self.states: list[_State] = []
        self.start = self.compile(node, self.add(_State("match")))

    def add(self, state: _State) -> int:
        if len(self.states) >= _MAX_STATES:
            raise RegexError("the expression is too large")
        self.states.append(state)
        return len(self.states) - 1

    def compile(self, node: _Node, following: int) -> int:
        kind = node.kind
        if kind == "char":
            return self.add(_State("char", following, test=node.test))
        if kind in ("bol", "eol"):
            return self.add(_State(kind, following))
        if kind == "group":
            return self.compile((node.items or [])[0], following)
        if kind == "cat":
            for item in reversed(node.items or []):
                following = self.compile(item, following)
            return following
        if kind == "alt":
            entries = [self.compile(item, following) for item in node.items or []]
            entry = entries[-1]
            for other in reversed(entries[:-1]):
                entry = self.add(_State("split", other, entry))
            return entry
        inner = (node.items or [])[0]
        if node.high is None:
            # One loop for the unbounded tail, then the required copies in front of it.
            loop = self.add(_State("split", -1, following))
            self.states[loop].following = self.compile(inner, loop)
            entry = loop
        else:
            entry = following
            for _ in range(node.high - node.low):
                entry = self.add(_State("split", self.compile(inner, entry), following))
        for _ in range(node.low):
            entry = self.compile(inner, entry)
        return entry

    def closure(self, states: list[int], position: int, text: str) -> list[int]:
        """The reading and matching states reached from ``states`` without reading."""
        seen: set[int] = set()
        ordered: list[int] = []
        stack = list(reversed(states))
        while stack:
            index = stack.pop()
            if index in seen:
                continue
            seen.add(index)
            state = self.states[index]
            if state.kind == "split":
                stack.extend([state.other, state.following])
            elif state.kind == "bol":
                if position == 0:
                    stack.append(state.following)
            elif state.kind == "eol":
                if position == len(text):
                    stack.append(state.following)
            else:
                ordered.append(index)
        return ordered

    def ends(self, text: str, start: int, stop: int, spend: Callable[[int], None]) -> list[int]:
        """Every end position in [start, stop] of a match starting at ``start``."""
        found: list[int] = []
        current = self.closure([self.start], start, text)
        position = start
        while True:
            spend(len(current) + 1)
            if any(self.states[i].kind == "match" for i in current):
                found.append(position)
            if position >= stop or not current:
                return found
            c = text[position]
            following = [
                self.states[i].following
                for i in current
                if self.states[i].test is not None and self.states[i].test(c)  # type: ignore[misc]
            ]
            position += 1
            current = self.closure(following, position, text)


@dataclass(frozen=True)
class Match:
    """What ``=~`` sets: the match and each capture (None: not modelled here)."""

    groups: tuple[str | None, ...]


def search(pattern: str, text: str, spend: Callable[[int], None]) -> Match | None:
    """POSIX leftmost-longest search of ``pattern`` in ``text``; None when it does not match."""
    if not text.isascii():
        raise RegexError("non-ASCII text depends on the locale")
    parser = _Parser(pattern)
    tree = parser.parse()
    program = _Program(tree)
    for start in range(len(text) + 1):
        ends = program.ends(text, start, len(text), spend)
        if ends:
            end = ends[-1]
            captures = _captures(tree, parser.groups, text, start, end, spend)
            return Match((text[start:end], *captures))
    return None


def _captures(
    tree: _Node, count: int, text: str, start: int, end: int, spend: Callable[[int], None]
) -> list[str | None]:
    """The captures POSIX gives, where each is a top-level element of the sequence."""
    found: list[str | None] = [None] * count
    elements = tree.items if tree.kind == "cat" else [tree]
    assert elements is not None
    simple = [e.kind == "group" and not _has_group((e.items or [])[0]) for e in elements]
    if not any(simple):
        return found
    programs = [_Program(e) for e in elements]
    rests = [_Program(_Node("cat", items=elements[i:])) for i in range(1, len(elements))]
    position = start
    for index, element in enumerate(elements):
        if index == len(elements) - 1:
            chosen = end
        else:
            candidates = programs[index].ends(text, position, end, spend)
            chosen = next(
                (
                    candidate
                    for candidate in reversed(candidates)
                    if end in rests[index].ends(text, candidate, end, spend)
                ),
                -1,
            )
            if chosen < 0:
                return [None] * count
        if simple[index]:
            found[element.index - 1] = text[position:chosen]
        position = chosen
    return found


def _has_group(node: _Node) -> bool:
    return node.kind == "group" or any(_has_group(item) for item in node.items or [])
