"""What changed upstream: the corpus on another release's tree, a release matrix, migration.

The modules, each importing only those before it: ``report`` (``drift``: the corpus composed and
compiled on another tree), ``retarget`` (a profile for another tree), ``cells`` (the matrix's
cached composition cells), ``matrix`` (scripts on every release; each supported release's cell
is ``check``'s verdict, ``upstream/verdict/case.py``), ``evidence`` (where a key went, and
upstream's word for it), ``migrate`` (edits at the script's source, verified) and
``migrate_corpus`` (``migrate`` measured over a folder of scripts). The releases themselves (their
files, environments and facts) are the ``releases`` layer's. Others use what this face names.
"""

from __future__ import annotations

from pytest_verl_compat.releases.index import ReleaseError, load_release_index
from pytest_verl_compat.releases.wheels import release_tree
from pytest_verl_compat.upstream.drift.cells import CellCache
from pytest_verl_compat.upstream.drift.matrix import (
    MatrixError,
    matrix_failed,
    matrix_report,
    render_markdown,
    render_text,
)
from pytest_verl_compat.upstream.drift.migrate import MigrateError, migrate_script, render_lines

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
