"""Arithmetic: bash integer constants, signed 64-bit wrapping and ``$((...))`` evaluation."""

from __future__ import annotations

from pytest_verl_compat.bash.parse import Node, line_of
from pytest_verl_compat.bash.state import State
from pytest_verl_compat.bash.words import Fields, ascii_digits, is_name

_INT64 = 1 << 64


def _wrap(value: int) -> int:
    """``value`` as bash's signed 64-bit arithmetic holds it."""
    value &= _INT64 - 1
    return value - _INT64 if value >= 1 << 63 else value


def _decimal_wrapped(digits: str) -> int:
    """ASCII decimal digits as bash's arithmetic reads them: wrapped to 64 bits as it goes.

    Read in chunks: Python refuses ``int()`` of more than 4300 digits, and the chunks keep the
    cost linear in the length of the constant.
    """
    value = 0
    for start in range(0, len(digits), 18):
        chunk = digits[start : start + 18]
        value = (value * 10 ** len(chunk) + int(chunk)) % _INT64
    return _wrap(value)


def _parse_number(text: str) -> int | None:
    """A bash integer constant (decimal, 0octal, 0xhex, base#digits); None if not a number."""
    # Malformed constants raise ValueError: bash rejects them instead of reading a name.
    if not text:
        return None
    if "#" in text:
        base_text, _, digits = text.partition("#")
        if not ascii_digits(base_text):
            return None
        base = int(base_text) if len(base_text) <= 2 else 0
        if not 2 <= base <= 64 or not digits:
            raise ValueError(f"invalid arithmetic base in {text!r}")
        value = 0
        for c in digits:
            if "0" <= c <= "9":
                d = ord(c) - 48
            elif "a" <= c <= "z":
                d = ord(c) - 87
            elif "A" <= c <= "Z":
                d = ord(c) - 29 if base > 36 else ord(c) - 55
            elif c == "@":
                d = 62
            elif c == "_":
                d = 63
            else:
                raise ValueError(f"invalid digit in {text!r}")
            if d >= base:
                raise ValueError(f"value too great for base in {text!r}")
            value = (value * base + d) % _INT64
        return _wrap(value)
    if text[0] not in "0123456789":
        return None
    if text[:2] in ("0x", "0X"):
        digits = text[2:]
        if not digits or any(c not in "0123456789abcdefABCDEF" for c in digits):
            raise ValueError(f"invalid hexadecimal constant {text!r}")
        return _wrap(int(digits, 16))
    if not ascii_digits(text):
        raise ValueError(f"invalid number {text!r}")
    if text[0] == "0" and len(text) > 1:
        if any(c in "89" for c in text):
            raise ValueError(f"value too great for base in {text!r}")
        return _wrap(int(text, 8))
    return _decimal_wrapped(text)


class Arithmetic(State):
    """Arithmetic expressions, operands and the variables they assign."""

    def arith(self, node: Node) -> int:
        """Evaluate a shfmt arithmetic expression with bash's 64-bit semantics."""
        kind = node.get("Type")
        line = line_of(node)
        if kind == "Word":
            return self.arith_word(node)
        if kind == "ParenArithm":
            return self.arith(node["X"])
        if kind == "UnaryArithm":
            op = node.get("Op")
            if op in ("++", "--"):
                name, index = self.arith_ref(node["X"])
                old = self.arith_var(name, index, line)
                new = _wrap(old + (1 if op == "++" else -1))
                self.arith_store(name, index, new, line)
                return old if node.get("Post") else new
            value = self.arith(node["X"])
            if op == "-":
                return _wrap(-value)
            if op == "+":
                return value
            if op == "!":
                return int(value == 0)
            if op == "~":
                return _wrap(~value)
            self.fail(line, "arithmetic", f"operator {op!r} is not supported")
        if kind == "BinaryArithm":
            op = node.get("Op", "")
            if op in ("=", "+=", "-=", "*=", "/=", "%=", "<<=", ">>=", "&=", "|=", "^="):
                name, index = self.arith_ref(node["X"])
                rhs = self.arith(node["Y"])
                if op != "=":
                    rhs = self.arith_binary(op[:-1], self.arith_var(name, index, line), rhs, line)
                self.arith_store(name, index, rhs, line)
                return rhs
            if op == "&&":
                return int(self.arith(node["X"]) != 0 and self.arith(node["Y"]) != 0)
            if op == "||":
                return int(self.arith(node["X"]) != 0 or self.arith(node["Y"]) != 0)
            if op == "?":
                branches = node["Y"]
                if branches.get("Type") != "BinaryArithm" or branches.get("Op") != ":":
                    self.fail(line, "arithmetic", "malformed ?: expression")
                chosen = branches["X"] if self.arith(node["X"]) else branches["Y"]
                return self.arith(chosen)
            if op == ",":
                self.arith(node["X"])
                return self.arith(node["Y"])
            return self.arith_binary(op, self.arith(node["X"]), self.arith(node["Y"]), line)
        self.fail(line, "arithmetic", f"unsupported expression {kind!r}")

    def arith_binary(self, op: str, a: int, b: int, line: int) -> int:
        """A binary arithmetic operator on two evaluated operands."""
        if op == "+":
            return _wrap(a + b)
        if op == "-":
            return _wrap(a - b)
        if op == "*":
            return _wrap(a * b)
        if op in ("/", "%"):
            if b == 0:
                self.fail(line, "arithmetic", "division by 0")
            # C semantics: the quotient truncates toward zero.
            quotient = abs(a) // abs(b)
            if (a < 0) != (b < 0):
                quotient = -quotient
            return _wrap(quotient) if op == "/" else _wrap(a - b * quotient)
        if op == "**":
            if b < 0:
                self.fail(line, "arithmetic", "exponent less than 0")
            return _wrap(pow(a, b, _INT64))
        if op == "<<":
            return _wrap(a << (b & 63))
        if op == ">>":
            return a >> (b & 63)
        if op == "&":
            return _wrap(a & b)
        if op == "|":
            return _wrap(a | b)
        if op == "^":
            return _wrap(a ^ b)
        comparisons = {
            "==": a == b,
            "!=": a != b,
            "<": a < b,
            "<=": a <= b,
            ">": a > b,
            ">=": a >= b,
        }
        if op in comparisons:
            return int(comparisons[op])
        self.fail(line, "arithmetic", f"operator {op!r} is not supported")

    def arith_word(self, word: Node) -> int:
        """An arithmetic operand: a constant, a variable name, or an expansion of one."""
        line = line_of(word)
        parts = word.get("Parts") or []
        if len(parts) == 1 and parts[0].get("Type") == "Lit":
            return self.arith_text(parts[0].get("Value", ""), line, bare=True)
        if len(parts) == 1 and parts[0].get("Type") == "ParamExp" and "Dollar" not in parts[0]:
            # A bare NAME[i] reference.
            name, index = self.arith_ref(word)
            return self.arith_var(name, index, line)
        fb = Fields(split=False)
        for part in parts:
            self.part(part, fb, quoted=True, pword=False)
        text = fb.joined()
        self.need(text, line, "is used in arithmetic")
        if not text.strip(" \t\n"):
            self.fail(line, "arithmetic", "an expansion in $((...)) is empty")
        return self.arith_text(text, line, bare=False)

    def arith_text(self, text: str, line: int, bare: bool = True, depth: int = 0) -> int:
        """Evaluate text that must be a constant or a variable name (no nested expressions)."""
        self.need(text, line, "is used in arithmetic")
        body = text.strip(" \t\n")
        if not body:
            return 0
        sign = 1
        if body[0] in "+-" and len(body) > 1 and body[1] not in "+-":
            sign = -1 if body[0] == "-" else 1
            body = body[1:].lstrip(" \t\n")
        try:
            number = _parse_number(body)
        except ValueError as exc:
            self.fail(line, "arithmetic", str(exc))
        if number is not None:
            return _wrap(sign * number)
        if is_name(body):
            if depth > 32:
                self.fail(line, "arithmetic", "expression recursion level exceeded")
            return _wrap(sign * self.arith_var(body, None, line, depth + 1))
        self.fail(line, "arithmetic", f"{text!r} is an expression inside a value; not supported")

    def arith_ref(self, node: Node) -> tuple[str, int | str | None]:
        """The variable an arithmetic assignment or ``++``/``--`` targets."""
        line = line_of(node)
        parts = (node.get("Parts") or []) if node.get("Type") == "Word" else []
        if len(parts) == 1 and parts[0].get("Type") == "Lit" and is_name(parts[0].get("Value", "")):
            return parts[0]["Value"], None
        if len(parts) == 1 and parts[0].get("Type") == "ParamExp" and "Dollar" not in parts[0]:
            pe = parts[0]
            name = pe["Param"].get("Value", "")
            if is_name(name) and not pe.get("Exp") and pe.get("Index") is not None:
                return name, self.subscript(name, pe["Index"], line)
        self.fail(line, "arithmetic", "assignment to something that is not a variable")

    def arith_var(self, name: str, index: int | str | None, line: int, depth: int = 0) -> int:
        """A variable's value as an arithmetic operand (unset is 0, or an error under set -u)."""
        value = self.lookup(name, index, line)
        if value is None:
            if "nounset" in self.sh.options:
                self.unbound(line, name if index is None else f"{name}[{index}]")
            return 0
        return self.arith_text(value, line, depth=depth)

    def arith_store(self, name: str, index: int | str | None, value: int, line: int) -> None:
        """Store an arithmetic result into a variable or element."""
        if index is None:
            self.set_scalar(name, str(value), line)
            return
        self.check_assignable(name, line)
        self.store_element(name, index, str(value), False, line)
