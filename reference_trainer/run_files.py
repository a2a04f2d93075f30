"""What a run writes to its folder, besides checkpoints (see `checkpoint.py`).

- `metrics.jsonl`: one row per logged step (`step` 0: validation before training); on resume,
  rows after the checkpoint (the interrupted attempt's) are dropped;
- `samples.jsonl`: a few completions per step, so a run can be read, not only plotted;
- `adaptations.json`: the ledger of what the local run changes from upstream (`budget.py`);
- `metrics.csv` and `metrics.png` at the end of a complete run;
- `final/`: the final actor in HF format (`export_hf`);
- `.lock`: held (`fcntl.flock`) while a run writes the folder, so two runs never share one.

A fresh run refuses a folder that holds another run's files unless told to overwrite them;
a resumed run keeps the rows up to its checkpoint. A kill mid-write leaves a torn last line in
a JSONL file: it is dropped with a warning naming the file and line, and the run resumes.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import fcntl
import io
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from reference_trainer.batching import Batch
from reference_trainer.budget import Adaptation
from reference_trainer.config import ReferenceTrainerConfig

LOCK = ".lock"
RUN_ENTRIES = frozenset(
    {
        LOCK,
        "metrics.jsonl",
        "samples.jsonl",
        "adaptations.json",
        "metrics.csv",
        "metrics.png",
        "checkpoints",
        "final",
        "tensorboard_log",
        "file_logger",
        "wandb",
        "reward_model",
    }
)
"""What a run (and `--reward-model tiny`) writes to its folder; `--overwrite` removes no other."""
KEPT_ON_OVERWRITE = frozenset({LOCK, "reward_model"})
MAX_LOG_BYTES = 1 << 30


class RunFolderError(RuntimeError):
    """A run folder that is locked, taken by another run, or holds unreadable files."""


class TornLineWarning(UserWarning):
    """A JSONL file's last line was cut off (a killed run) and is dropped."""


@contextmanager
def locked_run_folder(out: Path) -> Iterator[None]:
    """Hold an exclusive lock on `out` for the block; a second holder fails at once."""
    if out.exists() and not out.is_dir():
        raise RunFolderError(f"{out}: the run folder is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        lock_path = out / LOCK
        if lock_path.is_symlink() or (lock_path.exists() and not lock_path.is_file()):
            raise RunFolderError(f"{lock_path}: the lock file is not a regular file")
        handle = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise RunFolderError(f"{out}: cannot use as a run folder ({exc.strerror})") from None
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunFolderError(
                f"{out}: another run is using this run folder (it holds {lock_path})"
            ) from None
        yield
    finally:
        os.close(handle)  # closing releases the lock


def claim_run_folder(out: Path, *, resume: bool, overwrite: bool) -> None:
    """A fresh run needs a folder free of other runs' files; `overwrite` removes them first."""
    if resume:
        return
    taken = sorted(p.name for p in out.iterdir() if p.name not in KEPT_ON_OVERWRITE)
    if not taken:
        return
    if not overwrite:
        raise RunFolderError(
            f"{out}: the run folder holds an earlier run ({', '.join(taken[:3])}"
            f"{', ...' if len(taken) > 3 else ''}); use --resume to continue it, "
            "--overwrite to replace it, or another --out"
        )
    foreign = [name for name in taken if name not in RUN_ENTRIES]
    if foreign:
        raise RunFolderError(
            f"{out}: --overwrite removes only run files, and {foreign[0]!r} is not one; "
            "choose another --out"
        )
    for name in taken:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to a temporary file next to `path`, then rename it into place."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise RunFolderError(f"{path}: not a regular file, not replaced")
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a run's JSONL file; a torn last line is dropped with a warning.

    Any other unreadable line, or a row without an integer `step`, fails naming file and line.
    """
    if path.is_symlink() or not path.is_file():
        raise RunFolderError(f"{path}: not a regular file")
    if path.stat().st_size > MAX_LOG_BYTES:
        raise RunFolderError(f"{path}: larger than {MAX_LOG_BYTES} bytes")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RunFolderError(f"{path}: not UTF-8 (byte {exc.start})") from None
    lines = text.split("\n")
    complete = lines[:-1]  # what follows the last newline was never finished
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            if number == len(complete) and not lines[-1]:
                warnings.warn(
                    f"{path}:{number}: dropped a torn last line (an interrupted write)",
                    TornLineWarning,
                    stacklevel=2,
                )
                continue
            raise RunFolderError(f"{path}:{number}: not a JSON row ({exc})") from None
        if not isinstance(row, dict) or type(row.get("step")) is not int:
            raise RunFolderError(f"{path}:{number}: a row needs an integer 'step'")
        rows.append(row)
    if lines[-1].strip():
        warnings.warn(
            f"{path}:{len(lines)}: dropped a torn last line (an interrupted write)",
            TornLineWarning,
            stacklevel=2,
        )
    return rows


def reset_logs(out: Path, step: int, *, resume: bool) -> list[dict[str, float]]:
    """Start `metrics.jsonl` and `samples.jsonl` at `step`; the metric rows kept (resume)."""
    metrics_path = out / "metrics.jsonl"
    history: list[dict[str, float]] = []
    if resume and metrics_path.exists():
        # Rows logged after the checkpoint belong to the interrupted attempt.
        history = [r for r in read_jsonl(metrics_path) if r["step"] <= step]
    write_atomic(metrics_path, _jsonl(history))
    samples_path = out / "samples.jsonl"
    if resume and samples_path.exists():
        kept = [r for r in read_jsonl(samples_path) if r["step"] <= step]
        write_atomic(samples_path, "".join(json.dumps(r) + "\n" for r in kept))
    elif samples_path.is_file():
        samples_path.unlink()
    return history


def _jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)


def append_row(path: Path, row: dict[str, float]) -> dict[str, float]:
    with path.open("a") as handle:
        handle.write(json.dumps(row, sort_keys=True) + "\n")
    return row


def append_samples(path: Path, step: int, batch: Batch, count: int = 4) -> None:
    """A few completions of `batch`, so a run can be read, not only plotted."""
    with path.open("a") as handle:
        for i in range(min(count, len(batch))):
            sample = {
                "step": step,
                "prompt": batch.prompts[i].prompt,
                "response": batch.texts[i] if batch.texts else "",
                "score": float(batch.tensors["score"][i]),
                "truncated": bool(batch.truncated[i]),
            }
            handle.write(json.dumps(sample) + "\n")


def write_ledger(
    path: Path,
    cfg: ReferenceTrainerConfig,
    upstream: ReferenceTrainerConfig,
    ledger: list[Adaptation],
) -> None:
    """`adaptations.json`: the local config's changes, and updates per step both ways."""
    payload = {
        "case": cfg.case_id,
        "profile": cfg.profile,
        "adaptations": [dataclasses.asdict(a) for a in ledger],
        "updates_per_step": {
            "actor": cfg.actor_updates_per_step,
            "critic": cfg.critic_updates_per_step,
            "upstream_actor": upstream.actor_updates_per_step,
            "upstream_critic": upstream.critic_updates_per_step,
        },
    }
    write_atomic(path, json.dumps(payload, indent=1, default=str))


def write_csv(path: Path, rows: list[dict[str, float]]) -> None:
    keys = sorted({k for row in rows for k in row}, key=lambda k: (k != "step", k))
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=keys)
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(path, buffer.getvalue())


PANELS = (
    ("critic/score/mean", "val/reward/mean", "reward"),
    ("actor/ref_kl", None, "KL to reference"),
    ("actor/entropy", None, "entropy"),
    ("response_length/mean", "val/response_length/mean", "response length"),
)
"""(training key, validation key, title) per panel of `metrics.png`."""


def metrics_figure(rows: list[dict[str, float]]) -> Any:
    """Reward (train and validation), KL, entropy and response length per integer step."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3))
    for axis, (key, val_key, title) in zip(axes, PANELS, strict=True):
        for name, label, style in ((key, "train", "."), (val_key, "validation", "s")):
            points = [(r["step"], r[name]) for r in rows if name is not None and name in r]
            if points:
                axis.plot(*zip(*points, strict=True), marker=style, label=label)
        if val_key is not None and any(val_key in r for r in rows):
            axis.legend(fontsize="small")
        axis.set_title(title)
        axis.set_xlabel("step")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    figure.tight_layout()
    return figure


def plot_metrics(path: Path, rows: list[dict[str, float]]) -> None:
    """`metrics_figure` as one PNG, written through a temporary file."""
    from matplotlib import pyplot as plt

    figure = metrics_figure(rows)
    temporary = path.with_name(f".{path.name}.tmp")
    figure.savefig(temporary, dpi=80, format="png")
    plt.close(figure)
    os.replace(temporary, path)


def export_hf(
    folder: Path,
    policy: torch.nn.Module,
    tokenizer: Any,
    cfg: ReferenceTrainerConfig,
    *,
    lora: bool,
) -> Path:
    """The final actor in HF format; LoRA: the adapter, its base, and a merged model."""
    from transformers import GenerationConfig

    folder.mkdir(parents=True, exist_ok=True)
    generation = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        do_sample=cfg.rollout.do_sample,
        temperature=cfg.rollout.temperature,
        max_new_tokens=cfg.data.max_response_length,
    )
    if not lora:
        hf = folder / "hf"
        policy.save_pretrained(hf)
    else:
        policy.save_pretrained(folder / "adapter")
        # unload() strips the adapter without merging: the frozen base, exported so the
        # adapter folder loads offline on top of it.
        base = copy.deepcopy(policy).unload()
        base.save_pretrained(folder / "base")
        tokenizer.save_pretrained(folder / "base")
        merged = copy.deepcopy(policy).merge_and_unload()
        hf = folder / "hf"
        merged.save_pretrained(hf)
        base_state = base.state_dict()
        # verl #4553: a "merged" export that is the unchanged base is a silent failure.
        if all(torch.equal(v, base_state[k]) for k, v in merged.state_dict().items()):
            raise RuntimeError(f"{hf}: merged LoRA export equals the base model")
    tokenizer.save_pretrained(hf)
    generation.save_pretrained(hf)
    return hf
