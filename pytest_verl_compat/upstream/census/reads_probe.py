"""The read census's question, answered in the oracle process (``--serve`` this module).

A ``reads`` question runs every probe of ``check`` on one resolved mapping, as a ``checks``
question does, and answers which configuration keys each line of verl read (the recorder's
``by_line``: ``verl/…py:line`` → the dotted keys). The probes are ``check``'s own, unchanged; the
recorder's table is taken from the probe run's collector, which this handler keeps a handle on
for the duration of the question only.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

KIND = "reads"
KEY_READS = "reads"  # ``verl/…py:line`` → sorted keys read on that line


@contextlib.contextmanager
def _keeping_collectors(made: list[Any]) -> Iterator[None]:
    """``phases.Collector`` records each instance the probe run makes; restored on exit."""
    from pytest_verl_compat.upstream.probes import phases
    from pytest_verl_compat.upstream.probes.records import Collector

    class Keeping(Collector):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    original = getattr(phases, "Collector")  # noqa: B009 - phases imports it, not exports it
    setattr(phases, "Collector", Keeping)  # noqa: B010
    try:
        yield
    finally:
        setattr(phases, "Collector", original)  # noqa: B010


def answer(request: Mapping[str, Any]) -> dict[str, Any]:
    from pytest_verl_compat.upstream.probes import phases
    from pytest_verl_compat.upstream.probes.validate import validate_config_with_stand_ins

    made: list[Any] = []
    with (
        _keeping_collectors(made),
        contextlib.redirect_stdout(io.StringIO()),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        phases.run_all(dict(request["mapping"]), validate_config_with_stand_ins)
    reads: dict[str, set[str]] = {}
    for collector in made:
        for (relative, line), keys in collector.reads.by_line.items():
            if relative.startswith("verl/"):
                reads.setdefault(f"{relative}:{line}", set()).update(keys)
    return {KEY_READS: {where: sorted(keys) for where, keys in sorted(reads.items())}}


ORACLE_HANDLERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {KIND: answer}
