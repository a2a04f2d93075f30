"""The reader and the static scans of verl's source, side by side with a baseline checkout.

    python benchmarks/bench_scans.py --baseline /tmp/before [--reps 3]

Each phase runs in a fresh process per checkout (``PYTHONPATH`` puts the checkout's package
first; the same interpreter, verl and Hydra for both), the two checkouts alternating, and the
table gives each phase's median seconds and the ratio now/before:

- ``read examples``: every launch script of ``corpus/examples.yaml`` read once (the reader alone:
  no composition), in one process, after its first read (shfmt's tree cache is cold);
- ``entry points``: the scan of the installed verl for its ``@hydra.main`` modules;
- ``read census``: ``read_census.census`` over main_ppo's default tree, no traced reads;
- ``off-path index``: ``off_path.build`` on the same, after the census (as ``census --reads``).

Nothing here asks the oracle, so neither checkout's recorded answers are read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_UPSTREAM = Path(
    os.environ.get("VERL_UPSTREAM") or REPO.parent / "shared/upstream/verl-v0.9.0"
)

# The phases, timed in one process and printed as JSON (seconds by phase).
PHASES = textwrap.dedent(
    """
    import json, sys, time, warnings
    warnings.simplefilter("ignore")
    from pytest_verl_compat.model import StageFailed, StageUnavailable
    from pytest_verl_compat.pipeline import entry_points
    from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
    from pytest_verl_compat.pipeline.manifest import (
        default_examples_path, default_manifest_path, load_examples, load_manifest)
    from pytest_verl_compat.upstream.census import off_path
    from pytest_verl_compat.upstream.census import reads as read_census

    import pytest_verl_compat
    assert pytest_verl_compat.__file__.startswith(sys.argv[2]), pytest_verl_compat.__file__
    out = {}
    try:  # the verl a checkout reads: the release's own files, or (before them) the installed one
        from pytest_verl_compat.releases.wheels import release_tree
        site = release_tree(load_manifest(default_manifest_path()).upstream.version).root
    except ImportError:
        from pytest_verl_compat.pipeline.pins import installed_verl_root
        site = installed_verl_root()[0]
    start = time.perf_counter()
    entry_points.scan(site)
    out["entry points"] = time.perf_counter() - start
    session = AuditSession.start(AuditOptions(upstream=sys.argv[1]))
    bindings = load_manifest(default_manifest_path()).bindings
    cases = list(load_examples(default_examples_path(), bindings))
    start = time.perf_counter()
    for case in cases:
        try:
            session.read(case)
        except (StageFailed, StageUnavailable):
            pass
    out["read examples"] = time.perf_counter() - start
    trees = {"ppo_trainer": dict(session.composer().compose((), {}).mapping)}
    start = time.perf_counter()
    entries = read_census.census(site, trees, {})
    out["read census"] = time.perf_counter() - start
    start = time.perf_counter()
    off_path.build(site, trees, {}, entries)
    out["off-path index"] = time.perf_counter() - start
    print(json.dumps(out))
    """
)


def measure(checkout: Path, upstream: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(checkout), "VERL_COMPAT_NO_CACHE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", PHASES, str(upstream), str(checkout)],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{checkout}: the phases failed:\n{proc.stderr[-3000:]}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout to compare with")
    parser.add_argument("--upstream", type=Path, default=DEFAULT_UPSTREAM)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"before": [], "now": []}
    for _ in range(args.reps):
        runs["before"].append(measure(args.baseline.resolve(), args.upstream))
        runs["now"].append(measure(REPO, args.upstream))
    print(f"medians of {args.reps} runs each, alternating; seconds")
    print(f"| phase | before ({args.baseline.name}) | now | now/before |")
    print("| --- | ---: | ---: | ---: |")
    for phase in runs["now"][0]:
        before = statistics.median(run[phase] for run in runs["before"])
        now = statistics.median(run[phase] for run in runs["now"])
        print(f"| {phase} | {before:.2f} | {now:.2f} | {now / before:.2f}× |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
