"""Which files ``source`` may read: the read's :class:`SourceScope`.

A shared word of the reader: the interpreter is given one, the ``source`` builtin checks every
file against it, and the pipeline builds one per manifest case (its pinned inputs).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SourceScope:
    """Which files ``source`` may read: those under ``root``; with ``pins``, only those pinned
    (path relative to ``root`` -> sha256)."""

    root: str
    pins: Mapping[str, str] | None = field(default=None)

    @classmethod
    def around(cls, script: str | os.PathLike[str]) -> SourceScope:
        """The default: the folder tree of the script."""
        return cls(os.path.dirname(os.path.abspath(os.fspath(script))))
