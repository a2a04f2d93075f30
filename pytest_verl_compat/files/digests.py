"""Digests of files read bounded: a pinned input's sha256, a config tree's hash, a scan's key."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from pytest_verl_compat.files.safe_input import InputError, read_bytes


def sha256_file(path: Path, what: str = "pinned input") -> str:
    """sha256 of a bounded regular file (a pinned input may be a link to /dev/zero or a FIFO)."""
    return hashlib.sha256(read_bytes(path, what=what)).hexdigest()


def files_sha256(files: Iterable[tuple[str, Path]], what: str) -> list[list[str]]:
    """[name, sha256] of each file, in order: a key for what is read from them. A file the bounded
    reader refuses is "unreadable" (the scans that read such files skip it too)."""
    digests = []
    for name, path in files:
        try:
            digests.append([name, sha256_file(path, what)])
        except InputError:
            digests.append([name, "unreadable"])
    return digests


def tree_sha256(config_dir: Path) -> str:
    """Hash of the YAML files of a config tree: their relative paths and contents, sorted."""
    digest = hashlib.sha256()
    for file in sorted(
        config_dir.rglob("*.yaml"), key=lambda p: p.relative_to(config_dir).as_posix()
    ):
        digest.update(
            f"{file.relative_to(config_dir).as_posix()}\0{sha256_file(file, 'config file')}\n".encode()
        )
    return digest.hexdigest()
