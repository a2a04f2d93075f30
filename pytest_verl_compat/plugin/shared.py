"""A result computed once per pytest session, also when pytest-xdist splits it over workers.

Under xdist every worker collects the whole selection, so a stage that computes one result for
all its selected cases (the step stage's upstream run) would compute it once per worker. The
workers of one session share the parent of their base temporary folders
(`tmp_path_factory.getbasetemp().parent`, pytest-xdist's documented pattern): the first worker
to take the lock computes the result and writes it there as JSON (a temporary file, then a
rename); the others wait for the lock and read it. A worker that dies while computing releases
the lock with its process, and the next one computes instead.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from pytest_verl_compat.pipeline.snapshot import write_atomic
from pytest_verl_compat.plugin.keys import is_xdist_worker

# Results this process computed or read, by name (the only store without xdist).
_computed_key: pytest.StashKey[dict[str, Any]] = pytest.StashKey()


def result_name(stage: str, selection: Iterable[str]) -> str:
    """A file-safe name for `stage`'s result over `selection` (case ids may hold "/")."""
    digest = hashlib.sha256("\n".join(sorted(selection)).encode()).hexdigest()[:16]
    return f"verl-{stage}-{digest}"


def once_per_session(
    config: pytest.Config,
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    compute: Callable[[], Any],
) -> Any:
    """`compute()`'s JSON-able result, computed once in this session for `name`.

    Without xdist it is computed in this process and kept; in an xdist worker, the first worker
    to ask computes it and the others read what it wrote.
    """
    computed = config.stash.setdefault(_computed_key, {})
    if name in computed:
        return computed[name]
    if not is_xdist_worker(config):
        computed[name] = compute()
        return computed[name]
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp().parent
    # The run's id, shared by its workers: a folder reused with --basetemp holds no stale result.
    run = getattr(config, "workerinput", {}).get("testrunuid", "")
    path = root / f"{name}-{run}.json"
    with FileLock(f"{path}.lock"):
        if path.is_file():
            value = json.loads(path.read_text(encoding="utf-8"))
        else:
            value = compute()
            write_atomic(path, json.dumps(value, sort_keys=True))
    computed[name] = value
    return value
