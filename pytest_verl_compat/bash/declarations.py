"""Declarations and assignments: ``declare``/``local``/``export``/``readonly``, ``A=(...)``,
``A[i]=v``, and associative arrays (``declare -A``), whose subscripts are strings.

shfmt parses every subscript as arithmetic (it cannot know an array is associative), so the key
of an associative array is the subscript's expansion when shfmt kept it a word (``[$k]``,
``["a.b"]``, ``[name]``), else its source text when that holds nothing to expand (``[a-b]``,
``[7b]``), as bash reads it.
"""

from __future__ import annotations

from pytest_verl_compat.bash.arrays import Assoc
from pytest_verl_compat.bash.parse import Node, line_of
from pytest_verl_compat.bash.state import Value
from pytest_verl_compat.bash.stdin import Stdin
from pytest_verl_compat.bash.words import is_name

# The options each declaration builtin takes here: (turned on with -, turned off with +).
_ALLOWED = {
    "export": ("np", ""),
    "declare": ("aAfFgprx", "x"),
    "typeset": ("aAfFgprx", "x"),
    "local": ("aArpx", "x"),
    "readonly": ("aAfp", ""),
}


class Declarations(Stdin):
    """Declarations, assignments and array subscripts."""

    def declaration(self, cmd: Node, line: int) -> int:
        """``export``, ``declare``/``typeset``, ``local`` and ``readonly``."""
        variant = (cmd.get("Variant") or {}).get("Value", "")
        if variant == "local" and not self.in_function():
            self.fail(line, "local", "`local` outside a function")
        if variant not in _ALLOWED:
            self.fail(line, variant or "declaration", "not supported")
        on: set[str] = set()
        off: set[str] = set()
        # Each name: an assignment word shfmt parsed, or the text of an expanded word.
        entries: list[Node | str] = []
        for arg in cmd.get("Args") or []:
            if arg.get("Naked") and arg.get("Name") is None:
                parts = (arg.get("Value") or {}).get("Parts") or []
                text = parts[0].get("Value", "") if len(parts) == 1 else ""
                if len(parts) == 1 and parts[0].get("Type") == "Lit" and text[:1] in ("-", "+"):
                    if text not in ("-", "--"):
                        (on if text[0] == "-" else off).update(text[1:])
                    continue
                # `export "$k=$v"`, `declare -F "preset_$x"`: bash reads the expanded words.
                entries.extend(self.fields([arg["Value"]], use="names it declares"))
                continue
            entries.append(arg)
        allowed_on, allowed_off = _ALLOWED[variant]
        for flag in sorted(on - set(allowed_on)):
            self.fail(line, f"{variant} -{flag}", "option not supported")
        for flag in sorted(off - set(allowed_off)):
            self.fail(line, f"{variant} +{flag}", "option not supported")
        if on & {"f", "F"}:
            return self.declared_functions(entries, "F" in on)
        if "p" in on or not entries:
            if entries:
                self.fail(line, f"{variant} -p", "printing with names is not supported")
            self.write_unknown(f"`{variant}`")  # it lists variables
            return 0
        # In a function, `local` and `declare` without -g make each name local to it.
        local = variant == "local" or (variant in ("declare", "typeset") and self.in_function())
        local = local and "g" not in on
        export = (variant == "export" and "n" not in on) or "x" in on
        unexport = (variant == "export" and "n" in on) or "x" in off
        readonly = variant == "readonly" or "r" in on
        status = 0
        for entry in entries:
            name, assign = self.declared_name(entry, line)
            if local:
                self.make_local(name, line)
            if on & {"a", "A"} and not self.convert_array(name, "A" in on, line):
                status = 1
                continue
            if assign is not None:
                self.assign(assign)
            elif isinstance(entry, str) and "=" in entry:
                self.assign_text(name, entry, line)
            if export:
                self.sh.exported.add(name)
            if unexport:
                self.sh.exported.discard(name)
            if readonly:
                self.sh.readonly.add(name)
        return status

    def declared_name(self, entry: Node | str, line: int) -> tuple[str, Node | None]:
        """The variable an entry declares, and the assignment shfmt parsed, if any."""
        if not isinstance(entry, str):
            name: str = entry["Name"]["Value"]
            return name, None if entry.get("Naked") else entry
        name = entry.split("=", 1)[0].removesuffix("+")
        if not is_name(name):
            self.fail(line, "declaration", f"not a variable name: {self.shown(entry)!r}")
        return name, None

    def assign_text(self, name: str, text: str, line: int) -> None:
        """``NAME=VALUE`` given as an expanded word: the value is taken as it is."""
        head, _, value = text.partition("=")
        if value.startswith("("):
            self.fail(line, "declaration", "an array assigned through an expanded word")
        self.check_assignable(name, line)
        if head.endswith("+"):
            value = (self.lookup(name, None, line) or "") + value
        self.set_scalar(name, value, line)

    def declared_functions(self, entries: list[Node | str], names_only: bool) -> int:
        """``declare -F NAME...`` prints the names that are functions (status 1 if one is
        not); ``-f`` prints their text, which only running bash formats."""
        if not entries:
            self.write_unknown("`declare -f`")
            return 0
        status = 0
        for entry in entries:
            name = entry if isinstance(entry, str) else entry["Name"]["Value"]
            if name not in self.sh.functions:
                status = 1
            elif names_only:
                self.write(name + "\n")
            else:
                self.write_unknown("`declare -f`")
        return status

    def convert_array(self, name: str, associative: bool, line: int) -> bool:
        """``declare -a``/``-A``: make ``name`` an array of that kind (False: bash refuses)."""
        current = self.sh.vars.get(name)
        if associative:
            if isinstance(current, dict):
                return False  # cannot convert indexed to associative array
            if not isinstance(current, Assoc):
                self.check_assignable(name, line)
                self.store(name, Assoc({} if current is None else {"0": current}), line)
            return True
        if isinstance(current, Assoc):
            return False  # cannot convert associative to indexed array
        if isinstance(current, str):
            self.store(name, {0: current}, line)
        return True

    # ---------------------------------------------------------------- assignments

    def assign(self, assign: Node) -> None:
        """One assignment word: scalar, ``+=``, ``A=( ... )``, ``A+=( ... )`` or ``A[i]=v``."""
        line = line_of(assign)
        name = assign["Name"]["Value"]
        self.check_assignable(name, line)
        append = bool(assign.get("Append"))
        current = self.sh.vars.get(name)
        if assign.get("Array") is not None:
            if assign.get("Index") is not None:
                self.fail(line, "assignment", f"{name}[...] cannot be assigned a list")
            if isinstance(current, Assoc):
                table = current.copy() if append else Assoc()
                for key, element, add in self.assoc_elements(assign["Array"], name, line):
                    table.items[key] = table.items.get(key, "") + element if add else element
                self.store(name, table, line)
                return
            self.store(name, self.indexed_list(current, assign["Array"], append, name), line)
            return
        value = self.string(assign.get("Value"), tilde="assign")
        if assign.get("Index") is not None:
            index = self.subscript(name, assign["Index"], line)
            self.store_element(name, index, value, append, line)
            return
        if isinstance(current, (dict, Assoc)):
            first: int | str = "0" if isinstance(current, Assoc) else 0
            self.store_element(name, first, value, append, line)
            return
        self.store(name, (current or "") + value if append else value, line)

    def indexed_list(
        self, current: Value | None, array: Node, append: bool, name: str
    ) -> dict[int, str]:
        """The indexed array ``A=( ... )`` (or ``A+=( ... )``) makes."""
        line = line_of(array)
        base: dict[int, str] = {}
        if append and isinstance(current, dict):
            base = dict(current)
        elif append and isinstance(current, str):
            base = {0: current}
        following = max(base) + 1 if base else 0
        for index, value in self.array_elements(array):
            if index is None:
                index = following
            elif index < 0:
                index += max(base) + 1 if base else 0
                if index < 0:
                    self.fail(line, "assignment", f"{name}: bad array subscript")
            base[index] = value
            following = index + 1
        return base

    def array_elements(self, array: Node) -> list[tuple[int | None, str]]:
        """The elements of ``( ... )``: plain words split like arguments, ``[i]=v`` not split."""
        elements: list[tuple[int | None, str]] = []
        for elem in array.get("Elems") or []:
            if elem.get("Index") is not None:
                index = self.arith(elem["Index"])
                elements.append((index, self.string(elem.get("Value"), tilde="assign")))
            elif elem.get("Value") is not None:
                fields = self.fields(
                    [elem["Value"]], assignment_words=False, use="elements the array gets"
                )
                elements.extend((None, f) for f in fields)
        return elements

    def assoc_elements(self, array: Node, name: str, line: int) -> list[tuple[str, str, bool]]:
        """The (key, value, appended) of ``( [k]=v ... )``, or of ``( k1 v1 k2 v2 ... )``."""
        elems = array.get("Elems") or []
        subscripted = [elem.get("Index") is not None for elem in elems]
        if any(subscripted) and not all(subscripted):
            # bash warns "must use subscript" and drops the element.
            self.fail(line, "assignment", f"{name}: an associative element without a key")
        if all(subscripted):
            return [
                (
                    self.assoc_key(elem["Index"], line),
                    self.string(elem.get("Value"), tilde="assign"),
                    False,
                )
                for elem in elems
            ]
        words: list[str] = []
        for elem in elems:
            if elem.get("Value") is not None:
                words.extend(self.fields([elem["Value"]], use="elements the array gets"))
        if len(words) % 2:
            words.append("")
        for key in words[::2]:
            self.check_key(key, name, line)
        return [(words[i], words[i + 1], False) for i in range(0, len(words), 2)]

    # ---------------------------------------------------------------- subscripts

    def subscript(self, name: str, index: Node, line: int) -> int | str:
        """An element's subscript: a string key for an associative array, else arithmetic."""
        if isinstance(self.sh.vars.get(name), Assoc):
            return self.check_key(self.assoc_key(index, line), name, line)
        return self.arith(index)

    def assoc_key(self, index: Node, line: int) -> str:
        """The key a subscript names in an associative array, as bash expands it."""
        if index.get("Type") == "Word":
            return self.string(index, tilde=None)
        text = self.source_text(index)
        if any(c in text for c in "$`\"'\\"):
            self.fail(line, "array subscript", f"[{text}] mixes expansions into an expression")
        return text

    def check_key(self, key: str, name: str, line: int) -> str:
        """Refuse a key whose text is only known at run time, or empty (bash refuses it)."""
        self.need(key, line, f"is a key of the associative array {name}")
        if not key:
            self.fail(line, "array subscript", f"{name}[]: bad array subscript")
        return key
