"""The SFT step oracle's cost and its differences: ours against verl 0.9.0's SFT trainer steps.

Every case of `corpus/sft_step.yaml` in each optimizer variant, two steps from the same tiny
model and batches (`pytest_verl_compat/conformance/step/sft.py`): verl's side in one sandboxed
subprocess (verl imported once, its `TrainingWorker` per case as `sft_trainer.py` builds it),
ours in this process. Per case and variant it prints the seconds of each side's steps (verl's
building of its worker included on its side, as it is per case) and the largest difference of
any trainable weight after step 1 and step 2 (the oracle's check); then the stage's wall time,
split into upstream's subprocess (verl's import included) and ours.

    python benchmarks/bench_sft_step.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the table as JSON here")
    args = parser.parse_args(argv)

    from pytest_verl_compat.conformance.step.sft import (
        compare_sft_steps,
        load_sft_step_plan,
        reference_sft_steps,
        run_key,
        run_sft_upstream,
        step_batches,
        step_config,
    )
    from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
    from pytest_verl_compat.upstream.oracle.runner import release_runner

    plan = load_sft_step_plan()
    # verl runs in the checked release's own environment (built on first use), as the stage's.
    run_module = release_runner(AuditSession.start(AuditOptions()).version)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-sft-step-") as tmp:
        started = time.perf_counter()
        upstream = run_sft_upstream(plan, run_module, Path(tmp))
        upstream_wall = time.perf_counter() - started
        ours_wall = 0.0
        for case in plan.cases:
            for name, variant in plan.variants.items():
                began = time.perf_counter()
                ours = reference_sft_steps(
                    step_config(case.config, variant),
                    variant,
                    step_batches(plan, case.config),
                    Path(tmp) / "models",
                )
                seconds = time.perf_counter() - began
                ours_wall += seconds
                up = upstream[run_key(case.id, name)]
                results = {
                    r.quantity: r.max_abs_diff
                    for r in compare_sft_steps(ours, up, plan.tolerances[name])
                }
                rows.append(
                    {
                        "case": f"{case.id}.{name}",
                        "ours_s": round(seconds, 3),
                        "verl_s": round(up["seconds"], 3),
                        "max_dW_step1": results["weights"],
                        "max_dW_step2": results["weights@2"],
                        "max_dmetric": max(results["metrics"], results["metrics@2"]),
                    }
                )
    header = f"{'case.variant':<24}{'ours':>9}{'verl':>9}{'max|dW| 1':>12}{'max|dW| 2':>12}"
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row['case']:<24}{row['ours_s']:>8.2f}s{row['verl_s']:>8.2f}s"
            f"{row['max_dW_step1']:>12.1e}{row['max_dW_step2']:>12.1e}"
        )
    print("-" * len(header))
    print(
        f"stage wall: upstream subprocess {upstream_wall:.1f} s (verl's import included), "
        f"ours {ours_wall:.1f} s"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
