"""What the commands say besides their output: notes, progress, and how much of it.

Requested output goes to stdout and errors to stderr always. Notes ("wrote drift.json") and the
progress of a slow step go to stderr at the level ``--quiet`` / ``--verbose`` set, through the
standard ``logging`` machinery: ``--quiet`` leaves errors only; the default adds notes and, on a
terminal, a line for a step still running after a second (a cold ``check`` waits ~5 s for verl's
import); ``--verbose`` announces every step as it starts and its time when it ends.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterator

_LOG = logging.getLogger("pytest_verl_compat.cli")
# A step is announced (on a terminal) once it has taken this long: a warm answer stays silent.
PROGRESS_AFTER_SECONDS = 1.0
LEVELS = {-1: logging.WARNING, 0: logging.INFO, 1: logging.DEBUG}


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a message is emitted (pytest's capture swaps it)."""

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _: object) -> None:
        pass


def configure_output(verbosity: int) -> None:
    """``-1`` (``--quiet``), ``0`` or ``1`` (``--verbose``)."""
    _LOG.setLevel(LEVELS[max(-1, min(1, verbosity))])


_HANDLER = _Stderr()
_HANDLER.setFormatter(logging.Formatter("%(message)s"))
_LOG.addHandler(_HANDLER)
_LOG.propagate = False
configure_output(0)


def _prefixed(command: str, message: str) -> str:
    return f"verl-compat {command}: {message}" if command else f"verl-compat: {message}"


def note(command: str, message: str) -> None:
    """A message the user may want but need not read (``--quiet`` drops it)."""
    _LOG.info(_prefixed(command, message))


def detail(command: str, message: str) -> None:
    """A message for ``--verbose`` only."""
    _LOG.debug(_prefixed(command, message))


@contextlib.contextmanager
def waiting(command: str, what: str) -> Iterator[None]:
    """Run a step that may be slow: say what it waits for once it has run a second (on a
    terminal), or at once with ``--verbose``, which also says how long it took."""
    started = time.monotonic()
    timer: threading.Timer | None = None
    if _LOG.isEnabledFor(logging.DEBUG):
        note(command, f"{what}...")
    elif _LOG.isEnabledFor(logging.INFO) and sys.stderr.isatty():
        timer = threading.Timer(PROGRESS_AFTER_SECONDS, note, (command, f"{what}..."))
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
        detail(command, f"{what}: {time.monotonic() - started:.1f} s")
