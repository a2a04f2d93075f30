"""The default audit's upstream checks, side by side: one process per case (before) vs the oracle.

    python benchmarks/bench_audit.py [--skip-baseline] [--skip-audit]

(a) ``baseline``: upstream's entry point once per corpus case, each its own sandboxed
    ``python -I -m verl.trainer.main_ppo --cfg job --resolve`` (what the trusted stage did);
(b) ``oracle``: every case through one ``UpstreamOracle`` process (verl imported once), and
    through its two workers forked after that import;
(c) ``audit``: the README's first command, ``pytest --verl-corpus``, cold (no pytest cache), on the
    embedded default, with the trusted stage on and, for reference, off.
Prints wall seconds and the ratio to the baseline. Results are equal case by case, or it fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def corpus_fields() -> list[tuple[str, list[str], dict[str, str]]]:
    """Every composed case's explicit fields (from the golden files) and its variables."""
    from pytest_verl_compat.pipeline.manifest import default_manifest_path, load_manifest

    manifest = load_manifest(default_manifest_path())
    golden = Path(manifest.golden_dir or REPO / "golden") / "compose"
    out = []
    for case in manifest.cases:
        path = golden / f"{case.id}.json"
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("resolved") is not None:
                out.append((case.id, data["explicit_fields"], dict(case.bindings.variables)))
    return out


def baseline(cases: list[tuple[str, list[str], dict[str, str]]]) -> tuple[float, dict[str, Any]]:
    import yaml

    from pytest_verl_compat.upstream.oracle.client import ENTRY_MODULE, entry_argv
    from pytest_verl_compat.upstream.oracle.runner import referenced_variables, run_module

    start = time.perf_counter()
    results = {}
    for case_id, fields, variables in cases:
        run = run_module(
            ENTRY_MODULE,
            ["--cfg", "job", "--resolve", *entry_argv(fields)],
            variables=referenced_variables(fields, variables),
        )
        results[case_id] = yaml.safe_load(run.stdout) if run.returncode == 0 else run.stderr_tail(3)
    return time.perf_counter() - start, results


def oracle(
    cases: list[tuple[str, list[str], dict[str, str]]], workers: int
) -> tuple[float, dict[str, Any]]:
    import yaml

    from pytest_verl_compat.upstream.oracle.client import UpstreamOracle, compose_request
    from pytest_verl_compat.upstream.oracle.runner import referenced_variables

    start = time.perf_counter()
    from pytest_verl_compat.conformance.plan import pinned_version

    process = UpstreamOracle(workers, release=pinned_version())
    requests = {
        case_id: compose_request(fields, referenced_variables(fields, variables))
        for case_id, fields, variables in cases
    }
    for case_id, request in requests.items():
        process.submit(case_id, request)
    results = {}
    for case_id, request in requests.items():
        answer = process.answer(case_id, request)
        results[case_id] = yaml.safe_load(answer["stdout"]) if answer["ok"] else answer["error"]
    process.close()
    return time.perf_counter() - start, results


def audit(*extra: str) -> float:
    env = {k: v for k, v in os.environ.items() if k not in {"VERL_UPSTREAM", "PYTEST_ADDOPTS"}}
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "--verl-corpus",
                "-q",
                "-p",
                "no:cacheprovider",
                *extra,
            ],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        seconds = time.perf_counter() - start
    if run.returncode != 0:
        raise SystemExit(f"pytest --verl-corpus failed:\n{run.stdout[-2000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--skip-audit", action="store_true")
    args = parser.parse_args()
    cases = corpus_fields()
    rows: list[tuple[str, float]] = []
    base_seconds = None
    if not args.skip_baseline:
        base_seconds, base_results = baseline(cases)
        rows.append((f"(a) baseline: {len(cases)} entry-point processes", base_seconds))
    oracle_seconds, oracle_results = oracle(cases, 1)
    rows.append((f"(b) oracle: {len(cases)} cases, one process", oracle_seconds))
    forked_seconds, forked_results = oracle(cases, 2)
    rows.append((f"    oracle: {len(cases)} cases, two forked workers", forked_seconds))
    if forked_results != oracle_results:
        raise SystemExit("the oracle's two workers and its single process disagree")
    if not args.skip_baseline and base_results != oracle_results:
        differ = sorted(k for k in base_results if base_results[k] != oracle_results.get(k))
        raise SystemExit(f"oracle and baseline disagree on {differ}")
    if not args.skip_audit:
        rows.append(("(c) pytest --verl-corpus, cold, trusted on", audit()))
        rows.append(
            ("    pytest --verl-corpus, cold, trusted off", audit("--verl-corpus-trusted=off"))
        )
    print(f"{'what':52} {'seconds':>8} {'vs (a)':>8}")
    for label, seconds in rows:
        ratio = f"{seconds / base_seconds:8.3f}" if base_seconds else f"{'-':>8}"
        print(f"{label:52} {seconds:8.1f} {ratio}")
    print(f"cpus: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}")
    # Set in some sandboxes; it makes every run recompile pytest's assertion-rewritten modules.
    print(f"PYTHONDONTWRITEBYTECODE: {os.environ.get('PYTHONDONTWRITEBYTECODE', 'unset')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
