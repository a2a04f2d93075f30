"""Where the upstream verl inputs come from: a checkout given by the user, or the installed wheel."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from pytest_verl_compat.model import InputPin, UpstreamPin
from pytest_verl_compat.pipeline.safe_input import InputError, read_bytes


class PinMismatch(Exception):
    """An input file's sha256 differs from the one pinned in the manifest."""


class UpstreamError(Exception):
    """An upstream location was given but is not usable."""


@dataclass(frozen=True)
class UpstreamTree:
    """A located upstream: its root folder, its Hydra config tree and that tree's hash."""

    root: Path
    config_dir: Path
    source: str  # how it was found: "option", "VERL_UPSTREAM", "ini", "distribution"
    kind: str  # "checkout" (has the example scripts) or "distribution" (config tree only)
    tree_sha256: str
    version: str | None

    @property
    def has_scripts(self) -> bool:
        return self.kind == "checkout"

    def describe(self) -> str:
        version = f"verl {self.version}" if self.version else "unknown verl version"
        if self.source == "distribution":
            return (
                f"installed {version} distribution at {self.root}; tree sha256 {self.tree_sha256}"
            )
        return f"{self.kind} {self.root} (from {self.source}); {version}; tree sha256 {self.tree_sha256}"


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


def installed_verl_root() -> tuple[Path, str] | None:
    """The site-packages folder holding an installed verl, and its version, without importing it."""
    try:
        dist = metadata.distribution("verl")
    except metadata.PackageNotFoundError:
        return None
    root = Path(str(dist.locate_file("")))
    return root, dist.version


def checkout_tree(root: Path, pin: UpstreamPin, source: str) -> UpstreamTree:
    """An upstream folder laid out like a checkout (examples/ and the config tree)."""
    root = root.expanduser().resolve()
    config_dir = root / pin.config_dir
    if not (config_dir / f"{pin.config_name}.yaml").is_file():
        raise UpstreamError(
            f"{root} ({source}) is not an upstream checkout: expected "
            f"{pin.config_dir}/{pin.config_name}.yaml inside it"
        )
    try:
        digest = tree_sha256(config_dir)
    except InputError as exc:
        raise UpstreamError(f"{root} ({source}): {exc}") from exc
    version = pin.version if digest == pin.tree_sha256 else None
    kind = "checkout" if (root / "examples").is_dir() else "distribution"
    return UpstreamTree(root, config_dir, source, kind, digest, version)


def distribution_tree(pin: UpstreamPin) -> tuple[UpstreamTree | None, str]:
    """The config tree of the installed verl, if any; the second value says why not."""
    found = installed_verl_root()
    if found is None:
        return None, "verl is not installed (pip install 'pytest-verl-compat[upstream]')"
    root, version = found
    config_dir = root / pin.config_dir
    if not (config_dir / f"{pin.config_name}.yaml").is_file():
        return None, f"installed verl {version} at {root} has no {pin.config_dir}"
    tree = UpstreamTree(
        root, config_dir, "distribution", "distribution", tree_sha256(config_dir), version
    )
    return tree, ""


def locate_upstream(
    pin: UpstreamPin, *, option: str | None, ini: str | None, rootdir: Path
) -> tuple[UpstreamTree | None, str]:
    """Find the upstream tree: option, then VERL_UPSTREAM, then ini, then the installed verl."""
    for source, value in (
        ("option", option),
        ("VERL_UPSTREAM", os.environ.get("VERL_UPSTREAM")),
        ("ini", ini),
    ):
        if value:
            base = rootdir if source == "ini" else Path.cwd()
            return checkout_tree(base / value, pin, source), ""
    return distribution_tree(pin)


@dataclass(frozen=True)
class PinCheck:
    """The result of checking one pinned input file against the upstream folder."""

    path: str
    pinned: str
    found: str | None

    @property
    def ok(self) -> bool:
        return self.pinned == self.found

    def message(self) -> str:
        if self.found is None:
            return f"{self.path}: pinned sha256 {self.pinned}, but the file is missing"
        return f"{self.path}: pinned sha256 {self.pinned}, found {self.found}"


def check_pins(root: Path, pins: tuple[InputPin, ...]) -> list[PinCheck]:
    checks = []
    for pin in pins:
        file = root / pin.path
        checks.append(PinCheck(pin.path, pin.sha256, sha256_file(file) if file.is_file() else None))
    return checks
