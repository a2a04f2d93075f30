"""Conditions: ``[[ ... ]]``, and ``[``/``test`` with real statuses (2 for syntax errors)."""

from __future__ import annotations

import pytest_verl_compat.bash.regex as regex
from pytest_verl_compat.bash.arrays import Assoc
from pytest_verl_compat.bash.errors import MalformedTest
from pytest_verl_compat.bash.expansion import Expansion
from pytest_verl_compat.bash.parse import Node, line_of
from pytest_verl_compat.bash.state import SET_NAMED
from pytest_verl_compat.bash.words import is_name, legal_integer

_TEST_FILE_OPS = frozenset("-a -b -c -d -e -f -g -h -k -p -r -s -t -u -w -x -G -L -N -O -S".split())
_TEST_BINARY = frozenset("= == != < > -eq -ne -lt -le -gt -ge -nt -ot -ef".split())
_INT_OPS = frozenset("-eq -ne -lt -le -gt -ge".split())
_DECIDES = "decides a condition"
_REGEX_SPECIAL = ".[]()*+?{}|^$\\"


class Conditions(Expansion):
    """``[[ ]]`` expressions and the ``[``/``test`` builtin."""

    def cond(self, node: Node) -> bool:
        """Evaluate a ``[[ ... ]]`` expression."""
        kind = node.get("Type")
        line = line_of(node)
        if kind == "Word":
            return self.decide_nonempty(self.string(node, tilde="start"), line, _DECIDES)
        if kind == "ParenTest":
            return self.cond(node["X"])
        if kind == "UnaryTest":
            op = node.get("Op")
            if op == "!":
                return not self.cond(node["X"])
            operand = self.string(node["X"], tilde="start")
            return self.unary_test(op or "", operand, line)
        if kind == "BinaryTest":
            op = node.get("Op", "")
            if op == "&&":
                return self.cond(node["X"]) and self.cond(node["Y"])
            if op == "||":
                return self.cond(node["X"]) or self.cond(node["Y"])
            left = self.string(node["X"], tilde="start")
            self.need(left, line, _DECIDES)
            if op in ("==", "=", "!="):
                matched = self.compile_pattern(node["Y"], line, _DECIDES).fullmatch(left)
                return matched if op != "!=" else not matched
            if op == "=~":
                return self.regex_match(left, node["Y"], line)
            right = self.string(node["Y"], tilde="start")
            self.need(right, line, _DECIDES)
            if op == "<":
                return left < right
            if op == ">":
                return left > right
            if op in _INT_OPS:
                # Inside [[ ]] the operands of -eq and friends are arithmetic expressions.
                return _compare(op, self.arith_text(left, line), self.arith_text(right, line))
            self.fail(line, f"[[ {op} ]]", "file tests need the file system")
        self.fail(line, "[[ ]]", f"unsupported expression {kind!r}")

    def regex_match(self, text: str, word: Node, line: int) -> bool:
        """``[[ TEXT =~ REGEX ]]``: quoted characters of the word match themselves; sets
        BASH_REMATCH (a capture not modelled is a run-time value)."""
        chars = self.pattern_chars(word)
        pattern = "".join(
            c if special or c not in _REGEX_SPECIAL else "\\" + c for c, special in chars
        )
        self.need(pattern, line, _DECIDES)
        self.check_pattern_subject(text, line)
        try:
            found = regex.search(pattern, text, self.spend_pattern_steps)
        except regex.RegexError as exc:
            self.fail(line, "[[ =~ ]]", str(exc))
        if "BASH_REMATCH" in self.sh.readonly:
            self.fail(line, "[[ =~ ]]", "BASH_REMATCH is readonly")
        groups: dict[int, str] = {}
        for index, group in enumerate(found.groups if found else ()):
            groups[index] = (
                group
                if group is not None
                else self.lazy(
                    line,
                    f"${{BASH_REMATCH[{index}]}}",
                    "bash's choice of a repeated, nested or alternative capture is not modelled; "
                    "capture it with a top-level group",
                    nonempty=False,
                )
            )
        self.sh.vars["BASH_REMATCH"] = groups
        return found is not None

    def unary_test(self, op: str, operand: str, line: int) -> bool:
        """Unary operators shared by ``[[ ]]`` and ``[``."""
        if op == "-z":
            return not self.decide_nonempty(operand, line, _DECIDES)
        if op == "-n":
            return self.decide_nonempty(operand, line, _DECIDES)
        self.need(operand, line, _DECIDES)
        if op == "-v":
            name, bracket, rest = operand.partition("[")
            if not is_name(name):
                return False
            if bracket:
                if not rest.endswith("]"):
                    return False
                if isinstance(self.sh.vars.get(name), Assoc):
                    return self.lookup(name, rest[:-1], line) is not None
                return self.lookup(name, self.arith_text(rest[:-1], line), line) is not None
            return self.lookup(name, None, line) is not None
        if op == "-o":
            if operand in SET_NAMED:
                return SET_NAMED[operand] in self.sh.options
            self.fail(line, f"test -o {operand}", "shell option not modelled")
        self.fail(line, f"test {op}", "file and terminal tests need the running system")

    def test_builtin(self, argv: list[str], line: int) -> int:
        """``[ ... ]`` and ``test``: real statuses, 2 for syntax errors."""
        args = argv[1:]
        if argv[0] == "[":
            if args:
                self.need(args[-1], line, _DECIDES)
            if not args or args[-1] != "]":
                return 2
            args = args[:-1]
        if any(self.lazy_ids(arg) for arg in args):
            # Only an emptiness test of a run-time value can be decided, and only when it is
            # certainly non-empty (``[ -n "$PWD/x" ]``); anything else reads its text.
            if len(args) == 1:
                return 0 if self.decide_nonempty(args[0], line, _DECIDES) else 1
            if len(args) == 2 and args[0] in ("-n", "-z") and not self.lazy_ids(args[0]):
                return 0 if self.unary_test(args[0], args[1], line) else 1
            for arg in args:
                self.need(arg, line, _DECIDES)
        try:
            return 0 if self.test_expr(args, line) else 1
        except MalformedTest:
            return 2

    def test_expr(self, args: list[str], line: int) -> bool:
        """POSIX argument-count rules, then bash's precedence parser."""
        n = len(args)
        if n == 0:
            return False
        if n == 1:
            return args[0] != ""
        if n == 2:
            if args[0] == "!":
                return args[1] == ""
            return self.test_unary(args[0], args[1], line)
        if n == 3:
            if args[1] in _TEST_BINARY or args[1] in ("-a", "-o"):
                return self.test_binary(args[0], args[1], args[2], line)
            if args[0] == "!":
                return not self.test_expr(args[1:], line)
            if args[0] == "(" and args[2] == ")":
                return args[1] != ""
        elif n == 4:
            if args[0] == "!":
                return not self.test_expr(args[1:], line)
            if args[0] == "(" and args[3] == ")":
                return self.test_expr(args[1:3], line)
        return _TestParser(self, args, line).parse()

    def test_unary(self, op: str, operand: str, line: int) -> bool:
        """A unary ``[`` operator; anything else is a syntax error."""
        if op in ("-z", "-n", "-v", "-o"):
            return self.unary_test(op, operand, line)
        if op in _TEST_FILE_OPS or op == "-R":
            self.fail(line, f"test {op}", "file and terminal tests need the running system")
        raise MalformedTest(op)

    def test_binary(self, left: str, op: str, right: str, line: int) -> bool:
        """A binary ``[`` operator."""
        if op in ("=", "=="):
            return left == right
        if op == "!=":
            return left != right
        if op == "<":
            return left < right
        if op == ">":
            return left > right
        if op == "-a":
            return left != "" and right != ""
        if op == "-o":
            return left != "" or right != ""
        if op in _INT_OPS:
            a, b = legal_integer(left), legal_integer(right)
            if a is None or b is None:
                raise MalformedTest("integer expression expected")
            return _compare(op, a, b)
        self.fail(line, f"test {op}", "file tests need the file system")


class _TestParser:
    """bash's ``test`` grammar for more than four arguments (``-o`` < ``-a`` < ``!``)."""

    def __init__(self, shell: Conditions, args: list[str], line: int) -> None:
        self.shell = shell
        self.args = args
        self.pos = 0
        self.line = line

    def parse(self) -> bool:
        """The whole expression; leftover arguments are a syntax error."""
        value = self.disjunction()
        if self.pos != len(self.args):
            raise MalformedTest("too many arguments")
        return value

    def disjunction(self) -> bool:
        """``expr -o expr``."""
        value = self.conjunction()
        while self.pos < len(self.args) and self.args[self.pos] == "-o":
            self.pos += 1
            right = self.conjunction()
            value = value or right
        return value

    def conjunction(self) -> bool:
        """``expr -a expr``."""
        value = self.term()
        while self.pos < len(self.args) and self.args[self.pos] == "-a":
            self.pos += 1
            right = self.term()
            value = value and right
        return value

    def term(self) -> bool:
        """``! term``, ``( expr )``, binary, unary, or a single string."""
        args = self.args
        if self.pos >= len(args):
            raise MalformedTest("argument expected")
        arg = args[self.pos]
        if arg == "!":
            self.pos += 1
            return not self.term()
        if arg == "(":
            self.pos += 1
            value = self.disjunction()
            if self.pos >= len(args) or args[self.pos] != ")":
                raise MalformedTest("`)' expected")
            self.pos += 1
            return value
        if self.pos + 3 <= len(args) and args[self.pos + 1] in _TEST_BINARY:
            value = self.shell.test_binary(arg, args[self.pos + 1], args[self.pos + 2], self.line)
            self.pos += 3
            return value
        if (
            self.pos + 2 <= len(args)
            and len(arg) == 2
            and arg[0] == "-"
            and arg not in ("-a", "-o")
        ):
            value = self.shell.test_unary(arg, args[self.pos + 1], self.line)
            self.pos += 2
            return value
        self.pos += 1
        return arg != ""


def _compare(op: str, a: int, b: int) -> bool:
    """Integer comparison operators of ``test`` and ``[[ ]]``."""
    return {
        "-eq": a == b,
        "-ne": a != b,
        "-lt": a < b,
        "-le": a <= b,
        "-gt": a > b,
        "-ge": a >= b,
    }[op]
