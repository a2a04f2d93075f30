"""Word expansion: fields, tilde, quoting, command substitutions and parameter expansion."""

from __future__ import annotations

from collections.abc import Callable

from pytest_verl_compat.bash.arrays import Assoc
from pytest_verl_compat.bash.braces import brace_expand, merge_names
from pytest_verl_compat.bash.errors import BudgetExceeded, LaunchReadError
from pytest_verl_compat.bash.parse import Node, line_of, substitution_text
from pytest_verl_compat.bash.patterns import Patterns
from pytest_verl_compat.bash.shapes import INTEGER, output_characters
from pytest_verl_compat.bash.words import (
    ANSI_ESCAPES,
    Fields,
    Item,
    Quoted,
    ascii_case,
    ascii_case_char,
    ascii_digits,
    could_be_user,
    is_char,
    is_name,
    literal_chunks,
    single_quoted,
    unescape_double_quoted,
)


class Expansion(Patterns):
    """Expands words into fields or strings with bash's rules."""

    # ---------------------------------------------------------------- word expansion

    def word_items(self, parts: list[Node]) -> list[Item]:
        """The parts of an unquoted word with its literal text split into characters."""
        items: list[Item] = []
        for part in parts:
            if part.get("Type") == "Lit":
                for chunk, escaped in literal_chunks(part.get("Value", "")):
                    if escaped:
                        items.append(Quoted(chunk))
                    else:
                        items.extend(chunk)
            else:
                items.append(part)
        return items

    def fields(
        self, words: list[Node], *, assignment_words: bool = True, use: str = "are words here"
    ) -> list[str]:
        """Expand words as command arguments; a run-time value split into words is refused."""
        result, uncertain = self.fields_split(words, assignment_words=assignment_words)
        if uncertain is not None:
            self.need(uncertain, self.line, f"is split into words unquoted (how many {use})")
        return result

    def fields_split(
        self, words: list[Node], *, assignment_words: bool = True
    ) -> tuple[list[str], str | None]:
        """Expand words as command arguments: braces, tilde, parameters, splitting.

        Also returns the first split text holding a run-time value (None if there is none):
        with it, how many fields there are is only known at run time.
        """
        # bash gives NAME=... arguments assignment-style tilde expansion, but not the elements
        # of A=( ... ) (``assignment_words=False``).
        fb = Fields(split=True, ifs=self.split_characters(), certain=self.splits_as_one)
        try:
            for word in words:
                line = line_of(word)
                items = self.word_items(word.get("Parts") or [])
                mode = "word" if assignment_words else "start"
                alternatives = [items]
                if "braceexpand" in self.sh.options and "{" in items:
                    alternatives = brace_expand(items, line, self)
                    if alternatives != [items]:
                        # bash re-reads the expanded text, so `$E{1,2}` names $E1 and $E2, and
                        # the new words lose the "looks like an assignment" flag.
                        alternatives = [merge_names(alt) for alt in alternatives]
                        mode = "start"
                for alternative in alternatives:
                    self.emit_items(self.tilde(alternative, mode, line), fb, pword=False)
                    fb.delimit()
        except BudgetExceeded as exc:
            self.fail(self.line, "limit", str(exc))
        result = fb.finish()
        self.charge(sum(map(len, result)) + len(result))
        return result, fb.uncertain

    def string(self, word: Node | None, tilde: str | None) -> str:
        """Expand a word to one string: no brace expansion, no splitting."""
        if word is None:
            return ""
        fb = Fields(split=False)
        items = self.word_items(word.get("Parts") or [])
        self.emit_items(self.tilde(items, tilde, line_of(word)), fb, pword=False)
        result = fb.joined()
        self.charge(len(result))
        return result

    def tilde(self, items: list[Item], mode: str | None, line: int) -> list[Item]:
        """Tilde expansion with bash's rules for each kind of word (``mode``)."""
        # start: only a leading ~.  word: an argument; if it reads NAME=... it is also expanded
        # after the first = and after each :.  assign: an assignment value, at its start and
        # after each :.
        if mode is None or "~" not in items:
            return items
        out: list[Item] = []
        i = 0
        n = len(items)
        if is_char(items[0], "~"):
            if mode == "assign":
                replaced = self.tilde_assign_prefix(items, 0, line)
            else:
                replaced = self.tilde_start_prefix(items, line)
            if replaced is not None:
                text, i = replaced
                out.append(Quoted(text))
        after_colon = mode == "assign"
        equals = -1
        if mode == "word":
            # bash flags NAME=... arguments as assignments (an unquoted, valid name before `=`).
            for index, item in enumerate(items):
                if type(item) is not str:
                    break
                if item == "=":
                    if index and is_name("".join(items[:index])):  # type: ignore[arg-type]
                        equals = index
                    break
        while i < n:
            item = items[i]
            out.append(item)
            i += 1
            trigger = i - 1 == equals or (after_colon and is_char(item, ":"))
            if i - 1 == equals:
                after_colon = True
            if trigger and i < n and is_char(items[i], "~"):
                replaced = self.tilde_assign_prefix(items, i, line)
                if replaced is not None:
                    text, i = replaced
                    out.append(Quoted(text))
        return out

    def tilde_start_prefix(self, items: list[Item], line: int) -> tuple[str, int] | None:
        """A leading ``~...`` of an ordinary word: bash reads it up to the first ``/``."""
        end = 1
        while end < len(items) and not is_char(items[end], "/"):
            end += 1
        raw = ["~"]
        opaque_at: int | None = None
        for index in range(1, end):
            item = items[index]
            if type(item) is str:
                raw.append(item)
                continue
            if isinstance(item, Quoted):
                return None  # bash never expands a tilde-prefix that contains quoting
            source = self.source_text(item)  # type: ignore[arg-type]
            if any(c in source for c in ("\\", "'", '"')):
                return None
            if opaque_at is None:
                opaque_at = len("".join(raw))
            raw.append(source)
        text = "".join(raw)
        # readline ends the user name at `:` or `=~` and copies the rest of the prefix verbatim.
        stop = len(text)
        for index in range(1, len(text)):
            if text[index] == ":" or text.startswith("=~", index):
                stop = index
                break
        if opaque_at is not None and opaque_at < stop:
            return None  # the user name holds an expansion: no such user, the word stays
        if opaque_at is not None:
            self.fail(line, "tilde expansion", f"{text} copies an expansion verbatim in bash")
        expansion = self.tilde_user(text[1:stop], line)
        if expansion is None:
            return None
        return expansion + text[stop:], end

    def tilde_assign_prefix(
        self, items: list[Item], start: int, line: int
    ) -> tuple[str, int] | None:
        """A ``~...`` in assignment position: the prefix ends at ``/`` or ``:``."""
        end = start + 1
        while end < len(items):
            item = items[end]
            if type(item) is not str:
                return None  # quoted, or a user name containing an expansion
            if item in "/:":
                break
            end += 1
        expansion = self.tilde_user("".join(items[start + 1 : end]), line)  # type: ignore[arg-type]
        return None if expansion is None else (expansion, end)

    def tilde_user(self, user: str, line: int) -> str | None:
        """The directory for ``~user`` (None: bash leaves the text unexpanded)."""
        if user == "":
            home = self.sh.vars.get("HOME")
            if not isinstance(home, str):
                # bash asks the password database: the home of whoever runs the script.
                return self.lazy(line, "~", "bind HOME: --env HOME=DIR", nonempty=True)
            return home
        if user in ("+", "-"):
            return self.lookup("PWD" if user == "+" else "OLDPWD", None, line)
        if not could_be_user(user):
            return None  # no such user can exist, so bash leaves the word alone
        self.fail(line, "tilde expansion", f"~{user} needs the password database")

    def source_text(self, node: Node) -> str:
        """The exact source text of a node."""
        start = node.get("Pos", {}).get("Offset", 0)
        end = node.get("End", {}).get("Offset", start)
        return self.data[start:end].decode("utf-8", "replace")

    def emit_items(self, items: list[Item], fb: Fields, pword: bool) -> None:
        """Expand a word's items into ``fb``; in a parameter word literal text also splits."""
        run: list[str] = []
        for item in items:
            if type(item) is str:
                run.append(item)
                continue
            if run:
                (fb.expanded if pword else fb.text)("".join(run))
                run = []
            if isinstance(item, Quoted):
                fb.text(item.text)
            else:
                self.part(item, fb, quoted=False, pword=pword)  # type: ignore[arg-type]
        if run:
            (fb.expanded if pword else fb.text)("".join(run))

    def part(self, part: Node, fb: Fields, quoted: bool, pword: bool) -> None:
        """Expand one word part. ``quoted``: inside double quotes."""
        kind = part.get("Type")
        line = line_of(part)
        if kind == "Lit":
            value = part.get("Value", "")
            if quoted:
                fb.text(unescape_double_quoted(value))
            else:
                for chunk, escaped in literal_chunks(value):
                    (fb.expanded if pword and not escaped else fb.text)(chunk)
        elif kind == "SglQuoted":
            value = part.get("Value", "")
            if quoted:
                if part.get("Dollar"):
                    self.fail(line, "quoting", "$'...' inside a double-quoted expansion")
                # In "${X:-'w'}" the single quotes are ordinary characters.
                fb.text(f"'{value}'")
            else:
                fb.text(self.ansi_c(value, line) if part.get("Dollar") else value)
        elif kind == "DblQuoted":
            inner = part.get("Parts") or []
            if not inner or not all(self.is_at_list(p) for p in inner):
                fb.text("")
            for sub in inner:
                self.part(sub, fb, quoted=True, pword=False)
        elif kind == "ParamExp":
            self.param(part, fb, quoted, pword)
        elif kind == "CmdSubst":
            output = self.substitution(part)
            (fb.text if quoted else fb.expanded)(output)
        elif kind == "ArithmExp":
            (fb.text if quoted else fb.expanded)(self.arithmetic_expansion(part, line))
        elif kind == "ProcSubst":
            # One path, never split: bash expands it to a /dev/fd name.
            fb.text(self.process_substitution(part))
        elif kind == "ExtGlob":
            self.fail(line, "extended glob", "extglob patterns are not supported")
        else:
            self.fail(line, str(kind), "this word part is not supported")

    def arithmetic_expansion(self, part: Node, line: int) -> str:
        """``$((...))``: its value; a run-time value when one is an operand and the expression
        assigns nothing (its result is then refused only where it decides something)."""
        try:
            return str(self.arith(part["X"]))
        except LaunchReadError as exc:
            index = getattr(exc, "runtime_index", None)
            if index is None or not assigns_nothing(part["X"]):
                raise
            binding = self.lazies[index].binding
            return self.lazy(line, "$((...))", binding, True, index, chars=INTEGER)

    def substitution(self, part: Node) -> str:
        """A command substitution's output: bound, or its body's as this reader evaluates it.

        Nothing is executed: the body is interpreted, and output that only running something
        would give (an unmodelled program) makes the whole output a run-time value.
        """
        text = substitution_text(self.data, part)
        shown = f"`{text}`" if part.get("Backquotes") else f"$({text})"
        if text not in self.substitutions:
            evaluated = self.evaluate_substitution(part)
            if evaluated is not None:
                return evaluated
            # Its output is only known at run time; never run, it stays a run-time value (of
            # known characters when its program prints a known shape, never empty then).
            chars = _output_shape(part.get("Stmts") or [])
            return self.lazy(
                line_of(part),
                shown,
                f"bind it: --subst {single_quoted(text)} OUTPUT (environment.substitutions in the manifest)",
                nonempty=chars is not None,
                chars=chars,
            )
        # bash drops NUL bytes and strips every trailing newline from the output.
        return str(self.substitutions[text]).replace("\0", "").rstrip("\n")

    def ansi_c(self, text: str, line: int) -> str:
        """Decode ``$'...'`` escapes as bash does in the C locale."""
        out: list[str] = []
        i = 0
        n = len(text)
        while i < n:
            c = text[i]
            if c != "\\" or i + 1 >= n:
                out.append(c)
                i += 1
                continue
            e = text[i + 1]
            i += 2
            if e in ANSI_ESCAPES:
                out.append(ANSI_ESCAPES[e])
                continue
            code: int | None = None
            if "0" <= e <= "7":
                j = i
                while j < n and j < i + 2 and "0" <= text[j] <= "7":
                    j += 1
                code = int(e + text[i:j], 8) & 0xFF
                i = j
            elif e in "xuU":
                width = {"x": 2, "u": 4, "U": 8}[e]
                j = i
                while j < n and j < i + width and text[j] in "0123456789abcdefABCDEF":
                    j += 1
                if j == i:
                    out.append("\\" + e)
                    continue
                code = int(text[i:j], 16)
                i = j
            elif e == "c" and i < n:
                ctl = text[i]
                i += 1
                code = 0x7F if ctl == "?" else ord(ascii_case_char(ctl, True)) & 0x1F
            else:
                out.append("\\" + e)
                continue
            if code == 0:
                break  # bash strings end at a NUL byte
            if code > 0x7F:
                self.fail(line, "quoting", "$'...' with a non-ASCII escape depends on the locale")
            out.append(chr(code))
        return "".join(out)

    @staticmethod
    def is_at_list(part: Node) -> bool:
        """Whether a part is ``$@`` or ``${A[@]}`` (which may expand to no field at all)."""
        if part.get("Type") != "ParamExp" or part.get("Length"):
            return False
        if part.get("Excl") and _index_word(part.get("Index")) not in ("@", "*"):
            return False
        if (part.get("Param") or {}).get("Value") == "@":
            return True
        return _index_word(part.get("Index")) == "@"

    # ---------------------------------------------------------------- parameters

    def param(self, pe: Node, fb: Fields, quoted: bool, pword: bool) -> None:
        """Parameter expansion: ``$X ${X} ${X:-w} ${#X} ${A[@]} ${X#p} ${X/p/r} ${X:o:l}`` ..."""
        line = line_of(pe)
        name = pe["Param"].get("Value", "")
        index_node = pe.get("Index")
        index_word = _index_word(index_node)
        if pe.get("Names") or pe.get("Width"):
            self.fail(line, "parameter expansion", f"the variable names ${{!{name}*}}")
        if pe.get("Excl") and index_word in ("@", "*"):
            if pe.get("Exp") or pe.get("Slice") or pe.get("Repl") or pe.get("Length"):
                self.fail(line, "parameter expansion", f"operators combined with ${{!{name}[@]}}")
            self.emit_list(self.keys(name, line), fb, quoted, index_word == "*")
            return
        if pe.get("Excl"):
            name, index_node = self.indirect(name, index_node, line)
            index_word = _index_word(index_node)
        nounset = "nounset" in self.sh.options
        is_list = name in ("@", "*") or index_word in ("@", "*")
        emit: Callable[[str], None] = fb.text if quoted else fb.expanded
        if pe.get("Length"):
            if pe.get("Exp") or pe.get("Slice") or pe.get("Repl"):
                self.fail(line, "parameter expansion", "operators combined with ${#...}")
            if name in ("@", "*") and index_node is None:
                emit(str(len(self.sh.positional)))
                return
            if is_list:
                values = self.elements(name, line)
                # bash 5.2 under set -u also rejects ${#X[@]} when X is not an array.
                if nounset and (values is None or isinstance(self.sh.vars.get(name), str)):
                    self.unbound(line, name)
                emit(str(len(values or [])))
                return
            value = self.scalar(name, index_node, line)
            if value is None:
                if nounset:
                    self.unbound(line, _display_name(name, index_node))
                value = ""
            derived = self.derive(line, f"${{#{name}}}", value, nonempty=True)
            if derived is not None:
                emit(derived)
                return
            if not value.isascii():
                self.fail(
                    line,
                    "parameter expansion",
                    f"${{#{name}}} of non-ASCII text depends on the locale",
                )
            emit(str(len(value)))
            return
        if is_list:
            if pe.get("Repl") or (pe.get("Slice") and pe.get("Exp")):
                self.fail(line, "parameter expansion", f"replacing in the list {name}")
            if pe.get("Slice"):
                values = self.list_slice(name, pe["Slice"], line)
            elif name in ("@", "*"):
                values = list(self.sh.positional)
            else:
                # bash 5.2 lets "${A[@]}" expand to nothing under set -u, like "$@".
                values = self.elements(name, line) or []
            star = name == "*" or index_word == "*"
            exp = pe.get("Exp")
            if exp is not None:
                op = exp.get("Op", "")
                if op not in (":-", "-", ":+", "+", ":?", "?"):
                    self.fail(line, "parameter expansion", f"operator {op!r} on the list {name}")
                # A list is unset with no elements and null when its joined value is empty.
                if op.startswith(":"):
                    what = f"testing ${{{name}[@]:...}} for being empty decides the expansion"
                    missing = not self.decide_nonempty(" ".join(values), line, what)
                else:
                    missing = not values
                if op.endswith("?") and missing:
                    self.fail(line, "parameter check", f"{name}: parameter null or not set")
                if (op.endswith("-") and missing) or (op.endswith("+") and not missing):
                    self.param_word(exp.get("Word"), fb, quoted)
                    return
                # Otherwise bash expands the list itself (for an unused `+`, [] or [""]).
            self.emit_list(values, fb, quoted, star)
            return
        value = self.scalar(name, index_node, line)
        exp = pe.get("Exp")
        if exp is not None:
            op = exp.get("Op", "")
            word = exp.get("Word")
            if op in (":-", "-", ":=", "=", ":+", "+", ":?", "?"):
                null = value is None or (
                    op.startswith(":")
                    and not self.decide_nonempty(
                        value, line, f"is tested for being empty by ${{{name}{op}...}}"
                    )
                )
                if op.endswith("-"):
                    if null:
                        self.param_word(word, fb, quoted)
                    else:
                        emit(value or "")
                elif op.endswith("="):
                    if null:
                        if not is_name(name):
                            self.fail(
                                line, "parameter expansion", f"${name}: cannot assign in this way"
                            )
                        new = self.string(word, tilde="start")
                        self.assign_indexed(name, index_node, new, line)
                        value = new
                    emit(value or "")
                elif op.endswith("+"):
                    if not null:
                        self.param_word(word, fb, quoted)
                else:
                    if null:
                        message = self.string(word, tilde=None) if word is not None else ""
                        if not message:
                            message = (
                                "parameter null or not set" if op == ":?" else "parameter not set"
                            )
                        self.fail(
                            line, "parameter check", f"{_display_name(name, index_node)}: {message}"
                        )
                    emit(value or "")
                return
            if value is None:
                if nounset:
                    self.unbound(line, _display_name(name, index_node))
                value = ""
            if op in ("#", "##", "%", "%%"):
                emit(self.remove_affix(value, op, word, line, f"${{{name}{op}...}}"))
            elif op in ("^^", "^", ",,", ","):
                if word is not None:
                    self.fail(line, "parameter expansion", f"${{X{op}pattern}} is not supported")
                derived = self.derive(line, f"${{{name}{op}}}", value)
                if derived is not None:
                    emit(derived)
                    return
                if not value.isascii():
                    self.fail(
                        line,
                        "parameter expansion",
                        "case change of non-ASCII text depends on the locale",
                    )
                emit(ascii_case(value, op))
            else:
                self.fail(line, "parameter expansion", f"operator {op!r} is not supported")
            return
        if value is None:
            if nounset:
                self.unbound(line, _display_name(name, index_node))
            value = ""
        if pe.get("Slice") is not None:
            value = self.slice(value, pe["Slice"], line)
            value = self.derive(line, f"${{{name}:...}}", value) or value
        elif pe.get("Repl") is not None:
            value = self.replace(value, pe["Repl"], line, f"${{{name}/...}}")
        emit(value)

    def list_slice(self, name: str, spec: Node, line: int) -> list[str]:
        """``${@:offset:length}`` (position 0 is ``$0``) and ``${A[@]:offset:length}`` (from
        the first element whose index is at least ``offset``)."""
        offset = self.arith(spec["Offset"]) if spec.get("Offset") is not None else 0
        length = self.arith(spec["Length"]) if spec.get("Length") is not None else None
        if name in ("@", "*"):
            indexed = dict(enumerate([self.script, *self.sh.positional]))
        else:
            value = self.sh.vars.get(name)
            if isinstance(value, Assoc):
                self.fail(line, "parameter expansion", f"a slice of the associative array {name}")
            if isinstance(value, str):
                indexed = {0: value}
            elif isinstance(value, dict):
                indexed = dict(value)
            else:
                indexed = dict(enumerate(self.elements(name, line) or []))
        top = max(indexed) + 1 if indexed else 0
        if offset < 0:
            offset += top
            if offset < 0:
                return []
        values = [indexed[k] for k in sorted(indexed) if k >= offset]
        if length is None:
            return values
        if length < 0:
            self.fail(line, "parameter expansion", f"{length}: substring expression < 0")
        return values[:length]

    def emit_list(self, values: list[str], fb: Fields, quoted: bool, star: bool) -> None:
        """Emit ``$@``/``$*``/``${A[@]}``/``${A[*]}`` with bash's field rules."""
        if not fb.split or (quoted and star):
            # "$*" and every list in a non-splitting context join with the first IFS char.
            (fb.text if quoted else fb.expanded)(self.join_character().join(values))
            return
        separator = self.join_character()
        if not quoted and separator:
            # bash joins an unquoted list with IFS's first character and splits the result, so
            # with IFS=, an empty element still makes an (empty) field. With IFS whitespace
            # next to other IFS characters, where an element's whitespace ends is not modelled.
            if fb.delimiters and any(c in fb.whitespace for value in values for c in value):
                self.fail(
                    self.line,
                    "IFS",
                    "an unquoted list whose elements hold IFS whitespace, with other IFS characters",
                )
            for i, value in enumerate(values):
                if i:
                    fb.list_separator(separator, values[i - 1])
                fb.expanded(value)
            return
        for i, value in enumerate(values):
            if quoted:
                if i:
                    fb.hard()
                fb.text(value)
            else:
                if i:
                    fb.delimit()
                fb.expanded(value)

    def param_word(self, word: Node | None, fb: Fields, quoted: bool) -> None:
        """The word of ``${X:-word}``: unquoted text in it is split like the expansion."""
        if word is None:
            return
        parts = word.get("Parts") or []
        if quoted:
            for part in parts:
                self.part(part, fb, quoted=True, pword=False)
            return
        items = self.tilde(self.word_items(parts), "start", line_of(word))
        self.emit_items(items, fb, pword=True)

    def scalar(self, name: str, index_node: Node | None, line: int) -> str | None:
        """The value of a scalar parameter (special, positional, variable or element)."""
        if name == "#":
            return str(len(self.sh.positional))
        if name == "?":
            return str(self.sh.status)
        if name == "0":
            return self.script
        if ascii_digits(name):
            # A position past 64 bits is past the end of any list.
            position = int(name) if len(name) <= 19 else 1 << 63
            return self.sh.positional[position - 1] if position <= len(self.sh.positional) else None
        if name == "$":
            return self.lazy(line, "$$", "the process id is never known in advance", True)
        if name == "!":
            if not self.sh.background:
                return None
            return self.lazy(line, "$!", "the process id is never known in advance", True)
        if name in ("-", "_"):
            self.fail(line, "special parameter", f"${name} is only known at run time")
        if not is_name(name):
            self.fail(line, "parameter expansion", f"unsupported parameter {name!r}")
        index = None if index_node is None else self.subscript(name, index_node, line)
        return self.lookup(name, index, line)

    def indirect(self, name: str, index: Node | None, line: int) -> tuple[str, Node | None]:
        """``${!NAME}``: the parameter NAME's value names (a variable, an element, a position)."""
        target = self.scalar(name, index, line)
        if target is None:
            if "nounset" in self.sh.options:
                self.unbound(line, name)
            self.fail(line, "parameter expansion", f"${{!{name}}}: {name} is unset")
        self.need(target, line, f"names the variable ${{!{name}}} expands")
        base, bracket, rest = target.partition("[")
        if not (is_name(base) or ascii_digits(base) or base in ("@", "*", "#", "?")):
            self.fail(line, "parameter expansion", f"${{!{name}}}: {target!r}: invalid name")
        if not bracket:
            return base, None
        if not rest.endswith("]") or not rest[:-1]:
            self.fail(line, "parameter expansion", f"${{!{name}}}: {target!r}: bad subscript")
        key = rest[:-1]
        word: Node = {"Type": "Word", "Parts": [{"Type": "Lit", "Value": key}]}
        if not isinstance(self.sh.vars.get(base), Assoc) and not key.isdigit() and key not in "@*":
            self.fail(line, "parameter expansion", f"${{!{name}}}: {target!r}: not supported")
        return base, word

    def assign_indexed(self, name: str, index_node: Node | None, value: str, line: int) -> None:
        """Assignment made by ``${X:=word}`` (possibly to an element)."""
        if index_node is None:
            self.set_scalar(name, value, line)
            return
        self.check_assignable(name, line)
        self.store_element(name, self.subscript(name, index_node, line), value, False, line)

    def slice(self, value: str, spec: Node, line: int) -> str:
        """``${X:offset}`` and ``${X:offset:length}``."""
        if self.lazy_ids(value):
            # The offsets are still evaluated (they may assign); the result is the run-time
            # value's (derived by the caller).
            if spec.get("Offset") is not None:
                self.arith(spec["Offset"])
            if spec.get("Length") is not None:
                self.arith(spec["Length"])
            return value
        if not value.isascii():
            self.fail(
                line, "parameter expansion", "substring of non-ASCII text depends on the locale"
            )
        n = len(value)
        offset = self.arith(spec["Offset"]) if spec.get("Offset") is not None else 0
        if offset < 0:
            offset += n
            if offset < 0:
                return ""
        if offset > n:
            return ""
        if spec.get("Length") is None:
            return value[offset:]
        length = self.arith(spec["Length"])
        if length < 0:
            end = n + length
            if end < offset:
                self.fail(line, "parameter expansion", f"substring expression < 0 ({length})")
            return value[offset:end]
        return value[offset : offset + length]


# Arithmetic and parameter operators that assign a variable.
_ASSIGNING = frozenset("= += -= *= /= %= <<= >>= &= |= ^= ++ -- := ".split())


def assigns_nothing(node: object) -> bool:
    """Whether an arithmetic expression (and every word in it) assigns no variable."""
    if isinstance(node, list):
        return all(assigns_nothing(item) for item in node)
    if not isinstance(node, dict):
        return True
    if node.get("Op") in _ASSIGNING and node.get("Type") in ("BinaryArithm", "UnaryArithm"):
        return False
    if node.get("Type") == "ParamExp" and (node.get("Exp") or {}).get("Op") in ("=", ":="):
        return False
    return all(assigns_nothing(value) for value in node.values())


def _index_word(index: Node | None) -> str | None:
    """The literal text of an index such as ``@`` or ``*``, if it is one literal."""
    if not index or index.get("Type") != "Word":
        return None
    parts = index.get("Parts") or []
    if len(parts) == 1 and parts[0].get("Type") == "Lit":
        value: str | None = parts[0].get("Value")
        return value
    return None


def _display_name(name: str, index: Node | None) -> str:
    """How bash names a parameter in its error messages."""
    if ascii_digits(name):
        return f"${name}"
    if index is not None:
        return f"{name}[{_index_word(index) or '...'}]"
    return name


def _literal(word: Node) -> str | None:
    """A word's text when it is written out (plain, single- or double-quoted text only)."""
    pieces = []
    for part in word.get("Parts") or []:
        kind = part.get("Type")
        if kind in ("Lit", "SglQuoted") and not part.get("Dollar"):
            pieces.append(part.get("Value", ""))
        elif kind == "DblQuoted" and not part.get("Dollar"):
            inner = [_literal({"Parts": [p]}) for p in part.get("Parts") or []]
            if any(piece is None or "\\" in piece for piece in inner):
                return None
            pieces.extend(piece for piece in inner if piece is not None)
        else:
            return None
    text = "".join(pieces)
    return None if "\\" in text else text


def _output_shape(stmts: list[Node]) -> frozenset[str] | None:
    """The characters a substitution whose body is one program of known output shape prints
    (``date +%Y%m%d``, ``shuf -i 20000-30000 -n 1``; its errors may go anywhere); else None."""
    if len(stmts) != 1:
        return None
    stmt = stmts[0]
    cmd = stmt.get("Cmd") or {}
    if cmd.get("Type") != "CallExpr" or cmd.get("Assigns"):
        return None
    if stmt.get("Negated") or stmt.get("Background") or stmt.get("Coprocess"):
        return None
    if any((r.get("N") or {}).get("Value") != "2" for r in stmt.get("Redirs") or []):
        return None
    words = [_literal(arg) for arg in cmd.get("Args") or []]
    if any(word is None for word in words):
        return None
    return output_characters([word for word in words if word is not None])
