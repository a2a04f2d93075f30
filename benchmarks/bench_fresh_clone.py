"""The README's first command as a new user meets it, at two commits side by side.

    python benchmarks/bench_fresh_clone.py BASELINE_COMMIT [--now HEAD] [--rounds 2]

Each commit is cloned fresh and installed as the command says (``python3 -m venv .venv``, then
``.venv/bin/pip install -e '.[upstream]'``: no other extra); then its audit,
``.venv/bin/pytest --verl-corpus`` as written, runs cold (an empty user cache and runtime folder,
no pytest cache) and warm (the same again). The two clones alternate round by round, so a drift of
the machine's speed falls on both. Round 1's cold run is the clone's very first: Python compiles
our modules as it imports them. Prints one line per run and a table of the medians; the clones
are removed at the end.
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
SIDES = ("baseline", "now")


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def clone_and_install(commit: str, folder: Path) -> None:
    """A fresh clone of ``commit`` with the README's first command's install."""
    git("clone", "-q", str(REPO), str(folder))
    git("checkout", "-q", git("rev-parse", commit), cwd=folder)
    subprocess.run(["python3", "-m", "venv", ".venv"], cwd=folder, check=True)
    subprocess.run(
        [".venv/bin/pip", "install", "-q", "-e", ".[upstream]"],
        cwd=folder,
        check=True,
        capture_output=True,
    )


def audit(clone: Path, env: dict[str, str]) -> float:
    """One ``pytest --verl-corpus`` in the clone: its wall seconds."""
    start = time.perf_counter()
    done = subprocess.run(
        [".venv/bin/pytest", "--verl-corpus"], cwd=clone, env=env, capture_output=True, text=True
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(
            f"the audit failed in {clone}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    return seconds


def cold_and_warm(clone: Path) -> tuple[float, float]:
    """The audit with an empty user cache and runtime folder, then again with them filled."""
    cache, runtime = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
    # As a user's shell and CI: bytecode is written, no pinned upstream inputs in the environment.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VERL_UPSTREAM", "PYTHONDONT"))}
    env.update(XDG_CACHE_HOME=str(cache), XDG_RUNTIME_DIR=str(runtime))
    shutil.rmtree(clone / ".pytest_cache", ignore_errors=True)
    try:
        return audit(clone, env), audit(clone, env)
    finally:
        # The warm templates a cold run may leave end with their runtime folder.
        shutil.rmtree(runtime, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("baseline", help="the baseline commit")
    parser.add_argument("--now", default="HEAD", help="the commit measured against it")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-fresh-clone-"))
    try:
        clones = dict(zip(SIDES, (work / "baseline", work / "now"), strict=True))
        for side, commit in zip(SIDES, (args.baseline, args.now), strict=True):
            clone_and_install(commit, clones[side])
        times: dict[str, list[tuple[float, float]]] = {side: [] for side in SIDES}
        for round_ in range(1, args.rounds + 1):
            for side in SIDES:
                cold, warm = cold_and_warm(clones[side])
                times[side].append((cold, warm))
                commit = git("rev-parse", "--short", "HEAD", cwd=clones[side])
                print(f"round {round_}, {side} ({commit}): cold {cold:.2f} s, warm {warm:.2f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(f"| README command 1's audit, fresh clone | {args.baseline} | {args.now} | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for index, run in enumerate(("cold", "warm")):
        before, now = (statistics.median(t[index] for t in times[side]) for side in SIDES)
        print(
            f"| {run} (median of {args.rounds}) | {before:.1f} s | {now:.1f} s | {now / before:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
