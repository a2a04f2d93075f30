"""``verl-compat check`` and the default audit with the deeper probes, side by side with a baseline.

    python benchmarks/bench_check.py [--baseline TREE --baseline-python PYTHON] [--repeat N]

Each command runs as a user runs it, in a subprocess, cold (an empty ``$XDG_CACHE_HOME`` and a new
pytest cache folder: verl is imported and every probe runs) and then warm (the answers cached):

- ``check SCRIPT``: one official example script (run_qwen3_8b_fsdp.sh of GRPO);
- ``check SCRIPT --no-upstream-checks``: the static checks alone, for the probes' share;
- ``check SFT_SCRIPT``: one official SFT script (gsm8k's run_qwen2_5_0_5b_fsdp.sh, its two
  documented arguments bound: torchrun's 8 ranks and a save folder), beside the GRPO one (a
  baseline without SFT verdicts answers it at once, so compare it with ``check SCRIPT``);
- ``pytest --verl-corpus``: the README's first command on the embedded default.

With ``--baseline``, the same commands run on another checkout of this project (an earlier
commit, e.g. ``git worktree add /tmp/before 96209b5``) with its own interpreter, taking turns
with this tree's on each command, so both see the same machine load; the table gives each time and the ratio
now / baseline. Then the probes' phases are timed one by one inside one process
(``--phases``): config load, trainer construction, the first step, the effects.
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
SCRIPT = "examples/grpo_trainer/run_qwen3_8b_fsdp.sh"
SFT_SCRIPT = "examples/sft/gsm8k/run_qwen2_5_0_5b_fsdp.sh"
SFT_ARGS = ["--arg", "8", "--arg", "/home/verl/ckpt/sft_gsm8k"]


def _releases_home() -> str:
    """Where the releases' environments are kept: installed once, like verl itself, so "cold"
    is an empty answer cache, not an environment built again (``files.cache.releases_home``)."""
    from pytest_verl_compat.files.cache import releases_home

    return os.environ.get("VERL_COMPAT_HOME") or str(releases_home())


def _run(python: str, tree: Path, args: list[str], cache: Path) -> float:
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(cache / "xdg"),
        "VERL_COMPAT_HOME": _releases_home(),
    }
    start = time.perf_counter()
    done = subprocess.run(
        [python, *args], cwd=tree, env=env, capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - start
    if done.returncode == 2 and "unrecognized arguments" in done.stderr:
        return float("nan")  # the baseline has no such option: "nan" in the table
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(args)} in {tree} exited {done.returncode}:\n{done.stderr}")
    return seconds


def commands(upstream: Path, cache: Path) -> dict[str, list[str]]:
    cli = ["-m", "pytest_verl_compat.cli", "--upstream", str(upstream)]
    return {
        "check SCRIPT": [*cli, "check", str(upstream / SCRIPT)],
        "check SCRIPT --no-upstream-checks": [
            *cli,
            "check",
            str(upstream / SCRIPT),
            "--no-upstream-checks",
        ],
        "check SFT_SCRIPT": [*cli, "check", str(upstream / SFT_SCRIPT), *SFT_ARGS],
        "pytest --verl-corpus": [
            "-m",
            "pytest",
            "--verl-corpus",
            f"--verl-corpus-upstream={upstream}",
            "-p",
            "no:randomly",
            # The README's first command runs where only the `upstream` extra is installed: the
            # test extra's pytest plugins (hypothesis alone imports in ~0.6 s) are not there.
            "-p",
            "no:hypothesispytest",
            "-p",
            "no:xdist",
            "-q",
            "-o",
            f"cache_dir={cache / 'pytest'}",
        ],
    }


def measure(
    sides: list[tuple[str, Path]], upstream: Path, repeat: int
) -> list[dict[str, tuple[float, float]]]:
    """(cold, warm) seconds per command for each (python, tree) side, medians over ``repeat``
    fresh caches; the sides take turns on each command, so that both see the same machine load
    (a shared machine's load moves by minutes)."""
    out: list[dict[str, tuple[float, float]]] = [{} for _ in sides]
    for name in commands(upstream, Path("/")):
        runs: list[tuple[list[float], list[float]]] = [([], []) for _ in sides]
        for _ in range(repeat):
            for (python, tree), (colds, warms) in zip(sides, runs, strict=True):
                cache = Path(tempfile.mkdtemp(prefix="bench-check-"))
                try:
                    args = commands(upstream, cache)[name]
                    colds.append(_run(python, tree, args, cache))
                    warms.append(_run(python, tree, args, cache))
                finally:
                    shutil.rmtree(cache, ignore_errors=True)
        for side, (colds, warms) in zip(out, runs, strict=True):
            side[name] = (statistics.median(colds), statistics.median(warms))
    return out


def phases(upstream: Path) -> list[tuple[str, float]]:
    """The probes' phases on the GRPO script's mapping, timed in one process of the release's own
    environment (verl imported there)."""
    from pytest_verl_compat.conformance.plan import pinned_version
    from pytest_verl_compat.upstream.oracle.runner import release_interpreter

    interpreter = release_interpreter(pinned_version())  # the embedded corpus's release
    code = f"""
import json, time, warnings
warnings.simplefilter("ignore")
from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
from pytest_verl_compat.upstream.verdict.case import explicit_keys
session = AuditSession.start(AuditOptions(upstream={str(upstream)!r}))
case = session.case_for_script(session.upstream.root / {SCRIPT!r})
mapping = session.outcome(case).composition.mapping
explicit = list(explicit_keys(session, case))
t = time.perf_counter()
import verl.trainer.main_ppo, verl.workers.engine_workers, verl.trainer.ppo.v1.trainer_base
import_s = time.perf_counter() - t
from pytest_verl_compat.upstream.probes.validate import timed_phases
print(json.dumps([["import verl", import_s], *timed_phases(mapping, explicit)]))
"""
    assert interpreter.python is not None and interpreter.checker is not None
    done = subprocess.run(
        [
            interpreter.python,
            "-c",
            f"import sys; sys.path.insert(0, {interpreter.checker!r})\n{code}",
        ],
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    import json

    return [(name, float(seconds)) for name, seconds in json.loads(done.stdout.splitlines()[-1])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", default=os.environ.get("VERL_UPSTREAM", ""))
    parser.add_argument("--baseline", type=Path, help="another checkout of this project")
    parser.add_argument("--baseline-python", default="", help="the baseline's interpreter")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--phases", action="store_true", help="also time the probes' phases")
    args = parser.parse_args()
    upstream = Path(args.upstream).resolve()
    if not (upstream / SCRIPT).is_file():
        raise SystemExit("--upstream (or $VERL_UPSTREAM): a verl v0.9.0 checkout")
    print(f"machine load before: {os.getloadavg()[0]:.1f}")
    sides = [(sys.executable, REPO)]
    if args.baseline is not None:
        sides.append((args.baseline_python or sys.executable, args.baseline))
    measured = measure(sides, upstream, args.repeat)
    now = measured[0]
    before = measured[1] if len(measured) > 1 else None
    print()
    print(
        "| command | now cold | now warm | baseline cold | baseline warm | cold ratio | warm ratio |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, (cold, warm) in now.items():
        if before is not None:
            b_cold, b_warm = before[name]
            print(
                f"| `{name}` | {cold:.1f} s | {warm:.1f} s | {b_cold:.1f} s | {b_warm:.1f} s | "
                f"{cold / b_cold:.2f}× | {warm / b_warm:.2f}× |"
            )
        else:
            print(f"| `{name}` | {cold:.1f} s | {warm:.1f} s | | | | |")
    if args.phases:
        print()
        print("| probe phase (GRPO script, one process) | seconds |")
        print("| --- | ---: |")
        for name, seconds in phases(upstream):
            print(f"| {name} | {seconds:.2f} |")
    print(f"\nmachine load after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
