"""Running the step oracle: every case's upstream step in one subprocess, ours in process, compared.

`run_steps` takes the accepted cases' lowered configs and a runner (the plugin passes
`pytest_verl_compat.upstream.runner.run_module`, the one place allowed to start upstream code;
this layer may not import it). It writes the shared models, starts
``python -I -m pytest_verl_compat.conformance.step_upstream`` once for all cases and both
optimizer variants (verl is imported once), then runs our step per case and compares.
Upstream's step depends only on a case's step settings (`step_plan.upstream_key`), so cases
whose settings are equal (a derived case that changes nothing the step reads, e.g. group
filtering, which V1 applies before the batch exists) share one upstream run; ours still runs
per case from that case's own lowered config.
The result is the step report: case → variant → quantity → largest difference, deterministic.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pytest_verl_compat.conformance.step_plan import (
    VARIANTS,
    load_step_tolerances,
    request_json,
    settings_key,
    step_settings,
    upstream_key,
)
from reference_trainer.config import ReferenceTrainerConfig

UPSTREAM_MODULE = "pytest_verl_compat.conformance.step_upstream"


class StepOracleError(RuntimeError):
    """The upstream side did not run (its stderr's tail is the message)."""


def run_steps(
    configs: Mapping[str, ReferenceTrainerConfig],
    run_module: Callable[..., Any],
    *,
    variants: tuple[str, ...] = VARIANTS,
    tolerance_path: Path | None = None,
    timings: dict[str, dict[str, dict[str, float]]] | None = None,
) -> dict[str, Any]:
    """The step report of `configs` (case id → lowered config).

    `timings`, when given, receives per `case.variant` each side's seconds of the no-gradient
    passes (log-probs, values, advantages) and of the updates; they stay out of the report,
    which is deterministic.
    """
    import torch

    from pytest_verl_compat.conformance.step_compare import compare_step, summarise
    from pytest_verl_compat.conformance.step_reference import prepare_models, reference_step

    tolerances = load_step_tolerances(tolerance_path)
    cases = [step_settings(configs[cid], v) for cid in sorted(configs) for v in variants]
    # One upstream run per distinct settings: the first case (in sorted order) names its file.
    runs: dict[str, dict[str, Any]] = {}
    for s in cases:
        runs.setdefault(upstream_key(s), s)
    adapters = {s["lora"]["adapter"]: s["lora"] for s in cases if s["lora"] is not None}
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="verl-step-") as tmp:
        folder = Path(tmp)
        (folder / "models").mkdir()
        (folder / "out").mkdir()
        rollout = prepare_models(folder / "models", [adapters[k] for k in sorted(adapters)])
        run = run_module(
            UPSTREAM_MODULE,
            [str(folder / "out")],
            stdin=request_json(str(folder / "models"), list(runs.values()), rollout),
            timeout=900,
        )
        if run.returncode != 0:
            raise StepOracleError(
                f"upstream step failed (exit {run.returncode}): {run.stderr_tail(5)}"
            )
        mask = torch.zeros(len(rollout["responses"]), max(len(r) for r in rollout["responses"]))
        for i, response in enumerate(rollout["responses"]):
            mask[i, : len(response)] = 1
        for s in cases:
            run_name = settings_key(runs[upstream_key(s)])
            up = torch.load(folder / "out" / f"{run_name}.pt", weights_only=False)
            ours = reference_step(configs[s["case"]], s, folder / "models", rollout)
            table = summarise(compare_step(ours, up, mask, tolerances[s["variant"]]))
            if timings is not None:
                timings[settings_key(s)] = {
                    side: {k: float(r[k]) for k in ("pass_seconds", "update_seconds")}
                    for side, r in (("ours", ours), ("upstream", up))
                }
            report.setdefault(s["case"], {})[s["variant"]] = table
    return report


def case_failures(entry: Mapping[str, Any]) -> list[str]:
    """The failing quantities of one case's report entry, as `variant.quantity (diff, where)`."""
    return [
        f"{variant}.{quantity} (max |diff| {row['max_abs_diff']:.3g}"
        + (f" at {row['worst']}" if row["worst"] else "")
        + ")"
        for variant in sorted(entry)
        for quantity, row in sorted(entry[variant].items())
        if not row["passed"]
    ]


def report_json(report: Mapping[str, Any]) -> str:
    """The report as deterministic JSON (sorted keys, differences rounded to 3 significant digits)."""

    def rounded(value: Any) -> Any:
        if isinstance(value, float):
            return float(f"{value:.3g}")
        if isinstance(value, dict):
            return {k: rounded(v) for k, v in value.items()}
        return value

    return json.dumps(rounded(dict(report)), sort_keys=True, indent=1) + "\n"
