"""A release's environment: the interpreter its upstream code runs in, built once from pinned wheels.

As pre-commit keeps a hook's environment and nox a session's, each supported release has one
virtual environment of its own in the user cache
(``$XDG_CACHE_HOME/pytest-verl-compat/environments/verl-<version>-<lock digest>``), never the
user's: the checker installs without verl, and the verl a team has installed only chooses the
release (``choice``). The environment holds exactly the wheels of the release's lock
(``data/releases/<version>/environment-<platform>.txt``: every distribution pinned by version and
sha256, derived by ``verl-compat release lock``), installed by pip with ``--require-hashes
--no-deps`` from a folder of wheels (``wheels/``) that pip fills first: a machine offline with
those wheels there (copied, or left by an earlier build) builds it without a network. The first
use prints a progress line and its time; the folder is assembled beside the cache and renamed
into place, marked complete last, under a file lock (two processes build it once).

Only pip and the new interpreter (``python -m venv``, and its ``-I -c`` that reads the installed
version) run here, each with an argv built here.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pytest_verl_compat.files.cache import releases_home
from pytest_verl_compat.files.safe_input import InputError, read_bytes, read_text
from pytest_verl_compat.releases.index import Release, ReleaseError
from pytest_verl_compat.releases.wheels import pip_reason

ENVIRONMENTS = "environments"
WHEELS = "wheels"
LOCK_PREFIX = "environment-"
COMPLETE = ".complete"
MAX_LOCK_BYTES = 1 << 20
BUILD_TIMEOUT = 3600
# The packages of the checker the release's interpreter imports (the oracle's own modules, and
# the reference trainer's math that a served module may use): linked, never installed there.
CHECKER_PACKAGES = ("pytest_verl_compat", "reference_trainer")

Progress = Callable[[str], None]


def platform_tag() -> str:
    """This interpreter's platform, as a lock names it: ``cp311-linux-x86_64``."""
    machine = platform.machine().lower() or "unknown"
    return f"cp{sys.version_info.major}{sys.version_info.minor}-{sys.platform}-{machine}"


@dataclass(frozen=True)
class Pin:
    """One distribution of a lock: ``name==version --hash=sha256:…``."""

    name: str
    version: str
    sha256: str


@dataclass(frozen=True)
class Lock:
    """A release's environment for one platform: every distribution, pinned."""

    release: Release
    platform: str
    path: Path
    text: str
    pins: tuple[Pin, ...]

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def version_of(self, name: str) -> str:
        """The pinned version of a distribution ("" when the lock has none)."""
        wanted = _normal(name)
        return next((pin.version for pin in self.pins if _normal(pin.name) == wanted), "")


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def lock_path(release: Release, tag: str | None = None) -> Path:
    return release.data_dir / f"{LOCK_PREFIX}{tag or platform_tag()}.txt"


def parse_lock(release: Release, path: Path, text: str) -> tuple[Pin, ...]:
    """The pins of a lock's text: each line ``name==version --hash=sha256:HEX``."""
    pins = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        requirement, _, hashed = line.partition(" --hash=sha256:")
        name, equals, version = requirement.partition("==")
        if not equals or not name or not version or len(hashed.strip()) != 64:
            raise ReleaseError(
                f"{path}:{number}: expected `name==version --hash=sha256:HEX`, got {line[:80]!r}"
            )
        pins.append(Pin(name.strip(), version.strip(), hashed.strip()))
    if not any(_normal(pin.name) == "verl" and pin.version == release.version for pin in pins):
        raise ReleaseError(f"{path}: the lock does not pin verl=={release.version}")
    return tuple(pins)


def load_lock(release: Release, tag: str | None = None) -> Lock:
    """The release's lock for this platform (the package's, else one pinned in the user cache by
    ``verl-compat release lock``); one line naming what exists when there is none."""
    tag = tag or platform_tag()
    for path in (lock_path(release, tag), user_lock_path(release, tag)):
        if path.is_file():
            try:
                text = read_text(path, MAX_LOCK_BYTES, "environment lock")
            except InputError as exc:
                raise ReleaseError(str(exc)) from exc
            return Lock(release, tag, path, text, parse_lock(release, path, text))
    pinned = sorted(
        p.name.removeprefix(LOCK_PREFIX).removesuffix(".txt")
        for p in release.data_dir.glob(f"{LOCK_PREFIX}*.txt")
    )
    raise ReleaseError(
        f"verl {release.version} has no pinned environment for {tag} (pinned: "
        f"{', '.join(pinned) or 'none'}); `verl-compat release lock {release.version}` pins one "
        "for this machine"
    )


def user_lock_path(release: Release, tag: str) -> Path:
    return releases_home() / "locks" / release.version / f"{LOCK_PREFIX}{tag}.txt"


@dataclass(frozen=True)
class ReleaseEnvironment:
    """A built environment: its interpreter runs the release's upstream code."""

    lock: Lock
    folder: Path

    @property
    def python(self) -> Path:
        return self.folder / "bin" / "python"

    @property
    def version(self) -> str:
        return self.lock.release.version


def environments_dir() -> Path:
    """Where the environments are kept (``files.cache.releases_home``)."""
    return releases_home() / ENVIRONMENTS


def wheels_dir() -> Path:
    """The pinned wheels the environments are built from, beside them."""
    return releases_home() / WHEELS


def environment_folder(lock: Lock) -> Path:
    return environments_dir() / f"verl-{lock.release.version}-{lock.platform}-{lock.digest[:16]}"


def built(lock: Lock) -> ReleaseEnvironment | None:
    """The environment of this lock when it is built and complete, else None."""
    folder = environment_folder(lock)
    marker = folder / COMPLETE
    if folder.is_symlink() or marker.is_symlink() or not marker.is_file():
        return None
    try:
        done = read_bytes(marker, 256, "environment marker").decode("ascii", "replace").strip()
    except InputError:
        return None
    environment = ReleaseEnvironment(lock, folder)
    return environment if done == lock.digest and environment.python.exists() else None


def release_environment(release: Release, progress: Progress | None = None) -> ReleaseEnvironment:
    """The release's environment, built now when it is not yet (raises ReleaseError, one line)."""
    lock = load_lock(release)
    found = built(lock)
    if found is not None:
        return found
    environments_dir().mkdir(parents=True, exist_ok=True, mode=0o700)
    folder = environment_folder(lock)
    with _locked(folder.parent / f"{folder.name}.lock"):
        found = built(lock)  # another process built it while this one waited
        if found is not None:
            return found
        started = time.monotonic()
        say = progress or (lambda _message: None)
        say(
            f"building the environment of verl {release.version} from {len(lock.pins)} pinned "
            f"wheels (once; kept in {environments_dir()})..."
        )
        environment = _build(lock)
        say(f"environment of verl {release.version} built in {time.monotonic() - started:.0f} s")
        return environment


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ReleaseError(f"{Path(argv[0]).name} did not finish: {exc}") from exc


def _pip(python: Path | str, *args: str) -> list[str]:
    return [
        str(python),
        "-m",
        "pip",
        *args,
        "--disable-pip-version-check",
        "--no-input",
    ]


def download_command(lock: Lock, dest: Path) -> list[str]:
    """The argv that fetches the lock's wheels (hash-checked) into ``dest``."""
    return _pip(
        sys.executable,
        "download",
        "--no-deps",
        "--require-hashes",
        "--dest",
        str(dest),
        "-r",
        str(lock.path),
    )


def shown_download_command(lock: Lock) -> str:
    return f"pip download --no-deps --require-hashes -r {lock.path} --dest {wheels_dir()}"


def _build(lock: Lock) -> ReleaseEnvironment:
    folder = environment_folder(lock)
    wheels = wheels_dir()
    wheels.mkdir(parents=True, exist_ok=True, mode=0o700)
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        venv = work / "env"
        made = _run([sys.executable, "-m", "venv", str(venv)], work)
        if made.returncode != 0:
            raise ReleaseError(f"python -m venv failed: {pip_reason(made.stderr)}")
        python = venv / "bin" / "python"
        install = _pip(
            python,
            "install",
            "--no-index",
            "--find-links",
            str(wheels),
            "--no-deps",
            "--require-hashes",
            "--no-compile",
            "-r",
            str(lock.path),
        )
        done = _run(install, work)
        if done.returncode != 0:
            # Wheels missing from the folder: fetched (by index and the user's pip settings),
            # then the install from the folder again.
            fetched = _run(download_command(lock, wheels), work)
            if fetched.returncode != 0:
                raise ReleaseError(
                    f"cannot fetch the pinned wheels of verl {lock.release.version} "
                    f"({pip_reason(fetched.stderr)}); where PyPI is reachable run "
                    f"`{shown_download_command(lock)}`"
                )
            done = _run(install, work)
            if done.returncode != 0:
                raise ReleaseError(
                    f"cannot install the environment of verl {lock.release.version}: "
                    f"{pip_reason(done.stderr)}"
                )
        installed = _run(
            [str(python), "-I", "-c", "import importlib.metadata as m; print(m.version('verl'))"],
            work,
        )
        if installed.stdout.strip() != lock.release.version:
            raise ReleaseError(
                f"the environment of verl {lock.release.version} holds verl "
                f"{installed.stdout.strip() or '(none)'}"
            )
        (venv / COMPLETE).write_text(lock.digest + "\n", encoding="ascii")
        if os.path.lexists(folder):
            os.replace(folder, work / "stale")
        os.rename(venv, folder)
    except OSError as exc:
        raise ReleaseError(f"cannot write the environment {folder}: {exc}") from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    environment = built(lock)
    if environment is None:
        raise ReleaseError(f"the environment {folder} is not complete after its build")
    return environment


def checker_folder() -> Path:
    """A folder holding only links to this checker's own packages: what a release's interpreter
    puts first on its path to run the oracle's modules (nothing else of the checker's
    environment is visible there). Made once per checker location, in the user cache."""
    base = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256(str(base).encode()).hexdigest()[:16]
    folder = releases_home() / "checker" / digest
    if all((folder / name).is_symlink() for name in CHECKER_PACKAGES):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    work = Path(tempfile.mkdtemp(prefix=f".{digest}.", dir=folder.parent))
    try:
        for name in CHECKER_PACKAGES:
            os.symlink(base / name, work / name)
        try:
            os.rename(work, folder)
        except OSError:
            if not all((folder / name).is_symlink() for name in CHECKER_PACKAGES):
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder
