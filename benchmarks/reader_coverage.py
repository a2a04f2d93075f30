"""How many launch scripts the reader reads, per folder, with the refusals by construct.

    python benchmarks/reader_coverage.py                                  # this checkout
    python benchmarks/reader_coverage.py --baseline ../main               # side by side
    python benchmarks/reader_coverage.py --folder v0.8.0=../shared/upstream/verl-v0.8.0/examples
    python benchmarks/reader_coverage.py --exact /tmp/scratch             # and against bash

Every script is read with the embedded manifest's bindings (HOME, the device probe, `date`); the
v0.9.0 examples also with their own bindings from corpus/examples.yaml. `--baseline` runs the
same count with another checkout's package (its own reader) in a subprocess.

`--exact SCRATCH` also compares each script with real bash (tests/bash_oracle.py's sandbox, test
code: bash runs a copy of the script in SCRATCH with nothing real but the pure programs the reader
models): a script counts as exact when the reader reads it, accepting every entry module (verl.*,
recipe.*), and its launch is bash's last one (module, argv, known environment, folder). It runs
with HOME, PATH and PWD bound to the sandbox's, for both.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "upstream"
# Each folder with the scripts to read in it (the user scripts' lib/ holds sourced files).
DEFAULT_FOLDERS = {
    "v0.8.0 examples": SHARED / "verl-v0.8.0" / "examples",
    "v0.9.0 examples": SHARED / "verl-v0.9.0" / "examples",
    "tests/user_scripts": ROOT / "tests" / "user_scripts",
}
PATTERNS = {"tests/user_scripts": "*.sh"}


def count(folders: dict[str, Path]) -> dict[str, dict[str, object]]:
    """Per folder: scripts, read, and refusals by construct (this interpreter's package)."""
    from pytest_verl_compat.bash import LaunchReadError, read_launch
    from pytest_verl_compat.pipeline.manifest import (
        default_examples_path,
        default_manifest_path,
        load_examples,
        load_manifest,
    )

    bindings = load_manifest(default_manifest_path()).bindings
    runs = {
        label: [(path, bindings) for path in sorted(folder.glob(PATTERNS.get(label, "**/*.sh")))]
        for label, folder in folders.items()
        if folder.is_dir()
    }
    upstream = SHARED / "verl-v0.9.0"
    if upstream.is_dir():
        cases = load_examples(default_examples_path(), bindings)
        runs["v0.9.0 examples, examples.yaml bindings"] = [
            (upstream / str(case.launch), case.bindings) for case in cases
        ]
    result: dict[str, dict[str, object]] = {}
    for label, items in runs.items():
        refused: collections.Counter[str] = collections.Counter()
        for path, case_bindings in items:
            try:
                read_launch(path, case_bindings)
            except LaunchReadError as exc:
                refused[exc.construct] += 1
        result[label] = {
            "scripts": len(items),
            "read": len(items) - sum(refused.values()),
            "refused": dict(sorted(refused.items())),
        }
    return result


def exact(folders: dict[str, Path], scratch: Path) -> dict[str, dict[str, object]]:
    """Per folder: scripts read accepting every entry module, and of those, the ones whose
    launch is the one bash runs (module, argv, known environment, folder)."""
    import shutil

    sys.path.insert(0, str(ROOT / "tests"))
    from bash_oracle import run_bash_sandboxed, sandbox

    from pytest_verl_compat.bash import LaunchReadError, read_launch
    from pytest_verl_compat.model import Bindings

    def module_of_file(path: str, cwd: str) -> str | None:
        """`.../verl/x/y.py` as `verl.x.y` (the test's own mapping, so a baseline runs too)."""
        parts = os.path.normpath(os.path.join(cwd, path)).split("/")
        starts = [i for i, part in enumerate(parts[:-1]) if part in ("verl", "recipe")]
        if not path.endswith(".py") or not starts:
            return None
        return ".".join([*parts[starts[-1] : -1], parts[-1][:-3]])

    def is_entry_module(module: str) -> bool:
        return module.split(".")[0] in ("verl", "recipe") and "." in module

    from pytest_verl_compat.pipeline.manifest import default_manifest_path, load_manifest

    base = load_manifest(default_manifest_path()).bindings
    ignored = {"PATH", "PWD", "OLDPWD", "SHLVL", "_"}
    result: dict[str, dict[str, object]] = {}
    for label, folder in folders.items():
        if not folder.is_dir():
            continue
        copy = scratch / label.replace(" ", "_").replace("/", "_")
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(folder, copy / "tree")
        home, work = copy / "home", copy / "work"
        home.mkdir()
        work.mkdir()
        scripts = sorted((copy / "tree").glob(PATTERNS.get(label, "**/*.sh")))
        read = same = 0
        differ: list[str] = []
        for script in scripts:
            original = script.read_bytes()
            programs, _ = sandbox(script.parent.parent)
            variables = {**base.variables, "HOME": str(home)}
            bindings = Bindings(
                {**variables, "PATH": str(programs), "PWD": str(work)}, base.substitutions
            )
            try:
                try:
                    launch = read_launch(script, bindings, entry_modules=lambda module: True)
                except TypeError:  # a baseline reader without entry_modules: main_ppo alone
                    launch = read_launch(script, bindings)
            except LaunchReadError:
                continue
            read += 1
            bash = run_bash_sandboxed(original, script, work, variables, base.substitutions)
            script.write_bytes(original)

            def module(found: object) -> str | None:
                kind, target, cwd = found.kind, found.target, found.cwd  # type: ignore[attr-defined]
                return target if kind == "module" else module_of_file(target, cwd)

            last = bash.last(lambda found: (m := module(found)) is not None and is_entry_module(m))
            ours = {k: v for k, v in launch.exported.items() if k not in ignored}
            theirs = (
                {} if last is None else {k: v for k, v in last.exported.items() if k not in ignored}
            )
            environment = ours.items() <= theirs.items() if launch.unseen else ours == theirs
            if (
                last is not None
                and launch.argv == last.args
                and getattr(launch, "module", "verl.trainer.main_ppo") == module(last)
                and environment
                and (launch.cwd is None or launch.cwd == last.cwd)
            ):
                same += 1
            else:
                differ.append(str(script.relative_to(copy / "tree")))
        result[label] = {"scripts": len(scripts), "read": read, "exact": same, "differ": differ}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--baseline", help="another checkout of this project to compare with")
    parser.add_argument("--folder", action="append", default=[], metavar="LABEL=PATH")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--exact", metavar="SCRATCH", help="also compare with bash in SCRATCH")
    args = parser.parse_args()
    folders = dict(DEFAULT_FOLDERS)
    for item in args.folder:
        label, _, path = item.partition("=")
        folders[label] = Path(path).resolve()
    ours = count(folders)
    if args.json:
        print(json.dumps(ours))
        return 0
    theirs: dict[str, dict[str, object]] = {}
    if args.baseline:
        command = [sys.executable, __file__, "--json"]
        command += [f"--folder={label}={path}" for label, path in folders.items()]
        env = {**os.environ, "PYTHONPATH": str(Path(args.baseline).resolve())}
        theirs = json.loads(
            subprocess.run(command, env=env, capture_output=True, check=True).stdout
        )
    width = max(map(len, ours))
    header = f"{'folder':<{width}}  {'read (this)':>12}"
    print(header + (f"  {'read (baseline)':>16}" if theirs else ""))
    for label, figures in ours.items():
        line = f"{label:<{width}}  {figures['read']:>5} / {figures['scripts']:<4}"
        if label in theirs:
            line += f"  {theirs[label]['read']:>8} / {theirs[label]['scripts']:<5}"
        print(line)
    for label, figures in ours.items():
        print(f"  {label}: refused by construct {figures['refused']}")
    if args.exact:
        print("\nevery entry module, HOME/PATH/PWD bound to the sandbox: read, and exact as bash")
        for label, figures in exact(folders, Path(args.exact)).items():
            print(
                f"{label:<{width}}  {figures['read']:>5} / {figures['scripts']:<4} read"
                f"  {figures['exact']:>5} exact"
            )
            for script in figures["differ"]:  # type: ignore[attr-defined]
                print(f"    differs from bash: {script}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
