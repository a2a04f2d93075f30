"""Where a finding's key was set: the script text, a ``--set`` argument, or the tree's YAML line.

A finding names dotted config keys (its ``path``); the first one is located, in this order:

1. a ``--set KEY=VALUE`` argument that sets it (or a parent of it): Hydra applies the overrides in
   order and ``--set`` comes last, so that is where the value came from. Its location is
   ``<command line>:1:N``, N the argument's position after ``verl-compat``;
2. the launch script's text that overrides it: ``KEY=``, ``+KEY=``, ``++KEY=`` or ``~KEY`` as a
   word (not in a comment), at the key's line and column. Of several, the one whose text is the
   override Hydra received wins, then one on or after the launcher line, then the first;
3. the launcher line, when the key is set (the explicit fields name it) but not by text the
   search finds (built from variables: ``${ROLE}.n=1``);
0. in a run's resolved file (``defined_here``), which writes every key, the key's own line there;
4. for a key left at its default, the config tree's YAML file and line that defines it: Hydra's
   own defaults list for these fields (``Composer.config_files``) says which files are merged in
   which order and under which package, and the last file that defines the key wins;
5. the launcher line (or the manifest entry of a case with no script text).

Only text is searched: nothing here reads the script as bash (the launch reader does that).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pytest_verl_compat.files.safe_input import InputError, read_text
from pytest_verl_compat.model import ExplicitFields, Finding, Location

COMMAND_LINE = "<command line>"
_INDEX = re.compile(r"\[\d+\]")
_QUOTED_KEY = re.compile(r"'([A-Za-z_][\w-]*(?:\.[\w-]+)+)'")
_REFUSED_KEY = re.compile(r"([A-Za-z_][\w-]*(?:\.[\w-]+|\[\d+\])+)=")


def override_key(field_text: str) -> str:
    """The dotted key an override sets (``+a.b=1`` → ``a.b``, ``~a.b`` → ``a.b``)."""
    key = field_text.split("=", 1)[0]
    return key.lstrip("+~").split("@", 1)[0]


def _covers(set_key: str, key: str) -> bool:
    return key == set_key or key.startswith(set_key + ".")


def display_path(path: Path, cwd: Path | None = None) -> str:
    """A path as output shows it: relative to the working folder when under it."""
    cwd = cwd or Path.cwd()
    try:
        return (
            Path(os.path.relpath(path, cwd)).as_posix() if path.is_relative_to(cwd) else str(path)
        )
    except ValueError:
        return str(path)


# --- the config tree ---------------------------------------------------------------------------


def _yaml_keys(node: Any, prefix: str) -> Iterator[tuple[str, int, int]]:
    if not isinstance(node, yaml.MappingNode):
        return
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            continue
        path = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
        yield path, key_node.start_mark.line + 1, key_node.start_mark.column + 1
        yield from _yaml_keys(value_node, path)


@dataclass
class TreeIndex:
    """Every key's defining YAML line, for one list of merged config files (asked for only when
    a finding needs a default's line: Hydra's defaults list costs ~0.5 s the first time)."""

    files: Callable[[], Sequence[tuple[Path, str]]]
    _keys: dict[str, tuple[Path, int, int]] | None = None

    def _build(self) -> dict[str, tuple[Path, int, int]]:
        keys: dict[str, tuple[Path, int, int]] = {}
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        try:
            files = self.files()
        except (HydraException, OmegaConfBaseException, InputError):
            return keys  # no defaults list for these fields: defaults fall back to the launcher
        for file, package in files:
            try:
                # The tree's files were bounded and checked before Hydra read them (tree_digest);
                # compose() builds nodes with line marks and constructs nothing.
                node = yaml.compose(read_text(file, what="config file"), Loader=yaml.SafeLoader)
            except (InputError, yaml.YAMLError):
                continue
            for key, line, column in _yaml_keys(node, ""):
                if key == "defaults" or key.startswith("defaults."):
                    continue
                full = f"{package}.{key}" if package else key
                keys[full] = (file, line, column)
        return keys

    def where(self, key: str) -> tuple[Path, int, int] | None:
        if self._keys is None:
            self._keys = self._build()
        parts = key.split(".")
        for end in range(len(parts), 0, -1):
            found = self._keys.get(".".join(parts[:end]))
            if found is not None:
                return found
        return None


# --- the script text ---------------------------------------------------------------------------


def _comment_start(line: str) -> int:
    """Where an unquoted ``#`` comment starts on a line (len(line) if none); quotes are tracked
    within the line only, which is what override words need."""
    quote = ""
    for index, char in enumerate(line):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1] in " \t;(|&"):
            return index
    return len(line)


@dataclass(frozen=True)
class _Occurrence:
    line: int
    column: int
    text: str  # the override word from the key on (up to whitespace or a closing quote)


def _occurrences(lines: Sequence[str], key: str) -> list[_Occurrence]:
    pattern = re.compile(
        r"(?:(?<=^)|(?<=[\s'\"(]))(?:\+\+|\+|~)?(" + re.escape(key) + r")(?:(=)|(?=[\s'\")]|$))"
    )
    found = []
    for number, line in enumerate(lines, start=1):
        if key not in line:
            continue
        end = _comment_start(line)
        for match in pattern.finditer(line, 0, end):
            prefix = line[match.start() : match.start(1)]
            if not match.group(2) and prefix != "~":
                continue  # a bare word that is not a deletion: not an override
            word = re.match(r"[^\s'\")]*", line[match.start() :])
            found.append(_Occurrence(number, match.start(1) + 1, word.group(0) if word else ""))
    return found


def _best(
    occurrences: list[_Occurrence], received: set[str], launch_line: int | None
) -> _Occurrence:
    exact = [o for o in occurrences if o.text in received]
    if exact:
        return exact[-1]
    if launch_line is not None:
        after = [o for o in occurrences if o.line >= launch_line]
        if after:
            return after[-1]
    return occurrences[0]


# --- the locator -------------------------------------------------------------------------------


@dataclass
class Locator:
    """Locates the findings of one checked script (or case)."""

    label: str  # the script as output names it (or the case id)
    text: str | None  # the script's source
    fields: ExplicitFields  # everything Hydra received, the --set overrides included
    set_args: Sequence[tuple[str, int]] = ()  # (override, its position after `verl-compat`)
    tree: TreeIndex | None = None
    fallback: Location | None = None  # a case with no script text: its manifest entry
    # Every key is written in ``tree``'s one file, the input itself (a run's resolved file): a key
    # is located at its own line there, the run's settings included.
    defined_here: bool = False
    _lines: list[str] | None = field(default=None, repr=False)

    @property
    def lines(self) -> list[str]:
        if self._lines is None:
            self._lines = (self.text or "").splitlines()
        return self._lines

    def launcher(self) -> Location | None:
        if self.text is not None and self.fields.launch_line:
            return Location(self.label, self.fields.launch_line, 0, "launcher")
        return self.fallback

    def key_of(self, finding: Finding) -> str | None:
        """The config key a finding is about: its first key, or for a composition rejection the
        key Hydra's message quotes that the fields set."""
        if finding.path.startswith("<"):
            head = _REFUSED_KEY.match(finding.message)
            if self.defined_here and head is not None:
                return _INDEX.sub("", head.group(1))  # a refused value: ``KEY='value': ...``
            explicit = {override_key(f) for f in self.fields.fields}
            for candidate in _QUOTED_KEY.findall(finding.message):
                candidate = str(candidate)
                if any(_covers(k, candidate) or _covers(candidate, k) for k in explicit):
                    return candidate
            return None
        keys = finding.keys
        return _INDEX.sub("", keys[0]) if keys else None

    def locate(self, finding: Finding) -> Location | None:
        key = self.key_of(finding)
        if key is None:
            return self.launcher()
        if self.defined_here and self.tree is not None:
            where = self.tree.where(key)
            if where is not None:
                file, line, column = where
                return Location(display_path(file), line, column, "resolved")
        for override, position in reversed(self.set_args):
            if _covers(override_key(override), key):
                return Location(COMMAND_LINE, 1, position, "set")
        explicit = [f for f in self.fields.fields if _covers(override_key(f), key)]
        if self.text is not None:
            for candidate in (key, *[override_key(f) for f in reversed(explicit)]):
                found = _occurrences(self.lines, candidate)
                if found:
                    best = _best(found, set(self.fields.fields), self.fields.launch_line)
                    return Location(self.label, best.line, best.column, "script")
        if explicit:
            return self.launcher()
        if self.tree is not None:
            where = self.tree.where(key)
            if where is not None:
                file, line, column = where
                return Location(display_path(file), line, column, "tree")
        return self.launcher()

    def located(self, findings: Sequence[Finding]) -> list[Finding]:
        return [dataclasses.replace(f, location=self.locate(f)) for f in findings]


def set_positions(argv: Sequence[str], overrides: Sequence[str]) -> list[tuple[str, int]]:
    """Each ``--set`` override with its 1-based position among ``argv`` (the words after the
    command's name), in order; an override not found in ``argv`` gets position 0."""
    positions: list[tuple[str, int]] = []
    used: set[int] = set()
    for override in overrides:
        position = 0
        for index, word in enumerate(argv):
            if index in used:
                continue
            if word == f"--set={override}" or (
                word == override and index > 0 and argv[index - 1] == "--set"
            ):
                position = index + 1
                used.add(index)
                break
        positions.append((override, position))
    return positions
