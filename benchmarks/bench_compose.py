"""Composition speed, side by side: upstream's entry point, a Hydra app, Hydra in-process, ours.

    python benchmarks/bench_compose.py [--upstream PATH] [--reps N] [--scripts 200] [--skip-entry-point]

Prints per-case medians and ratios, the 16-case audit cold (a pytest subprocess) and warm
(in-process), and a synthetic corpus of generated launch scripts (time per 50 and peak RSS).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_UPSTREAM = Path(
    os.environ.get("VERL_UPSTREAM") or REPO.parent / "shared/upstream/verl-v0.9.0"
)
ENTRY_POINT = (sys.executable, "-m", "verl.trainer.main_ppo", "--cfg", "job", "--resolve")
HYDRA_APP = textwrap.dedent(
    """
    import hydra
    from omegaconf import OmegaConf

    @hydra.main(config_path={config_dir!r}, config_name="ppo_trainer", version_base=None)
    def main(cfg):
        print(OmegaConf.to_yaml(cfg, resolve=True))

    main()
    """
)


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_of(fn: Callable[[], Any], reps: int) -> float:
    return statistics.median(timed(fn) for _ in range(reps))


def run(cmd: Sequence[str], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]}... exited {proc.returncode}:\n{proc.stderr[-2000:]}")


def official_fields() -> dict[str, list[str]]:
    out = {}
    for path in sorted((REPO / "golden/compose").glob("*.json")):
        out[path.stem] = json.loads(path.read_text())["explicit_fields"]
    return out


def bench_per_case(upstream: Path, reps: int, entry_point: bool) -> list[dict[str, Any]]:
    from pytest_verl_compat.pipeline.compose import Composer

    config_dir = upstream / "verl/trainer/config"
    variables = {"HOME": "/home/verl"}
    fast = Composer(config_dir, "ppo_trainer")
    hydra_in_process = Composer(config_dir, "ppo_trainer", fast=False)
    first_base = timed(lambda: fast.compose([], variables))
    print(f"override-free base composed once in {first_base:.3f} s (in-process memo)")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONHASHSEED": "0", **variables}
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-compose-") as tmp:
        app = Path(tmp) / "app.py"
        app.write_text(HYDRA_APP.format(config_dir=str(config_dir)))
        for index, (case, fields) in enumerate(official_fields().items()):
            row: dict[str, Any] = {"case": case}
            if entry_point and index < 2:
                row["entry_point"] = timed(
                    lambda f=fields: run(
                        [*ENTRY_POINT, *f],
                        cwd=Path(tmp),
                        env=env,
                    )
                )
            if index < 2:
                row["hydra_app"] = median_of(
                    lambda f=fields: run(
                        [sys.executable, str(app), "--cfg", "job", "--resolve", *f],
                        cwd=Path(tmp),
                        env=env,
                    ),
                    max(1, reps // 2),
                )
            row["hydra_in_process"] = median_of(
                lambda f=fields: hydra_in_process.compose(f, variables), reps
            )
            # First call for this case: parse of its override strings not memoised yet.
            row["ours_first"] = timed(lambda f=fields: fast.compose(f, variables))
            row["ours_warm"] = median_of(lambda f=fields: fast.compose(f, variables), reps * 3)
            rows.append(row)
    return rows


def audit_cold(upstream: Path) -> float:
    cmd = [sys.executable, "-m", "pytest", "--verl-corpus", f"--verl-corpus-upstream={upstream}"]
    cmd += ["--verl-corpus-trusted=off", "-p", "no:cacheprovider", "-q"]
    cmd += ["-k", "not conformance and not verdict"]
    return timed(lambda: run(cmd, cwd=REPO))


def audit_warm(upstream: Path, reps: int) -> tuple[float, float, int]:
    """(first in-process pass, median of later passes, cases) through AuditSession."""
    from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession

    def one_pass() -> int:
        session = AuditSession.start(AuditOptions(upstream=str(upstream)))
        assert session.manifest is not None, session.manifest_error
        for case in session.cases:
            # `outcome` runs the read stage (the launch reader) and then composes.
            session.outcome(case)
            session.compile(case)
            golden = json.loads(session.golden_path(case).read_text())
            payload = json.loads(json.dumps(session.golden_payload(case)))
            if payload != golden:
                raise AssertionError(f"{case.id}: snapshot differs from golden")
        return len(session.cases)

    first = timed(one_pass)
    cases = one_pass()
    warm = median_of(one_pass, reps)
    return first, warm, cases


KNOBS = {
    "NNODES": [1, 2, 4],
    "TRAIN_BATCH_SIZE": [256, 512, 1024, 2048],
    "PPO_MINI_BATCH_SIZE": [64, 128, 256],
    "MAX_PROMPT_LENGTH": [512, 1024, 2048],
    "MAX_RESPONSE_LENGTH": [1024, 2048, 4096],
}
MODELS = ["Qwen/Qwen3-8B", "Qwen/Qwen2.5-7B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"]


def synthetic_corpus(upstream: Path, count: int, folder: Path) -> list[tuple[Path, dict[str, str]]]:
    """Copies of the official scripts with other `${X:-default}` defaults and other env values."""
    from pytest_verl_compat.pipeline.manifest import load_manifest

    manifest = load_manifest(REPO / "corpus/manifest.yaml")
    scripts = sorted({c.launch for c in manifest.cases if c.launch and c.kind == "official"})
    out = []
    for index in range(count):
        source = upstream / scripts[index % len(scripts)]
        text = source.read_text()
        for offset, (name, values) in enumerate(sorted(KNOBS.items())):
            pick = str(values[(index + offset) % len(values)])
            text = re.sub(rf"\$\{{{name}:-[^}}]*\}}", f"${{{name}:-{pick}}}", text)
        path = folder / f"{index:03d}_{source.name}"
        path.write_text(text)
        env = {"HOME": f"/home/user{index % 7}", "MODEL_PATH": MODELS[index % len(MODELS)]}
        out.append((path, env))
    return out


def bench_synthetic(upstream: Path, count: int) -> dict[str, Any]:
    from pytest_verl_compat.bash import read_launch
    from pytest_verl_compat.model import Bindings
    from pytest_verl_compat.pipeline.compile import compile_resolved
    from pytest_verl_compat.pipeline.compose import Composer
    from pytest_verl_compat.pipeline.manifest import load_manifest
    from pytest_verl_compat.pipeline.profile import DEFAULT_PROFILE, load_profile

    manifest = load_manifest(REPO / "corpus/manifest.yaml")
    substitutions = dict(manifest.cases[0].bindings.substitutions)
    composer = Composer(upstream / "verl/trainer/config", "ppo_trainer")
    profile = load_profile(manifest.profile or DEFAULT_PROFILE)
    marks: dict[int, float] = {}
    rss: dict[int, float] = {}
    outcomes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="bench-corpus-") as tmp:
        corpus = synthetic_corpus(upstream, count, Path(tmp))
        start = time.perf_counter()
        for index, (path, env) in enumerate(corpus, start=1):
            read = read_launch(path, Bindings(variables=env, substitutions=substitutions))
            composition = composer.compose(read.argv, env)
            if composition.composed:
                report = compile_resolved(
                    composition.resolved,
                    case_id=path.stem,
                    profile=profile,
                    explicit_fields=read.argv,
                )
                outcomes[report.outcome] = outcomes.get(report.outcome, 0) + 1
            else:
                outcomes[composition.outcome] = outcomes.get(composition.outcome, 0) + 1
            if index % 50 == 0:
                marks[index] = time.perf_counter() - start
                rss[index] = _current_rss_mib()
        total = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "total": total,
        "marks": marks,
        "rss": rss,
        "outcomes": outcomes,
        "peak_rss_mib": peak_kib / 1024,
    }


def _current_rss_mib() -> float:
    """Resident memory now (Linux), to show that it stays flat as the corpus grows."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", type=Path, default=DEFAULT_UPSTREAM)
    parser.add_argument("--reps", type=int, default=3, help="repetitions per measured median")
    parser.add_argument("--scripts", type=int, default=200, help="synthetic launch scripts")
    parser.add_argument("--skip-entry-point", action="store_true", help="skip (a), ~15 s a case")
    parser.add_argument("--skip-cold", action="store_true", help="skip the cold pytest audit")
    args = parser.parse_args(argv)
    upstream = args.upstream.resolve()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, upstream {upstream}")

    rows = bench_per_case(upstream, args.reps, not args.skip_entry_point)
    header = ["case", "entry_point", "hydra_app", "hydra_in_process", "ours_first", "ours_warm"]
    print("\nper-case median seconds (a) entry point (b) Hydra app subprocess (c) Hydra in-process")
    print("(d) ours, first call and warm")
    print(" | ".join(f"{h:>16}" for h in header) + " | in-process/ours | entry/ours")
    for row in rows:
        cells = [f"{row['case']:>16}"] + [
            f"{row[h]:>16.4f}" if h in row else f"{'-':>16}" for h in header[1:]
        ]
        ratio = row["hydra_in_process"] / row["ours_warm"]
        entry = f"{row['entry_point'] / row['ours_warm']:>9.0f}x" if "entry_point" in row else "-"
        print(" | ".join(cells) + f" | {ratio:>14.1f}x | {entry}")
    hydra_med = statistics.median(r["hydra_in_process"] for r in rows)
    ours_med = statistics.median(r["ours_warm"] for r in rows)
    first_med = statistics.median(r["ours_first"] for r in rows)
    entries = [r["entry_point"] for r in rows if "entry_point" in r]
    print(
        f"median over cases: Hydra in-process {hydra_med:.3f} s, ours warm {ours_med:.4f} s "
        f"({hydra_med / ours_med:.1f}x), ours first call {first_med:.4f} s "
        f"({hydra_med / first_med:.1f}x)"
    )
    if entries:
        entry_med = statistics.median(entries)
        print(f"entry point {entry_med:.1f} s: {entry_med / ours_med:.0f}x ours warm")

    first, warm, cases = audit_warm(upstream, args.reps)
    print(f"\n{cases}-case audit in-process: first pass {first:.2f} s, warm {warm:.3f} s")
    if not args.skip_cold:
        cold = audit_cold(upstream)
        print(f"{cases}-case audit cold (pytest subprocess): {cold:.2f} s")

    synthetic = bench_synthetic(upstream, args.scripts)
    marks = ", ".join(
        f"{n}: {t:.2f} s, {synthetic['rss'][n]:.0f} MiB"
        for n, t in sorted(synthetic["marks"].items())
    )
    print(
        f"\nsynthetic corpus of {args.scripts} scripts: {synthetic['total']:.2f} s "
        f"({marks}); outcomes {synthetic['outcomes']}; peak RSS {synthetic['peak_rss_mib']:.0f} MiB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
