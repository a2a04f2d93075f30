"""A failure's keys narrowed to the argument a library's message names.

A library that verl calls with keyword arguments refuses one of them by name: torch's data loader
says ``batch_size should be a positive integer value, but got batch_size=0`` of
``StatefulDataLoader(dataset=…, batch_size=self.train_batch_size_per_dp, num_workers=…,
collate_fn=…)`` (verl/trainer/sft_trainer.py:244-253). The recorder names every key the statement
read (the batch size's, the workers', the pad mode's through the collator); the keys that decide
the failure are those read for the named argument: its value's line and the assignments it uses,
back through the function (``self.train_batch_size_per_dp = self.global_batch_size // dp_size``,
``self.global_batch_size = config.data.train_batch_size``).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from typing import Any

from pytest_verl_compat.upstream.probes import statements
from pytest_verl_compat.upstream.probes.recorder import ConfigReads
from pytest_verl_compat.upstream.probes.records import KEY_KEYS, KEY_MESSAGE, KEY_WHERE, verl_root

# How far back through assignments a named argument's value is followed.
_DEPTH = 4


def _chain(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _used(node: ast.AST) -> set[str]:
    """Names and attribute chains an expression loads (``self.a.b`` gives ``self.a.b``)."""
    found = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name | ast.Attribute) and isinstance(child.ctx, ast.Load):
            chain = _chain(child)
            if chain is not None and chain != "self":
                found.add(chain)
    return found


def _assigned(statement: ast.stmt) -> set[str]:
    targets = statement.targets if isinstance(statement, ast.Assign) else []
    if isinstance(statement, ast.AnnAssign | ast.AugAssign):
        targets = [statement.target]
    return {chain for target in targets if (chain := _chain(target)) is not None}


def _lines(source: statements.Source, line: int, value: ast.expr) -> list[tuple[int, int]]:
    """The value's lines, then those of the assignments (before ``line``, in its function) of
    what it uses, and of what those use, ``_DEPTH`` deep."""
    ranges = [(value.lineno, value.end_lineno or value.lineno)]
    function = source.function(value)
    if function is None:
        return ranges
    wanted, seen = _used(value), set[str]()
    for _ in range(_DEPTH):
        fresh = wanted - seen
        seen |= fresh
        wanted = set()
        for node in ast.walk(function):
            if isinstance(node, ast.stmt) and node.lineno < line and _assigned(node) & fresh:
                ranges.append((node.lineno, node.end_lineno or node.lineno))
                wanted |= _used(node)
    return ranges


def _named_argument(source: statements.Source, line: int, message: str) -> ast.expr | None:
    """The one keyword argument of the failing statement's calls whose name the message says."""
    statement = source.statement_at(line)
    if statement is None:
        return None
    named = [
        keyword.value
        for call in ast.walk(statement)
        if isinstance(call, ast.Call)
        for keyword in call.keywords
        if keyword.arg and re.search(rf"\b{re.escape(keyword.arg)}\b", message)
    ]
    return named[0] if len(named) == 1 else None


def narrowed(record: Mapping[str, Any], reads: ConfigReads) -> list[str]:
    """The record's keys read for the argument its message names, or its keys as they are."""
    keys = list(record[KEY_KEYS])
    relative, _, number = str(record[KEY_WHERE]).rpartition(":")
    if len(keys) < 2 or not number.isdigit():
        return keys
    source = statements.parse(str(verl_root().parent / relative), relative)
    value = (
        _named_argument(source, int(number), str(record[KEY_MESSAGE]))
        if source is not None
        else None
    )
    if source is None or value is None:
        return keys
    read = {
        key
        for lo, hi in _lines(source, int(number), value)
        for (where, line), found in reads.by_line_deep.items()
        if where == relative and lo <= line <= hi
        for key in found
    }
    narrow = sorted(set(keys) & reads.origins(read))
    return narrow or keys
