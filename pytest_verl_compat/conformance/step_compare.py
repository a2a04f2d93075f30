"""Comparing one step of both sides: per quantity the largest difference, within tolerance.

Quantities (`step_plan.QUANTITIES`): the per-token tensors of the batch (compared over the
response mask; upstream's rows come in the order its balance step gave them, mapped back), the
per-step metrics both sides report (under their shared names), and every trainable parameter
of the actor (the adapter only, with LoRA) and the critic after the step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from pytest_verl_compat.conformance.step_plan import StepTolerance

TOKEN_QUANTITIES = (
    "old_log_probs",
    "entropy",
    "ref_log_prob",
    "values",
    "token_level_rewards",
    "advantages",
    "returns",
)
# Metric names as both sides report them (upstream's without the "actor/" prefix the trainer adds).
ACTOR_METRICS = (
    "pg_loss",
    "pg_clipfrac",
    "pg_clipfrac_lower",
    "ppo_kl",
    "kl_loss",
    "grad_norm",
    "lr",
    "entropy",
)
CRITIC_METRICS = ("vf_loss", "vf_clipfrac", "grad_norm", "lr")


@dataclass(frozen=True)
class QuantityResult:
    quantity: str
    max_abs_diff: float
    worst: str
    passed: bool


def _diff(ours: torch.Tensor, up: torch.Tensor, tol: StepTolerance) -> tuple[float, bool]:
    ours, up = ours.double(), up.double()
    if ours.shape != up.shape:
        return math.inf, False
    err = (ours - up).abs()
    ok = bool((err <= tol.atol + tol.rtol * up.abs()).all()) and bool(torch.isfinite(ours).all())
    return float(err.max()) if err.numel() else 0.0, ok


def _token_rows(up: torch.Tensor, order: list[int], mask: torch.Tensor) -> torch.Tensor:
    """Upstream's rows back in rollout order, cut to our width, padding zeroed."""
    back = torch.empty_like(up)
    back[torch.tensor(order)] = up
    width = mask.shape[1]
    return back[:, :width] * mask


def _metric_name(key: str) -> str:
    return key.split("/", 1)[1] if "/" in key else key


def compare_step(
    ours: dict[str, Any], up: dict[str, Any], mask: torch.Tensor, tol: dict[str, StepTolerance]
) -> list[QuantityResult]:
    out: list[QuantityResult] = []
    for q in TOKEN_QUANTITIES:
        if q not in ours and q not in up:
            continue
        if (q in ours) != (q in up):
            side = "ours" if q in ours else "upstream"
            out.append(QuantityResult(q, math.inf, f"only {side} computed it", False))
            continue
        a = ours[q].double() * mask
        b = _token_rows(up[q].double(), up["order"], mask)
        d, ok = _diff(a, b, tol[q])
        out.append(QuantityResult(q, d, "", ok))
    for role, names in (("actor", ACTOR_METRICS), ("critic", CRITIC_METRICS)):
        if role not in up["metrics"]:
            continue
        mine = {_metric_name(k): v for k, v in ours["metrics"][role].items()}
        theirs = {_metric_name(k): v for k, v in up["metrics"][role].items()}
        for name in names:
            if name not in theirs:
                continue
            if name not in mine:
                out.append(
                    QuantityResult("metrics", math.inf, f"{role}/{name} not reported", False)
                )
                continue
            d, ok = _diff(torch.tensor(mine[name]), torch.tensor(theirs[name]), tol["metrics"])
            out.append(QuantityResult("metrics", d, f"{role}/{name}", ok))
    for role in ("actor", "critic"):
        if role not in up:
            continue
        if set(ours[role]) != set(up[role]):
            missing = sorted(set(ours[role]) ^ set(up[role]))[:3]
            out.append(QuantityResult(role, math.inf, f"parameter names differ: {missing}", False))
            continue
        worst, worst_name, passed = 0.0, "", True
        for name in sorted(up[role]):
            d, ok = _diff(ours[role][name], up[role][name], tol[role])
            passed = passed and ok
            if d >= worst:
                worst, worst_name = d, name
        out.append(QuantityResult(role, worst, worst_name, passed))
    return out


def summarise(results: list[QuantityResult]) -> dict[str, dict[str, Any]]:
    """quantity → largest difference (and where), and whether every element passed."""
    table: dict[str, dict[str, Any]] = {}
    for r in results:
        entry = table.setdefault(r.quantity, {"max_abs_diff": 0.0, "worst": "", "passed": True})
        if r.max_abs_diff >= entry["max_abs_diff"]:
            entry["max_abs_diff"] = r.max_abs_diff
            entry["worst"] = r.worst
        entry["passed"] = entry["passed"] and r.passed
    return {k: table[k] for k in sorted(table)}
