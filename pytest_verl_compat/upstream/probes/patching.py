"""Patches of third-party and upstream internals, applied inside a ``with`` and restored after.

The probes' only way to change what upstream or a library does (STYLE 14d): every patch of the
oracle process goes through ``patched`` or ``environment``, and every one is undone on exit.

Each patched name is a *patch point* of the release the probes run on: a stand-in only stands in
where upstream still looks the name up, so a name the release no longer has is never set anew
(that would skip the stand-in silently and run the real code): ``patched`` raises
``PatchPointMissing``, which the probes never take for the configuration's failure, and the
command says ``release X not supported: <patch point> not found``. The patch points a run meets
are recorded per release (``data/releases/<version>/patch_points.json``, ``recording``) and each
is checked to exist in every supported release's files (``releases.patch_points``).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

_MISSING = object()
MISSING = _MISSING  # what ``in_force`` gives for a name upstream's object did not have
# The patch points met while ``recording`` (one list per oracle process; the process answers one
# question at a time).
_RECORDING: list[set[str]] = []
# The patches in force, outermost first: (owner, name, what upstream had there, the stand-in), for
# ``stand_ins``, which checks each stand-in against what it replaces and judges a failure that a
# stand-in caused as the sandbox's.
_IN_FORCE: list[tuple[Any, str, Any, Any]] = []


# Every patch entered while ``watching`` (the stand-ins' contract test collects them over a run).
_WATCHING: list[list[tuple[Any, str, Any, Any]]] = []


def in_force() -> tuple[tuple[Any, str, Any, Any], ...]:
    """The patches in force now: (owner, name, upstream's value, the stand-in)."""
    return tuple(_IN_FORCE)


@contextlib.contextmanager
def watching() -> Iterator[list[tuple[Any, str, Any, Any]]]:
    """Every patch entered in the block: (owner, name, upstream's value, the stand-in)."""
    met: list[tuple[Any, str, Any, Any]] = []
    _WATCHING.append(met)
    try:
        yield met
    finally:
        _WATCHING.remove(met)


class PatchPointMissing(Exception):
    """A patch point the release does not have: the probes cannot run on this release."""


def patch_point(owner: Any, name: str) -> str:
    """The patched name, qualified: ``module.name``, ``module.Class.name`` (a class or an
    instance's class)."""
    if isinstance(owner, type(sys)):
        return f"{owner.__name__}.{name}"
    cls = owner if isinstance(owner, type) else type(owner)
    return f"{cls.__module__}.{cls.__qualname__}.{name}"


def missing_message(point: str) -> str:
    """What a release lacking ``point`` (a name, or a module the probes import) is said to be."""
    return f"release {_release()} not supported: {point} not found"


def release_module_missing(exc: ModuleNotFoundError) -> PatchPointMissing | None:
    """A module of verl's that the probes import and the release does not have (0.8.0 has no
    ``verl.trainer.ppo.v1``): the release lacks what the probes need, as a moved patch point."""
    name = exc.name or ""
    if name == "verl" or name.startswith("verl."):
        return PatchPointMissing(missing_message(name))
    return None


def _release() -> str:
    from importlib import metadata

    try:
        return metadata.version("verl")
    except metadata.PackageNotFoundError:
        return "(none)"


@contextlib.contextmanager
def recording() -> Iterator[set[str]]:
    """The patch points met in the block."""
    met: set[str] = set()
    _RECORDING.append(met)
    try:
        yield met
    finally:
        _RECORDING.remove(met)


@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any, *, provided: bool = False) -> Iterator[None]:
    """``owner.name = value`` for the block. A class's own attribute is restored, an inherited
    one is deleted again (so the class inherits it as before). Raises ``PatchPointMissing`` when
    ``owner`` has no such name (the release moved it); ``provided``: an attribute upstream's own
    build would have set on the instance and the probe's stand-in build did not (the engine's
    module and optimizer), so the instance lacks it until now (the release's files are checked
    for it instead, ``releases.patch_points``)."""
    point = patch_point(owner, name)
    if not provided and not hasattr(owner, name):
        raise PatchPointMissing(missing_message(point))
    for met in _RECORDING:
        met.add(point)
    entry = (owner, name, getattr(owner, name, _MISSING), value)
    for seen in _WATCHING:
        seen.append(entry)
    with _set(owner, name, value):
        _IN_FORCE.append(entry)
        try:
            yield
        finally:
            del _IN_FORCE[next(i for i, e in enumerate(_IN_FORCE) if e is entry)]


@contextlib.contextmanager
def attached(owner: Any, name: str, value: Any) -> Iterator[None]:
    """An attribute of the probes' own on an upstream object for the block (data a stand-in
    reads): no patch point, nothing of upstream's replaced."""
    if hasattr(owner, name):
        raise ValueError(f"{patch_point(owner, name)} exists: attach a name upstream lacks")
    with _set(owner, name, value):
        yield


@contextlib.contextmanager
def _set(owner: Any, name: str, value: Any) -> Iterator[None]:
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
def all_patched(
    patches: Iterable[tuple[Any, str, Any]], *, provided: bool = False
) -> Iterator[None]:
    """Every ``(owner, name, value)`` of ``patches`` for the block, undone in reverse order."""
    with contextlib.ExitStack() as stack:
        for owner, name, value in patches:
            stack.enter_context(patched(owner, name, value, provided=provided))
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
