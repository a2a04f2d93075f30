"""Where a tree's defaults lists put each config it merges: the config, its package, the config
whose defaults list names it and that entry's line (``Composer.config_mounts``; the evidence of a
section a later release mounts elsewhere, ``upstream/drift/evidence.py`` moved-mount)."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from pytest_verl_compat.files.safe_input import InputError, read_text


@dataclass(frozen=True)
class Mount:
    """One config a composition merges, where its parent's defaults list puts it: ``config``
    (``engine/fsdp``) at ``package`` (``critic.fsdp``), named on ``line`` of ``file``, the YAML
    file of ``parent`` (``critic/dp_critic``); line and file are None where the tree has none."""

    config: str
    package: str
    parent: str
    file: Path | None
    line: int | None


def _defaults_entry_line(file: Path, parent: str, config: str) -> int | None:
    """The line of ``file``'s defaults list (the config ``parent``) that names ``config``."""
    try:
        node = yaml.compose(read_text(file, what="config file"), Loader=yaml.SafeLoader)
    except (InputError, yaml.YAMLError):
        return None
    if not isinstance(node, yaml.MappingNode):
        return None
    listed = next((v for k, v in node.value if getattr(k, "value", None) == "defaults"), None)
    if not isinstance(listed, yaml.SequenceNode):
        return None
    for item in listed.value:
        if isinstance(item, yaml.ScalarNode):
            named = str(item.value)
        elif isinstance(item, yaml.MappingNode) and len(item.value) == 1:
            key, value = item.value[0]
            named = f"{str(key.value).split('@')[0]}/{value.value}"
        else:
            continue
        if posixpath.normpath(posixpath.join(posixpath.dirname(parent), named)) == config:
            return int(item.start_mark.line) + 1
    return None


def mounts_of(listed: Sequence[tuple[str, str, str]], folders: Sequence[Path]) -> list[Mount]:
    """Hydra's (config path, package, parent) triples as mounts, each parent's file and line
    found in the first of ``folders`` that holds it (confined to that folder)."""
    mounts = []
    for config_path, package, parent in listed:
        config = posixpath.normpath(config_path)
        file = next(
            (
                candidate
                for folder in folders
                if (candidate := (folder / f"{parent}.yaml").resolve()).is_file()
                and candidate.is_relative_to(folder.resolve())
            ),
            None,
        )
        line = _defaults_entry_line(file, parent, config) if file is not None else None
        mounts.append(Mount(config, package, parent, file, line))
    return mounts
