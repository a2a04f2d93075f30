"""Case lists and totals the tests expect, read from the corpus and the golden audit, never pasted.

Adding a derived case is then data only: a manifest entry and the regenerated golden files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
MANIFEST: dict[str, Any] = yaml.safe_load((REPO / "corpus" / "manifest.yaml").read_text())
AUDIT: dict[str, Any] = json.loads((REPO / "golden" / "audit.json").read_text())


def case_ids(kind: str) -> list[str]:
    """The manifest's case ids of one kind, in manifest order."""
    return [case["id"] for case in MANIFEST["cases"] if case["kind"] == kind]


OFFICIAL = case_ids("official")


def launched_module(case_id: str) -> str | None:
    """The entry module a case's golden snapshot records (None: the pinned main_ppo)."""
    snapshot = json.loads((REPO / "golden" / "compose" / f"{case_id}.json").read_text())
    launch = snapshot.get("launch") or {}
    return launch.get("module")


# The official cases of the RL entry point (main_ppo): those whose snapshot records no other
# entry point (an SFT case's records verl.trainer.sft_trainer, whose tree is sft_trainer_engine).
OFFICIAL_RL = [case_id for case_id in OFFICIAL if launched_module(case_id) is None]
PINNED_VERSION: str = MANIFEST["upstream"]["version"]


def release_ready(version: str = PINNED_VERSION) -> bool:
    """Whether ``version``'s own environment is built (tests/conftest.py builds every supported
    release's before the run collects: the tests that run upstream's code skip without it)."""
    from pytest_verl_compat.releases.environment import built, load_lock
    from pytest_verl_compat.releases.index import ReleaseError, load_release_index

    try:
        return built(load_lock(load_release_index().supported_release(version))) is not None
    except ReleaseError:
        return False


def release_root(version: str = PINNED_VERSION) -> Path:
    """The folder of ``version``'s own files (its ``verl`` package, read as data)."""
    from pytest_verl_compat.releases.wheels import release_tree

    return release_tree(version).root


def needs_release(version: str = PINNED_VERSION):  # type: ignore[no-untyped-def]
    """A mark skipping a test that runs ``version``'s upstream code when its environment is not
    built (CI builds it, and fails when it cannot)."""
    import pytest

    return pytest.mark.skipif(
        not release_ready(version), reason=f"the environment of verl {version} is not built"
    )


def skip_unless_built(version: str) -> None:
    """Skip the running test where ``version``'s environment is not built (``needs_release``
    for a test parametrized by release)."""
    import pytest

    if not release_ready(version):
        pytest.skip(f"the environment of verl {version} is not built")


def environment_pins(version: str, names: tuple[str, ...]) -> dict[str, str]:
    """The versions ``version``'s environment lock pins for the packages ``names``."""
    from pytest_verl_compat.releases.index import RELEASE_DATA

    pins = {}
    for path in (RELEASE_DATA / version).glob("environment-*.txt"):
        for line in path.read_text(encoding="utf-8").splitlines():
            name, _, rest = line.partition("==")
            if name in names:
                pins[name] = rest.split()[0]
    return pins
