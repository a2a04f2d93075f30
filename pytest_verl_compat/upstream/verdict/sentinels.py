"""Types from the reading code: a string the code that reads a key replaces before using it.

The static type check (``checks/types.py``) takes a key's type from the tree's default, but the
code that reads the key may accept more. verl's SFT trainer reads ``trainer.save_freq`` into
``self.save_freq`` and replaces the string ``"after_each_epoch"`` by the steps of an epoch
before any arithmetic (verl/trainer/sft_trainer.py:190-196), although the tree's default is an
int. ``accepted`` finds that shape at the lines the probes saw read the key on this very
configuration: the read assigns a name, and an ``if`` of the same function compares that name to
the script's string (``==``, or ``in`` a literal collection) and assigns the name again in its
body. Any other string (``trainer.save_freq=sometimes``) stays a wrong type.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from pytest_verl_compat.upstream.census import static_reads
from pytest_verl_compat.upstream.probes import statements


def _dotted(node: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _strings(node: ast.expr) -> set[str]:
    """The string constants of ``"a"`` or a literal tuple, list or set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {
            e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
        }
    return set()


def _compared_strings(test: ast.expr, name: str) -> set[str]:
    """The strings ``test`` (an ``if``'s) matches ``name`` against with ``==`` or ``in``."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return set()
    if _dotted(test.left) != name or not isinstance(test.ops[0], ast.Eq | ast.In):
        return set()
    return _strings(test.comparators[0])


def _assigns(body: Sequence[ast.stmt], name: str) -> bool:
    return any(
        isinstance(node, ast.Assign) and any(_dotted(t) == name for t in node.targets)
        for statement in body
        for node in ast.walk(statement)
    )


def replaced_strings(source: statements.Source, line: int) -> set[str]:
    """The strings the function holding the read at ``line`` replaces in the name it assigns."""
    read = source.statement_at(line)
    if not (isinstance(read, ast.Assign) and len(read.targets) == 1):
        return set()
    name = _dotted(read.targets[0])
    function = source.function(read)
    if name is None or function is None:
        return set()
    found: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.If) and node.lineno > read.lineno and _assigns(node.body, name):
            found |= _compared_strings(node.test, name)
    return found


def accepted(
    key: str, value: object, read_at: Mapping[str, Iterable[str]], root: Path
) -> str | None:
    """The upstream line (``verl/…py:line``) whose code replaces the string ``value`` of ``key``
    before using it, at a line the probes read ``key`` at here; None when there is none."""
    if not isinstance(value, str):
        return None
    for where in read_at.get(key, ()):
        relative, _, line = str(where).rpartition(":")
        if not line.isdigit():
            continue
        source = statements.parse(str(root / relative), relative)
        if source is not None and value in replaced_strings(source, int(line)):
            return str(where)
    return None


def _config_key(node: ast.AST) -> str | None:
    """The dotted key a read of ``….config.a.b`` names (after its last ``config``), or None."""
    chain = static_reads.key_chain(node)
    if not chain or "config" not in chain[:-1]:
        return None
    last = len(chain) - 1 - chain[::-1].index("config")
    return ".".join(chain[last + 1 :]) or None


def module_sentinels(source: statements.Source) -> dict[str, dict[str, str]]:
    """For each configuration key the module reads, the strings its code replaces before any
    use, with the read's ``file:line``; only keys every read of which (in this module) assigns a
    name that an ``if`` then replaces: one read that uses the value as it is (``config.trainer.
    save_freq > 0``) and the string reaches arithmetic, so the key is left out."""
    reads: dict[str, list[ast.expr]] = {}
    for node in source.nodes:
        if not isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
            continue
        parent = source.parents.get(id(node))
        # Only a whole read: ``config.trainer`` inside ``config.trainer.save_freq`` is not one.
        if isinstance(parent, ast.Attribute | ast.Subscript) and parent.value is node:
            continue
        if isinstance(parent, ast.Call) and parent.func is node:
            continue
        key = _config_key(node)
        if key is not None:
            reads.setdefault(key, []).append(node)
    found: dict[str, dict[str, str]] = {}
    for key, nodes in sorted(reads.items()):
        common: set[str] | None = None
        for node in nodes:
            strings = replaced_strings(source, node.lineno)
            parent = source.parents.get(id(node))
            if not (isinstance(parent, ast.Assign) and parent.value is node) or not strings:
                common = set()
                break
            common = strings if common is None else common & strings
        if common:
            where = f"{source.relative}:{min(n.lineno for n in nodes)}"
            found[key] = {string: where for string in sorted(common)}
    return found
