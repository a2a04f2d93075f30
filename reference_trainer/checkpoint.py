"""Atomic, verified checkpoints holding the whole training state.

A checkpoint is a folder `global_step_<k>` written under a temporary name and renamed into place
only when complete: every file first, then `manifest.json` (sha256 of each file), then the
`COMPLETE` marker, then the rename. Loading checks the marker and every digest, so a truncated
or corrupted file fails with its name instead of resuming from garbage. Older checkpoints are
deleted only after a newer one is complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

COMPLETE = "COMPLETE"
MANIFEST = "manifest.json"
PREFIX = "global_step_"


class CheckpointError(RuntimeError):
    """A checkpoint that is incomplete, corrupted or does not match the run."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def save_checkpoint(
    root: Path,
    step: int,
    *,
    tensors: dict[str, dict[str, torch.Tensor]],
    torch_objects: dict[str, Any],
    json_objects: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write `root/global_step_<step>` atomically; returns its path.

    `tensors` become safetensors files, `torch_objects` (optimizer and scheduler state: tensors,
    numbers, lists, dicts only) `torch.save` files, `json_objects` JSON files.
    """
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step}"
    temporary = root / f".{PREFIX}{step}.tmp-{os.getpid()}"
    if temporary.exists():
        shutil.rmtree(temporary)
    temporary.mkdir()
    for name, state in tensors.items():
        # clone: safetensors refuses tensors that share storage (tied or sliced weights).
        save_file(
            {k: v.detach().clone().contiguous() for k, v in state.items()},
            temporary / f"{name}.safetensors",
        )
    for name, obj in torch_objects.items():
        torch.save(obj, temporary / f"{name}.pt")
    for name, obj in json_objects.items():
        (temporary / f"{name}.json").write_text(json.dumps(obj, indent=1, sort_keys=True))
    digests = {p.name: _sha256(p) for p in sorted(temporary.iterdir())}
    (temporary / MANIFEST).write_text(json.dumps(digests, indent=1, sort_keys=True))
    # The marker goes last: a folder without it was interrupted mid-write.
    (temporary / COMPLETE).write_text(f"{step}\n")
    if final.exists():
        shutil.rmtree(final)
    os.replace(temporary, final)
    for old in complete_checkpoints(root)[:-keep]:
        shutil.rmtree(old)
    return final


def complete_checkpoints(root: Path) -> list[Path]:
    """Finished checkpoint folders, oldest first (temporary folders are never listed)."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith(PREFIX) and (p / COMPLETE).is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def verify_checkpoint(folder: Path) -> None:
    """Raise CheckpointError naming the first missing or corrupted file."""
    if not (folder / COMPLETE).is_file():
        raise CheckpointError(f"{folder}: no {COMPLETE} marker, the checkpoint was not finished")
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"{manifest_path}: manifest missing")
    for name, expected in json.loads(manifest_path.read_text()).items():
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{path}: file listed in the manifest is missing")
        if _sha256(path) != expected:
            raise CheckpointError(
                f"{path}: sha256 does not match the manifest (truncated or corrupted); "
                "earlier checkpoints in the same folder are kept"
            )


def load_checkpoint(folder: Path) -> dict[str, Any]:
    """Every file of a verified checkpoint, keyed by its stem."""
    verify_checkpoint(folder)
    loaded: dict[str, Any] = {}
    for path in sorted(folder.iterdir()):
        if path.suffix == ".safetensors":
            loaded[path.stem] = load_file(path)
        elif path.suffix == ".pt":
            loaded[path.stem] = torch.load(path, weights_only=True)
        elif path.suffix == ".json" and path.name != MANIFEST:
            loaded[path.stem] = json.loads(path.read_text())
    return loaded
