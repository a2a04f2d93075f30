"""The step stage's cost: the reference trainer against verl 0.9.0's own engine steps, side by side.

Every step case (`pytest_verl_compat/conformance/step/`, `corpus/step.yaml`) in each of its
optimizer variants: the tiny Qwen2 on one CPU thread per process, from the same weights and the
same fixed rollouts; upstream is verl's V1 path (`engine_workers` over the FSDP engine) in one
subprocess for every one-rank case and one process per rank for the two-rank case. Per case it
prints each side's seconds of the no-gradient passes (old/reference log-probs, values,
advantages) and of the updates (critic then actor), summed over the case's steps, and the
largest actor-weight difference after the last step (the oracle's check); then the stage's wall
time, split into upstream's subprocesses (verl's import and model building included) and our
side. `--baseline DIR --baseline-python PY` instead times `pytest --verl-corpus
--verl-corpus-step -k test_step` in a source tree of an earlier commit and in this one,
alternating, as the before/after of `benchmarks/README.md`; PY is an interpreter whose path
puts that tree before this venv's packages (the sandboxed upstream subprocess, `python -I`,
ignores PYTHONPATH), see `benchmarks/README.md`.

    python benchmarks/bench_step.py [--cases ppo,step/two-ranks,...] [--json FILE]
    python benchmarks/bench_step.py --baseline /tmp/base --baseline-python /tmp/base-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _stage_seconds(tree: Path, python: str) -> float:
    """Wall seconds of the plugin's step stage run by `python` from `tree`."""
    started = time.perf_counter()
    done = subprocess.run(
        [
            python,
            "-m",
            "pytest",
            "--verl-corpus",
            "--verl-corpus-step",
            "--verl-corpus-trusted=off",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "-q",
            "-k",
            "test_step",
        ],
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - started
    last = (done.stdout.strip().splitlines() or ["?"])[-1]
    print(f"  {tree}: {seconds:.1f} s  ({last})", flush=True)
    return seconds


def main() -> int:
    from pytest_verl_compat.conformance.step.cases import step_cases
    from pytest_verl_compat.conformance.step.run import compare_case, run_upstream
    from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
    from pytest_verl_compat.upstream.oracle.runner import run_module

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cases", help="comma-separated step case ids (default: every one)")
    parser.add_argument("--json", help="also write the timings and the report to FILE")
    parser.add_argument("--baseline", help="a source tree of an earlier commit to time instead")
    parser.add_argument("--baseline-python", help="the interpreter that runs --baseline's tree")
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs per tree")
    args = parser.parse_args()

    if args.baseline:
        times: dict[str, list[float]] = {"baseline": [], "this tree": []}
        for _ in range(args.repeats):
            times["baseline"].append(_stage_seconds(Path(args.baseline), args.baseline_python))
            times["this tree"].append(_stage_seconds(HERE.parent, sys.executable))
        medians = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"stage wall time, median of {args.repeats}: baseline {medians['baseline']:.1f} s, "
            f"this tree {medians['this tree']:.1f} s "
            f"({medians['this tree'] / medians['baseline']:.2f}x)"
        )
        return 0

    session = AuditSession.start(AuditOptions(manifest=None, upstream=None))
    cases = step_cases(session, args.cases.split(",") if args.cases else None)
    timings: dict[str, dict[str, dict[str, float]]] = {}
    report: dict[str, dict[str, object]] = {}
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        started = time.perf_counter()
        upstream = run_upstream(cases, run_module, Path(tmp))
        upstream_wall = time.perf_counter() - started
        started = time.perf_counter()
        for case in cases:
            for variant in case.variants:
                entry = compare_case(upstream, case, variant, timings=timings)
                report.setdefault(case.id, {})[variant] = entry
        ours_wall = time.perf_counter() - started

    header = (
        f"{'case.variant':<52} {'ours passes':>11} {'verl passes':>11} {'ours update':>11} "
        f"{'verl update':>11} {'ratio':>6} {'max|dW|':>9}"
    )
    print(header)
    print("-" * len(header))
    totals = {"ours": 0.0, "upstream": 0.0}
    for key in sorted(timings):
        case_id, variant = key.rsplit(".", 1)
        case_id = case_id.replace("__", "/")
        ours, up = timings[key]["ours"], timings[key]["upstream"]
        mine = ours["pass_seconds"] + ours["update_seconds"]
        theirs = up["pass_seconds"] + up["update_seconds"]
        totals["ours"] += mine
        totals["upstream"] += theirs
        rows = report[case_id][variant]
        assert isinstance(rows, dict)
        last = max((q for q in rows if q.split("@")[0] == "actor"), default="actor")
        print(
            f"{key:<52} {ours['pass_seconds']:>10.3f}s {up['pass_seconds']:>10.3f}s "
            f"{ours['update_seconds']:>10.3f}s {up['update_seconds']:>10.3f}s "
            f"{theirs / max(mine, 1e-9):>5.1f}x {rows[last]['max_abs_diff']:>9.1e}"
        )
    print("-" * len(header))
    print(
        f"{'steps only':<52} ours {totals['ours']:.2f} s, verl's engine {totals['upstream']:.2f} s "
        f"({totals['upstream'] / max(totals['ours'], 1e-9):.1f}x)"
    )
    print(
        f"{'stage wall':<52} upstream subprocesses {upstream_wall:.1f} s "
        f"(imports and model building included), ours {ours_wall:.1f} s"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"timings": timings, "report": report}, sort_keys=True, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
