"""The oracle process itself (see ``oracle.py``): verl imported once, one answer per question.

Run only through ``oracle.UpstreamOracle`` (``python -I -m`` in an empty folder with an
allow-listed environment). It trusts no sender: every argv is checked again before Hydra sees it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import importlib
import io
import json
import multiprocessing
import os
import sys
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

from pytest_verl_compat.upstream.oracle.client import (
    ENTRY_MODULE,
    KEY_UNSUPPORTED,
    PROCESS_MODULE,
    EntryArgvRefused,
    entry_argv,
)
from pytest_verl_compat.upstream.oracle.runner import safe_variables
from pytest_verl_compat.upstream.probes import validate
from pytest_verl_compat.upstream.probes.patching import PatchPointMissing, release_module_missing


def _entry_module(entry: Any, request: Mapping[str, Any]) -> tuple[Any, list[str]]:
    """The entry point a ``compose`` question names (the pinned one by default), imported once,
    and the search path override its config needs; only an ``@hydra.main`` module of the
    installed verl is ever imported (``pipeline.entry_points``), whatever the sender asks."""
    module = request.get("module") or ENTRY_MODULE
    if module == ENTRY_MODULE:
        return entry, []
    import verl

    from pytest_verl_compat.pipeline.entry_points import by_module, scan

    site = Path(verl.__file__).resolve().parents[1]
    known = by_module(scan(site))
    if module not in known:
        raise EntryArgvRefused(f"{module!r}: not an entry point of the installed verl")
    found = known[module]
    searching = []
    if found.cwd_relative:
        folders = ",".join(f"file://{site / folder}" for folder in found.search_path)
        searching = [f"hydra.searchpath=[{folders}]"]
    if module not in _ENTRIES:
        _ENTRIES[module] = importlib.import_module(module)
    return _ENTRIES[module], searching


def _compose(entry: Any, request: Mapping[str, Any]) -> dict[str, Any]:
    argv = entry_argv(request["argv"])  # checked again here: this side trusts no sender
    module, searching = _entry_module(entry, request)
    saved_argv, saved_environ = sys.argv, dict(os.environ)
    os.environ.update(safe_variables(request.get("env")))
    name = str(getattr(module, "__name__", ENTRY_MODULE)).rsplit(".", 1)[-1]
    sys.argv = [f"{name}.py", "--cfg", "job", "--resolve", *searching, *argv]
    printed, errors = io.StringIO(), io.StringIO()
    status: Any = 0
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(errors):
            module.main()
    except SystemExit as exc:  # Hydra reports an invalid config by exiting 1
        status = exc.code
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_environ)
    if status in (0, None):
        return {"ok": True, "stdout": printed.getvalue()}
    tail = "\n".join(errors.getvalue().strip().splitlines()[-12:])
    return {"ok": False, "error": f"exit status {status}:\n{tail}"}


def _answer(entry: Any, request: Mapping[str, Any]) -> dict[str, Any]:
    try:
        if request["kind"] == "compose":
            answer = _compose(entry, request)
        elif request["kind"] == "checks":
            answer = validate.checks_one(
                request["mapping"],
                request.get("watch"),
                request.get("explicit") or [],
                entry=request.get("entry"),
                world_size=request.get("world_size"),
            )
        elif request["kind"] in _SERVED:
            answer = _SERVED[request["kind"]](request)
        else:
            answer = validate.validate_one(request["mapping"])
    except EntryArgvRefused as exc:
        answer = {"ok": False, "error": f"refused: {exc}"}
    except PatchPointMissing as exc:  # the release lacks what the probes need: said as such
        answer = _unsupported(exc)
    except ModuleNotFoundError as exc:
        missing = release_module_missing(exc)
        answer = _unsupported(missing) if missing else {"ok": False, "error": f"{exc!r}"}
    except Exception as exc:  # one bad question must not end the audit's other answers
        answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"id": request["id"], **answer}


def _unsupported(exc: PatchPointMissing) -> dict[str, Any]:
    return {"ok": False, KEY_UNSUPPORTED: str(exc), "error": str(exc)}


_ENTRY: Any = None  # the imported entry point, set before the workers fork
# The other entry points a question named, imported at its first question.
_ENTRIES: dict[str, Any] = {}
# Questions of other kinds, answered by the modules named with --serve (their ORACLE_HANDLERS).
_SERVED: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {}


def _load_served(modules: list[str]) -> None:
    """Import each --serve module (only this package's own) and take its handlers; its
    ORACLE_WARM, if any, runs now so that the forked workers share what it imports."""
    for name in modules:
        if not name.startswith("pytest_verl_compat."):
            raise SystemExit(f"--serve {name!r}: not a module of pytest_verl_compat")
        module = importlib.import_module(name)
        _SERVED.update(module.ORACLE_HANDLERS)
        warm = getattr(module, "ORACLE_WARM", None)
        if warm is not None:
            warm()


def _answer_in_worker(request: Mapping[str, Any]) -> dict[str, Any]:
    return _answer(_ENTRY, request)


def prepare() -> Any:
    """What every oracle process does first, and the warm template once for all its children
    (``warm_process``): the stand-ins installed, then the entry point imported (~5-14 s)."""
    validate.install_stand_ins()
    return __import__(ENTRY_MODULE, fromlist=["main"])


def prepare_children() -> None:
    """What each forked child's first answer would otherwise do, done once where processes are
    forked to answer (the warm template, the worker pool): the probes' scan of verl's source
    (``effects.referenced_names``, every file parsed: ~4 s on 2 cores) and the import of the
    modules the trainer's probes patch (``trainer.PATCHED_MODULES``: V1's trainer, the engines,
    Megatron's chain, ~8 s, which the entry point's import does not reach). Both are pure
    functions of the installed files, kept per process; a single process does them when its
    first answer needs them."""
    from pytest_verl_compat.upstream.probes import effects, records, trainer

    effects.referenced_names(records.verl_root())
    for module in trainer.PATCHED_MODULES:
        importlib.import_module(module)


def serve(workers: int = 1, served: list[str] | None = None) -> None:
    """Answer one JSON question per stdin line on the original stdout, until stdin closes.

    With ``workers`` > 1 the questions are answered by that many processes forked after verl is
    imported: they share the import (copy-on-write) and compose on every core the audit leaves
    free, so a second core costs no second ~5 s import. Answers go out as they finish; the
    parent matches them by id.
    """
    global _ENTRY
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # anything upstream prints outside a request goes to stderr, not the protocol
    try:
        _ENTRY = prepare()
        _load_served(served or [])
        if workers > 1:
            prepare_children()
    except ModuleNotFoundError as exc:
        missing = release_module_missing(exc)
        if missing is None:
            raise
        # The release lacks a module the probes import: every question gets that answer.
        for line in sys.stdin:
            answers.write(json.dumps({"id": json.loads(line)["id"], **_unsupported(missing)}))
            answers.write("\n")
            answers.flush()
        return
    # verl's import leaves millions of long-lived objects (torch, transformers, ray); without
    # this every full collection during a compose walks them all, and after a fork it would
    # also copy the pages it touches (the pre-fork-server advice of the gc module's docs).
    gc.freeze()
    if workers <= 1:
        for line in sys.stdin:
            answers.write(json.dumps(_answer(_ENTRY, json.loads(line))) + "\n")
            answers.flush()
        return
    lock = threading.Lock()

    def send(request_id: str, future: Future[dict[str, Any]]) -> None:
        try:
            answer = future.result()
        except Exception as exc:  # a worker died (killed, out of memory): say so for this one
            answer = {"id": request_id, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        with lock:
            answers.write(json.dumps(answer) + "\n")
            answers.flush()

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        for line in sys.stdin:
            request = json.loads(line)
            future = pool.submit(_answer_in_worker, request)
            future.add_done_callback(functools.partial(send, request["id"]))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog=PROCESS_MODULE)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--serve", action="append", default=[], metavar="MODULE")
    args = parser.parse_args(argv)
    serve(args.workers, args.serve)


if __name__ == "__main__":
    main(sys.argv[1:])
