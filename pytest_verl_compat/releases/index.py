"""verl's releases as data: ``data/releases.yaml`` and each supported release's own folder.

The index pins every release the project knows by its wheel's sha256 and its config tree's
sha256 (``matrix``, ``migrate`` and ``drift`` read the trees of all of them). A release is
*supported* when the project checks it to full depth: its upstream code runs in an environment
of its own (``environment``), its facts are derived from its own files (``data/releases/<v>/``:
the environment's pinned wheels, the rules' citations, the probes' patch points) and it has its
own profile, golden answers and census pages. The versions come from here, never from code.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_verl_compat.files.safe_input import load_yaml_file

DATA = Path(__file__).resolve().parents[1] / "data"
RELEASES_FILE = DATA / "releases.yaml"
# Each supported release's derived facts: ``data/releases/<version>/``.
RELEASE_DATA = DATA / "releases"
# While a release is being added (``verl-compat release derive``) it is checked as if supported:
# the one way the index's ``supported`` is overridden, named by the command that sets it.
TRYING = "VERL_COMPAT_TRY_RELEASE"


class ReleaseError(Exception):
    """A release that is unknown, unsupported, cannot be fetched, or whose files are not the
    pinned ones; its message is one line."""


class ReleaseUnsupported(ReleaseError):
    """The release lacks what the probes need (a patch point moved): the checker cannot check
    it yet, and says so instead of skipping upstream's checks."""


@dataclass(frozen=True)
class EntryPointCall:
    """An upstream function the release's entry point applies to every config, and where."""

    function: str
    file: str
    line: int


@dataclass(frozen=True)
class Release:
    """One pinned release: its wheel and config tree hashes, and whether it is supported."""

    version: str
    wheel: str
    wheel_sha256: str
    tree_sha256: str
    entry_point_calls: tuple[EntryPointCall, ...] = ()
    # Checked to full depth (its own environment, data, profile, golden answers).
    supported: bool = False
    # The git tag and commit of the release, where known (the manifest's pin names them).
    tag: str = ""
    commit: str = ""
    # The profile the compiler classifies its leaves by (``profiles/<name>.yaml``).
    profile: str = ""
    sft_profile: str = ""
    # Requirements of this release's environment beyond the index's (a pin its own metadata
    # leaves out: verl 0.8.0 needs numpy<2, and pyarrow 26 imports only with numpy 2).
    environment: tuple[str, ...] = ()

    def calls(self, function: str) -> EntryPointCall | None:
        return next((call for call in self.entry_point_calls if call.function == function), None)

    @property
    def data_dir(self) -> Path:
        """The folder of this release's derived facts."""
        return RELEASE_DATA / self.version

    @property
    def label(self) -> str:
        return f"verl {self.version}"


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
    # A supported release's environment besides verl (pip requirements; the lock pins them).
    environment: tuple[str, ...] = ()
    # The release whose lines the project's texts cite (``lines``: every other release's
    # own lines are found from them).
    citations: str = ""

    @property
    def versions(self) -> tuple[str, ...]:
        return tuple(release.version for release in self.releases)

    @property
    def supported(self) -> tuple[Release, ...]:
        return tuple(release for release in self.releases if release.supported)

    @property
    def supported_versions(self) -> tuple[str, ...]:
        return tuple(release.version for release in self.supported)

    @property
    def newest_supported(self) -> Release:
        return self.supported[-1]

    def release(self, version: str) -> Release:
        for release in self.releases:
            if release.version == version:
                return release
        raise ReleaseError(
            f"verl {version} is not a pinned release (known: {', '.join(self.versions)}; "
            f"{RELEASES_FILE.name} pins them)"
        )

    def supported_release(self, version: str) -> Release:
        """The release, when the project checks it to full depth (else one line saying which
        releases are supported)."""
        found = next((r for r in self.releases if r.version == version), None)
        if found is not None and os.environ.get(TRYING) == version:
            return dataclasses.replace(found, supported=True)
        if found is None or not found.supported:
            what = "not a supported release" if found else "not a release the project knows"
            raise ReleaseError(
                f"verl {version} is {what}; supported: {', '.join(self.supported_versions)}"
            )
        return found

    def by_tree(self, tree_sha256: str) -> Release | None:
        """The release whose config tree has this digest."""
        return next((r for r in self.releases if r.tree_sha256 == tree_sha256), None)


def _release(entry: dict[str, Any]) -> Release:
    return Release(
        version=str(entry["version"]),
        wheel=str(entry["wheel"]),
        wheel_sha256=str(entry["wheel_sha256"]),
        tree_sha256=str(entry["tree_sha256"]),
        entry_point_calls=tuple(
            EntryPointCall(str(call["function"]), str(call["file"]), int(call["line"]))
            for call in entry.get("entry_point_calls") or ()
        ),
        supported=bool(entry.get("supported", False)),
        tag=str(entry.get("tag") or ""),
        commit=str(entry.get("commit") or ""),
        profile=str(entry.get("profile") or ""),
        sft_profile=str(entry.get("sft_profile") or ""),
        environment=tuple(str(requirement) for requirement in entry.get("environment") or ()),
    )


@functools.lru_cache(maxsize=4)
def load_release_index(path: Path = RELEASES_FILE) -> ReleaseIndex:
    raw: Any = load_yaml_file(path, what="release index")
    try:
        releases = tuple(_release(entry) for entry in raw["releases"])
        functions = tuple(
            MigrationFunction(str(entry["function"]), str(entry["file"]))
            for entry in raw.get("migration_functions") or ()
        )
        environment = tuple(str(requirement) for requirement in raw.get("environment") or ())
        return ReleaseIndex(
            releases,
            str(raw["config_dir"]),
            str(raw["version_file"]),
            functions,
            environment,
            str(raw["citations"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ReleaseError(f"{path}: malformed release index: {exc!r}") from exc
