"""Which keys a release's config dataclasses type as admitting a string, answered in the oracle
process (``--serve``).

An ``annotated_strings`` question holds a tree's defaults; the answer is ``types.string_admitting``
of them by the release's own annotations: the keys whose default is a number or a flag but whose
field admits a string (``rollout_is_threshold: str | float``). ``verl-compat release derive``
asks it for both engines' defaults and keeps the union per release
(``data/annotated_strings.yaml``), which the static type check reads without verl.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

KIND = "annotated_strings"
KEY_KEYS = "keys"


def answer(request: Mapping[str, Any]) -> dict[str, Any]:
    from pytest_verl_compat.upstream.probes.types import string_admitting

    return {KEY_KEYS: string_admitting(request["mapping"])}


ORACLE_HANDLERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {KIND: answer}
