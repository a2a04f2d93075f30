"""Runs inside the sandbox (``python -I -m``): upstream's entry point on many argvs in one process.

Reads a JSON list of argvs on stdin and runs ``verl.trainer.main_ppo`` as ``__main__`` (``runpy``,
what ``python -m`` does) once per argv with ``--cfg job --resolve``, importing verl's packages once.
Running it as ``__main__`` matters: Hydra then resolves a relative ``--config-path`` against the
module's file, not its package (hydra/_internal/utils.py:51-59 and :129-137). Prints one JSON list: per argv, the printed job config or the last line
of what Hydra reported before exiting.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from typing import Any


def run_one(argv: list[str]) -> dict[str, Any]:
    import runpy

    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["main_ppo.py", "--cfg", "job", "--resolve", *argv]
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module("verl.trainer.main_ppo", run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    # Hydra's message is the first line that is not a warning (logged or from `warnings`).
    noise = ("Warning:", "warnings.warn(", "WARNING:", "HYDRA_FULL_ERROR")
    lines = [
        line
        for line in err.getvalue().splitlines()
        if line.strip() and not any(mark in line for mark in noise)
    ]
    chosen = lines[0] if lines else ""
    return {"code": code, "stdout": out.getvalue(), "error": chosen}


def main() -> int:
    argvs = json.loads(sys.stdin.read())
    results = [run_one(argv) for argv in argvs]
    sys.stdout.write(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
