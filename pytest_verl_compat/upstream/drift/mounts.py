"""The sections a supported release's tree mounts elsewhere than an earlier release's did, shipped
as data (``data/releases/VERSION/moved_mounts.json``, written by ``verl-compat release derive
VERSION --only moved-mounts``) so that ``fit`` places a key of such a section without fetching
any other release: verl 0.7's ``critic.model.fsdp_config`` is ``critic.fsdp`` from 0.8 on.

Each move is the ``moved-mount`` evidence of ``evidence.py`` (the same config file's defaults list
names the same config at another package: Hydra's own defaults list of each tree), found between
every earlier release of the index and this one, for the tree's default config and each
``model_engine`` option both trees have.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packaging.version import Version  # pytest's own dependency

from pytest_verl_compat.files.safe_input import InputError, load_json_file
from pytest_verl_compat.pipeline.compose import Composer
from pytest_verl_compat.releases.index import ReleaseError, ReleaseIndex, load_release_index
from pytest_verl_compat.releases.wheels import release_tree
from pytest_verl_compat.upstream.drift.evidence import MOVED_MOUNT, Move, MoveContext, mount_moves

CONFIG_NAME = "ppo_trainer"
ENGINE_GROUP = "model_engine"
FILE_NAME = "moved_mounts.json"


def moved_mounts_path(version: str, index: ReleaseIndex | None = None) -> Path:
    return (index or load_release_index()).release(version).data_dir / FILE_NAME


def _engine_options(config_dir: Path) -> set[str]:
    return {path.stem for path in (config_dir / ENGINE_GROUP).glob("*.yaml")}


def derive_moved_mounts(version: str, index: ReleaseIndex | None = None) -> list[dict[str, str]]:
    """Every moved mount from each earlier release of the index into ``version``'s tree (the
    earlier trees fetched as ``migrate`` fetches them), newest earlier release first."""
    index = index or load_release_index()
    target_tree = release_tree(version, index=index)
    target = Composer(target_tree.config_dir, CONFIG_NAME)
    earlier = sorted(
        (v for v in index.versions if Version(v) < Version(version)), key=Version, reverse=True
    )
    found: dict[tuple[str, str], dict[str, str]] = {}
    for since in earlier:
        tree = release_tree(since, index=index)
        source = Composer(tree.config_dir, CONFIG_NAME)
        options = _engine_options(tree.config_dir) & _engine_options(target_tree.config_dir)
        for selection in ([], *([f"{ENGINE_GROUP}={o}"] for o in sorted(options))):
            before, after = source.compose(selection, {}), target.compose(selection, {})
            if not (before.composed and after.composed):
                continue
            context = MoveContext(
                index.release(since),
                index.release(version),
                before.mapping,
                after.mapping,
                index,
                None,
                version,
                source_mounts=source.config_mounts(selection),
                target_mounts=target.config_mounts(selection),
            )
            for move in mount_moves(context):
                entry = {
                    "old": ".".join(move.old),
                    "new": ".".join(move.new),
                    "since": since,
                    "evidence": move.evidence,
                }
                found.setdefault((entry["old"], entry["new"]), entry)
    return [found[key] for key in sorted(found)]


def dumps_moved_mounts(entries: Sequence[dict[str, str]]) -> str:
    return json.dumps(list(entries), indent=1, sort_keys=True) + "\n"


@functools.cache
def moved_mounts(version: str) -> tuple[Move, ...]:
    """The shipped moves into ``version``'s tree; none for a release without the file."""
    try:
        path = moved_mounts_path(version)
    except ReleaseError:  # a release the index does not know: nothing shipped
        return ()
    if not path.is_file():
        return ()
    try:
        raw: Any = load_json_file(path, what="moved mounts")
    except InputError:
        return ()
    return tuple(
        Move(
            tuple(str(e["old"]).split(".")),
            tuple(str(e["new"]).split(".")),
            MOVED_MOUNT,
            str(e["evidence"]),
        )
        for e in raw
        if isinstance(e, dict)
    )


def relocation(version: str, key: str) -> tuple[str, str] | None:
    """Where ``key``, in a section an earlier release mounted elsewhere, is in ``version``'s tree,
    and the evidence; None where no shipped move covers it."""
    for move in moved_mounts(version):
        successor = move.successor(key)
        if successor is not None:
            return successor, move.evidence
    return None
