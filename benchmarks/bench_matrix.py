"""``verl-compat matrix`` wall time, cold and warm, on the official cases and the 109 examples.

    python benchmarks/bench_matrix.py [--upstream PATH] [--skip-examples]

Each row is one ``verl-compat matrix`` subprocess on all five releases, in a fresh user cache
folder (``XDG_CACHE_HOME``) prepared three ways:

(a) ``cold``: nothing cached: the four release trees fetched with pip, every cell composed,
    upstream's own checks asked of a fresh oracle;
(b) ``--no-cache``: trees and upstream's answers cached, every cell composed again;
(c) ``warm``: the second run, every cell from the cache.

Prints wall seconds and the ratio to (a); the three JSON reports must be byte-identical.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(cache: Path, upstream: str, out: Path, *args: str) -> float:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    start = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_verl_compat.cli",
            "--upstream",
            upstream,
            "matrix",
            *args,
            "--format",
            "json",
            "--out",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"matrix failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return seconds


def bench(name: str, upstream: str, *args: str) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-matrix-") as folder:
        cache, base = Path(folder) / "cache", Path(folder)
        cold = run(cache, upstream, base / "cold.json", *args)
        uncached = run(cache, upstream, base / "uncached.json", *args, "--no-cache")
        run(cache, upstream, base / "fill.json", *args)  # --no-cache wrote nothing; fill it
        warm = run(cache, upstream, base / "warm.json", *args)
        reports = {p.name: p.read_bytes() for p in base.glob("*.json")}
        assert len(set(reports.values())) == 1, "the reports differ"
    for label, seconds in (("cold", cold), ("--no-cache", uncached), ("warm", warm)):
        print(f"| {name} | {label} | {seconds:.1f} s | {seconds / cold:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--upstream",
        default=os.environ.get("VERL_UPSTREAM") or str(REPO.parent / "shared/upstream/verl-v0.9.0"),
    )
    parser.add_argument("--skip-examples", action="store_true")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("| scripts | run | wall | ratio to cold |")
    print("| --- | --- | ---: | ---: |")
    bench("7 official cases", args.upstream, "--official")
    if not args.skip_examples:
        bench("109 v0.9.0 examples", args.upstream, "--examples")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
