"""The config trees of verl's releases, by version: pinned in data, fetched with pip, cached.

``pytest_verl_compat/data/releases.yaml`` pins each release by its wheel's sha256 and its config
tree's sha256. ``release_tree("0.8.0")`` returns the folder holding that tree: the installed verl
when it is that release with that tree, else ``$XDG_CACHE_HOME/pytest-verl-compat/releases/0.8.0``,
filled on first use by ``pip download --no-deps --only-binary=:all:`` (pip itself is the only
program run, with an argv built here; ``--only-binary`` keeps it from building, that is running,
a source distribution; ``--require-hashes`` makes it refuse any other file). The wheel is
untrusted input all the same: its sha256 is checked again, and only ``verl/trainer/config/**.yaml``
and the version file are taken out of it, each entry a bounded regular file confined to the
release's folder. The folder is assembled beside the cache and renamed into place, so a reader
never sees half a tree; a cached tree whose hash is no longer the pinned one is fetched again.
"""

from __future__ import annotations

import functools
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
from typing import Any

from pytest_verl_compat.pipeline.pins import installed_verl_root, tree_sha256
from pytest_verl_compat.pipeline.safe_input import InputError, load_yaml_file, read_bytes

RELEASES_FILE = Path(__file__).resolve().parents[2] / "data" / "releases.yaml"
CACHE_FOLDER = "pytest-verl-compat"
CACHE_KIND = "releases"
# A wheel is a few MB; a config file a few KB (the largest, a generated megatron tree, ~40 KB).
MAX_WHEEL_BYTES = 64 * 1024 * 1024
MAX_MEMBER_BYTES = 1024 * 1024
MAX_TREE_BYTES = 16 * 1024 * 1024
MAX_MEMBERS = 20_000
MAX_TAKEN = 2_000
PIP_TIMEOUT = 600


class ReleaseError(Exception):
    """A release that is unknown, cannot be fetched, or whose files are not the pinned ones."""


@dataclass(frozen=True)
class EntryPointCall:
    """An upstream function the release's entry point applies to every config, and where."""

    function: str
    file: str
    line: int


@dataclass(frozen=True)
class Release:
    """One pinned release: its wheel and config tree hashes."""

    version: str
    wheel: str
    wheel_sha256: str
    tree_sha256: str
    entry_point_calls: tuple[EntryPointCall, ...] = ()

    def calls(self, function: str) -> EntryPointCall | None:
        return next((call for call in self.entry_point_calls if call.function == function), None)


@dataclass(frozen=True)
class MigrationFunction:
    """An upstream function that moves config keys, and the file that defines it."""

    function: str
    file: str


@dataclass(frozen=True)
class ReleaseIndex:
    """The data file: the releases in order, and what is taken out of each wheel."""

    releases: tuple[Release, ...]
    config_dir: str
    version_file: str
    migration_functions: tuple[MigrationFunction, ...]

    @property
    def versions(self) -> tuple[str, ...]:
        return tuple(release.version for release in self.releases)

    def release(self, version: str) -> Release:
        for release in self.releases:
            if release.version == version:
                return release
        raise ReleaseError(
            f"verl {version} is not a pinned release (known: {', '.join(self.versions)}; "
            f"{RELEASES_FILE.name} pins them)"
        )


@functools.lru_cache(maxsize=4)
def load_release_index(path: Path = RELEASES_FILE) -> ReleaseIndex:
    raw: Any = load_yaml_file(path, what="release index")
    try:
        releases = tuple(
            Release(
                version=str(entry["version"]),
                wheel=str(entry["wheel"]),
                wheel_sha256=str(entry["wheel_sha256"]),
                tree_sha256=str(entry["tree_sha256"]),
                entry_point_calls=tuple(
                    EntryPointCall(str(call["function"]), str(call["file"]), int(call["line"]))
                    for call in entry.get("entry_point_calls") or ()
                ),
            )
            for entry in raw["releases"]
        )
        functions = tuple(
            MigrationFunction(str(entry["function"]), str(entry["file"]))
            for entry in raw.get("migration_functions") or ()
        )
        return ReleaseIndex(releases, str(raw["config_dir"]), str(raw["version_file"]), functions)
    except (KeyError, TypeError, ValueError) as exc:
        raise ReleaseError(f"{path}: malformed release index: {exc!r}") from exc


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/pytest-verl-compat/releases`` (else under ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or ""
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    return root / CACHE_FOLDER / CACHE_KIND


@dataclass(frozen=True)
class ReleaseTree:
    """A release's config tree on disk: ``root`` is laid out like a verl checkout."""

    release: Release
    root: Path
    config_dir: Path
    source: str  # "installed", "cache" or "fetched"

    @property
    def version(self) -> str:
        return self.release.version


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
    """The release's config tree: installed, cached, or fetched now (raises ReleaseError)."""
    index = index or load_release_index()
    release = index.release(version)
    installed = installed_verl_root()
    if installed is not None and installed[1] == release.version:
        config_dir = installed[0] / index.config_dir
        if config_dir.is_dir() and tree_sha256(config_dir) == release.tree_sha256:
            return ReleaseTree(release, installed[0], config_dir, "installed")
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
            f"verl {release.version}: the cached tree at {folder} is not the pinned one"
        )
    return ReleaseTree(release, folder, folder / index.config_dir, "fetched")


def _cached_tree(release: Release, folder: Path, index: ReleaseIndex) -> ReleaseTree | None:
    config_dir = folder / index.config_dir
    if folder.is_symlink() or not config_dir.is_dir():
        return None
    try:
        digest = tree_sha256(config_dir)
    except InputError:
        digest = ""
    if digest != release.tree_sha256:
        return None
    return ReleaseTree(release, folder, config_dir, "cache")


def _fetch_into(release: Release, folder: Path, index: ReleaseIndex) -> None:
    """Download the wheel into a folder beside the cache, then install its tree."""
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
    """Check a downloaded wheel, unpack its tree beside ``folder`` and rename it into place."""
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
        if os.path.lexists(folder):
            # A stale or damaged tree (its hash is not the pinned one): moved aside first, so
            # the rename below never merges into it.
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
            f"verl {release.version}: cannot fetch its wheel ({_pip_reason(proc.stderr)}); "
            f"`{shown_pip_command(release)}` needs PyPI"
        )
    wheel = dest / release.wheel
    if not wheel.is_file():
        found = ", ".join(sorted(p.name for p in dest.iterdir())) or "nothing"
        raise ReleaseError(f"verl {release.version}: pip downloaded {found}, not {release.wheel}")
    verify_wheel(release, wheel)
    return wheel


def _pip_reason(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    reason = (errors or lines or ["pip failed"])[0]
    return reason.removeprefix("ERROR: ")[:300]


def _taken(name: str, index: ReleaseIndex) -> bool:
    return name == index.version_file or (
        name.startswith(index.config_dir.rstrip("/") + "/") and name.endswith(".yaml")
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
    """Extract the config tree and the version file of a wheel into ``dest`` (a new folder).

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
    if index.version_file not in taken or not any(n.endswith(".yaml") for n in taken):
        raise ReleaseError(f"{wheel.name}: no {index.config_dir} tree or no version file in it")
    return taken
