"""What a run-time value is made of when only its characters are certain.

An unquoted run-time value is split into words by bash, and how many words it makes decides
where a command starts (``torchrun --master_port=$PORT -m MODULE``). Some values are unknown
but certainly one word of known characters: bash's arithmetic prints a decimal integer, the
variables it keeps as numbers (``$RANDOM``, ``$$``, ``$SECONDS``) are digits, ``date +FORMAT``
with numeric conversions only (POSIX ``date``: ``%Y`` … ``%S``, ``%s``) prints digits and the
format's own text, ``shuf -i LO-HI -n 1`` prints one number of that range. Their characters are
a set; a value whose set holds neither a character IFS splits on nor a pattern character is one
word whatever it turns out to be. Nothing is run, and no value is guessed: only its alphabet.
"""

from __future__ import annotations

DIGITS = frozenset("0123456789")
# bash prints an arithmetic result as a decimal integer, negative with a `-` (expr.c).
INTEGER = DIGITS | {"-"}
# The variables bash keeps as non-negative integers (variables.c assigns each from a number).
INTEGER_VARIABLES = frozenset(
    "RANDOM SRANDOM SECONDS EPOCHSECONDS BASHPID PPID UID EUID BASH_SUBSHELL SHLVL".split()
)
# Characters that make a word anything but one literal word: IFS may hold any of the first
# kind, pathname expansion acts on the second (this reader never globs, bash would).
PATTERN = frozenset("*?[")

# POSIX date's conversions whose output is digits (with `/` or `:` for %D, %F, %T, %R), in the
# C locale and any other (no names, no `%c`/`%x`, no space-padded `%e`, `%k`, `%l`).
_DATE_NUMERIC: dict[str, frozenset[str]] = {
    **{letter: DIGITS for letter in "CdgGHIjmMNsSuUVwWyY"},
    "D": DIGITS | {"/"},
    "F": DIGITS | {"-"},
    "T": DIGITS | {":"},
    "R": DIGITS | {":"},
    "z": DIGITS | {"+", "-"},
    "%": frozenset("%"),
}
# GNU date's flags that keep the output digits: `-` (no padding), `0` (zero padding), a width.
_DATE_FLAGS = frozenset("-0123456789")


def date_characters(format_text: str) -> frozenset[str] | None:
    """The characters ``date +FORMAT`` can print (None: not only known ones)."""
    chars: set[str] = set()
    index = 0
    while index < len(format_text):
        char = format_text[index]
        index += 1
        if char != "%":
            chars.add(char)
            continue
        while index < len(format_text) and format_text[index] in _DATE_FLAGS:
            index += 1
        if index >= len(format_text) or format_text[index] not in _DATE_NUMERIC:
            return None
        chars |= _DATE_NUMERIC[format_text[index]]
        index += 1
    return frozenset(chars) if chars else None


def _shuf_range(words: list[str]) -> bool:
    """``shuf -i LO-HI -n 1`` (any spelling of its options): one number of the range."""
    count: str | None = None
    span: str | None = None
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        for short, long in (("-n", "--head-count"), ("-i", "--input-range")):
            if word in (short, long) and index < len(words):
                value: str | None = words[index]
                index += 1
            elif word.startswith(long + "="):
                value = word[len(long) + 1 :]
            elif word.startswith(short) and len(word) > 2:
                value = word[2:]
            else:
                continue
            if short == "-n":
                count = value
            else:
                span = value
            break
        else:
            return False
    low, dash, high = (span or "").partition("-")
    return (
        count == "1" and bool(dash) and low.isdigit() and high.isdigit() and int(low) <= int(high)
    )


def output_characters(words: list[str]) -> frozenset[str] | None:
    """What a program of known output shape prints (its trailing newline left out, as ``$(...)``
    drops it), given its literal words; None for any other program or use."""
    if not words:
        return None
    program = words[0].rsplit("/", 1)[-1]
    if program == "date":
        rest = [word for word in words[1:] if word not in ("-u", "--utc", "--universal")]
        if len(rest) == 1 and rest[0].startswith("+"):
            return date_characters(rest[0][1:])
        return None
    if program == "shuf" and _shuf_range(words[1:]):
        return DIGITS
    return None


def one_word(chars: frozenset[str] | None, split_on: str) -> bool:
    """Whether a non-empty value made of ``chars`` is one word, splitting on ``split_on``."""
    return chars is not None and not chars & (frozenset(split_on) | PATTERN | {"\0"})
