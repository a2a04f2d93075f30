"""verl's releases side by side: their config trees, the release matrix, evidence-backed migration.

The modules, each importing only those before it: ``trees`` (the pinned releases of
``data/releases.yaml``, fetched with pip into the user cache), ``cells`` (the matrix's cached
composition cells), ``matrix`` (scripts on every release; the pinned one's cell is ``check``'s
verdict, ``upstream/verdict.py``), ``evidence`` (where a key went, and upstream's word for it),
``migrate`` (edits at the script's source, verified) and ``corpus`` (``migrate`` measured over a
folder of scripts). Others use what this face names.
"""

from __future__ import annotations

from pytest_verl_compat.releases.index import ReleaseError, load_release_index
from pytest_verl_compat.releases.wheels import release_tree
from pytest_verl_compat.upstream.releases.cells import CellCache
from pytest_verl_compat.upstream.releases.matrix import (
    MatrixError,
    matrix_failed,
    matrix_report,
    render_markdown,
    render_text,
)
from pytest_verl_compat.upstream.releases.migrate import MigrateError, migrate_script, render_lines

__all__ = [
    "CellCache",
    "MatrixError",
    "MigrateError",
    "ReleaseError",
    "load_release_index",
    "matrix_failed",
    "matrix_report",
    "migrate_script",
    "release_tree",
    "render_lines",
    "render_markdown",
    "render_text",
]
