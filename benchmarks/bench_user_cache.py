"""Commands a user repeats with new questions, side by side with a baseline checkout: what the
user cache keeps between runs besides each case's own results (Hydra's bases, the entry points,
the read census's static facts).

    python benchmarks/bench_user_cache.py --baseline /tmp/before [--reps 2]

Each command runs as a user runs it, ``python -m pytest_verl_compat.cli …`` in a fresh process
(``PYTHONPATH`` puts the checkout's package first; the same interpreter, verl and Hydra for both),
twice per repetition with the same fresh ``$XDG_CACHE_HOME``:

- ``cold``: the empty user cache;
- ``again, new question``: the cache the cold run left, asked what it has not answered yet (a
  ``--set`` value of its own per run, so no case result of the cold run is reused; ``explain`` of
  another key), which is where the kept bases, entry points and census facts pay.

The two checkouts alternate; the table gives each command's median seconds and now/before. No
command asks verl's oracle (``--no-upstream-checks``, and explain's traced reads are the
recorded ones of each checkout).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_UPSTREAM = Path(
    os.environ.get("VERL_UPSTREAM") or REPO.parent / "shared/upstream/verl-v0.9.0"
)
SCRIPT = "examples/grpo_trainer/run_qwen3_8b_fsdp.sh"
# (name, the command's arguments for the cold run, for the run again); {upstream} is the tree.
COMMANDS = (
    (
        "check SCRIPT --set (one script)",
        ["check", SCRIPT, "--no-upstream-checks", "--set", "data.train_batch_size=96"],
        ["check", SCRIPT, "--no-upstream-checks", "--set", "data.train_batch_size=80"],
    ),
    (
        "check examples/ --format sarif (109 scripts)",
        ["check", "examples", "--format", "sarif", "--no-upstream-checks"],
        [
            "check",
            "examples",
            "--format",
            "sarif",
            "--no-upstream-checks",
            "--set",
            "trainer.total_epochs=3",
        ],
    ),
    (
        "explain KEY grpo",
        [
            "-q",
            "--upstream",
            "{upstream}",
            "explain",
            "actor_rollout_ref.actor.kl_loss_coef",
            "grpo",
        ],
        ["-q", "--upstream", "{upstream}", "explain", "actor_rollout_ref.actor.clip_ratio", "grpo"],
    ),
)


def run(checkout: Path, work: Path, cache: Path, args: list[str], upstream: Path) -> float:
    env = {
        **os.environ,
        "PYTHONPATH": str(checkout),
        "XDG_CACHE_HOME": str(cache),
        "VERL_UPSTREAM": str(upstream),
    }
    argv = [a.replace("{upstream}", str(upstream)) for a in args]
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_verl_compat.cli", *argv],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{checkout}: {' '.join(argv)} exited {proc.returncode}:\n{proc.stderr}")
    return elapsed


def measure(checkout: Path, upstream: Path) -> dict[str, tuple[float, float]]:
    times: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder) / "work"
        shutil.copytree(upstream / "examples", work / "examples")
        for name, cold, again in COMMANDS:
            cache = Path(folder) / f"cache-{len(times)}"
            first = run(checkout, work, cache, cold, upstream)
            times[name] = (first, run(checkout, work, cache, again, upstream))
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout to compare with")
    parser.add_argument("--upstream", type=Path, default=DEFAULT_UPSTREAM)
    parser.add_argument("--reps", type=int, default=2)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, tuple[float, float]]]] = {"before": [], "now": []}
    for _ in range(args.reps):
        runs["before"].append(measure(args.baseline.resolve(), args.upstream))
        runs["now"].append(measure(REPO, args.upstream))
    print(f"medians of {args.reps} runs each, alternating; seconds")
    print(f"| command | run | before ({args.baseline.name}) | now | now/before |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, _, _ in COMMANDS:
        for index, label in enumerate(("cold", "again, new question")):
            before = statistics.median(r[name][index] for r in runs["before"])
            now = statistics.median(r[name][index] for r in runs["now"])
            print(f"| `{name}` | {label} | {before:.1f} | {now:.1f} | {now / before:.2f}× |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
