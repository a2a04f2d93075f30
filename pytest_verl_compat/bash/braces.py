"""Brace expansion (``a{b,c}d``, ``{1..5}``, ``{a..e..2}``) over word items, as bash does it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_verl_compat.bash.errors import MAX_FIELDS, BudgetExceeded
from pytest_verl_compat.bash.words import Item, is_char, is_name, legal_integer

if TYPE_CHECKING:
    from pytest_verl_compat.bash.state import State


def merge_names(items: list[Item]) -> list[Item]:
    """Re-read ``$NAME`` followed by name characters, as bash does after brace expansion."""
    out: list[Item] = []
    i = 0
    n = len(items)
    while i < n:
        item = items[i]
        i += 1
        if (
            isinstance(item, dict)
            and item.get("Type") == "ParamExp"
            and item.get("Short")
            and item.get("Index") is None
            and is_name((item.get("Param") or {}).get("Value", ""))
            and i < n
            and type(items[i]) is str
            and is_name("a" + items[i])  # type: ignore[operator]
        ):
            name = item["Param"]["Value"]
            while i < n and type(items[i]) is str and is_name("a" + items[i]):  # type: ignore[operator]
                name += items[i]
                i += 1
            item = {**item, "Param": {**item["Param"], "Value": name}}
        out.append(item)
    return out


def _brace_gobble(text: list[Item], i: int, satisfy: str) -> int:
    """bash's brace_gobbler: index of the next depth-0 ``satisfy`` character, or len(text)."""
    level = 0
    n = len(text)
    while i < n:
        item = text[i]
        if type(item) is not str:
            i += 1
            continue
        if item == satisfy and level == 0:
            # bash ignores an opening brace that ends the word or is followed by `}` at word start.
            if item == "{" and i == 0 and (i + 1 == n or is_char(text[i + 1], "}")):
                i += 1
                continue
            return i
        if item == "{":
            level += 1
        elif item == "}" and level:
            level -= 1
        i += 1
    return n


def brace_expand(text: list[Item], line: int, shell: State) -> list[list[Item]]:
    """bash brace expansion (``a{b,c}d``, ``{1..5}``, ``{a..e..2}``) over word items."""
    n = len(text)
    i = 0
    while True:
        i = _brace_gobble(text, i, "{")
        if i >= n:
            return [text]
        close = _brace_gobble(text, i + 1, "}")
        if close < n:
            break
        i += 1
    preamble = text[:i]
    amble = text[i + 1 : close]
    if any(is_char(item, ",") for item in amble):
        tack = _brace_amble(amble, line, shell)
    else:
        sequence = _brace_sequence(amble, line, shell)
        if sequence is not None:
            tack = [list(s) for s in sequence]
        elif close + 1 < n:
            tack = [text[i : close + 1]]
        else:
            return [text]
    result = [preamble + t for t in tack]
    post = text[close + 1 :]
    if post:
        posts = brace_expand(post, line, shell)
        if len(result) * len(posts) > MAX_FIELDS:
            raise BudgetExceeded("brace expansion produces too many words")
        result = [r + p for r in result for p in posts]
    return result


def _brace_amble(amble: list[Item], line: int, shell: State) -> list[list[Item]]:
    """The comma-separated alternatives inside braces, each brace-expanded in turn."""
    result: list[list[Item]] = []
    start = 0
    while True:
        i = _brace_gobble(amble, start, ",")
        result.extend(brace_expand(amble[start:i], line, shell))
        if len(result) > MAX_FIELDS:
            raise BudgetExceeded("brace expansion produces too many words")
        if i >= len(amble):
            return result
        start = i + 1


def _brace_sequence(amble: list[Item], line: int, shell: State) -> list[str] | None:
    """A ``{x..y[..incr]}`` sequence, or None when the text is not a valid one."""
    if not amble or any(type(item) is not str for item in amble):
        return None
    text = "".join(amble)  # type: ignore[arg-type]
    pieces = text.split("..")
    if len(pieces) not in (2, 3):
        return None
    lhs, rhs = pieces[0], pieces[1]
    step = 1
    if len(pieces) == 3:
        parsed = legal_integer(pieces[2]) if pieces[2].strip() == pieces[2] else None
        if parsed is None:
            return None
        step = parsed
    lhs_int = legal_integer(lhs) if lhs.strip() == lhs else None
    rhs_int = legal_integer(rhs) if rhs.strip() == rhs else None
    if lhs_int is not None and rhs_int is not None:
        start, end = lhs_int, rhs_int
        width = 0
        # bash zero-pads when either end is written with a leading zero; its width counts
        # everything after the first "..", increment included.
        rhs_len = len(text) - len(lhs) - 2
        if (len(lhs) > 1 and lhs[0] == "0") or (len(lhs) > 2 and lhs[:2] == "-0"):
            width = len(lhs)
        if (
            (rhs_len > 1 and rhs[0] == "0") or (rhs_len > 2 and rhs[:2] == "-0")
        ) and width < rhs_len:
            width = rhs_len
        chars = False
    elif (
        len(lhs) == 1
        and len(rhs) == 1
        and lhs.isascii()
        and rhs.isascii()
        and lhs.isalpha()
        and rhs.isalpha()
    ):
        start, end, width, chars = ord(lhs), ord(rhs), 0, True
    else:
        return None
    if step == 0:
        step = 1
    if step == -(1 << 63) and start < end:
        return None  # bash negates the increment to count upwards, and -INT64_MIN overflows
    step = abs(step) if start <= end else -abs(step)
    count = abs(end - start) // abs(step) + 1
    if count > MAX_FIELDS:
        shell.fail(line, "brace expansion", f"{{{text}}} produces {count} words")
    out: list[str] = []
    value = start
    for _ in range(count):
        if chars:
            out.append(chr(value))
        elif width:
            out.append(f"{value:0{width}d}")
        else:
            out.append(str(value))
        value += step
    return out
