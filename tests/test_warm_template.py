"""The warm template (``upstream/warm.py``): a forked oracle is the cold one without the import."""

from __future__ import annotations

import ast
import inspect
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from corpus_facts import PINNED_VERSION, needs_release, release_ready

from pytest_verl_compat.pipeline.manifest import embedded_root
from pytest_verl_compat.upstream.oracle import runner, warm
from pytest_verl_compat.upstream.oracle.client import (
    PROCESS_MODULE,
    UpstreamOracle,
    checks_request,
    compose_request,
)
from pytest_verl_compat.upstream.oracle.runner import sandbox_environment
from pytest_verl_compat.upstream.probes import trainer

needs_verl = needs_release()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A folder whose sockets fit in sun_path (108 bytes), which pytest's tmp_path may not."""
    folder = Path(tempfile.mkdtemp(prefix="warm-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _template_pids(socket: Path) -> list[int]:
    """The live templates serving ``socket`` (from /proc: Linux, like the sandbox)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if warm.TEMPLATE_MODULE.encode() in words and os.fsencode(socket) in words:
            found.append(int(cmdline.parent.name))
    return found


def _ask(oracle: UpstreamOracle, fields: list[str], resolved: dict) -> dict:  # type: ignore[type-arg]
    home = compose_request(["trainer.project_name=${oc.env:HOME}"], {})
    answers = {
        "compose": oracle.answer("compose", compose_request(fields, {})),
        "checks": oracle.answer("checks", checks_request(resolved)),
        "home": oracle.answer("home", home),
    }
    assert oracle._process is not None
    folder = oracle._process._cwd.name
    # Each process's home is its own fresh empty folder, whichever way it started.
    assert yaml.safe_load(answers.pop("home")["stdout"])["trainer"]["project_name"] == folder
    return answers


def test_the_template_imports_every_module_the_trainer_probes_import() -> None:
    """``prepare_children`` imports ``PATCHED_MODULES`` before the template forks; a module that
    ``ray_free`` imports and the list lacks would be imported again by every child, in its first
    answer (~8 s each before the list). Statically: ``from X import Y`` loads X, or X.Y when Y
    is a submodule, so one of the two must be listed."""
    tree = ast.parse(inspect.getsource(trainer.ray_free).lstrip())
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            missing += [a.name for a in node.names if a.name not in trainer.PATCHED_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            missing += [
                f"{node.module}.{a.name}"
                for a in node.names
                if node.module not in trainer.PATCHED_MODULES
                and f"{node.module}.{a.name}" not in trainer.PATCHED_MODULES
            ]
    assert not missing, f"ray_free imports what PATCHED_MODULES does not list: {missing}"


@needs_verl
def test_a_forked_oracle_answers_as_the_cold_one_and_the_template_ends_when_idle(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_path = short_tmp
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    case = json.loads((embedded_root() / "golden" / "compose" / "grpo.json").read_text())
    fields, resolved = case["explicit_fields"], case["resolved"]

    monkeypatch.setenv(warm.IDLE_VARIABLE, "0")  # the cold process, as before the template
    cold = UpstreamOracle(release=PINNED_VERSION)
    try:
        cold_answers = _ask(cold, fields, resolved)
        assert isinstance(cold._process.process, subprocess.Popen)  # type: ignore[union-attr]
    finally:
        cold.close()
    assert not (tmp_path / "pytest-verl-compat").exists()

    monkeypatch.setenv(warm.IDLE_VARIABLE, "4")
    forked = [
        UpstreamOracle(release=PINNED_VERSION),
        UpstreamOracle(workers=2, release=PINNED_VERSION),
    ]
    try:
        for oracle in forked:
            assert _ask(oracle, fields, resolved) == cold_answers
            assert isinstance(oracle._process.process, warm.ForkedProcess)  # type: ignore[union-attr]
    finally:
        for oracle in forked:
            oracle.close()
    sockets = list((tmp_path / "pytest-verl-compat").glob("*.sock"))
    assert len(sockets) == 1, "both oracles forked from one template"
    interpreter = runner.release_interpreter(PINNED_VERSION)
    assert sockets[0].stem == warm.template_key(sandbox_environment(), interpreter)
    (template,) = _template_pids(sockets[0])

    # A module the template did not prepare is refused by the child, in its own words.
    connection = warm._connect(sockets[0])
    assert connection is not None
    child = warm._request(connection, "json.tool", [], str(tmp_path))
    assert child.stderr is not None and "not served by the warm template" in child.stderr.read()
    assert child.wait(timeout=30) == 1
    for pipe in (child.stdin, child.stdout, child.stderr):
        assert pipe is not None
        pipe.close()

    deadline = time.monotonic() + 30
    while _template_pids(sockets[0]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _template_pids(sockets[0]), f"template {template} outlived its idle time"
    assert not sockets[0].exists()


def test_a_template_ends_when_its_socket_is_removed_and_removes_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its folder is a login's runtime folder, removed at logout: nothing may outlive it, not
    even the empty folder it ran in. (The template serves no request here, so verl's import is
    all it does first.)"""
    if not release_ready():
        pytest.skip("verl is not installed")
    socket = tmp_path / "t.sock"
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where start_detached makes its folder
    with open(tmp_path / "errors", "w", encoding="utf-8") as errors:
        started = runner.start_detached(
            warm.TEMPLATE_MODULE, ["--socket", str(socket), "--idle", "600"],
            sandbox_environment(), errors, runner.release_interpreter(PINNED_VERSION),
        )  # fmt: skip
    assert started.stdout is not None
    assert started.wait(timeout=60) == 0  # the first process detaches the template and exits
    assert started.stdout.readline().strip() == b"ready" and socket.exists()
    started.stdout.close()
    (folder,) = tmp_path.glob("verl-upstream-*")
    (template,) = _template_pids(socket)
    socket.unlink()
    deadline = time.monotonic() + 30
    while _template_pids(socket) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _template_pids(socket), f"template {template} outlived its socket"
    assert not folder.exists(), "the template left its folder behind"


def test_a_runtime_folder_others_can_enter_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert warm.runtime_folder() == tmp_path / "pytest-verl-compat"  # made private, mode 0700
    assert (tmp_path / "pytest-verl-compat").stat().st_mode & 0o777 == 0o700
    (tmp_path / "pytest-verl-compat").chmod(0o755)
    assert warm.runtime_folder() is None
    # Then the oracle starts cold, as before: no socket is made there.
    assert warm.fork(PROCESS_MODULE, [], str(tmp_path), sandbox_environment()) is None
    assert not list((tmp_path / "pytest-verl-compat").iterdir())


def test_off_means_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv(warm.IDLE_VARIABLE, "0")
    assert warm.fork(PROCESS_MODULE, [], str(tmp_path), sandbox_environment()) is None
    assert not (tmp_path / "pytest-verl-compat").exists()


def test_the_key_changes_with_the_code_and_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = tmp_path / "pytest_verl_compat"
    code.mkdir()
    (code / "a.py").write_text("A = 1\n")
    monkeypatch.setattr(warm, "_CODE", (code,))
    before = warm.template_key({"PATH": "/usr/bin"})
    assert warm.template_key({"PATH": "/usr/bin"}) == before
    assert warm.template_key({"PATH": "/usr/local/bin"}) != before
    copy = tmp_path / "copy" / "pytest_verl_compat"  # another clone of the same checkout
    copy.mkdir(parents=True)
    (copy / "a.py").write_text("A = 1\n")
    monkeypatch.setattr(warm, "_CODE", (copy,))
    assert warm.template_key({"PATH": "/usr/bin"}) == before
    (copy / "a.py").write_text("A = 2\n")  # an edit of the same size, at once
    assert warm.template_key({"PATH": "/usr/bin"}) != before
    monkeypatch.setattr(warm, "_CODE", (code,))
    (code / "a.py").write_text("A = 22\n")  # an edit in a checkout the template imported
    assert warm.template_key({"PATH": "/usr/bin"}) != before
