"""What a run writes to its folder, besides checkpoints (see `checkpoint.py`).

- `metrics.jsonl`: one row per logged step (`step` 0: validation before training); on resume,
  rows after the checkpoint (the interrupted attempt's) are dropped;
- `samples.jsonl`: a few completions per step, so a run can be read, not only plotted;
- `adaptations.json`: the ledger of what the local run changes from upstream (`budget.py`);
- `metrics.csv` and `metrics.png` at the end of a complete run;
- `final/`: the final actor in HF format (`export_hf`).
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from reference_trainer.batching import Batch
from reference_trainer.budget import Adaptation
from reference_trainer.config import ReferenceTrainerConfig


def reset_logs(out: Path, step: int, *, resume: bool) -> list[dict[str, float]]:
    """Start `metrics.jsonl` and `samples.jsonl` at `step`; the metric rows kept (resume)."""
    metrics_path = out / "metrics.jsonl"
    history: list[dict[str, float]] = []
    if resume and metrics_path.is_file():
        # Rows logged after the checkpoint belong to the interrupted attempt.
        rows = [json.loads(line) for line in metrics_path.read_text().splitlines()]
        history = [r for r in rows if r["step"] <= step]
    metrics_path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in history))
    samples_path = out / "samples.jsonl"
    if resume and samples_path.is_file():
        kept = [
            line
            for line in samples_path.read_text().splitlines()
            if json.loads(line)["step"] <= step
        ]
        samples_path.write_text("".join(line + "\n" for line in kept))
    elif samples_path.is_file():
        samples_path.unlink()
    return history


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
    path.write_text(json.dumps(payload, indent=1, default=str))


def write_csv(path: Path, rows: list[dict[str, float]]) -> None:
    keys = sorted({k for row in rows for k in row}, key=lambda k: (k != "step", k))
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def plot_metrics(path: Path, rows: list[dict[str, float]]) -> None:
    """Reward, KL, entropy and response length per step, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    panels = [
        ("critic/score/mean", "reward"),
        ("actor/ref_kl", "KL to reference"),
        ("actor/entropy", "entropy"),
        ("response_length/mean", "response length"),
    ]
    figure, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3))
    for axis, (key, title) in zip(axes, panels, strict=True):
        points = [(r["step"], r[key]) for r in rows if key in r]
        if points:
            axis.plot(*zip(*points, strict=True), marker=".")
        axis.set_title(title)
        axis.set_xlabel("step")
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)


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
