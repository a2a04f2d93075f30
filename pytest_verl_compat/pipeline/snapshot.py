"""Golden files: byte-deterministic JSON, atomic writes, and diffs by dotted path."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from pytest_verl_compat.files.safe_input import InputError, load_json_file

# A diff longer than this stalls CI logs and helps nobody; the file diff has the rest.
MAX_DIFF_LINES = 40


def dumps(data: Any) -> str:
    """Byte-deterministic JSON: sorted keys, fixed indentation, trailing newline."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


class OutputRefused(OSError):
    """An output path that must not be written (not a regular file)."""


def _default_mode() -> int:
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomic(path: Path, text: str) -> None:
    """Write text through a temporary file in the same folder, then rename: never half a file.

    Only a regular file is replaced, keeping its mode; a new file gets the mode ``open`` would
    give it. A device, a FIFO, a folder or a symlink at ``path`` is refused: renaming over
    ``/dev/null`` (as root) or a link to ``/proc/self/fd/1`` would replace it with a file.
    """
    write_atomic_bytes(path, text.encode("utf-8"))


def write_atomic_bytes(path: Path, data: bytes) -> None:
    """``write_atomic`` for bytes (a compressed golden file)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    if info is not None and not stat.S_ISREG(info.st_mode):
        kind = "a symlink" if stat.S_ISLNK(info.st_mode) else "not a regular file"
        raise OutputRefused(f"{path}: {kind}; refusing to replace it")
    mode = stat.S_IMODE(info.st_mode) if info is not None else _default_mode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _dotted(path: list[Any]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def leaf_diff(old: Any, new: Any, limit: int = MAX_DIFF_LINES) -> list[str]:
    """Changed leaves as ``+ path: new``, ``- path: old``, ``~ path: old -> new``, capped."""
    # deepdiff imports pandas when it is installed (half a second); only a mismatch needs it.
    from deepdiff import DeepDiff

    diff = DeepDiff(old, new, view="tree", ignore_order=False, verbose_level=2)
    lines: list[str] = []
    for kind in sorted(diff.keys()):
        for level in diff[kind]:
            path = _dotted(level.path(output_format="list"))
            if kind.endswith("_added"):
                lines.append(f"+ {path}: {_short(level.t2)}")
            elif kind.endswith("_removed"):
                lines.append(f"- {path}: {_short(level.t1)}")
            else:
                lines.append(f"~ {path}: {_short(level.t1)} -> {_short(level.t2)}")
    lines.sort(key=lambda line: (line[2:].split(":", 1)[0], line[0]))
    if len(lines) > limit:
        lines = [*lines[:limit], f"... and {len(lines) - limit} more changed leaves"]
    return lines


def read_golden(golden_dir: Path, stage: str, case_id: str) -> dict[str, Any] | None:
    path = golden_dir / stage / f"{case_id}.json"
    if not path.is_file():
        return None
    # A golden folder may come with a stranger's pull request: read bounded (InputError).
    golden = load_json_file(path, what="golden file")
    if not isinstance(golden, dict):
        raise InputError(f"{path}: the golden file is not a JSON object")
    return golden


def first_difference(ours: Any, theirs: Any, path: str = "") -> str | None:
    """The first place two mappings differ in value, type or key order, as a readable line."""
    if type(ours) is not type(theirs):
        return f"{path or '<root>'}: type {type(ours).__name__} != {type(theirs).__name__} ({ours!r} vs {theirs!r})"
    if isinstance(ours, dict):
        if list(ours) != list(theirs):
            if set(ours) != set(theirs):
                extra = sorted(set(ours) - set(theirs))
                lacking = sorted(set(theirs) - set(ours))
                return f"{path or '<root>'}: keys only here {extra}, only upstream {lacking}"
            return f"{path or '<root>'}: key order {list(ours)} != {list(theirs)}"
        for key in ours:
            found = first_difference(ours[key], theirs[key], f"{path}.{key}" if path else key)
            if found:
                return found
        return None
    if isinstance(ours, list):
        if len(ours) != len(theirs):
            return f"{path}: list length {len(ours)} != {len(theirs)}"
        for index, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            found = first_difference(a, b, f"{path}[{index}]")
            if found:
                return found
        return None
    if ours != theirs:
        return f"{path}: {ours!r} != {theirs!r}"
    return None
