"""What ``echo`` and ``printf`` print, as bash's builtins do in the C locale.

Pure functions of known text. A conversion or escape this reader does not model makes the
result ``None``: the output is then only known when the script runs, never guessed.
"""

from __future__ import annotations

import math
import re

# The escapes `echo -e` and `printf %b` share (bash's ansicstr); `\c` is handled by the caller.
_BACKSLASH = {
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
}
_OCTAL = "01234567"
_HEX = "0123456789abcdefABCDEF"


def backslash_escapes(text: str, *, format_string: bool) -> tuple[str, bool] | None:
    """Decode ``echo -e``/``%b`` escapes (``format_string``: those of a printf format).

    Returns the text and whether a ``\\c`` ended all output; None when an escape makes a
    character outside ASCII (its bytes depend on the locale).
    """
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\" or i + 1 >= len(text):
            out.append(c)
            i += 1
            continue
        e = text[i + 1]
        i += 2
        if e in _BACKSLASH:
            out.append(_BACKSLASH[e])
        elif format_string and e in "\"'?":
            out.append(e)
        elif e == "c" and not format_string:
            return "".join(out), True
        elif e in _OCTAL and (format_string or e == "0"):
            # printf's format takes up to three digits after the backslash, `echo -e` and %b
            # up to three after `\0`.
            start = i - 1 if format_string else i
            end = start
            while end < len(text) and end < start + 3 and text[end] in _OCTAL:
                end += 1
            digits = text[start:end] or "0"
            i = end
            out.append(chr(int(digits, 8) & 0xFF))
        elif e in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[e]
            end = i
            while end < len(text) and end < i + width and text[end] in _HEX:
                end += 1
            if end == i:
                out.append("\\" + e)
                continue
            out.append(chr(int(text[i:end], 16)))
            i = end
        else:
            out.append("\\" + e)
    result = "".join(out)
    return (result, False) if result.isascii() else None


def echo_output(words: list[str]) -> str | None:
    """``echo [-neE] WORDS``: leading words made only of n, e and E are options."""
    newline, escapes = True, False
    index = 0
    while index < len(words) and re.fullmatch(r"-[neE]+", words[index]):
        for flag in words[index][1:]:
            if flag == "n":
                newline = False
            else:
                escapes = flag == "e"
        index += 1
    text = " ".join(words[index:])
    if escapes:
        decoded = backslash_escapes(text, format_string=False)
        if decoded is None:
            return None
        text, stopped = decoded
        if stopped:
            return text
    return text + "\n" if newline else text


# One conversion: flags, width and precision (digits only: `*` takes an argument), the letter.
_CONVERSION = re.compile(r"%([-+ #0]*)([0-9]*)(?:\.([0-9]*))?([a-zA-Z%])")
_MODELLED = frozenset("sbdiuxXofeEgG%")
# bash formats numbers with C's printf, which Python's % operator follows for these
# conversions (an octal with `#` is written 0o by Python, so it is left out).
_INTEGER = frozenset("diuxXo")
_C_INTEGER = re.compile(r"([-+]?)(?:0[xX]([0-9a-fA-F]+)|0([0-7]*)|([1-9][0-9]*))")
_FLOAT = re.compile(r"\s*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")


def printf_output(format_text: str, arguments: list[str]) -> str | None:
    """``printf FORMAT ARGUMENTS``: the format is reused while arguments remain."""
    out: list[str] = []
    remaining = list(arguments)
    while True:
        consumed = False
        position = 0
        while position < len(format_text):
            percent = format_text.find("%", position)
            literal = format_text[position : len(format_text) if percent < 0 else percent]
            decoded = backslash_escapes(literal, format_string=True)
            if decoded is None:
                return None
            out.append(decoded[0])
            if percent < 0:
                break
            match = _CONVERSION.match(format_text, percent)
            if match is None or match.group(4) not in _MODELLED:
                return None
            flags, width, precision, letter = match.groups()
            position = match.end()
            if letter == "%":
                out.append("%")
                continue
            consumed = True
            argument = remaining.pop(0) if remaining else ""
            converted = _convert(letter, flags, width, precision, argument)
            if converted is None:
                return None
            if converted.endswith("\0c"):
                # `\c` in a %b argument ends all output, the format included.
                out.append(converted[:-2])
                return "".join(out)
            out.append(converted)
        if not consumed or not remaining:
            return "".join(out)


def _convert(
    letter: str, flags: str, width: str, precision: str | None, argument: str
) -> str | None:
    if "\0" in argument and (width or precision is not None or letter != "s"):
        return None  # a run-time value: its length or its digits decide the output
    if letter in _INTEGER or letter in "feEgG":
        return _number(letter, flags, width, precision, argument)
    if letter == "b":
        decoded = backslash_escapes(argument, format_string=False)
        if decoded is None:
            return None
        text = decoded[0] + ("\0c" if decoded[1] else "")
        if decoded[1]:
            return text
    else:
        if set(flags) - {"-"}:
            return None
        text = argument if precision is None else argument[: int(precision or "0")]
    if width:
        size = int(width)
        text = text.ljust(size) if "-" in flags else text.rjust(size)
    return text


def _c_integer(argument: str) -> int | None:
    """An integer argument as bash's printf reads it (strtoimax, base 0): 0x hex, 0 octal."""
    body = argument.strip(" \t\n")
    if not body:
        return 0
    match = _C_INTEGER.fullmatch(body)
    if match is None:
        return None  # bash complains and prints what it read: left to bash
    sign, hexadecimal, octal, decimal = match.groups()
    if hexadecimal is not None:
        value = int(hexadecimal, 16)
    elif octal is not None:
        value = int(octal or "0", 8)
    else:
        value = int(decimal)
    if value >= 1 << 63:
        return None
    return -value if sign == "-" else value


def _number(
    letter: str, flags: str, width: str, precision: str | None, argument: str
) -> str | None:
    """A numeric conversion, as C's printf formats bash's intmax_t or long double."""
    if letter in _INTEGER:
        number = _c_integer(argument)
        if number is None or (letter == "o" and "#" in flags):
            return None
        if letter in "uxXo":
            # C ignores the sign flags of unsigned conversions and reads the value unsigned.
            flags = flags.replace("+", "").replace(" ", "")
            number &= (1 << 64) - 1
        if not number:
            flags = flags.replace("#", "")  # C writes no 0x before a zero
        if precision is not None:
            flags = flags.replace("0", "")  # C ignores 0 when a precision is given
            if not int(precision or "0") and not number:
                return None  # C prints no digit at all
        spec = f"%{flags}{width}{'' if precision is None else '.' + precision}"
        return (spec + ("d" if letter in "iu" else letter)) % number
    spec = f"%{flags}{width}{'' if precision is None else '.' + precision}"
    if not _FLOAT.fullmatch(argument) and argument.strip():
        return None  # hex floats, inf, nan, trailing text: left to bash
    value = float(argument) if argument.strip() else 0.0
    if abs(value) >= 1e300 or (value and abs(value) < 1e-300):
        return None  # long double range, not double's
    # bash reads a long double, nearer the decimal than this double: the text is certain only
    # when the doubles on either side of it print the same (printing is monotone).
    texts = {
        (spec + letter) % v
        for v in (math.nextafter(value, -math.inf), value, math.nextafter(value, math.inf))
    }
    return texts.pop() if len(texts) == 1 else None
