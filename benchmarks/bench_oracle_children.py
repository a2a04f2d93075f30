"""New questions for upstream's oracle while its warm template runs, side by side with a baseline:
what a child forked from the template pays for its first answer.

    python benchmarks/bench_oracle_children.py --baseline /tmp/before \\
        --baseline-python /tmp/before-venv/bin/python [--reps 2] [--questions 3]

The sandboxed oracle runs ``python -I -m …`` (``upstream/runner.py``), which ignores
``PYTHONPATH``: the baseline's interpreter must put that checkout before this venv's packages,
a venv whose ``.pth`` lists the checkout, then this venv's ``site-packages`` (as for
``bench_step.py``, see ``benchmarks/README.md``):

    git worktree add /tmp/before COMMIT
    python3 -m venv --without-pip /tmp/before-venv
    printf '/tmp/before\\n%s\\n' "$PWD/.venv/lib/python3.11/site-packages" \\
        > /tmp/before-venv/lib/python3.11/site-packages/before.pth
    ln -s "$PWD/.venv/bin/shfmt" /tmp/before-venv/bin/  # the reader's shfmt, beside python

Per checkout and repetition, a fresh ``$XDG_CACHE_HOME`` and ``$XDG_RUNTIME_DIR`` (so its own
warm template): ``check SCRIPT --set LR`` once to start the template (``first``), then
``--questions`` more with a learning rate of their own each (``again``: every one a question no
answer holds, answered by a child the template forks). The checkouts alternate; the table gives
the medians of each command's wall seconds. The templates end with their runtime folders.
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
KEY = "actor_rollout_ref.actor.optim.lr"


def check(python: str, work: Path, env: dict[str, str], lr: str) -> float:
    start = time.perf_counter()
    proc = subprocess.run(
        [python, "-m", "pytest_verl_compat.cli", "check", SCRIPT, "--set", f"{KEY}={lr}"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 1) or "valid for verl 0.9.0: yes" not in proc.stderr:
        raise SystemExit(
            f"{python}: check --set {KEY}={lr} exited {proc.returncode}:\n{proc.stderr}"
        )
    return elapsed


def measure(python: str, checkout: Path, upstream: Path, questions: int) -> tuple[float, float]:
    """(the first check's seconds, the median of the next ones')."""
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder) / "work"
        shutil.copytree(upstream / "examples", work / "examples")
        runtime = Path(folder) / "runtime"
        runtime.mkdir(mode=0o700)
        env = {
            **os.environ,
            "PYTHONPATH": str(checkout),
            "XDG_CACHE_HOME": str(Path(folder) / "cache"),
            "XDG_RUNTIME_DIR": str(runtime),
        }
        env.pop("VERL_UPSTREAM", None)  # the installed verl's tree, as the oracle's
        first = check(python, work, env, "3e-6")
        again = [check(python, work, env, f"{n + 4}e-6") for n in range(questions)]
    # Removing the runtime folder removed the template's socket: it ends (upstream/warm.py).
    return first, statistics.median(again)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout to compare with")
    parser.add_argument("--baseline-python", required=True, help="see the module's docstring")
    parser.add_argument("--upstream", type=Path, default=DEFAULT_UPSTREAM)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--questions", type=int, default=3)
    args = parser.parse_args()
    sides = {
        "before": (args.baseline_python, args.baseline.resolve()),
        "now": (sys.executable, REPO),
    }
    runs: dict[str, list[tuple[float, float]]] = {"before": [], "now": []}
    for _ in range(args.reps):
        for side, (python, checkout) in sides.items():
            runs[side].append(measure(python, checkout, args.upstream, args.questions))
    print(f"medians of {args.reps} runs each, alternating; wall seconds")
    print(f"| `check SCRIPT --set {KEY}=…` | before ({args.baseline.name}) | now | now/before |")
    print("| --- | ---: | ---: | ---: |")
    for index, label in enumerate(("first (starts the template)", "a new question, template warm")):
        before = statistics.median(r[index] for r in runs["before"])
        now = statistics.median(r[index] for r in runs["now"])
        print(f"| {label} | {before:.1f} | {now:.1f} | {now / before:.2f}× |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
