"""The forecast as a picture: per kind of rank, one stacked bar per phase (its parts) against the
GPU's capacity and the warning margin. matplotlib (the [trainer] extra), Agg backend, imported
here only; PNG and SVG are written without timestamps or random ids, so the same forecast gives
the same bytes (tests/test_fit_report.py)."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

from pytest_verl_compat.memory.parts import PHASE_TITLES, Forecast, gib

# Part families drawn in one colour each (the part's key prefix after the role).
COLOURS = {
    "params": "#4C72B0",
    "gathered": "#64B5CD",
    "grads": "#DD8452",
    "accumulated": "#C44E52",
    "optimizer": "#8172B3",
    "activations": "#55A868",
    "reduce": "#937860",
    "logits": "#DA8BC3",
    "server": "#8C8C8C",
    "weights": "#5F8C8C",
    "asleep": "#BCBCBC",
    "staging": "#CCB974",
    "context": "#2F2F2F",
}


LEGEND = {
    "params": "weights",
    "gathered": "all-gathered units",
    "grads": "gradients",
    "accumulated": "unsharded gradients (no-sync)",
    "optimizer": "optimizer states",
    "activations": "activations",
    "reduce": "gradient reduce buffers",
    "logits": "logits",
    "server": "rollout server (awake)",
    "weights": "rollout weights",
    "asleep": "rollout server (asleep)",
    "staging": "staging",
    "context": "CUDA contexts + NCCL",
}


def _family(key: str) -> str:
    parts = key.split(".")
    for candidate in reversed(parts):
        if candidate in COLOURS:
            return candidate
    return parts[1] if len(parts) > 1 else parts[0]


def _colour(family: str) -> str:
    if family in COLOURS:
        return COLOURS[family]
    value = zlib.crc32(family.encode()) & 0xFFFFFF  # stable across runs, unlike hash()
    return f"#{value:06x}"


def write_plot(forecast: Forecast, path: Path) -> None:
    """Write the picture to ``path`` (.png or .svg); raises UsageError-worthy ValueError else."""
    suffix = path.suffix.lower()
    if suffix not in (".png", ".svg"):
        raise ValueError(f"{path}: the picture must be .png or .svg")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = forecast.ranks
    with plt.rc_context(
        {"svg.hashsalt": "verl-compat-fit", "font.size": 9, "path.simplify": False}
    ):
        fig, axes = plt.subplots(
            1, len(ranks), figsize=(6.2 + 3.6 * len(ranks), 5.0), squeeze=False, dpi=100
        )
        legend: dict[str, Any] = {}
        for ax, rank in zip(axes[0], ranks, strict=True):
            names = [PHASE_TITLES[p.phase] for p in rank.phases]
            for i, phase in enumerate(rank.phases):
                bottom = 0.0
                for part in phase.parts:
                    if not part.bytes:
                        continue
                    family = _family(part.key)
                    bar = ax.bar(
                        i,
                        gib(part.bytes),
                        bottom=bottom,
                        color=_colour(family),
                        edgecolor="white",
                        linewidth=0.4,
                        width=0.7,
                    )
                    legend.setdefault(family, bar)
                    bottom += gib(part.bytes)
                ax.text(i, bottom, f"{bottom:.1f}", ha="center", va="bottom", fontsize=7)
            if forecast.capacity and not forecast.capacity_assumed:
                cap = gib(forecast.capacity)
                ax.axhline(cap, color="#B00000", linewidth=1.2)
                ax.axhline(cap * forecast.margin, color="#B00000", linewidth=0.8, linestyle="--")
                ax.text(
                    -0.45,
                    cap,
                    f"{forecast.gpu}",
                    ha="left",
                    va="bottom",
                    fontsize=7,
                    color="#B00000",
                )
                ax.text(
                    len(names) - 0.55,
                    cap * forecast.margin,
                    f"{forecast.margin:.0%} margin",
                    ha="right",
                    va="bottom",
                    fontsize=6,
                    color="#B00000",
                )
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels(names, rotation=35, ha="right")
            ax.set_ylabel("GiB per GPU")
            ax.set_title(f"{rank.name} GPUs ({rank.count})", fontsize=9)
            ax.margins(y=0.12)
        fig.suptitle(f"{forecast.model}: memory per GPU by phase", fontsize=10)
        labels = [LEGEND.get(family, family) for family in legend]
        fig.tight_layout(rect=(0, 0, 0.76, 0.97))
        fig.legend(
            list(legend.values()),
            labels,
            loc="center left",
            bbox_to_anchor=(0.77, 0.55),
            fontsize=7,
            frameon=False,
        )
        # no creation date (SVG) and no software version (PNG): the bytes depend on the forecast only
        metadata: dict[str, Any] = {"Date": None} if suffix == ".svg" else {"Software": None}
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format=suffix[1:], metadata=metadata)
        plt.close(fig)
