"""The oracle process itself (see ``oracle.py``): verl imported once, one answer per question.

Run only through ``oracle.UpstreamOracle`` (``python -I -m`` in an empty folder with an
allow-listed environment). It trusts no sender: every argv is checked again before Hydra sees it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from pytest_verl_compat.upstream import validate
from pytest_verl_compat.upstream.oracle import ENTRY_MODULE, EntryArgvRefused, entry_argv
from pytest_verl_compat.upstream.runner import safe_variables


def _compose(entry: Any, request: Mapping[str, Any]) -> dict[str, Any]:
    argv = entry_argv(request["argv"])  # checked again here: this side trusts no sender
    saved_argv, saved_environ = sys.argv, dict(os.environ)
    os.environ.update(safe_variables(request.get("env")))
    sys.argv = ["main_ppo.py", "--cfg", "job", "--resolve", *argv]
    printed, errors = io.StringIO(), io.StringIO()
    status: Any = 0
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(errors):
            entry.main()
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


def serve() -> None:
    """Answer one JSON question per stdin line on the original stdout, until stdin closes."""
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # anything upstream prints outside a request goes to stderr, not the protocol
    validate.install_stand_ins()
    entry = __import__(ENTRY_MODULE, fromlist=["main"])
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["kind"] == "compose":
                answer = _compose(entry, request)
            elif request["kind"] == "checks":
                answer = validate.checks_one(request["mapping"])
            else:
                answer = validate.validate_one(request["mapping"])
        except EntryArgvRefused as exc:
            answer = {"ok": False, "error": f"refused: {exc}"}
        except Exception as exc:  # one bad question must not end the audit's other answers
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        answers.write(json.dumps({"id": request["id"], **answer}) + "\n")
        answers.flush()


if __name__ == "__main__":
    serve()
