"""``verl-compat fit`` side by side with ``check`` on the same script, cold and warm.

    python benchmarks/bench_fit.py [--upstream PATH] [--repeat N]

Each command runs as a user runs it, in a subprocess of this interpreter: cold (an empty
``$XDG_CACHE_HOME``: the first run after an install, upstream's answers and Python's bytecode
caches to make) once, then warm (the same cache) ``--repeat`` times, of which the median is
reported with the ratio to ``check SCRIPT --no-upstream-checks`` (what ``fit`` reads the script
with: read, compose, resolve) and to ``check SCRIPT`` (with upstream's own early checks):

- ``check SCRIPT --no-upstream-checks`` and ``check SCRIPT``: the official GRPO example;
- ``fit SCRIPT --gpu H100``: the forecast, its fixes forecast again, the text table;
- ``fit SCRIPT --gpu RTX4090``: a run that does not fit (every finding's fixes re-forecast);
- ``fit SCRIPT --gpu H100 --format json`` and ``--plot PNG`` (matplotlib imported and drawn);
- ``check SCRIPT --gpu H100``: check with the forecast's findings.

The issue's bar: ``fit`` under 2 s warm on one script; ``check`` without ``--gpu`` as before
(it does not load the forecast: tests/test_fit_cli.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = "examples/grpo_trainer/run_qwen3_8b_fsdp.sh"
BAR_SECONDS = 2.0


def _run(args: list[str], cache: Path, cwd: Path) -> float:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest_verl_compat.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"verl-compat {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
    return seconds


def commands(script: Path, picture: Path) -> dict[str, list[str]]:
    s = str(script)
    return {
        "check SCRIPT --no-upstream-checks": ["check", s, "--no-upstream-checks"],
        "check SCRIPT": ["check", s],
        "fit SCRIPT --gpu H100": ["fit", s, "--gpu", "H100"],
        "fit SCRIPT --gpu RTX4090": ["fit", s, "--gpu", "RTX4090"],
        "fit SCRIPT --gpu H100 --format json": ["fit", s, "--gpu", "H100", "--format", "json"],
        "fit SCRIPT --gpu H100 --plot PNG": ["fit", s, "--gpu", "H100", "--plot", str(picture)],
        "check SCRIPT --gpu H100": ["check", s, "--gpu", "H100"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--upstream",
        default=os.environ.get("VERL_UPSTREAM"),
        help="a verl v0.9.0 checkout (default: $VERL_UPSTREAM)",
    )
    parser.add_argument("--repeat", type=int, default=5, help="warm runs per command")
    args = parser.parse_args()
    if not args.upstream:
        parser.error("give --upstream PATH or set $VERL_UPSTREAM")
    script = Path(args.upstream) / SCRIPT
    with tempfile.TemporaryDirectory(prefix="bench-fit-") as folder:
        root = Path(folder)
        table = commands(script, root / "fit.png")
        rows = []
        for name, argv in table.items():
            cache = root / f"cache-{len(rows)}"
            cold = _run(argv, cache, root)
            warm = statistics.median(_run(argv, cache, root) for _ in range(args.repeat))
            rows.append((name, cold, warm))
    static = next(warm for name, _, warm in rows if name == "check SCRIPT --no-upstream-checks")
    full = next(warm for name, _, warm in rows if name == "check SCRIPT")
    print(f"{'command':40} {'cold s':>7} {'warm s':>7} {'/ static check':>15} {'/ check':>8}")
    for name, cold, warm in rows:
        print(f"{name:40} {cold:7.2f} {warm:7.2f} {warm / static:15.2f} {warm / full:8.2f}")
    fit = next(warm for name, _, warm in rows if name == "fit SCRIPT --gpu H100")
    verdict = "under" if fit < BAR_SECONDS else "OVER"
    print(f"\nfit warm: {fit:.2f} s, {verdict} the {BAR_SECONDS:.0f} s bar")
    return 0 if fit < BAR_SECONDS else 1


if __name__ == "__main__":
    raise SystemExit(main())
