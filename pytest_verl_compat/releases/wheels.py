"""A release's files, from its pinned wheel: fetched with pip, unpacked as data, cached.

``release_tree("0.8.0")`` returns ``$XDG_CACHE_HOME/pytest-verl-compat/releases/0.8.0`` (else under
``~/.cache``), laid out like an installed verl: its ``verl/`` package, source and config tree. It
is filled on first use by ``pip download --no-deps --only-binary=:all: --require-hashes`` (pip
itself is the only program run, with an argv built here; ``--only-binary`` keeps it from building,
that is running, a source distribution). The wheel is untrusted input all the same: its sha256 is
checked again, and only the ``verl`` package's ``.py`` and ``.yaml`` files and its version file
are taken out of it, each a bounded regular file confined to the release's folder; nothing of it
is imported in this process (its code runs only in the release's own environment,
``environment``). The folder is assembled beside the cache and renamed into place, so a reader
never sees half of it; a cached folder whose tree is no longer the pinned one is fetched again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pytest_verl_compat.files.cache import releases_home
from pytest_verl_compat.files.digests import tree_sha256
from pytest_verl_compat.files.safe_input import InputError, read_bytes
from pytest_verl_compat.releases.index import (
    Release,
    ReleaseError,
    ReleaseIndex,
    load_release_index,
)

CACHE_KIND = "releases"
# A wheel is a few MB; a source file at most a few hundred KB.
MAX_WHEEL_BYTES = 64 * 1024 * 1024
MAX_MEMBER_BYTES = 1024 * 1024
MAX_TREE_BYTES = 32 * 1024 * 1024
MAX_MEMBERS = 20_000
MAX_TAKEN = 4_000
PIP_TIMEOUT = 600
# What is taken out of a wheel: the package's source and data files, nothing else.
PACKAGE = "verl/"
TAKEN_SUFFIXES = (".py", ".yaml")
# Written last into an unpacked folder: the wheel it came from.
COMPLETE = ".complete"


def cache_dir() -> Path:
    """Where the releases' files are kept (``files.cache.releases_home``: the user cache's
    ``releases`` folder unless ``VERL_COMPAT_HOME`` says)."""
    return releases_home() / CACHE_KIND


@dataclass(frozen=True)
class ReleaseTree:
    """A release's files on disk: ``root`` holds its ``verl`` package, as a site-packages
    folder does, and its config tree."""

    release: Release
    root: Path
    config_dir: Path
    source: str  # "cache" or "fetched"

    @property
    def version(self) -> str:
        return self.release.version

    @property
    def package(self) -> Path:
        """The release's ``verl`` package folder (its source, read as data)."""
        return self.root / "verl"


def pip_command(release: Release, requirements: Path, dest: Path) -> list[str]:
    """The argv that downloads the release's wheel, and nothing else."""
    return [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--require-hashes",
        "--no-input",
        "--disable-pip-version-check",
        "--dest",
        str(dest),
        "-r",
        str(requirements),
    ]


def shown_pip_command(release: Release) -> str:
    """The pip command as a user would type it, for messages."""
    return f"pip download --no-deps --only-binary=:all: verl=={release.version}"


def release_tree(
    version: str,
    *,
    cache: Path | None = None,
    index: ReleaseIndex | None = None,
    fetch: bool = True,
) -> ReleaseTree:
    """The release's files: cached, or fetched now (raises ReleaseError)."""
    index = index or load_release_index()
    release = index.release(version)
    folder = (cache or cache_dir()) / release.version
    cached = _cached_tree(release, folder, index)
    if cached is not None:
        return cached
    if not fetch:
        raise ReleaseError(f"verl {release.version}: not in the cache {folder}")
    _fetch_into(release, folder, index)
    cached = _cached_tree(release, folder, index)
    if cached is None:  # another process replaced it with something else meanwhile
        raise ReleaseError(
            f"verl {release.version}: the cached files at {folder} are not the pinned ones"
        )
    return ReleaseTree(release, folder, folder / index.config_dir, "fetched")


def _cached_tree(release: Release, folder: Path, index: ReleaseIndex) -> ReleaseTree | None:
    config_dir = folder / index.config_dir
    marker = folder / COMPLETE
    if folder.is_symlink() or not config_dir.is_dir() or marker.is_symlink():
        return None
    try:
        complete = read_bytes(marker, 256, "cache marker").decode("ascii", "replace").strip()
        digest = tree_sha256(config_dir)
    except InputError:
        return None
    if complete != release.wheel_sha256 or digest != release.tree_sha256:
        return None
    return ReleaseTree(release, folder, config_dir, "cache")


def _fetch_into(release: Release, folder: Path, index: ReleaseIndex) -> None:
    """Download the wheel into a folder beside the cache, then unpack it into place."""
    work = _work_folder(release, folder.parent)
    try:
        install_wheel(release, download_wheel(release, work), folder, index)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _work_folder(release: Release, parent: Path) -> Path:
    try:
        parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return Path(tempfile.mkdtemp(prefix=f".{release.version}.", dir=parent))
    except OSError as exc:
        raise ReleaseError(
            f"verl {release.version}: cannot write the cache {parent}: {exc}"
        ) from exc


def install_wheel(release: Release, wheel: Path, folder: Path, index: ReleaseIndex) -> None:
    """Check a downloaded wheel, unpack it beside ``folder`` and rename it into place."""
    verify_wheel(release, wheel)
    work = _work_folder(release, folder.parent)
    try:
        tree = work / "tree"
        unpack_wheel(wheel, tree, index)
        digest = tree_sha256(tree / index.config_dir)
        if digest != release.tree_sha256:
            raise ReleaseError(
                f"verl {release.version}: the wheel's config tree has sha256 {digest}, "
                f"not the pinned {release.tree_sha256}"
            )
        (tree / COMPLETE).write_text(release.wheel_sha256 + "\n", encoding="ascii")
        if os.path.lexists(folder):
            # A stale or damaged folder (not the pinned files): moved aside first, so the
            # rename below never merges into it.
            os.replace(folder, work / "stale")
        try:
            os.rename(tree, folder)
        except OSError:
            if _cached_tree(release, folder, index) is None:  # not another process's twin
                raise
    except OSError as exc:
        raise ReleaseError(
            f"verl {release.version}: cannot write the cache {folder.parent}: {exc}"
        ) from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)


def verify_wheel(release: Release, wheel: Path) -> None:
    """The wheel is the pinned file: its name and its sha256 (a bounded regular file)."""
    if wheel.name != release.wheel or wheel.is_symlink():
        raise ReleaseError(f"verl {release.version}: {wheel.name} is not {release.wheel}")
    try:
        data = read_bytes(wheel, MAX_WHEEL_BYTES, "wheel")
    except InputError as exc:
        raise ReleaseError(f"verl {release.version}: {exc}") from exc
    digest = hashlib.sha256(data).hexdigest()
    if digest != release.wheel_sha256:
        raise ReleaseError(
            f"verl {release.version}: {release.wheel} has sha256 {digest}, "
            f"not the pinned {release.wheel_sha256}"
        )


def download_wheel(release: Release, work: Path) -> Path:
    """``pip download`` the release's wheel into ``work/wheel`` (pip alone runs; hash-checked)."""
    requirements = work / "requirements.txt"
    requirements.write_text(
        f"verl=={release.version} --hash=sha256:{release.wheel_sha256}\n", encoding="utf-8"
    )
    dest = work / "wheel"
    dest.mkdir(exist_ok=True)
    argv = pip_command(release, requirements, dest)
    try:
        proc = subprocess.run(
            argv,
            cwd=work,
            capture_output=True,
            text=True,
            timeout=PIP_TIMEOUT,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ReleaseError(
            f"verl {release.version}: pip did not finish ({exc}); run "
            f"`{shown_pip_command(release)}` where PyPI is reachable"
        ) from exc
    if proc.returncode != 0:
        raise ReleaseError(
            f"verl {release.version}: cannot fetch its wheel ({pip_reason(proc.stderr)}); "
            f"`{shown_pip_command(release)}` needs PyPI"
        )
    wheel = dest / release.wheel
    if not wheel.is_file():
        found = ", ".join(sorted(p.name for p in dest.iterdir())) or "nothing"
        raise ReleaseError(f"verl {release.version}: pip downloaded {found}, not {release.wheel}")
    verify_wheel(release, wheel)
    return wheel


def pip_reason(stderr: str) -> str:
    """pip's first error line, for a one-line message."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    reason = (errors or lines or ["pip failed"])[0]
    return reason.removeprefix("ERROR: ")[:300]


def _taken(name: str, index: ReleaseIndex) -> bool:
    return name == index.version_file or (
        name.startswith(PACKAGE) and name.endswith(TAKEN_SUFFIXES)
    )


def _member_path(name: str) -> PurePosixPath:
    """A member's relative path, or ReleaseError for one that could leave the folder."""
    path = PurePosixPath(name)
    if (
        not name
        or "\\" in name
        or "\0" in name
        or path.is_absolute()
        or any(part in ("", ".", "..") for part in name.split("/"))
    ):
        raise ReleaseError(f"wheel member {name!r}: not a plain relative path")
    return path


def unpack_wheel(wheel: Path, dest: Path, index: ReleaseIndex) -> list[str]:
    """Extract the ``verl`` package's ``.py`` and ``.yaml`` files and its version file into
    ``dest`` (a new folder).

    Every other member is skipped unread. A taken member must be a regular file of at most
    ``MAX_MEMBER_BYTES`` (its declared and its actual size), with a plain relative name, listed
    once; the taken files together stay under ``MAX_TREE_BYTES``. Returns the names taken.
    """
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise ReleaseError(f"{wheel.name}: not a readable wheel: {exc}") from exc
    taken: list[str] = []
    total = 0
    with archive:
        members = archive.infolist()
        if len(members) > MAX_MEMBERS:
            raise ReleaseError(f"{wheel.name}: {len(members)} members; the limit is {MAX_MEMBERS}")
        listed = Counter(member.filename for member in members)
        dest.mkdir(parents=True, mode=0o755)
        for member in members:
            name = member.filename
            if member.is_dir() or not _taken(name, index):
                continue
            relative = _member_path(name)
            kind = stat.S_IFMT(member.external_attr >> 16)
            if kind not in (0, stat.S_IFREG):
                raise ReleaseError(f"{wheel.name}: member {name} is not a regular file")
            if listed[name] > 1:
                raise ReleaseError(f"{wheel.name}: member {name} is listed twice")
            if member.file_size > MAX_MEMBER_BYTES or len(taken) >= MAX_TAKEN:
                raise ReleaseError(f"{wheel.name}: member {name} is over the size limits")
            with archive.open(member) as handle:
                data = handle.read(MAX_MEMBER_BYTES + 1)
            total += len(data)
            if len(data) > MAX_MEMBER_BYTES or total > MAX_TREE_BYTES:
                raise ReleaseError(f"{wheel.name}: member {name} is over the size limits")
            target = dest.joinpath(*relative.parts)
            if not target.resolve().is_relative_to(dest.resolve()):
                raise ReleaseError(f"{wheel.name}: member {name} resolves outside the tree")
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
            fd = os.open(target, flags, 0o644)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            taken.append(name)
    config_prefix = index.config_dir.rstrip("/") + "/"
    if index.version_file not in taken or not any(
        n.startswith(config_prefix) and n.endswith(".yaml") for n in taken
    ):
        raise ReleaseError(f"{wheel.name}: no {index.config_dir} tree or no version file in it")
    return taken
