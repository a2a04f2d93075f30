"""Runs inside the sandbox (``python -I -m``): upstream's entry points on many argvs in one process.

Reads a JSON list on stdin, each item an argv or ``{"module", "argv", "search_path"}``, and runs
the module (default ``verl.trainer.main_ppo``) as ``__main__`` (``runpy``, what ``python -m``
does) once per argv with ``--cfg job --resolve``, importing verl's packages once. A search path
its config names relative to the working directory (``file://verl/trainer/config``: the launch
runs from a verl checkout's root) is given as that folder of the installed verl.
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

DEFAULT_MODULE = "verl.trainer.main_ppo"


def _decorated_main(config_dir: str, config_name: str) -> None:
    """What ``python -m MODULE --cfg job`` prints for a module that does not import here (it
    imports a package verl does not require: main_generation_server's ``openai``): Hydra's own
    ``hydra.main`` with the module's decorator arguments (its config folder and name, read from
    its source by the entry-point registry), on a task that never runs (with ``--cfg`` Hydra
    prints the composed config instead of running the task, hydra/_internal/utils.py:403-410)."""
    from pathlib import Path

    import hydra
    import verl

    site = Path(verl.__file__).parent.parent

    @hydra.main(config_path=str(site / config_dir), config_name=config_name, version_base=None)
    def main(_: Any) -> None:
        raise RuntimeError("--cfg job never runs the task")

    main()


def run_one(
    argv: list[str],
    module: str = DEFAULT_MODULE,
    search_path: tuple[str, ...] = (),
    decorator: tuple[str, str] | None = None,
) -> dict[str, Any]:
    import runpy
    from pathlib import Path

    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    out, err = io.StringIO(), io.StringIO()
    searching = []
    if search_path:
        import verl

        site = Path(verl.__file__).parent.parent
        folders = ",".join(f"file://{site / folder}" for folder in search_path)
        searching = [f"hydra.searchpath=[{folders}]"]
    # The search path after the argv: an option of the argv (--config-name) after a positional
    # override would end argparse's positional run (Hydra parses overrides as one nargs="*").
    sys.argv = [module.rsplit(".", 1)[-1] + ".py", "--cfg", "job", "--resolve", *argv, *searching]
    code = 0
    via = ""
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            try:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            except ImportError as exc:
                if decorator is None:
                    raise
                via = f"{module} does not import here ({type(exc).__name__}: {exc})"
                GlobalHydra.instance().clear()
                _decorated_main(*decorator)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except ImportError as exc:
            # The module imports a package verl does not require (main_generation_server:
            # openai), absent where the oracle runs: said, and the other launches still run.
            name = type(exc).__name__
            return {
                "code": 1,
                "stdout": "",
                "error": f"{module} does not import here: {name}: {exc}",
            }
    # Hydra's message is the first line that is not a warning (logged or from `warnings`).
    noise = ("Warning:", "warnings.warn(", "WARNING:", "HYDRA_FULL_ERROR")
    lines = [
        line
        for line in err.getvalue().splitlines()
        if line.strip() and not any(mark in line for mark in noise)
    ]
    chosen = lines[0] if lines else ""
    return {"code": code, "stdout": out.getvalue(), "error": chosen, "via": via}


def main() -> int:
    items = json.loads(sys.stdin.read())
    results = [
        run_one(item)
        if isinstance(item, list)
        else run_one(
            item["argv"],
            item["module"],
            tuple(item.get("search_path", ())),
            tuple(item["decorator"]) if item.get("decorator") else None,
        )
        for item in items
    ]
    sys.stdout.write(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
