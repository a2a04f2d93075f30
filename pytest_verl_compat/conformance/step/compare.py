"""Comparing the steps of both sides: per quantity the largest difference, within tolerance.

Quantities (`plan.QUANTITIES`): the per-token tensors of the batch (compared over the response
mask; upstream's rows come in the order its padding and balance gave them, mapped back, its
padding rows left out), the metrics both sides report (under their shared names), and every
trainable parameter of the actor (the adapter only, with LoRA) and the critic after the step.
Step 1's quantities keep their names; a later step's carry `@<step>` (`actor@2`).

`activity` checks a case's claims about upstream's per-mini-batch metrics (that a clip binds,
that a gradient clip does not), so a case cannot silently stop seeing what it is there for.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from pytest_verl_compat.conformance.step.plan import StepTolerance

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
    "entropy_loss",
    "grad_norm",
    "lr",
    "entropy",
    "reward_kl_penalty",
    "reward_kl_penalty_coeff",
)
CRITIC_METRICS = ("vf_loss", "vf_clipfrac", "grad_norm", "lr")


@dataclass(frozen=True)
class QuantityResult:
    quantity: str
    max_abs_diff: float
    worst: str
    passed: bool


def base_quantity(name: str) -> str:
    """`actor@2` → `actor`: the tolerance of every step's quantity is the quantity's."""
    return name.split("@", 1)[0]


def _diff(ours: torch.Tensor, up: torch.Tensor, tol: StepTolerance) -> tuple[float, bool]:
    ours, up = ours.double(), up.double()
    if ours.shape != up.shape:
        return math.inf, False
    err = (ours - up).abs()
    ok = bool((err <= tol.atol + tol.rtol * up.abs()).all()) and bool(torch.isfinite(ours).all())
    return float(err.max()) if err.numel() else 0.0, ok


def _token_rows(up: torch.Tensor, order: list[int], real: int, mask: torch.Tensor) -> torch.Tensor:
    """Upstream's rows back in rollout order, its padding rows dropped, cut to our width."""
    back = torch.zeros_like(up)
    back[torch.tensor(order)] = up
    width = mask.shape[1]
    out = back[:real, :width]
    if out.shape[1] < width:
        out = torch.nn.functional.pad(out, (0, width - out.shape[1]))
    return out * mask


def _metric_name(key: str) -> str:
    return key.split("/", 1)[1] if "/" in key else key


def compare_step(
    ours: Mapping[str, Any],
    up: Mapping[str, Any],
    mask: torch.Tensor,
    tol: Mapping[str, StepTolerance],
    *,
    step: int = 1,
    not_compared: Mapping[str, str] | None = None,
) -> list[QuantityResult]:
    """One step of both sides; `not_compared` names `role/metric`s left out (with why)."""
    suffix = "" if step == 1 else f"@{step}"
    skipped = set(not_compared or ())
    out: list[QuantityResult] = []
    for q in TOKEN_QUANTITIES:
        if q not in ours and q not in up:
            continue
        if (q in ours) != (q in up):
            side = "ours" if q in ours else "upstream"
            out.append(QuantityResult(q + suffix, math.inf, f"only {side} computed it", False))
            continue
        a = ours[q].double() * mask
        b = _token_rows(up[q].double(), up["order"], up["real"], mask)
        d, ok = _diff(a, b, tol[q])
        out.append(QuantityResult(q + suffix, d, "", ok))
    for role, names in (("actor", ACTOR_METRICS), ("critic", CRITIC_METRICS)):
        if role not in up["metrics"]:
            continue
        mine = {_metric_name(k): v for k, v in ours["metrics"].get(role, {}).items()}
        theirs = {_metric_name(k): v for k, v in up["metrics"][role].items()}
        for name in names:
            if name not in theirs or f"{role}/{name}" in skipped:
                continue
            where = f"{role}/{name}"
            if name not in mine:
                out.append(
                    QuantityResult("metrics" + suffix, math.inf, f"{where} not reported", False)
                )
                continue
            d, ok = _diff(torch.tensor(mine[name]), torch.tensor(theirs[name]), tol["metrics"])
            out.append(QuantityResult("metrics" + suffix, d, where, ok))
    for role in ("actor", "critic"):
        if role not in up:
            continue
        if set(ours.get(role, {})) != set(up[role]):
            missing = sorted(set(ours.get(role, {})) ^ set(up[role]))[:3]
            out.append(
                QuantityResult(role + suffix, math.inf, f"parameter names differ: {missing}", False)
            )
            continue
        worst, worst_name, passed = 0.0, "", True
        for name in sorted(up[role]):
            d, ok = _diff(ours[role][name], up[role][name], tol[role])
            passed = passed and ok
            if d >= worst:
                worst, worst_name = d, name
        out.append(QuantityResult(role + suffix, worst, worst_name, passed))
    return out


def compare_steps(
    ours: Mapping[str, Any],
    up: Mapping[str, Any],
    masks: list[torch.Tensor],
    tol: Mapping[str, StepTolerance],
    *,
    not_compared: Mapping[str, str] | None = None,
) -> list[QuantityResult]:
    if len(ours["steps"]) != len(up["steps"]):
        return [QuantityResult("steps", math.inf, "the sides ran different step counts", False)]
    out = []
    for index, (a, b, mask) in enumerate(zip(ours["steps"], up["steps"], masks, strict=True), 1):
        out += compare_step(a, b, mask, tol, step=index, not_compared=not_compared)
    return out


_OPERATORS = {">": operator.gt, "<": operator.lt}


def activity(
    claims: tuple[str, ...], up: Mapping[str, Any], leaves: Mapping[str, Any], variant: str
) -> list[QuantityResult]:
    """Each claim `[variant:] role/metric OP bound` against upstream's per-mini-batch metrics of
    all steps (a claim naming a variant holds only for it).

    `>` holds when some mini-batch's value exceeds the bound (a clip that binds somewhere), `<`
    when every value is below it (a gradient clip that never binds). The bound is a number or
    a verl leaf the case trains with (`actor_rollout_ref.actor.optim.clip_grad`).
    """
    out = []
    for claim in claims:
        scope, _, text = claim.rpartition(":")
        if scope and scope.strip() != variant:
            continue
        name, op, bound_text = text.split()
        if op not in _OPERATORS:
            raise ValueError(f"activity claim {claim!r}: the operator is > or <")
        role, metric = name.split("/", 1)
        bound = float(leaves[bound_text]) if bound_text in leaves else float(bound_text)
        values = [
            v
            for step in up["steps"]
            for key, vs in step.get("raw_metrics", {}).get(role, {}).items()
            if _metric_name(key) == metric
            for v in vs
        ]
        holds = [_OPERATORS[op](v, bound) for v in values]
        ok = bool(values) and (any(holds) if op == ">" else all(holds))
        seen = max(values) if values else math.nan
        out.append(QuantityResult("active", seen, text.strip(), ok))
    return out


def summarise(results: list[QuantityResult]) -> dict[str, dict[str, Any]]:
    """quantity → largest difference (and where), and whether every element passed."""
    table: dict[str, dict[str, Any]] = {}
    for r in results:
        entry = table.setdefault(r.quantity, {"max_abs_diff": 0.0, "worst": "", "passed": True})
        if r.quantity == "active":
            # Each claim is its own row: the failing one names itself.
            if not r.passed:
                entry["worst"] = r.worst
            entry["passed"] = entry["passed"] and r.passed
            continue
        if r.max_abs_diff >= entry["max_abs_diff"]:
            entry["max_abs_diff"] = r.max_abs_diff
            entry["worst"] = r.worst
        entry["passed"] = entry["passed"] and r.passed
    return {k: table[k] for k in sorted(table)}
