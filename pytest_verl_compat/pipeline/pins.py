"""Where the upstream verl inputs come from: a checkout given by the user, or the installed wheel."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from pytest_verl_compat.files.digests import sha256_file, tree_sha256
from pytest_verl_compat.files.safe_input import InputError
from pytest_verl_compat.model import InputPin, UpstreamPin
from pytest_verl_compat.releases.index import load_release_index
from pytest_verl_compat.releases.wheels import ReleaseTree


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
        if self.source == "release":
            return f"{version}'s own files (its pinned wheel, at {self.root}); tree sha256 {self.tree_sha256}"
        return f"{self.kind} {self.root} (from {self.source}); {version}; tree sha256 {self.tree_sha256}"


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
    found = load_release_index().by_tree(digest)
    kind = "checkout" if (root / "examples").is_dir() else "distribution"
    return UpstreamTree(root, config_dir, source, kind, digest, found.version if found else None)


def release_files_tree(files: ReleaseTree, pin: UpstreamPin) -> UpstreamTree:
    """A release's own files (its pinned wheel, unpacked in the user cache) as the tree."""
    return UpstreamTree(
        files.root,
        files.root / pin.config_dir,
        "release",
        "distribution",
        files.release.tree_sha256,
        files.version,
    )


def with_release_tree(checkout: UpstreamTree, files: ReleaseTree, pin: UpstreamPin) -> UpstreamTree:
    """A checkout's scripts, composed on another release's own config tree (``--release``
    naming a release whose tree is not the checkout's)."""
    return dataclasses.replace(
        checkout,
        config_dir=files.root / pin.config_dir,
        tree_sha256=files.release.tree_sha256,
        version=files.version,
    )


def locate_upstream(
    pin: UpstreamPin, *, option: str | None, ini: str | None, rootdir: Path
) -> tuple[UpstreamTree | None, str]:
    """The upstream folder the user gave: option, then VERL_UPSTREAM, then ini (None: none
    given; the checked release's own files are the tree then)."""
    for source, value in (
        ("option", option),
        ("VERL_UPSTREAM", os.environ.get("VERL_UPSTREAM")),
        ("ini", ini),
    ):
        if value:
            base = rootdir if source == "ini" else Path.cwd()
            return checkout_tree(base / value, pin, source), ""
    return None, "no upstream folder given"


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
