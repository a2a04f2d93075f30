"""Which release a command checks, and why: a choice, never a silent assumption.

In order, the first that says: ``--release`` (or the plugin's ``--verl-corpus-release``);
``release = "X"`` in ``[tool.verl-compat]`` (or the plugin's ini key): a project's decision; the
release whose config tree an upstream folder holds (``--upstream``, ``VERL_UPSTREAM``: its
scripts are read either way, composed on the chosen release's tree); the verl installed beside
the checker (read from its distribution's metadata, never imported); the release a corpus
manifest pins. A release
that is not supported is one line naming the supported ones, never a verdict labelled with
another; so is an installed verl the project does not support.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from pytest_verl_compat.releases.index import Release, ReleaseError, load_release_index

# Why a release was chosen (``ReleaseChoice.why``), as every output says it.
FROM_OPTION = "chosen with --release"
FROM_TREE = "the config tree given"
FROM_SETTING = "[tool.verl-compat] release"
FROM_INSTALLED = "the installed verl"
FROM_MANIFEST = "the corpus manifest's release"


@dataclass(frozen=True)
class ReleaseChoice:
    """The release checked and the reason it was chosen."""

    release: Release
    why: str

    @property
    def version(self) -> str:
        return self.release.version

    def describe(self) -> str:
        return f"verl {self.version} ({self.why})"


def installed_version() -> str | None:
    """The version of the verl distribution installed beside the checker, if any."""
    try:
        return metadata.version("verl")
    except metadata.PackageNotFoundError:
        return None


def choose_release(
    *,
    option: str | None = None,
    tree_version: str | None = None,
    setting: str | None = None,
    setting_source: str = FROM_SETTING,
    manifest_version: str | None = None,
    installed: str | bool | None = True,
) -> ReleaseChoice:
    """The release to check (raises ReleaseError, one line).

    ``installed``: True reads the installed verl's version here; a string or None says it.
    """
    index = load_release_index()
    found = installed_version() if installed is True else installed or None
    for version, why in (
        (option, FROM_OPTION),
        (setting, setting_source),
        (tree_version, FROM_TREE),
        (found, FROM_INSTALLED),
        (manifest_version, FROM_MANIFEST),
    ):
        if version:
            try:
                return ReleaseChoice(index.supported_release(str(version)), why)
            except ReleaseError as exc:
                if why == FROM_INSTALLED:
                    raise ReleaseError(
                        f"the installed verl {version} is not a supported release; supported: "
                        f"{', '.join(index.supported_versions)} (choose one with --release)"
                    ) from exc
                raise ReleaseError(f"{exc} ({why})") from exc
    return ReleaseChoice(index.newest_supported, "the newest supported release")
