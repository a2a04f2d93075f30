"""The records a probe derives in a release's environment (``release derive VERSION --only
STEP``), kept per release under ``data/releases/<version>/``: where each is and how it is read.

A release without the record has no such fact, and neither has one whose record cannot be read
(too large, not JSON, a missing field): the check standing on it then says nothing there.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pytest_verl_compat.files.safe_input import InputError, read_bytes
from pytest_verl_compat.releases.index import RELEASE_DATA

MAX_BYTES = 1 << 20
T = TypeVar("T")


def record_path(version: str, filename: str) -> Path:
    return RELEASE_DATA / version / filename


def load_record(
    version: str, filename: str, parse: Callable[[Mapping[str, Any]], T], what: str, missing: T
) -> T:
    """The release's record read by ``parse``, or ``missing`` where it has none it can read."""
    path = record_path(version, filename)
    if not path.is_file():
        return missing
    try:
        return parse(json.loads(read_bytes(path, MAX_BYTES, what)))
    except (InputError, ValueError, KeyError, TypeError, AttributeError):
        return missing
