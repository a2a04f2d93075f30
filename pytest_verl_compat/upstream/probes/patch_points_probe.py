"""Which patch points a run of the probes meets, answered in the oracle process (``--serve``).

A ``patch_points`` question runs every probe of ``check`` on one mapping, for main_ppo or the SFT
trainer as a ``checks`` question does, and answers the qualified names the probes set
(``patching.recording``). ``verl-compat release derive`` asks it on the census's configurations
and keeps the union per release (``data/releases/<version>/patch_points.json``).
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable, Mapping
from typing import Any

KIND = "patch_points"
KEY_POINTS = "points"


def answer(request: Mapping[str, Any]) -> dict[str, Any]:
    from pytest_verl_compat.upstream.probes import patching, validate

    with (
        patching.recording() as met,
        contextlib.redirect_stdout(io.StringIO()),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        validate.checks_one(
            dict(request["mapping"]),
            entry=request.get("entry"),
            world_size=request.get("world_size"),
        )
    return {KEY_POINTS: sorted(met)}


ORACLE_HANDLERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {KIND: answer}
