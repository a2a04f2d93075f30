"""Standard input: here-documents, here-strings, pipes and what reads them.

A command's input is known text when it comes from the script (``<<EOF``, ``<<<``), from the
output of a pipeline's earlier command or of a process substitution that this reader evaluates;
it is unknown when it comes from a file or from whatever started the script. ``read`` and
``mapfile``/``readarray`` consume known input as bash does (commands of a compound command
share one input, so each ``read`` of ``while read ... done <<EOF`` takes the next line), and
the text filters of ``filters`` (``cat``, ``tee``, ``tr``, ``cut``, ...) print what they
make of it; reading unknown input is refused, since it sets variables only the running system
knows, and a filter of unknown input prints unknown text. ``getopts`` reads the positional parameters, which the bindings give.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pytest_verl_compat.bash.filters import FILTERS, Filter
from pytest_verl_compat.bash.parse import Node, line_of
from pytest_verl_compat.bash.programs import Programs
from pytest_verl_compat.bash.state import StandardInput
from pytest_verl_compat.bash.words import Fields, is_name, legal_integer

_WHITESPACE = " \t\n"
# A character read, and whether a backslash protected it from being a separator.
_Char = tuple[str, bool]


def getopt(words: list[str], spec: str) -> tuple[list[tuple[str, str]], list[str]] | str:
    """Options of a builtin as bash's ``internal_getopt`` reads them (``spec``: letters, ``:``
    after those taking a value); the error text when one is unknown or misses its value."""
    found: list[tuple[str, str]] = []
    index = 0
    while index < len(words):
        word = words[index]
        if word == "--":
            index += 1
            break
        if len(word) < 2 or word[0] != "-":
            break
        position = 1
        while position < len(word):
            letter = word[position]
            position += 1
            at = spec.find(letter)
            if letter == ":" or at < 0:
                return f"-{letter}: invalid option"
            if spec[at + 1 : at + 2] == ":":
                value = word[position:]
                if not value:
                    index += 1
                    if index >= len(words):
                        return f"-{letter}: option requires an argument"
                    value = words[index]
                found.append((letter, value))
                break
            found.append((letter, ""))
        index += 1
    return found, words[index:]


# Redirections that only send output to a file.
_OUTPUT_REDIRECTIONS = frozenset({">", ">>", ">|", "&>", "&>>"})


class Stdin(Programs):
    """Where a command's standard input comes from, and the builtins that read it."""

    # ---------------------------------------------------------------- sources of input

    def heredoc_text(self, redir: Node) -> str:
        """The text a here-document feeds: tabs stripped for ``<<-``, expanded unless its
        delimiter is quoted (then only ``\\$``, ``\\```, ``\\\\`` and ``\\newline`` lose their
        backslash)."""
        strip_tabs = redir.get("Op") == "<<-"
        expands = self.heredoc_expands(redir.get("Word"))
        pieces: list[str] = []
        line_start = True
        for part in (redir.get("Hdoc") or {}).get("Parts") or []:
            if part.get("Type") != "Lit":
                fb = Fields(split=False)
                self.part(part, fb, quoted=True, pword=False)
                pieces.append(fb.joined())
                line_start = False
                continue
            text = part.get("Value", "")
            if strip_tabs:
                lines = text.split("\n")
                text = "\n".join(
                    line.lstrip("\t") if line_start or number else line
                    for number, line in enumerate(lines)
                )
            line_start = text.endswith("\n")
            pieces.append(_heredoc_unescape(text) if expands else text)
        return "".join(pieces)

    @staticmethod
    def heredoc_expands(word: Node | None) -> bool:
        """Whether a here-document body is expanded (its delimiter is unquoted)."""
        for part in (word or {}).get("Parts") or []:
            if part.get("Type") != "Lit" or "\\" in part.get("Value", ""):
                return False
        return True

    @contextmanager
    def reading(self, source: StandardInput | None) -> Iterator[None]:
        """Run a command with ``source`` as its standard input (None: the one it inherits)."""
        saved = (self.stdin, self.stdin_owned)
        if source is not None:
            self.stdin = source
        self.stdin_owned = source is not None
        try:
            yield
        finally:
            self.stdin, self.stdin_owned = saved

    def consumed(self, program: str) -> None:
        """A skipped program may read what is left of an input it shares with the script."""
        if not self.stdin_owned and self.stdin.text is not None:
            self.stdin.text = None
            self.stdin.origin = f"what `{program}` left of {self.stdin.origin}"

    def input_text(self, line: int, command: str) -> str:
        """The rest of the known input, for a command that reads it all."""
        source = self.stdin
        if source.text is None:
            self.fail(
                line,
                command,
                f"reads {source.origin}, which is only known when the script runs",
            )
        return source.text[source.position :]

    # ---------------------------------------------------------------- filters

    def run_program(self, words: list[str], line: int) -> int | None:
        """Text filters (``cat``, ``tee``, ``tr``, ...) of the known input; other programs as
        the layer below."""
        program = words[0].rsplit("/", 1)[-1]
        text_filter = FILTERS.get(program)
        if text_filter is not None and self.sh.path_changed is None:
            return self.filter_program(program, text_filter, words)
        return super().run_program(words, line)

    def filter_program(self, program: str, text_filter: Filter, words: list[str]) -> int:
        """A text filter of the known input (known arguments, no run-time value in either)."""
        source = self.stdin
        text = None if source.text is None else source.text[source.position :]
        if source.text is not None:
            source.position = len(source.text)
        output = None
        if text is not None and not any(self.lazy_ids(w) for w in [text, *words]):
            self.charge(len(text))
            output = text_filter(words[1:], text)
        if output is None:
            self.write_unknown(f"`{program}` of {source.origin}")
        else:
            self.write(output)
        return 0

    # ---------------------------------------------------------------- read

    def read_builtin(self, words: list[str], line: int) -> int:
        """``read [-rs] [-a NAME] [-d DELIM] [-n|-N COUNT] [-p PROMPT] [NAME...]``."""
        parsed = getopt(words[1:], "ersa:d:i:n:N:p:t:u:")
        if isinstance(parsed, str):
            return 2
        options, names = parsed
        given = dict(options)
        for letter in "tu":
            if letter in given:
                self.fail(line, f"read -{letter}", "reads with a timeout or another descriptor")
        for name in [given.get("a", ""), *names]:
            if name and not is_name(name):
                self.fail(line, "read", f"not a variable name: {self.shown(name)!r}")
        delimiter = "\n"
        if "d" in given:
            delimiter = given["d"][:1] or "\0"
        count: int | None = None
        exact = "N" in given
        for letter in "nN":
            if letter in given:
                count = legal_integer(given[letter])
                if count is None or count < 0:
                    return 2
        self.need(self.stdin.text or "", line, "is read by `read`")
        chars, status = self.read_chars(
            line, raw="r" in given, delimiter=delimiter, count=count, exact=exact
        )
        ifs = self.split_characters()
        if exact:
            # -N: the characters read, never split, all to the first name.
            ifs = ""
        if "a" in given:
            self.check_assignable(given["a"], line)
            fields = _split_chars(chars, ifs)
            self.store(given["a"], dict(enumerate(fields)), line)
            return status
        if not names:
            self.set_scalar("REPLY", "".join(c for c, _ in chars), line)
            return status
        rest = _skip_white(chars, 0, ifs)
        for name in names[:-1]:
            word, rest = _next_word(chars, rest, ifs)
            self.set_scalar(name, word, line)
        self.set_scalar(names[-1], _last_word(chars, rest, ifs), line)
        return status

    def read_chars(
        self, line: int, *, raw: bool, delimiter: str, count: int | None, exact: bool
    ) -> tuple[list[_Char], int]:
        """Characters up to the delimiter (consumed, not kept); status 1 at the end of input."""
        source = self.stdin
        if source.text is None:
            self.fail(
                line, "read", f"reads {source.origin}, which is only known when the script runs"
            )
        text = source.text
        chars: list[_Char] = []
        status = 0
        position = source.position
        while count is None or len(chars) < count:
            if position >= len(text):
                status = 1
                break
            c = text[position]
            position += 1
            if c == "\\" and not raw:
                if position >= len(text):
                    status = 1
                    break
                escaped = text[position]
                position += 1
                if escaped != "\n":  # a line continuation
                    chars.append((escaped, True))
                continue
            if c == delimiter and not exact:
                break
            chars.append((c, False))
        source.position = position
        return chars, status

    # ---------------------------------------------------------------- mapfile

    def mapfile_builtin(self, words: list[str], line: int) -> int:
        """``mapfile``/``readarray [-t] [-d DELIM] [-n COUNT] [-O ORIGIN] [-s COUNT] [NAME]``."""
        parsed = getopt(words[1:], "d:n:O:s:tu:C:c:")
        if isinstance(parsed, str):
            return 2
        options, names = parsed
        given = dict(options)
        for letter in "uCc":
            if letter in given:
                self.fail(line, f"{words[0]} -{letter}", "not supported")
        name = names[0] if names else "MAPFILE"
        if len(names) > 1 or not is_name(name):
            self.fail(line, words[0], f"not one array name: {self.shown(' '.join(names))!r}")
        numbers = {}
        for letter in "nOs":
            value = legal_integer(given.get(letter, "0"))
            if value is None or value < 0:
                return 1
            numbers[letter] = value
        delimiter = given["d"][:1] or "\0" if "d" in given else "\n"
        text = self.input_text(line, words[0])
        lines: list[str] = []
        start = 0
        while start < len(text):
            end = text.find(delimiter, start)
            end = len(text) if end < 0 else end + 1
            lines.append(text[start:end])
            start = end
        taken = lines[numbers["s"] :]
        if numbers["n"]:
            taken = taken[: numbers["n"]]
        consumed = sum(map(len, lines[: numbers["s"] + len(taken)]))
        self.stdin.position += consumed
        if "t" in given:
            taken = [item[:-1] if item.endswith(delimiter) else item for item in taken]
        self.check_assignable(name, line)
        current = self.sh.vars.get(name)
        base = dict(current) if "O" in given and isinstance(current, dict) else {}
        for offset, item in enumerate(taken):
            base[numbers["O"] + offset] = item
        self.store(name, base, line)
        return 0

    # ---------------------------------------------------------------- getopts

    def getopts_builtin(self, words: list[str], line: int) -> int:
        """``getopts OPTSTRING NAME [ARGS...]`` as bash's ``sh_getopt``: OPTIND is the next word,
        a word of bundled options is taken a letter at a time."""
        if len(words) < 3:
            return 2
        spec, name = words[1], words[2]
        if not is_name(name):
            self.fail(line, "getopts", f"not a variable name: {self.shown(name)!r}")
        args = words[3:] if len(words) > 3 else list(self.sh.positional)
        for word in [spec, *args]:
            self.need(word, line, "is read by `getopts`")
        silent = spec.startswith(":")
        letters = spec[1:] if silent else spec
        optind_text = self.lookup("OPTIND", None, line) or ""
        self.need(optind_text, line, "is OPTIND, which `getopts` reads,")
        optind = legal_integer(optind_text) or 0
        seen_at, nextchar = self.sh.getopts_char
        if optind != seen_at:
            # The script set OPTIND (OPTIND=1 starts again): bash's getopts_reset.
            nextchar = 0
            optind = max(optind, 1)
        if optind > len(args):
            return self.getopts_result(name, "?", None, len(args) + 1, 0, line, status=1)
        word = args[optind - 1]
        if nextchar == 0:
            if word == "--":
                return self.getopts_result(name, "?", None, optind + 1, 0, line, status=1)
            if not word.startswith("-") or word == "-":
                return self.getopts_result(name, "?", None, optind, 0, line, status=1)
            nextchar = 1
        letter = word[nextchar]
        nextchar += 1
        rest = word[nextchar:]
        if not rest:
            optind, nextchar = optind + 1, 0
        at = letters.find(letter)
        if letter == ":" or at < 0:
            if not silent:
                self.write_error(f"illegal option -- {letter}")
            return self.getopts_result(
                name, "?", letter if silent else None, optind, nextchar, line
            )
        if letters[at + 1 : at + 2] != ":":
            return self.getopts_result(name, letter, None, optind, nextchar, line)
        if rest:
            return self.getopts_result(name, letter, rest, optind + 1, 0, line)
        if optind > len(args):
            if not silent:
                self.write_error(f"option requires an argument -- {letter}")
            return self.getopts_result(
                name, ":" if silent else "?", letter if silent else None, optind, 0, line
            )
        return self.getopts_result(name, letter, args[optind - 1], optind + 1, 0, line)

    def getopts_result(
        self,
        name: str,
        letter: str,
        value: str | None,
        optind: int,
        nextchar: int,
        line: int,
        status: int = 0,
    ) -> int:
        """Bind what one call of getopts found: NAME, OPTARG (unset for None), OPTIND."""
        self.sh.getopts_char = (optind, nextchar)
        self.set_scalar("OPTIND", str(optind), line)
        self.set_scalar(name, letter, line)
        if value is None:
            self.sh.vars.pop("OPTARG", None)
        else:
            self.set_scalar("OPTARG", value, line)
        return status

    def write_error(self, text: str) -> None:
        """A builtin's message on standard error (only a capture of stderr sees it)."""
        if self.stderr_captured:
            self.write_unknown("a message of bash on standard error")

    def redirections(self, redirs: list[Node], launcher: bool) -> StandardInput | None:
        """Expand redirection targets (for their side effects and errors); open nothing.

        Returns the command's standard input when a redirection gives it one.
        """
        stdin: StandardInput | None = None
        for redir in redirs:
            line = line_of(redir)
            op = redir.get("Op")
            number = (redir.get("N") or {}).get("Value", "")
            if number.startswith("{"):
                self.fail(line, "redirection", f"{number} assigns a file descriptor to a variable")
            standard_input = number in ("", "0")
            if op in ("<<", "<<-", "<<<"):
                what = "here-string" if op == "<<<" else "here-document"
                if launcher:
                    self.fail(line, what, "feeds the launcher's standard input")
                if op == "<<<":
                    text = self.string(redir.get("Word"), tilde="start") + "\n"
                else:
                    text = self.heredoc_text(redir)
                if standard_input:
                    stdin = StandardInput(text, f"the {what} of line {line}", heredoc=True)
                continue
            use = "files it names: bash refuses more than one"
            if launcher and op in _OUTPUT_REDIRECTIONS and redir.get("Word"):
                # The launcher's log file only names where its output goes: a run-time value in
                # its name is taken as one word, as in an override's value (a file's name holds
                # no blank), and never decides anything the reader reports.
                targets, _ = self.fields_split([redir["Word"]])
            else:
                targets = self.fields([redir["Word"]], use=use) if redir.get("Word") else []
            if len(targets) != 1:
                self.fail(line, "redirection", "ambiguous redirect")
            if op in ("<", "<>") and standard_input:
                target = targets[0]
                if target in self.process_outputs:
                    stdin = StandardInput(
                        self.process_outputs[target], f"the <(...) of line {line}"
                    )
                else:
                    stdin = StandardInput(None, f"the file {self.shown(target)!r}")
            elif op == "<&" and standard_input:
                stdin = StandardInput(None, "another file descriptor")
        return stdin


def _heredoc_unescape(text: str) -> str:
    """Backslashes in an expanded here-document: only before ``$ ` \\`` and newline."""
    if "\\" not in text:
        return text
    out: list[str] = []
    index = 0
    while index < len(text):
        c = text[index]
        if c == "\\" and index + 1 < len(text) and text[index + 1] in "$`\\\n":
            if text[index + 1] != "\n":
                out.append(text[index + 1])
            index += 2
            continue
        out.append(c)
        index += 1
    return "".join(out)


def _white(ifs: str) -> str:
    return "".join(c for c in ifs if c in _WHITESPACE)


def _skip_white(chars: list[_Char], position: int, ifs: str) -> int:
    white = _white(ifs)
    while position < len(chars) and not chars[position][1] and chars[position][0] in white:
        position += 1
    return position


def _next_word(chars: list[_Char], position: int, ifs: str) -> tuple[str, int]:
    """bash's ``get_word_from_string``: a field, then its delimiter (IFS whitespace, at most one
    other IFS character, IFS whitespace)."""
    white = _white(ifs)
    position = _skip_white(chars, position, ifs)
    start = position
    while position < len(chars) and (chars[position][1] or chars[position][0] not in ifs):
        position += 1
    word = "".join(c for c, _ in chars[start:position])
    separated_by_white = position < len(chars) and chars[position][0] in white
    if position < len(chars):
        position += 1
    position = _skip_white(chars, position, ifs)
    if (
        separated_by_white
        and position < len(chars)
        and not chars[position][1]
        and chars[position][0] in ifs
        and chars[position][0] not in white
    ):
        position = _skip_white(chars, position + 1, ifs)
    return word, position


def _last_word(chars: list[_Char], position: int, ifs: str) -> str:
    """What the last name gets: the rest of the line, its trailing IFS whitespace removed; just
    the field when one field (and its delimiter) is all that is left."""
    if position >= len(chars):
        return ""
    word, after = _next_word(chars, position, ifs)
    if after >= len(chars):
        return word
    white = _white(ifs)
    end = len(chars)
    while end > position and not chars[end - 1][1] and chars[end - 1][0] in white:
        end -= 1
    return "".join(c for c, _ in chars[position:end])


def _split_chars(chars: list[_Char], ifs: str) -> list[str]:
    """``read -a``: the line split into fields as words are, escaped characters kept."""
    fields = Fields(split=True, ifs=ifs)
    for c, escaped in chars:
        (fields.text if escaped else fields.expanded)(c)
    return fields.finish()
