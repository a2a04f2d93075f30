"""The release matrix's composition cells, kept between runs in the user cache.

A cell of another release is a pure function of that release's config tree, the fields, the
bound variables and this package's code (the composer, Hydra's and OmegaConf's versions). Its
key hashes all of them, so any change to any of them is a miss, never a stale answer. An entry
is a small JSON file written through a temporary file and a rename; one that is not a regular
file, is too large or has another shape is a miss.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from pytest_verl_compat.files.cache import user_cache_root
from pytest_verl_compat.files.safe_input import InputError, read_bytes
from pytest_verl_compat.pipeline.snapshot import write_atomic

CACHE_KIND = "release-cells"
# Bumped when a cell's shape changes.
CELL_FORMAT = 1
MAX_CELL_BYTES = 1 << 20
_PACKAGE = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/pytest-verl-compat/release-cells`` (else under ``~/.cache``)."""
    return user_cache_root() / CACHE_KIND


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """sha256 of this package's code and data, and of Hydra's and OmegaConf's versions."""
    digest = hashlib.sha256()
    for file in sorted(_PACKAGE.rglob("*")):
        if file.suffix in {".py", ".yaml", ".json"} and "__pycache__" not in file.parts:
            digest.update(file.relative_to(_PACKAGE).as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(file.read_bytes()).digest())
    for distribution in ("hydra-core", "omegaconf"):
        try:
            digest.update(f"{distribution}=={metadata.version(distribution)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(distribution.encode())
    return digest.hexdigest()


def cell_key(
    tree_sha256: str, config_name: str, fields: Sequence[str], variables: Mapping[str, str]
) -> str:
    payload = json.dumps(
        [
            CELL_FORMAT,
            code_digest(),
            tree_sha256,
            config_name,
            list(fields),
            sorted(variables.items()),
        ]
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def _valid(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("composed"), bool)
        and isinstance(entry.get("reason"), str)
        and isinstance(entry.get("values"), dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in entry["values"].items())
    )


class CellCache:
    """One JSON file per cell; a missing, unreadable or malformed entry is a miss."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder if folder is not None else cache_dir()

    def get(self, key: str) -> dict[str, Any] | None:
        path = self.folder / f"{key}.json"
        if path.is_symlink():
            return None
        try:
            entry = json.loads(read_bytes(path, MAX_CELL_BYTES, "cache entry"))
        except (InputError, ValueError):
            return None
        return entry if _valid(entry) else None

    def put(self, key: str, entry: Mapping[str, Any]) -> None:
        """Store a cell; a cache that cannot be written is only slower, never an error."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_atomic(self.folder / f"{key}.json", json.dumps(entry, sort_keys=True))
        except OSError:
            return
