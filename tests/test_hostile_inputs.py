"""Hostile files: manifests, resolved files, config trees and output paths (issue 14, items 5, 8-10).

Each input is refused before it is parsed or written, with one line naming the file (and line);
nothing hangs, nothing exhausts memory, nothing is written outside its folder.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pytest_verl_compat.files.safe_input import (
    MAX_INPUT_BYTES,
    InputError,
    confined,
    load_yaml,
    read_text,
)
from pytest_verl_compat.model import Case
from pytest_verl_compat.pipeline.compose import Composer
from pytest_verl_compat.pipeline.manifest import ManifestError, default_manifest_path, load_manifest
from pytest_verl_compat.pipeline.resolved import ResolvedFileError, load_resolved
from pytest_verl_compat.pipeline.snapshot import OutputRefused, write_atomic

# Nine levels of nine aliases: 81 aliases in 10 lines, 9**9 nodes when anything walks it.
ALIAS_BOMB = 'l0: &l0 ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
    f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]\n" for i in range(1, 10)
)


def embedded_manifest_text() -> str:
    return default_manifest_path().read_text(encoding="utf-8")


def write_manifest(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "corpus" / "manifest.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_alias_bomb_is_refused_before_anything_walks_it() -> None:
    with pytest.raises(InputError, match=r"^m.yaml: its aliases expand to more than"):
        load_yaml(ALIAS_BOMB, "m.yaml")
    # A near-identical document with a few aliases is fine.
    assert load_yaml("a: &a [1, 2]\nb: *a\n", "m.yaml") == {"a": [1, 2], "b": [1, 2]}


def test_manifest_alias_bomb_and_duplicate_keys(tmp_path: Path) -> None:
    bomb = write_manifest(
        tmp_path,
        embedded_manifest_text()
        + "\nx_bomb:\n"
        + "".join("  " + line + "\n" for line in ALIAS_BOMB.splitlines()),
    )
    with pytest.raises(ManifestError, match="aliases expand"):
        load_manifest(bomb)
    text = embedded_manifest_text()
    duplicate = write_manifest(tmp_path, text + "\ncases:\n  - id: only_me\n    kind: user\n")
    with pytest.raises(ManifestError) as info:
        load_manifest(duplicate)
    assert "duplicate key 'cases'" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("bad_id", ["x/../../../../victim", "ok\n", "derived/.hidden", "../up"])
def test_unsafe_case_ids_are_invalid_cases(tmp_path: Path, bad_id: str) -> None:
    raw = yaml.safe_load(embedded_manifest_text())
    raw["cases"][0]["id"] = bad_id
    manifest = load_manifest(write_manifest(tmp_path, yaml.safe_dump(raw, sort_keys=False)))
    invalid = [c for c in manifest.cases if c.kind == "invalid"]
    assert len(invalid) == 1
    assert invalid[0].id.startswith("cases[") and ".." not in invalid[0].id
    assert invalid[0].error and "id" in invalid[0].error


def test_safe_ids_still_load() -> None:
    ids = [case.id for case in load_manifest(default_manifest_path()).cases]
    assert "derived/filter-groups-refill" in ids
    assert all(case.kind != "invalid" for case in load_manifest(default_manifest_path()).cases)


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "folder", "oversized", "not_utf8", "nul"])
def test_non_regular_or_unbounded_files_are_refused_in_one_line(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "manifest.yaml"
    if kind == "fifo":
        os.mkfifo(path)  # a read would wait forever for a writer
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")  # a read would never end
    elif kind == "folder":
        path.mkdir()
    elif kind == "oversized":
        with path.open("wb") as handle:
            handle.truncate(MAX_INPUT_BYTES + 1)
    elif kind == "not_utf8":
        path.write_bytes(b"schema_version: 1\ncases: \xff\n")
    else:
        path.write_bytes(b"schema_version: 1\n\0\n")
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    message = str(info.value)
    assert message.startswith(str(path)) and "\n" not in message
    expected = {"not_utf8": ":2: ", "nul": ":2: ", "oversized": "limit"}.get(
        kind, "not a regular file"
    )
    assert expected in message


def test_resolved_file_with_a_bomb_inside_a_logger_list(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    body = "".join("  " + line + "\n" for line in ALIAS_BOMB.splitlines())
    path.write_text("defs:\n" + body + "trainer:\n  logger: *l9\n")
    with pytest.raises(ResolvedFileError, match=r"config.yaml: its aliases expand"):
        load_resolved(path)


def _tree(tmp_path: Path, upstream_checkout: Path) -> Path:
    tree = tmp_path / "tree"
    source = upstream_checkout / "verl" / "trainer" / "config"
    subprocess.run(["cp", "-r", str(source), str(tree)], check=True)
    return tree


@pytest.mark.parametrize("attack", ["dev_zero", "bomb"])
def test_hostile_config_tree_is_a_rejection_not_a_hang(
    tmp_path: Path, upstream_checkout: Path, attack: str
) -> None:
    tree = _tree(tmp_path, upstream_checkout)
    victim = tree / "algorithm" / "rollout_correction.yaml"
    victim.unlink()
    if attack == "dev_zero":
        victim.symlink_to("/dev/zero")
        expected = "rollout_correction.yaml: the config file is not a regular file"
    else:
        victim.write_text(ALIAS_BOMB)
        expected = "rollout_correction.yaml: its aliases expand"
    composition = Composer(tree, "ppo_trainer").compose([], {})
    assert composition.outcome == "composition_rejection"
    assert expected in composition.reason


def test_write_atomic_keeps_modes_and_refuses_non_regular_targets(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh.json"
    old_umask = os.umask(0o022)
    try:
        write_atomic(fresh, "{}\n")
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o644  # what open() gives, not mkstemp's 0600
    kept = tmp_path / "kept.json"
    kept.write_text("old")
    kept.chmod(0o640)
    write_atomic(kept, "new")
    assert kept.read_text() == "new" and stat.S_IMODE(kept.stat().st_mode) == 0o640

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    for target in (fifo, link, tmp_path):
        with pytest.raises(OutputRefused, match="refusing to replace it"):
            write_atomic(target, "x")
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and link.is_symlink()


def test_golden_paths_stay_inside_their_folder(tmp_path: Path) -> None:
    assert confined(tmp_path, "compose/grpo.json") == (tmp_path / "compose" / "grpo.json").resolve()
    with pytest.raises(InputError, match="resolves outside"):
        confined(tmp_path / "compose", "../../../victim.json")
    case = Case(id="x/../../../../victim", kind="user", line=1)
    from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession

    session = AuditSession.start(AuditOptions(golden=str(tmp_path)))
    with pytest.raises(InputError):
        session.golden_path(case)


def test_read_text_reports_the_line_of_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_bytes(b"a: 1\nb: 2\nc: \xc3\x28\n")
    with pytest.raises(InputError, match=r"x.yaml:3: the file is not UTF-8 text"):
        read_text(path)


def test_cli_names_the_file_in_one_line_for_a_hostile_manifest(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.yaml"
    manifest.symlink_to("/dev/zero")
    run = subprocess.run(
        [sys.executable, "-m", "pytest_verl_compat.cli", "--manifest", str(manifest), "audit"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and str(manifest) in lines[0] and "Traceback" not in run.stderr


@pytest.mark.parametrize("target", ["folder", "fifo", "symlink"])
def test_report_path_that_is_not_a_regular_file_is_a_usage_error(
    pytester: pytest.Pytester, target: str
) -> None:
    path = pytester.path / "report.json"
    if target == "folder":
        path.mkdir()
    elif target == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/null")
    result = pytester.runpytest_subprocess(
        "--verl-corpus", f"--verl-corpus-report={path}", "-k", "test_read"
    )
    assert result.ret == 4
    result.stderr.fnmatch_lines([f"*--verl-corpus-report={path}: not a regular file*"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
    assert path.is_symlink() or not path.is_file()
