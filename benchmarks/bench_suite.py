"""The project's test suite, by file, side by side with a baseline checkout's, in one invocation.

    python benchmarks/bench_suite.py --baseline /tmp/before --baseline-python /tmp/before-venv/bin/python
    python benchmarks/bench_suite.py --junit-now now.xml --junit-before before.xml   # tables only

Each suite runs as CI runs it (``python -m pytest -n 2``, CI=true, its own fresh user cache,
VERL_UPSTREAM and VERL_UPSTREAM_091 beside the checkout), one after the other on the same
machine, with ``--junitxml``; the table gives each test file's summed test time (both xdist
workers' tests: wall time is about half), the wall time of each whole run, and the ratios.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "upstream"


def run_suite(python: str, tree: Path, junit: Path) -> float:
    """The suite of ``tree`` with ``python``; its wall seconds."""
    cache = Path(tempfile.mkdtemp(prefix="bench-suite-"))
    env = {
        **os.environ,
        "CI": "true",
        "XDG_CACHE_HOME": str(cache),
        "VERL_UPSTREAM": str(SHARED / "verl-v0.9.0"),
        "VERL_UPSTREAM_091": str(SHARED / "verl-v0.9.1"),
    }
    start = time.perf_counter()
    subprocess.run(
        [python, "-m", "pytest", "-n", "2", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"],
        cwd=tree,
        env=env,
        check=False,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def by_file(junit: Path) -> dict[str, float]:
    """Summed test seconds per test file."""
    totals: collections.Counter[str] = collections.Counter()
    for case in ET.parse(junit).iter("testcase"):
        module = ".".join((case.get("classname") or "?").split(".")[:2])
        totals[module] += float(case.get("time") or 0)
    return dict(totals)


def table(now: dict[str, float], before: dict[str, float], limit: int = 40) -> list[str]:
    rows = ["| test file | before | now | ratio |", "| --- | ---: | ---: | ---: |"]
    files = sorted(set(now) | set(before), key=lambda f: -max(now.get(f, 0), before.get(f, 0)))
    for name in files[:limit]:
        a, b = before.get(name), now.get(name)
        ratio = f"{b / a:.2f}x" if a and b else ""
        rows.append(
            f"| `{name}` | {f'{a:.1f} s' if a else '-'} | {f'{b:.1f} s' if b else '-'} | {ratio} |"
        )
    total_a, total_b = sum(before.values()), sum(now.values())
    rows.append(f"| all files | {total_a:.1f} s | {total_b:.1f} s | {total_b / total_a:.2f}x |")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, help="a checkout of an earlier commit")
    parser.add_argument("--baseline-python", default=sys.executable)
    parser.add_argument("--junit-now", type=Path, help="a finished run's JUnit file (no run)")
    parser.add_argument("--junit-before", type=Path, help="the baseline's JUnit file (no run)")
    args = parser.parse_args()
    walls: dict[str, float] = {}
    out = Path(tempfile.mkdtemp(prefix="bench-suite-junit-"))
    now_xml = args.junit_now or out / "now.xml"
    before_xml = args.junit_before or out / "before.xml"
    if args.baseline is not None and args.junit_before is None:
        walls["before"] = run_suite(args.baseline_python, args.baseline, before_xml)
    if args.junit_now is None:
        walls["now"] = run_suite(sys.executable, REPO, now_xml)
    for line in table(by_file(now_xml), by_file(before_xml)):
        print(line)
    for name, seconds in walls.items():
        print(f"{name}: the whole run took {seconds / 60:.1f} min wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
