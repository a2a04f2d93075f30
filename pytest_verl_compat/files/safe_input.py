"""Untrusted files, bounded before they are parsed (issue 14, items 8-10).

Manifests, resolved files, profiles, tolerance files and config trees may come from a stranger's
pull request. Every one is read through ``read_text``: a regular file (not a FIFO that hangs a
read, not a symlink to ``/dev/zero``), at most ``MAX_INPUT_BYTES``, strict UTF-8. YAML is then
parsed by ``load_yaml``: a safe loader that refuses duplicate keys (a second ``cases:`` silently
replacing the first) and documents whose aliases expand to more than ``MAX_YAML_NODES`` nodes
(the "billion laughs": nine levels of nine aliases are 81 aliases but 10^9 nodes once anything
walks the result). Every refusal is an ``InputError`` whose message names the file and line.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

import yaml

MAX_INPUT_BYTES = 8 * 1024 * 1024  # the largest input we ship (a resolved file) is ~60 KB
MAX_YAML_NODES = 1_000_000  # a resolved verl config has ~900 leaves
MAX_YAML_DEPTH = 200

# A case id is a path under the golden folder: segments of safe characters, none starting with
# a dot (so no "..", no hidden files), no newline (``$`` alone would accept "id\n").
SAFE_CASE_ID = re.compile(r"[a-z0-9_]+(/[a-z0-9_-][a-z0-9_.-]*)*")


class InputError(ValueError):
    """An input refused before or while parsing; the message names the file (and line)."""


def read_bytes(path: str | Path, limit: int = MAX_INPUT_BYTES, what: str = "file") -> bytes:
    """A regular file's bytes, refusing devices, FIFOs, sockets, folders and oversized files."""
    path = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        reason = "not found" if isinstance(exc, FileNotFoundError) else exc.strerror
        raise InputError(f"{path}: cannot read the {what}: {reason}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{path}: the {what} is not a regular file")
        if info.st_size > limit:
            raise InputError(f"{path}: the {what} is {info.st_size} bytes; the limit is {limit}")
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:  # grew while we read it
        raise InputError(f"{path}: the {what} is larger than the limit of {limit} bytes")
    return data


def read_text(path: str | Path, limit: int = MAX_INPUT_BYTES, what: str = "file") -> str:
    """``read_bytes`` decoded as strict UTF-8; NUL bytes refused (no text format of ours has one)."""
    data = read_bytes(path, limit, what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(f"{path}:{line}: the {what} is not UTF-8 text") from exc
    if "\0" in text:
        line = text[: text.index("\0")].count("\n") + 1
        raise InputError(f"{path}:{line}: the {what} contains a NUL byte")
    return text


class _Bounds:
    """The refusals every bounded loader adds to PyYAML's safe constructor: duplicate keys and
    integers Python will not convert (more digits than ``sys.get_int_max_str_digits()``)."""

    def construct_yaml_int(self, node: yaml.ScalarNode) -> Any:
        digits = sum(ch.isdigit() for ch in str(node.value))
        limit = sys.get_int_max_str_digits()
        if limit and digits > limit:
            raise yaml.YAMLError(
                f"line {node.start_mark.line + 1}: an integer of {digits} digits; "
                f"the limit is {limit}"
            )
        return super().construct_yaml_int(node)  # type: ignore[misc]

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Any:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)  # type: ignore[attr-defined]
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:
                continue  # an unhashable key: the base constructor reports it
            if first is not None:
                raise yaml.YAMLError(f"line {line}: duplicate key {key!r} (first at line {first})")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc]


class BoundedLoader(_Bounds, yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no types
    """PyYAML's pure-Python safe loader with the bounds, refusing nesting deeper than
    MAX_YAML_DEPTH as it composes (its subclasses see each node: the manifest's line numbers)."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.YAMLError(f"line {mark.line + 1}: nested deeper than {MAX_YAML_DEPTH}")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)

# libyaml's parser and composer (C) under the same safe constructor and bounds: the same data,
# ~5x faster on a config tree's ~100 files, which every run parses. libyaml refuses nesting past
# 1000 levels itself; MAX_YAML_DEPTH is checked on the result (``_shape``).
_C_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", None)
if _C_SAFE_LOADER is not None:

    class BoundedCLoader(_Bounds, _C_SAFE_LOADER):  # type: ignore[misc]
        """``BoundedLoader`` over libyaml."""

    BoundedCLoader.add_constructor("tag:yaml.org,2002:int", BoundedCLoader.construct_yaml_int)
    _FAST_LOADER: Any = BoundedCLoader
else:  # PyYAML built without libyaml
    _FAST_LOADER = BoundedLoader


def _shape(value: Any, limit: int = MAX_YAML_NODES) -> tuple[int, int]:
    """(how many nodes walking ``value`` visits, counting shared (aliased) parts each time, and
    how deep it nests); stops counting past ``limit``. Memoised by identity, so a bomb is
    measured, not walked."""
    memo: dict[int, tuple[int, int]] = {}

    def size(node: Any) -> tuple[int, int]:
        if not isinstance(node, dict | list):
            return 1, 0
        known = memo.get(id(node))
        if known is not None:
            return known
        memo[id(node)] = (limit + 1, 0)  # a cycle (a recursive alias) counts as too large
        items = node.values() if isinstance(node, dict) else node
        total, depth = 1, 1
        for item in items:
            count, below = size(item)
            total += count
            depth = max(depth, below + 1)
            if total > limit:
                break
        memo[id(node)] = (min(total, limit + 1), depth)
        return memo[id(node)]

    return size(value)


def expanded_nodes(value: Any, limit: int = MAX_YAML_NODES) -> int:
    """How many nodes walking ``value`` visits, counting shared (aliased) parts each time."""
    return _shape(value, limit)[0]


def load_yaml(text: str, label: str, loader: type[Any] | None = None) -> Any:
    """Parse untrusted YAML text (``label`` names its file in errors); ``loader``: a
    ``BoundedLoader`` subclass (default: the fastest bounded loader)."""
    try:
        data = yaml.load(text, Loader=loader or _FAST_LOADER)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise InputError(f"{label}: not valid YAML: {_one_line(exc)}") from exc
    except RecursionError as exc:
        raise InputError(f"{label}: not valid YAML: nested too deeply") from exc
    except (
        ValueError,
        OverflowError,
    ) as exc:  # a scalar its constructor refuses (a date 2020-13-45)
        raise InputError(f"{label}: not valid YAML: {' '.join(str(exc).split())}") from exc
    try:
        nodes, depth = _shape(data)
    except RecursionError as exc:  # libyaml allows 1000 levels, deeper than Python's stack
        raise InputError(f"{label}: not valid YAML: nested too deeply") from exc
    if nodes > MAX_YAML_NODES:
        raise InputError(
            f"{label}: its aliases expand to more than {MAX_YAML_NODES} nodes (refused)"
        )
    if depth > MAX_YAML_DEPTH:
        raise InputError(f"{label}: not valid YAML: nested deeper than {MAX_YAML_DEPTH}")
    return data


def load_yaml_file(path: str | Path, what: str = "file") -> Any:
    return load_yaml(read_text(path, what=what), str(path))


def load_json_file(path: str | Path, limit: int = MAX_INPUT_BYTES, what: str = "file") -> Any:
    """An untrusted JSON file, read bounded; any refusal (syntax, nesting, an integer of more
    digits than Python converts) is an ``InputError`` naming the file."""
    text = read_text(path, limit=limit, what=what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: the {what} is not valid JSON: {exc.msg}") from exc
    except RecursionError as exc:
        raise InputError(f"{path}: the {what} is nested too deeply") from exc
    except ValueError as exc:  # an integer past sys.get_int_max_str_digits()
        raise InputError(
            f"{path}: the {what} is not usable JSON: {str(exc).split(';')[0]}"
        ) from exc


def _one_line(exc: yaml.YAMLError) -> str:
    return " ".join(str(exc).split())


def confined(root: Path, relative: str) -> Path:
    """``root / relative``, refusing any result that resolves outside ``root``."""
    candidate = (root / relative).resolve()
    if not candidate.is_relative_to(root.resolve()):
        raise InputError(f"{relative}: resolves outside {root}")
    return candidate
