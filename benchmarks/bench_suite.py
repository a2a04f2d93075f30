"""The project's test suite, by file, side by side with a baseline checkout's, in one invocation.

    python benchmarks/bench_suite.py --baseline /tmp/before --baseline-python /tmp/before-venv/bin/python
    python benchmarks/bench_suite.py --baseline ... --baseline-python ... --rounds 2
    python benchmarks/bench_suite.py --junit-now now.xml --junit-before before.xml   # tables only

Each suite runs as CI runs it (``python -m pytest -n 2``, CI=true, its own fresh user cache and
runtime folder, VERL_UPSTREAM and VERL_UPSTREAM_091 beside the checkout), one after the other on
the same machine, with ``--junitxml``; with ``--rounds N`` the two checkouts alternate N times, so
a drift of the machine's speed (seen here at 1.5-2x within a day) falls on both. The table gives
each test file's summed test time from the last round (both xdist workers' tests: wall time is
about half); then each run's wall time, the machine's busy CPU time over it (``/proc/stat``: the
suite's own processes, its subprocesses and anything else running) and its tests' outcomes.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "upstream"


def busy_cpu_seconds() -> float | None:
    """The machine's busy CPU time so far (every core, every process), or None off Linux."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def run_suite(python: str, tree: Path, junit: Path) -> tuple[float, float | None]:
    """The suite of ``tree`` with ``python``: its wall seconds and the machine's busy CPU seconds."""
    cache = Path(tempfile.mkdtemp(prefix="bench-suite-"))
    runtime = Path(tempfile.mkdtemp(prefix="bench-suite-run-"))
    env = {
        **os.environ,
        "CI": "true",
        "XDG_CACHE_HOME": str(cache),
        # A runtime folder per run, as .ci/run makes: no warm template outlives its run.
        "XDG_RUNTIME_DIR": str(runtime),
        "VERL_UPSTREAM": str(SHARED / "verl-v0.9.0"),
        "VERL_UPSTREAM_091": str(SHARED / "verl-v0.9.1"),
    }
    # Bytecode is written as CI writes it (.ci/run unsets this).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cpu_start, start = busy_cpu_seconds(), time.perf_counter()
    try:
        subprocess.run(
            [
                python,
                "-m",
                "pytest",
                "-n",
                "2",
                "-q",
                "-p",
                "no:cacheprovider",
                f"--junitxml={junit}",
            ],
            cwd=tree,
            env=env,
            check=False,
            stdout=subprocess.DEVNULL,
        )
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
    wall, cpu_end = time.perf_counter() - start, busy_cpu_seconds()
    return wall, (cpu_end - cpu_start if cpu_start is not None and cpu_end is not None else None)


def outcomes(junit: Path) -> str:
    """The run's tests by outcome, from the counts pytest writes on the JUnit file's suite."""
    suite = next(ET.parse(junit).iter("testsuite")).attrib
    counts = {kind: int(suite.get(kind, 0)) for kind in ("failures", "errors", "skipped")}
    passed = int(suite.get("tests", 0)) - sum(counts.values())
    return ", ".join(f"{n} {kind}" for kind, n in {"passed": passed, **counts}.items() if n)


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:04.1f} s"


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
    parser.add_argument("--rounds", type=int, default=1, help="before/now pairs, alternating")
    args = parser.parse_args()
    runs: list[tuple[str, float, float | None, str]] = []
    out = Path(tempfile.mkdtemp(prefix="bench-suite-junit-"))
    now_xml = args.junit_now or out / "now.xml"
    before_xml = args.junit_before or out / "before.xml"
    for _ in range(args.rounds):
        if args.baseline is not None and args.junit_before is None:
            wall, cpu = run_suite(args.baseline_python, args.baseline, before_xml)
            runs.append(("before", wall, cpu, outcomes(before_xml)))
        if args.junit_now is None:
            wall, cpu = run_suite(sys.executable, REPO, now_xml)
            runs.append(("now", wall, cpu, outcomes(now_xml)))
    for line in table(by_file(now_xml), by_file(before_xml)):
        print(line)
    print()
    print("| run | wall | busy CPU | tests |")
    print("| --- | ---: | ---: | --- |")
    for name, wall, cpu, tests in runs:
        print(
            f"| {name} | {minutes(wall)} | {f'{cpu:.0f} s' if cpu is not None else '-'} | {tests} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
