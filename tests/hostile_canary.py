"""The hostile-input suite's payload: a canary file that only running attacker-chosen code creates.

Every hostile input in the suite carries ``canary.payload`` (a shell command) or
``canary.python`` (a Python statement) where an attacker would put code. The test then runs
the project on that input and asserts ``not canary.fired()``: if any part of the audit ran the
payload, the canary file exists.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Canary:
    path: Path

    @property
    def payload(self) -> str:
        """A shell command that creates the canary."""
        return f"touch {shlex.quote(str(self.path))}"

    @property
    def python(self) -> str:
        """A Python statement that creates the canary."""
        return f"open({str(self.path)!r}, 'w').close()"

    def fired(self) -> bool:
        return self.path.exists()


def make_canary(folder: Path) -> Canary:
    """A canary in its own folder, outside whatever folder the hostile input lives in."""
    home = folder / "canary"
    home.mkdir(parents=True, exist_ok=True)
    return Canary(home / "FIRED")
