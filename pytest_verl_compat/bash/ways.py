"""Every way a script can go at the conditions only the running system decides.

:func:`read_launch_ways` reads a script as :func:`read_launch` does; where a condition whose
ways part is met (a file test, a program looked up, a run-time value tested: ``LaunchForked``),
it reads the script again down each way (``Bindings.conditions``), depth first, the way where
the test succeeds first. Each way ends in a read or in the refusal of that way (``exit 1``
before the launcher, a run-time value that reaches a size); ways that all launch the same are
one read. Past ``MAX_WAYS`` ways it stops
with one line naming the conditions: a script whose launch depends on so many run-time tests
is read with bindings instead. Nothing is run: every way is the reader's own evaluation.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from pytest_verl_compat.bash.entry_points import EntryModules
from pytest_verl_compat.bash.errors import LaunchForked, LaunchReadError
from pytest_verl_compat.bash.interpreter import Carry, read_launch
from pytest_verl_compat.bash.results import LaunchRead, TakenCondition
from pytest_verl_compat.bash.scope import SourceScope
from pytest_verl_compat.model import Bindings

# Ways followed at most: each is read, composed and checked on its own.
MAX_WAYS = 8


@dataclass(frozen=True)
class Way:
    """One way through the script: the conditions it took, its bindings, and what it reads."""

    conditions: tuple[TakenCondition, ...]
    bindings: Bindings
    read: LaunchRead | None = None
    error: LaunchReadError | None = None

    def said(self) -> str:
        """``when [ -d "$HOME/models/Qwen" ] (line 2) is true``; empty for the only way."""
        return "when " + " and ".join(c.said() for c in self.conditions) if self.conditions else ""


def read_launch_ways(
    path: str | os.PathLike[str],
    bindings: Bindings,
    *,
    scope: SourceScope | None = None,
    entry_modules: EntryModules = None,
    carry: Carry | None = None,
    max_ways: int = MAX_WAYS,
) -> tuple[Way, ...]:
    """Each way the script goes at its undecidable conditions whose ways part; one way (with
    no condition) when there are none. Bound conditions are taken as bound. A refusal that is
    not a way's own (unreadable file, syntax) is raised as :func:`read_launch` raises it."""
    ways: list[Way] = []
    met: dict[str, LaunchForked] = {}
    pending: list[dict[str, bool]] = [{}]
    while pending:
        choices = pending.pop()
        chosen = replace(bindings, conditions={**bindings.conditions, **choices})
        try:
            read = read_launch(path, chosen, scope=scope, entry_modules=entry_modules, carry=carry)
        except LaunchForked as fork:
            if fork.key in choices or len(ways) + len(pending) + 2 > max_ways:
                raise _too_many(fork, met, max_ways) from None
            met[fork.key] = fork
            pending.append({**choices, fork.key: False})
            pending.append({**choices, fork.key: True})
            continue
        except LaunchReadError as exc:
            if not choices:
                raise
            ways.append(Way(_taken(choices, met), chosen, error=exc))
            continue
        ways.append(Way(read.conditions, chosen, read=read))
    reads = [replace(way.read, conditions=()) for way in ways if way.read is not None]
    if len(reads) == len(ways) and all(read == reads[0] for read in reads):
        # Every way launches the same (`[ -f x ] && echo small || echo large`): one read.
        return (Way((), bindings, read=reads[0]),)
    return tuple(ways)


def _taken(choices: dict[str, bool], met: dict[str, LaunchForked]) -> tuple[TakenCondition, ...]:
    """The conditions a way that ended in a refusal took, in the order they were met."""
    return tuple(
        TakenCondition(key, met[key].text, met[key].path, met[key].line or 0, value)
        for key, value in choices.items()
    )


def _too_many(fork: LaunchForked, met: dict[str, LaunchForked], max_ways: int) -> LaunchReadError:
    lines = ", ".join(str(f.line) for f in [*met.values(), fork])
    return LaunchReadError(
        fork.path,
        fork.line,
        "run-time conditions",
        f"the tests on lines {lines} are only decided where the script runs and lead to more "
        f"than {max_ways} different launches; bind the values they test (--env NAME=VALUE, "
        "--subst COMMAND OUTPUT) or check each way's script",
    )
