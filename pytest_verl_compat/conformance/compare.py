"""The conformance comparator: one case's outputs against the reference's, and its verdict.

Shapes and dtypes must match exactly; values within the case's rtol/atol (clip fractions within
the component's float32 tolerance). A failure reads as a table of the first mismatching
elements, both sides, absolute and relative error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pytest_verl_compat.conformance.plan import ConformanceCase, ConformanceResult

__all__ = ["Check", "ConformanceResult", "case_result", "compare_outputs"]


_TABLE_ROWS = 5


@dataclass
class Check:
    """One quantity of one sample compared; `problem` is set when it does not conform."""

    quantity: str
    sample: int
    max_abs: float
    problem: str | None = None


def _as_array(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().to(torch.float64).numpy()
    return np.asarray(value, dtype=np.float64)


def _describe_dtype(value: Any) -> str:
    return str(value.dtype).removeprefix("torch.") if isinstance(value, torch.Tensor) else "float"


def _compare(
    case: ConformanceCase,
    quantity: str,
    sample: int,
    actual: Any,
    expected: Any,
    labels: tuple[str, str],
) -> Check:
    """Shapes, dtypes, then closeness; a readable table of the first mismatches on failure."""
    tag = f"[{case.id} sample {sample}]"
    if isinstance(expected, torch.Tensor) or isinstance(actual, torch.Tensor):
        shape_a = tuple(getattr(actual, "shape", ()))
        shape_e = tuple(getattr(expected, "shape", ()))
        if shape_a != shape_e:
            return Check(
                quantity,
                sample,
                math.inf,
                f"{quantity}.shape={shape_a}, but should be {shape_e} {tag}",
            )
        if _describe_dtype(actual) != _describe_dtype(expected):
            return Check(
                quantity,
                sample,
                math.inf,
                f"{quantity}.dtype={_describe_dtype(actual)}, "
                f"but should be {_describe_dtype(expected)} {tag}",
            )
    a, e = _as_array(actual), _as_array(expected)
    fraction = "clipfrac" in quantity
    rtol = case.fraction_rtol if fraction else case.rtol
    atol = case.fraction_atol if fraction else case.atol
    close = np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        abs_err = np.where(close, 0.0, np.abs(a - e))
        abs_err = np.where(np.isnan(abs_err), np.inf, abs_err)
        all_abs = np.abs(a - e)
        both_finite = np.isfinite(a) & np.isfinite(e)
        finite_abs = np.where(both_finite, all_abs, 0.0)
        rel = np.where(both_finite & (e != 0), all_abs / np.abs(e), 0.0)
    max_abs = (
        float(abs_err.max(initial=0.0)) if not close.all() else float(finite_abs.max(initial=0.0))
    )
    if close.all():
        return Check(quantity, sample, max_abs)
    bad = np.argwhere(~close.reshape(a.shape)) if a.ndim else np.zeros((1, 0), dtype=int)
    count, total = int((~close).sum()), int(close.size)
    nonfinite = int((~close & ~both_finite).sum())
    nonfinite_note = f" ({nonfinite} non-finite on one side only)" if nonfinite else ""
    lines = [
        f"{quantity}: {count} of {total} elements ({count / total:.1%}) differ{nonfinite_note}, "
        f"max abs err={float(finite_abs.max(initial=0.0)):.3g}, "
        f"but should be within rtol={rtol:g}, atol={atol:g} {tag}",
        f"  abs err: max {float(finite_abs.max(initial=0.0)):.3g}, "
        f"mean {float(finite_abs.mean()):.3g}; "
        f"rel err: max {float(rel.max(initial=0.0)):.3g}, mean {float(rel.mean()):.3g}",
        f"  {'index':<14} {labels[0]:>24} {labels[1]:>24} {'abs err':>10} {'rel err':>10}",
    ]
    for position in bad[:_TABLE_ROWS]:
        key = tuple(int(i) for i in position)
        lines.append(
            f"  {str(key) if key else '()':<14} {a[key]:>24.17g} {e[key]:>24.17g} "
            f"{float(all_abs[key]):>10.3g} {float(rel[key]):>10.3g}"
        )
    if count > _TABLE_ROWS:
        lines.append(f"  ... {count - _TABLE_ROWS} more")
    return Check(quantity, sample, max_abs, "\n".join(lines))


def compare_outputs(
    case: ConformanceCase,
    sample: int,
    actual: Mapping[str, Any],
    expected: Mapping[str, Any],
    labels: tuple[str, str],
) -> list[Check]:
    """Every quantity of one sample compared, or one failed check if the keys differ."""
    if set(actual) != set(expected):
        extra, missing = sorted(set(actual) - set(expected)), sorted(set(expected) - set(actual))
        return [
            Check(
                "keys",
                sample,
                math.inf,
                f"keys={sorted(actual)}, but should be {sorted(expected)} "
                f"(extra {extra}, missing {missing}) [{case.id} sample {sample}]",
            )
        ]
    return [
        _compare(case, key, sample, actual[key], expected[key], labels) for key in sorted(expected)
    ]


def case_result(case: ConformanceCase, checks: Sequence[Check]) -> ConformanceResult:
    values = [c.max_abs for c in checks if not c.quantity.startswith("grad/")]
    grads = [c.max_abs for c in checks if c.quantity.startswith("grad/")]
    problems = [c.problem for c in checks if c.problem]
    if problems:
        shown = problems[:3]
        more = f"\n... and {len(problems) - 3} more failing quantities" if len(problems) > 3 else ""
        message = "\n".join(shown) + more
        if case.divergence:
            message += f"\n(tolerance loosened for a known upstream divergence: {case.divergence})"
    else:
        message = (
            f"{len(checks)} comparisons over {case.samples} samples within rtol={case.rtol:g}, "
            f"atol={case.atol:g} [{case.id}]"
        )
    return ConformanceResult(
        case_id=case.id,
        component=case.component,
        variant=case.variant,
        samples=case.samples,
        max_abs_err=max(values, default=0.0),
        max_grad_abs_err=max(grads, default=0.0),
        passed=not problems,
        message=message,
    )
