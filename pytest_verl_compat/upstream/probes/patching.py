"""Patches of third-party and upstream internals, applied inside a ``with`` and restored after.

The probes' only way to change what upstream or a library does (STYLE 14d): every patch of the
oracle process goes through ``patched`` or ``environment``, and every one is undone on exit.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

_MISSING = object()


@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name = value`` for the block. A class's own attribute is restored, an inherited
    one is deleted again (so the class inherits it as before)."""
    saved = (
        owner.__dict__.get(name, _MISSING)
        if isinstance(owner, type)
        else getattr(owner, name, _MISSING)
    )
    setattr(owner, name, value)
    try:
        yield
    finally:
        if saved is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, saved)


@contextlib.contextmanager
def all_patched(patches: Iterable[tuple[Any, str, Any]]) -> Iterator[None]:
    """Every ``(owner, name, value)`` of ``patches`` for the block, undone in reverse order."""
    with contextlib.ExitStack() as stack:
        for owner, name, value in patches:
            stack.enter_context(patched(owner, name, value))
        yield


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` updated for the block and restored whole (upstream writes to it too)."""
    saved = dict(os.environ)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


# Module-level state a library keeps between the configurations one oracle worker answers, with
# the library's own function that clears it. Megatron-Core's parallel state is set up once per
# process by the first Megatron engine (``mpu.initialize_model_parallel``,
# verl/workers/engine/megatron/transformer_impl.py:272-282) and skipped by every later one once
# ``mpu.is_initialized()`` (:245-257): left in place, a configuration's layout would be checked
# or not depending on which configurations the same worker answered before it.
LIBRARY_TEARDOWNS = (("megatron.core.parallel_state", "destroy_model_parallel"),)


@contextlib.contextmanager
def library_state_cleared() -> Iterator[None]:
    """The block, then every loaded library's ``LIBRARY_TEARDOWNS`` function: each configuration
    meets the libraries as the first one did."""
    try:
        yield
    finally:
        for module_name, function in LIBRARY_TEARDOWNS:
            module = sys.modules.get(module_name)
            if module is not None:
                getattr(module, function)()
