"""One training step: the reference trainer against verl 0.9.0's own engine step, side by side.

Both sides run the step oracle's workload (`pytest_verl_compat/conformance/step_plan.py`): the
tiny Qwen2, 4 prompts x 2 responses, 2 mini-batches of 2 micro-batches, 2 epochs, on one CPU
thread, from the same weights and the same fixed rollout; upstream is verl's V1 path
(`engine_workers` over the FSDP engine) in one subprocess that imports verl once. Per case it
prints the seconds of the no-gradient passes (old/reference log-probs, values, advantages) and
of the updates (critic then actor), each side, and the largest weight difference after the step
(the oracle's check). Model building and imports are not timed. The TRL comparison of a whole
GRPO step is `bench_trainer.py` (see README.md).

    python benchmarks/bench_step.py [--cases ppo,grpo,...] [--variant sgd|adamw] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main() -> int:
    from pytest_verl_compat.conformance.step_run import run_steps
    from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
    from pytest_verl_compat.upstream.runner import run_module

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", help="comma-separated case ids (default: the official cases)")
    parser.add_argument("--variant", default="sgd", choices=["sgd", "adamw"])
    parser.add_argument("--json", help="also write the timings and the report to FILE")
    args = parser.parse_args()

    session = AuditSession.start(AuditOptions(manifest=None, upstream=None))
    wanted = args.cases.split(",") if args.cases else None
    cases = [c for c in session.cases if (c.id in wanted if wanted else c.kind == "official")]
    configs = {c.id: session.reference_config(c) for c in cases}
    timings: dict[str, dict[str, dict[str, float]]] = {}
    report = run_steps(configs, run_module, variants=(args.variant,), timings=timings)

    header = (
        f"{'case':<24} {'ours passes':>11} {'verl passes':>11} {'ours update':>11} "
        f"{'verl update':>11} {'ratio':>6} {'max|dW|':>9}"
    )
    print(header)
    print("-" * len(header))
    totals = {"ours": 0.0, "upstream": 0.0}
    for case_id in sorted(report):
        t = timings[f"{case_id.replace('/', '__')}.{args.variant}"]
        ours, up = t["ours"], t["upstream"]
        totals["ours"] += ours["pass_seconds"] + ours["update_seconds"]
        totals["upstream"] += up["pass_seconds"] + up["update_seconds"]
        ratio = (up["pass_seconds"] + up["update_seconds"]) / max(
            ours["pass_seconds"] + ours["update_seconds"], 1e-9
        )
        moved = report[case_id][args.variant]["actor"]["max_abs_diff"]
        print(
            f"{case_id:<24} {ours['pass_seconds']:>10.3f}s {up['pass_seconds']:>10.3f}s "
            f"{ours['update_seconds']:>10.3f}s {up['update_seconds']:>10.3f}s "
            f"{ratio:>5.1f}x {moved:>9.1e}"
        )
    print("-" * len(header))
    print(
        f"{'total':<24} ours {totals['ours']:.2f}s, verl's engine {totals['upstream']:.2f}s "
        f"({totals['upstream'] / max(totals['ours'], 1e-9):.1f}x)"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"timings": timings, "report": report}, sort_keys=True, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
