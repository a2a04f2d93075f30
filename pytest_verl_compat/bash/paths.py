"""Path text as coreutils and bash compute it: ``dirname``, ``basename``, ``cd``'s logical path.

Pure functions of known strings (the interpreter decides what is known); the one exception is
:func:`physical`, which asks this machine for the symbolic links on a path, as ``realpath``,
``readlink -f`` and ``pwd -P`` do on the machine that runs the script.
"""

from __future__ import annotations

import os


def dirname(path: str) -> str:
    """``dirname PATH`` (coreutils; gnulib ``dir_len`` where ``//`` is not a root of its own)."""
    stripped = path.rstrip("/")
    if not stripped:
        return "/" if path else "."
    slash = stripped.rfind("/")
    if slash < 0:
        return "."
    return stripped[:slash].rstrip("/") or "/"


def basename(path: str, suffix: str = "") -> str:
    """``basename PATH [SUFFIX]``: the last component; a suffix is removed unless it is all."""
    stripped = path.rstrip("/")
    if not stripped:
        return "/" if path else ""
    base = stripped[stripped.rfind("/") + 1 :]
    if suffix and base != suffix and base.endswith(suffix):
        base = base[: -len(suffix)]
    return base


def joined(cwd: str, path: str) -> str:
    """``path`` taken relative to ``cwd`` (an absolute ``path`` stands alone)."""
    return path if path.startswith("/") else f"{cwd.rstrip('/')}/{path}"


def logical(path: str) -> str:
    """bash's canonical logical path (``cd`` and ``pwd`` without ``-P``).

    ``.`` components and repeated slashes go, ``..`` removes the component before it as text,
    whatever links the path holds; a leading ``//`` is kept as POSIX allows (bash keeps it).
    """
    double = path.startswith("//") and not path.startswith("///")
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    return ("//" if double else "/") + "/".join(parts)


def physical(path: str) -> str:
    """An absolute path with its symbolic links resolved as this machine has them.

    Components that do not exist here are kept as text (``realpath -m``); the script's own
    folder, which the caller knows, is resolved exactly.
    """
    return os.path.realpath(path)
