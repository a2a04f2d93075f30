"""Text filters scripts pipe values through, as pure functions of their input (C locale).

``echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\\n' | wc -l``, ``echo "$MODEL" | cut -d/ -f2``,
``awk -F/ '{print $NF}'``, ``sed 's/\\//_/g'``: each filter here computes what GNU coreutils (and
awk, sed) print for the options it models, from known input only. An option, operand or
program text it does not model makes the output unknown (None), never guessed; input from a
file is unknown too. The tests compare every filter with the real program.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pytest_verl_compat.bash.words import ANSI_ESCAPES

Filter = Callable[[list[str], str], "str | None"]
# Input longer than this is left to the running system.
_MAX_INPUT = 1 << 20


def _lines(text: str) -> list[str]:
    """Input lines without their newlines (a last line without one counts)."""
    if not text:
        return []
    return text[:-1].split("\n") if text.endswith("\n") else text.split("\n")


def _joined(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


def _count(word: str) -> int | None:
    return int(word) if word.isascii() and word.isdigit() else None


# ------------------------------------------------------------------------------------ tr

_CLASSES = {
    "alnum": "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
    "alpha": "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
    "digit": "0123456789",
    "lower": "abcdefghijklmnopqrstuvwxyz",
    "upper": "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "space": " \t\n\v\f\r",
    "blank": " \t",
    "punct": "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "xdigit": "0123456789ABCDEFabcdef",
}


def _tr_set(spec: str) -> str | None:
    """The characters of a tr set: escapes, ranges ``a-z`` and classes ``[:upper:]``."""
    chars: list[str] = []
    index = 0
    while index < len(spec):
        if spec.startswith("[:", index):
            end = spec.find(":]", index + 2)
            name = spec[index + 2 : end] if end > 0 else ""
            if name not in _CLASSES:
                return None
            chars.extend(_CLASSES[name])
            index = end + 2
            continue
        if (spec[index] == "[" and "*" in spec[index:]) or spec.startswith("[=", index):
            return None  # [c*n] repeats and [=c=] equivalence classes
        c = spec[index]
        if c == "\\" and index + 1 < len(spec):
            escaped = spec[index + 1]
            if escaped in "01234567":
                return None
            c = ANSI_ESCAPES.get(escaped, escaped)
            index += 2
        else:
            index += 1
        if spec.startswith("-", index) and index + 1 < len(spec):
            last = spec[index + 1]
            if last == "\\" or ord(last) < ord(c):
                return None
            chars.extend(chr(code) for code in range(ord(c), ord(last) + 1))
            index += 2
            continue
        chars.append(c)
    return "".join(chars)


def tr(args: list[str], text: str) -> str | None:
    """``tr [-d] [-s] SET1 [SET2]`` (no complement, no truncation)."""
    flags: set[str] = set()
    while args and args[0].startswith("-") and len(args[0]) > 1:
        if args[0] == "--":
            args = args[1:]
            break
        if set(args[0][1:]) - set("ds"):
            return None
        flags.update(args[0][1:])
        args = args[1:]
    sets = [_tr_set(arg) for arg in args]
    if any(s is None for s in sets) or not 1 <= len(sets) <= 2:
        return None
    first, second = sets[0] or "", (sets[1] if len(sets) > 1 else None)
    if "d" in flags:
        if second is not None and "s" not in flags:
            return None
        text = "".join(c for c in text if c not in first)
        squeeze = second
    elif second is None:
        if "s" not in flags:
            return None
        squeeze = first
    else:
        if not second:
            return None
        # GNU tr pads SET2 with its last character.
        second = second + second[-1] * max(0, len(first) - len(second))
        table = {}
        for source, target in zip(first, second, strict=False):
            table[source] = target
        text = "".join(table.get(c, c) for c in text)
        squeeze = second if "s" in flags else None
    if squeeze:
        out: list[str] = []
        for c in text:
            if not (out and out[-1] == c and c in squeeze):
                out.append(c)
        text = "".join(out)
    return text


# ------------------------------------------------------------------------------------ cut


def _ranges(spec: str) -> list[tuple[int, int | None]] | None:
    ranges: list[tuple[int, int | None]] = []
    for item in spec.split(","):
        first, dash, last = item.partition("-")
        start = _count(first) if first else 1
        end = (_count(last) if last else None) if dash else start
        if start is None or start < 1 or (dash and last and end is None):
            return None
        ranges.append((start, end))
    return ranges


def _selected(count: int, ranges: list[tuple[int, int | None]]) -> list[int]:
    return [
        i for i in range(1, count + 1) if any(a <= i and (b is None or i <= b) for a, b in ranges)
    ]


def cut(args: list[str], text: str) -> str | None:
    """``cut -d DELIM -f LIST [-s]`` and ``cut -c LIST``."""
    delimiter, fields, characters, only_delimited = "\t", None, None, False
    index = 0
    while index < len(args):
        word = args[index]
        for letter in "dfc":
            if word.startswith(f"-{letter}"):
                value = (
                    word[2:]
                    if len(word) > 2
                    else (args[index + 1] if index + 1 < len(args) else None)
                )
                if value is None:
                    return None
                if len(word) == 2:
                    index += 1
                if letter == "d":
                    if len(value) != 1:
                        return None
                    delimiter = value
                elif letter == "f":
                    fields = _ranges(value)
                else:
                    characters = _ranges(value)
                break
        else:
            if word != "-s":
                return None  # another option, or a file to read
            only_delimited = True
        index += 1
    out: list[str] = []
    for line in _lines(text):
        if characters is not None and fields is None:
            out.append("".join(line[i - 1] for i in _selected(len(line), characters)))
        elif fields is not None and characters is None:
            if delimiter not in line:
                if not only_delimited:
                    out.append(line)
                continue
            parts = line.split(delimiter)
            out.append(delimiter.join(parts[i - 1] for i in _selected(len(parts), fields)))
        else:
            return None
    return _joined(out)


# ------------------------------------------------------------------------------------ head, tail


def _line_count(args: list[str]) -> int | None:
    """The N of ``-n N``, ``-nN`` or ``-N`` (10 when none); None for anything else."""
    if not args:
        return 10
    if len(args) == 2 and args[0] == "-n":
        return _count(args[1])
    if len(args) == 1 and args[0].startswith("-n"):
        return _count(args[0][2:])
    if len(args) == 1 and args[0].startswith("-"):
        return _count(args[0][1:])
    return None


def head(args: list[str], text: str) -> str | None:
    """``head [-n N]``: up to the Nth newline (a last line without one stays without)."""
    count = _line_count(args)
    if count is None:
        return None
    end = 0
    for _ in range(count):
        found = text.find("\n", end)
        if found < 0:
            return text
        end = found + 1
    return text[:end]


def tail(args: list[str], text: str) -> str | None:
    count = _line_count(args)
    if count is None:
        return None
    lines = _lines(text)
    kept = lines[len(lines) - count :] if count else []
    out = _joined(kept)
    return out[:-1] if out and not text.endswith("\n") else out


# ------------------------------------------------------------------------------------ wc, sort, uniq


def wc(args: list[str], text: str) -> str | None:
    """``wc -l``, ``-w`` or ``-c`` of standard input: the bare number."""
    counts = {"-l": text.count("\n"), "-w": len(text.split()), "-c": len(text.encode())}
    if len(args) != 1 or args[0] not in counts:
        return None
    return f"{counts[args[0]]}\n"


def sort(args: list[str], text: str) -> str | None:
    """``sort [-r] [-u] [-n]`` on whole lines, byte order (the C locale)."""
    flags = "".join(word[1:] for word in args if word.startswith("-"))
    if len(flags) != sum(len(word) - 1 for word in args) or set(flags) - set("run"):
        return None
    lines = _lines(text)
    if "n" in flags:
        numeric = re.compile(r"\s*(-?[0-9]+)")
        values = [numeric.match(line) for line in lines]
        if not all(values):
            return None
        keyed = sorted(lines, key=lambda line: (int(numeric.match(line).group(1)), line))  # type: ignore[union-attr]
    else:
        keyed = sorted(lines, key=lambda line: line.encode())
    if "r" in flags:
        keyed.reverse()
    if "u" in flags and "n" not in flags:
        keyed = [line for i, line in enumerate(keyed) if i == 0 or line != keyed[i - 1]]
    elif "u" in flags:
        return None
    return _joined(keyed)


def uniq(args: list[str], text: str) -> str | None:
    if args:
        return None
    lines = _lines(text)
    return _joined([line for i, line in enumerate(lines) if i == 0 or line != lines[i - 1]])


# ------------------------------------------------------------------------------------ awk, sed

# `{print ITEM, ...}` where an item is $N, $NF, $(NF-K) or NF.
_AWK_ITEM = r"(?:\$[0-9]+|\$NF|\$\(NF-[0-9]+\)|NF)"
_AWK_PRINT = re.compile(rf"\s*\{{\s*print\s+({_AWK_ITEM}(?:\s*,\s*{_AWK_ITEM})*)\s*;?\s*\}}\s*")


def awk(args: list[str], text: str) -> str | None:
    """``awk [-F C] '{print $N, $NF, $(NF-1), NF}'``: fields by blanks, or by one literal
    character."""
    separator: str | None = None
    if args and args[0].startswith("-F"):
        separator = args[0][2:] or (args[1] if len(args) > 1 else "")
        args = args[1:] if args[0][2:] else args[2:]
        separator = "\t" if separator == "\\t" else separator
        # One character other than a blank is taken literally (-Ft means a tab to some awks).
        if len(separator) != 1 or separator in " \\t":
            return None
    if len(args) != 1:
        return None
    program = _AWK_PRINT.fullmatch(args[0])
    if program is None:
        return None
    wanted = [item.strip() for item in program.group(1).split(",")]
    out: list[str] = []
    for line in _lines(text):
        if separator is None:
            fields = [field for field in re.split("[ \t]+", line.strip(" \t")) if field]
        else:
            fields = line.split(separator) if line else []
        values = []
        for item in wanted:
            if item == "NF":
                values.append(str(len(fields)))
                continue
            inner = item[1:].strip("()")
            position = len(fields) - int(inner[3:] or "0") if inner.startswith("NF") else int(inner)
            if position < 0:
                return None  # awk stops with an error
            if position == 0:
                values.append(line)
            else:
                values.append(fields[position - 1] if position <= len(fields) else "")
        out.append(" ".join(values))
    return _joined(out)


_SED_SUBSTITUTE = re.compile(r"s(.)(.*?)(?<!\\)\1(.*?)(?<!\\)\1(g?)")


def sed(args: list[str], text: str) -> str | None:
    """``sed 's/OLD/NEW/[g]'`` where OLD and NEW are literal (escaped delimiters allowed)."""
    if len(args) == 2 and args[0] == "-e":
        args = args[1:]
    if len(args) != 1:
        return None
    command = _SED_SUBSTITUTE.fullmatch(args[0])
    if command is None:
        return None
    delimiter, old, new, every = command.groups()
    old = _sed_literal(old, delimiter, "^$.*[\\")
    new = _sed_literal(new, delimiter, "&\\")
    if old is None or new is None or not old:
        return None
    count = 0 if every else 1
    lines = [line.replace(old, new, -1 if count == 0 else 1) for line in _lines(text)]
    out = _joined(lines)
    return out[:-1] if out and not text.endswith("\n") else out


def _sed_literal(text: str, delimiter: str, special: str) -> str | None:
    """The literal text of a sed pattern or replacement; None when it holds a special."""
    out: list[str] = []
    index = 0
    while index < len(text):
        c = text[index]
        if c == "\\" and index + 1 < len(text) and text[index + 1] in (delimiter + "/._-"):
            out.append(text[index + 1])
            index += 2
            continue
        if c in special:
            return None
        out.append(c)
        index += 1
    return "".join(out)


def cat(args: list[str], text: str) -> str | None:
    """``cat`` (or ``cat -``): its input; a file to read is left to the running system."""
    return text if all(arg in ("-", "--") for arg in args) else None


def tee(args: list[str], text: str) -> str | None:
    """``tee [-a] [FILE]...``: its input (the files it writes are skipped, like any program's
    effects)."""
    options = [arg for arg in args if arg.startswith("-") and arg != "-"]
    return text if all(option in ("-a", "--append", "--") for option in options) else None


FILTERS: dict[str, Filter] = {
    "cat": cat,
    "tee": tee,
    "tr": tr,
    "cut": cut,
    "head": head,
    "tail": tail,
    "wc": wc,
    "sort": sort,
    "uniq": uniq,
    "awk": awk,
    "sed": sed,
}
