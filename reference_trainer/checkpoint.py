"""Atomic, verified checkpoints holding the whole training state.

A checkpoint is a folder `global_step_<k>` written under a temporary name and renamed into place
only when complete: every file first, then `manifest.json` (sha256 of each file), then the
`COMPLETE` marker, then the rename. Loading checks the marker and every digest, so a truncated
or corrupted file fails with its name instead of resuming from garbage. Older checkpoints are
retired only after a newer one is complete: the RL trainer removes each role's part on its own
count, as verl does (`retire_role`); the SFT trainer keeps the newest folders whole.

A run folder may come from someone else, so loading trusts nothing but the manifest: only the
files it lists load (a stray `trainer_state.pt` next to the verified `trainer_state.json` is
never read), each name must be a plain file name inside the checkpoint folder (no `..`, no
absolute path, no symlink) of bounded size, and `torch.load` runs with `weights_only=True`.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

COMPLETE = "COMPLETE"
MANIFEST = "manifest.json"
PREFIX = "global_step_"
MAX_FILE_BYTES = 8 << 30
"""No checkpoint file of a local run comes near this; anything larger is refused unread."""
MAX_MANIFEST_BYTES = 1 << 20
LOADERS = (".safetensors", ".pt", ".json")


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
    keep: int | None = 2,
) -> Path:
    """Write `root/global_step_<step>` atomically; returns its path. With `keep`, only the
    newest `keep` complete checkpoints of `root` remain (None: the caller retires them).

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
    if keep is not None:
        for old in complete_checkpoints(root)[:-keep]:
            shutil.rmtree(old)
    return final


def role_files(role: str) -> tuple[str, ...]:
    """The files of one role's part of a checkpoint: its weights, optimizer and scheduler."""
    return (f"{role}.safetensors", f"{role}_optimizer.pt", f"{role}_scheduler.pt")


def retire_role(saved: list[Path], role: str, keep: int | None) -> list[Path]:
    """verl's retention of one role's checkpoints: of the folders this process saved (oldest
    first), the role's part of all but the newest `keep` is removed, the rest of each folder
    stays (the engine's checkpoint manager removes ``global_step_<k>/<role>`` only,
    verl/utils/checkpoint/checkpoint_manager.py:181-194). `keep` None or below 1 keeps all;
    folders an earlier process saved are never counted (its list starts empty, :59). Returns
    the folders still counted."""
    if not (isinstance(keep, int) and keep > 0) or len(saved) <= keep:
        return saved
    for folder in saved[: len(saved) - keep]:
        _remove_files(folder, role_files(role))
    return saved[len(saved) - keep :]


def _remove_files(folder: Path, names: tuple[str, ...]) -> None:
    """Remove `names` from a checkpoint and from its manifest (what remains still verifies)."""
    if not folder.is_dir():
        return
    manifest = folder / MANIFEST
    entries = _manifest(folder) if manifest.is_file() else {}
    remaining = {name: digest for name, digest in entries.items() if name not in names}
    temporary = folder / f".{MANIFEST}.tmp-{os.getpid()}"
    temporary.write_text(json.dumps(remaining, indent=1, sort_keys=True))
    os.replace(temporary, manifest)
    for name in names:
        (folder / name).unlink(missing_ok=True)


def resume_folder(root: Path, mode: str, path: str | None) -> Path | None:
    """The checkpoint a run resumes from, as verl's ``_load_checkpoint`` picks it
    (verl/trainer/ppo/v1/trainer_base.py:789-815): none under ``disable``; the latest complete
    checkpoint of `root` under ``auto`` (none: from scratch); ``resume_from_path`` under
    ``resume_path``, relative to the working folder, naming a ``global_step_<k>`` folder."""
    if mode == "disable":
        return None
    if mode == "auto":
        found = complete_checkpoints(root)
        return found[-1] if found else None
    if mode == "resume_path":
        if not isinstance(path, str) or PREFIX not in path:
            raise CheckpointError(
                f"trainer.resume_from_path={path!r}: resume_mode=resume_path needs the path "
                f"of a {PREFIX}<k> folder"
            )
        return Path.cwd() / path
    raise CheckpointError(f"trainer.resume_mode={mode!r}: expected auto, disable or resume_path")


def complete_checkpoints(root: Path) -> list[Path]:
    """Finished checkpoint folders, oldest first (temporary folders are never listed)."""
    if not root.is_dir():
        return []
    found = [
        p
        for p in root.iterdir()
        if re.fullmatch(rf"{PREFIX}[0-9]{{1,9}}", p.name) and (p / COMPLETE).is_file()
    ]
    return sorted(found, key=checkpoint_step)


def checkpoint_step(folder: Path) -> int:
    """The step in a checkpoint folder's name (`global_step_<k>`)."""
    return int(folder.name[len(PREFIX) :])


def _manifest(folder: Path) -> dict[str, str]:
    """The manifest's {file name: sha256}, every name checked to stay inside `folder`."""
    path = folder / MANIFEST
    if path.is_symlink() or not path.is_file():
        raise CheckpointError(f"{path}: manifest missing (or not a regular file)")
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise CheckpointError(f"{path}: manifest larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        entries = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a JSON manifest ({exc})") from None
    if not isinstance(entries, dict):
        raise CheckpointError(f"{path}: expected an object of file name to sha256")
    for name, digest in entries.items():
        if (
            not isinstance(name, str)
            or not _PLAIN_NAME.fullmatch(name)
            or name in (".", "..", MANIFEST, COMPLETE)
        ):
            raise CheckpointError(
                f"{path}: entry {name!r} is not a plain file name inside the checkpoint"
            )
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise CheckpointError(f"{path}: entry {name!r} has no sha256 hex digest")
        entry = folder / name
        if entry.is_symlink():
            raise CheckpointError(f"{entry}: a symlink; checkpoint files must be regular files")
        if entry.exists() and not entry.is_file():
            raise CheckpointError(f"{entry}: not a regular file")
        if entry.is_file() and entry.stat().st_size > MAX_FILE_BYTES:
            raise CheckpointError(f"{entry}: larger than {MAX_FILE_BYTES} bytes, refused unread")
    return entries


_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,200}")


def verify_checkpoint(folder: Path) -> dict[str, str]:
    """The verified manifest; raise CheckpointError naming the first bad, missing or corrupted file."""
    if folder.is_symlink() or not folder.is_dir():
        raise CheckpointError(f"{folder}: not a checkpoint folder")
    marker = folder / COMPLETE
    if marker.is_symlink() or not marker.is_file():
        raise CheckpointError(f"{folder}: no {COMPLETE} marker, the checkpoint was not finished")
    entries = _manifest(folder)
    for name, expected in entries.items():
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{path}: file listed in the manifest is missing")
        if _sha256(path) != expected:
            raise CheckpointError(
                f"{path}: sha256 does not match the manifest (truncated or corrupted); "
                "earlier checkpoints in the same folder are kept"
            )
    return entries


def load_checkpoint(folder: Path) -> dict[str, Any]:
    """Every file the verified manifest lists, keyed by its stem; nothing else is read."""
    entries = verify_checkpoint(folder)
    loaded: dict[str, Any] = {}
    for name in sorted(entries):
        path = folder / name
        stem, suffix = path.stem, path.suffix
        if suffix not in LOADERS:
            continue
        if stem in loaded:
            raise CheckpointError(f"{path}: a second file for {stem!r} in the manifest")
        try:
            if suffix == ".safetensors":
                loaded[stem] = load_file(path)
            elif suffix == ".pt":
                # weights_only: tensors and plain containers only, never a pickled callable.
                loaded[stem] = torch.load(path, weights_only=True)
            else:
                loaded[stem] = json.loads(path.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RuntimeError, OSError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CheckpointError(f"{path}: cannot be loaded ({first})") from None
        except pickle.UnpicklingError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "unsafe pickle"
            raise CheckpointError(f"{path}: refused by the weights-only loader ({first})") from None
    return loaded


RESUMABLE = frozenset(
    {
        "trainer.total_training_steps",
        "trainer.total_epochs",
        "trainer.logger",
        "trainer.resume_mode",
        "trainer.resume_from_path",
        "trainer.max_actor_ckpt_to_keep",
        "trainer.max_critic_ckpt_to_keep",
    }
)
"""Config fields a resumed run may change: a finished run is extended by asking for more steps
(or epochs); how it resumes and how many checkpoints it keeps change no training."""


def config_differences(
    saved: Any, current: Any, *, ignore: frozenset[str], path: str = ""
) -> list[str]:
    """Dotted paths where two JSON config trees differ (fields in `ignore` are skipped)."""
    if path in ignore:
        return []
    if isinstance(saved, dict) and isinstance(current, dict):
        found: list[str] = []
        for key in sorted(set(saved) | set(current), key=str):
            child = f"{path}.{key}" if path else str(key)
            if key not in saved or key not in current:
                if child not in ignore:
                    found.append(child)
                continue
            found.extend(config_differences(saved[key], current[key], ignore=ignore, path=child))
        return found
    return [] if saved == current else [path or "<root>"]
