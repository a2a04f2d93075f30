"""``verl-compat release lock VERSION``: pin every wheel of a release's environment, for this platform.

pip resolves ``verl==VERSION`` with the index's ``environment`` requirements as it would install
them (``pip install --dry-run --ignore-installed --report``: nothing is installed, nothing of the
packages runs, only pip), and its report names every distribution with the sha256 of the file it
chose. The lock is that list, ``name==version --hash=sha256:…`` per line under a header naming
the release and the platform: what ``environment`` installs with ``--require-hashes --no-deps``.
A supported release's lock for the platform CI runs on is part of the package
(``data/releases/<version>/``); another platform's is written to the user cache.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from pytest_verl_compat.releases.environment import (
    LOCK_PREFIX,
    Pin,
    platform_tag,
    user_lock_path,
)
from pytest_verl_compat.releases.index import Release, ReleaseError, ReleaseIndex
from pytest_verl_compat.releases.wheels import pip_reason

RESOLVE_TIMEOUT = 900


def resolve_command(release: Release, index: ReleaseIndex, report: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--disable-pip-version-check",
        "--no-input",
        "--report",
        str(report),
        f"verl=={release.version}",
        *index.environment,
        *release.environment,
    ]


def pins_from_report(report: dict[str, Any]) -> list[Pin]:
    """Every distribution pip's installation report would install, with its file's sha256."""
    pins = []
    for item in report.get("install") or ():
        meta = item["metadata"]
        hashes = item.get("download_info", {}).get("archive_info", {}).get("hashes", {})
        if "sha256" not in hashes:
            raise ReleaseError(f"pip's report gives no sha256 for {meta['name']} {meta['version']}")
        pins.append(Pin(str(meta["name"]), str(meta["version"]), str(hashes["sha256"])))
    return sorted(pins, key=lambda pin: pin.name.lower())


def lock_text(release: Release, tag: str, pins: list[Pin]) -> str:
    lines = [
        f"# The environment of verl {release.version} for {tag}: every distribution, pinned.",
        f"# Derived by `verl-compat release lock {release.version}` (pip's resolution of verl and",
        "# the release index's environment requirements); installed with --require-hashes --no-deps.",
        *(f"{pin.name}=={pin.version} --hash=sha256:{pin.sha256}" for pin in pins),
    ]
    return "\n".join(lines) + "\n"


def derive_lock(release: Release, index: ReleaseIndex) -> str:
    """The lock's text for this platform, resolved by pip now (needs the index)."""
    with tempfile.TemporaryDirectory(prefix="verl-compat-lock-") as work:
        report = Path(work) / "report.json"
        try:
            proc = subprocess.run(
                resolve_command(release, index, report),
                cwd=work,
                capture_output=True,
                text=True,
                timeout=RESOLVE_TIMEOUT,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ReleaseError(f"pip did not resolve verl {release.version}: {exc}") from exc
        if proc.returncode != 0 or not report.is_file():
            raise ReleaseError(
                f"pip cannot resolve verl {release.version}: {pip_reason(proc.stderr)}"
            )
        pins = pins_from_report(json.loads(report.read_text(encoding="utf-8")))
    return lock_text(release, platform_tag(), pins)


def lock_destination(release: Release, *, package: bool) -> Path:
    """Where ``release lock`` writes: the package's data (a checkout's) or the user cache."""
    tag = platform_tag()
    if package:
        return release.data_dir / f"{LOCK_PREFIX}{tag}.txt"
    return user_lock_path(release, tag)
