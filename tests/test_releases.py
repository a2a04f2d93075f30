"""The release trees: pinned in data, fetched with pip, unpacked as untrusted input, cached."""

from __future__ import annotations

import ast
import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from corpus_facts import MANIFEST, PINNED_VERSION

from pytest_verl_compat.files.digests import tree_sha256
from pytest_verl_compat.releases.index import (
    RELEASES_FILE,
    Release,
    ReleaseError,
    ReleaseIndex,
    load_release_index,
)
from pytest_verl_compat.releases.wheels import (
    COMPLETE,
    MAX_MEMBER_BYTES,
    cache_dir,
    install_wheel,
    release_tree,
    unpack_wheel,
    verify_wheel,
)

INDEX = load_release_index()
CLI = (sys.executable, "-m", "pytest_verl_compat.cli")


def test_the_index_pins_each_release_once_in_order() -> None:
    versions = [tuple(int(p) for p in v.split(".")) for v in INDEX.versions]
    assert versions == sorted(set(versions)) and len(versions) >= 5
    pinned = INDEX.release(PINNED_VERSION)
    assert pinned.tree_sha256 == MANIFEST["upstream"]["tree_sha256"]
    for release in INDEX.releases:
        assert release.wheel == f"verl-{release.version}-py3-none-any.whl"
        assert len(release.wheel_sha256) == len(release.tree_sha256) == 64


def test_an_unknown_release_names_the_known_ones() -> None:
    with pytest.raises(
        ReleaseError, match=r"verl 0\.1\.0 is not a pinned release \(known: 0\.7\.0"
    ):
        INDEX.release("0.1.0")


def test_the_fetched_trees_are_the_pinned_ones(release_cache: Path) -> None:
    for release in INDEX.releases:
        tree = release_tree(release.version, fetch=False)
        assert tree_sha256(tree.config_dir) == release.tree_sha256
        # Only the package's source and YAML files, the version file and the completion marker
        # are taken out of the wheel.
        files = sorted(
            p.relative_to(tree.root).as_posix() for p in tree.root.rglob("*") if p.is_file()
        )
        assert files and all(
            name in (INDEX.version_file, COMPLETE)
            or (name.startswith("verl/") and name.endswith((".py", ".yaml")))
            for name in files
        ), files
        assert (tree.root / INDEX.version_file).read_text().strip() == release.version


def test_the_091_wheel_holds_the_shared_091_tree(release_cache: Path, upstream_091: Path) -> None:
    tree = release_tree("0.9.1", fetch=False)
    assert tree_sha256(tree.config_dir) == tree_sha256(upstream_091 / INDEX.config_dir)


def _wheel_text(wheel: Path, name: str) -> str | None:
    with zipfile.ZipFile(wheel) as archive:
        if name not in archive.namelist():
            return None
        return archive.read(name).decode("utf-8")


def test_entry_point_calls_are_what_each_wheel_says(release_wheels: dict[str, Path]) -> None:
    """Read as text from each wheel (never run): the call lines the index records."""
    for release in INDEX.releases:
        for function in INDEX.migration_functions:
            call = release.calls(function.function)
            source = _wheel_text(release_wheels[release.version], "verl/trainer/main_ppo.py")
            assert source is not None
            calls = [
                n
                for n, line in enumerate(source.splitlines(), 1)
                if f"{function.function}(" in line
            ]
            assert calls == ([call.line] if call else []), (release.version, calls)
            if call:
                assert call.file == "verl/trainer/main_ppo.py"


def test_each_migration_function_has_one_body_in_every_release(
    release_wheels: dict[str, Path],
) -> None:
    """The pinned verl's copy (what `migrate` reads) is the copy of every release that has it."""
    for function in INDEX.migration_functions:
        bodies = set()
        for release in INDEX.releases:
            source = _wheel_text(release_wheels[release.version], function.file)
            if source is None:
                continue
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.FunctionDef) and node.name == function.function:
                    bodies.add(ast.dump(node, include_attributes=False))
        assert len(bodies) == 1, function.function


def test_a_wheel_must_be_the_pinned_file(tmp_path: Path, release_wheels: dict[str, Path]) -> None:
    release = INDEX.release("0.7.0")
    verify_wheel(release, release_wheels["0.7.0"])
    other = tmp_path / release.wheel
    other.write_bytes(release_wheels["0.7.0"].read_bytes() + b"\0")
    with pytest.raises(ReleaseError, match=r"has sha256 .*, not the pinned"):
        verify_wheel(release, other)
    with pytest.raises(ReleaseError, match=r"is not verl-0\.7\.0"):
        verify_wheel(release, release_wheels["0.7.1"])


def test_a_cached_tree_that_changed_is_not_used(
    tmp_path: Path, release_wheels: dict[str, Path]
) -> None:
    release = INDEX.release("0.7.0")
    install_wheel(release, release_wheels["0.7.0"], tmp_path / "0.7.0", INDEX)
    assert release_tree("0.7.0", cache=tmp_path, fetch=False).source == "cache"
    (tmp_path / "0.7.0" / INDEX.config_dir / "ppo_trainer.yaml").write_text("trainer: {}\n")
    with pytest.raises(ReleaseError, match="not in the cache"):
        release_tree("0.7.0", cache=tmp_path, fetch=False)
    # Installing again replaces the damaged tree, never merges into it.
    install_wheel(release, release_wheels["0.7.0"], tmp_path / "0.7.0", INDEX)
    assert release_tree("0.7.0", cache=tmp_path, fetch=False).source == "cache"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.7.0"]  # no work folder left


@pytest.mark.slow
def test_release_tree_fetches_with_pip_into_the_user_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release_wheels: dict[str, Path]
) -> None:
    """The whole path: pip download, checks, unpack, rename; the second call answers from the
    cache. pip is pointed at the session's wheel folder, so this downloads nothing again."""
    monkeypatch.setenv("VERL_COMPAT_HOME", str(tmp_path))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(release_wheels["0.7.1"].parent))
    tree = release_tree("0.7.1")
    assert tree.source == "fetched" and tree.root == cache_dir() / "0.7.1"
    assert cache_dir() == tmp_path / "releases"
    assert release_tree("0.7.1").source == "cache"


def test_without_pypi_a_release_is_a_one_line_usage_error(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp_path / "empty-cache"),
        "VERL_COMPAT_HOME": str(tmp_path / "no-releases"),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(tmp_path / "no-wheels"),
        "PIP_CONFIG_FILE": os.devnull,
    }
    proc = subprocess.run(
        [*CLI, "drift", "--against", "0.8.0"], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0].startswith("verl-compat drift: verl 0.8.0: cannot fetch its wheel")
    assert "pip download --no-deps --only-binary=:all: verl==0.8.0" in lines[0]


def test_an_output_that_must_not_be_replaced_is_a_usage_error(upstream_checkout: Path) -> None:
    proc = subprocess.run(
        [
            *CLI,
            "--upstream",
            str(upstream_checkout),
            "drift",
            "--against",
            str(upstream_checkout),
            "--json",
            "/dev/stdout",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == "verl-compat drift: /dev/stdout: a symlink; refusing to replace it\n"


def test_against_must_be_a_folder_or_a_pinned_release(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*CLI, "drift", "--against", "0.6.0"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "'0.6.0' is not a folder nor a pinned release (0.7.0, 0.7.1" in proc.stderr


@pytest.mark.slow
def test_drift_against_a_release_version(
    release_cache: Path, upstream_checkout: Path, tmp_path: Path
) -> None:
    out = tmp_path / "drift.json"
    proc = subprocess.run(
        [
            *CLI,
            "--upstream",
            str(upstream_checkout),
            "drift",
            "--against",
            "0.8.0",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr  # 0.8.0 drifts from 0.9.0
    report = json.loads(out.read_text())
    assert report["against"]["version"] == "0.8.0"
    assert report["against"]["tree_sha256"] == INDEX.release("0.8.0").tree_sha256
    cases = {case["id"]: case for case in report["cases"]}
    # 0.8.0's tree has no algorithm.filter_groups: the pinned checks cannot compile its mapping.
    assert cases["grpo"]["outcome"] == {"pinned": "accepted", "against": "composed"}
    assert "filter_groups" in report["outcome_reasons"]["grpo"]["against"]
    assert "algorithm.filter_groups.enable" in cases["grpo"]["removed"]


# --- the wheel is untrusted input ---------------------------------------------------------------


def _zip(path: Path, members: list[tuple[str, bytes, int]]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data, mode in members:
            info = zipfile.ZipInfo(name)
            info.external_attr = mode << 16
            archive.writestr(info, data)
    return path


GOOD = [
    ("verl/version/version", b"0.0.1\n", stat.S_IFREG | 0o644),
    ("verl/trainer/config/ppo_trainer.yaml", b"trainer: {}\n", stat.S_IFREG | 0o644),
    ("verl/trainer/main_ppo.py", b"import os; os.system('x')\n", stat.S_IFREG | 0o644),
    ("verl/ops/kernel.so", b"\x7fELF", stat.S_IFREG | 0o755),
    ("verl-0.0.1.dist-info/RECORD", b"", stat.S_IFREG | 0o644),
    ("setup_helper.py", b"import os\n", stat.S_IFREG | 0o644),
]


def test_unpack_takes_the_packages_source_and_data_as_files(tmp_path: Path) -> None:
    """The verl package's .py and .yaml files and the version file, to be read as data (the
    release's code runs only in its own environment); nothing else of the wheel."""
    taken = unpack_wheel(_zip(tmp_path / "w.whl", GOOD), tmp_path / "out", INDEX)
    assert taken == [
        "verl/version/version",
        "verl/trainer/config/ppo_trainer.yaml",
        "verl/trainer/main_ppo.py",
    ]
    assert not (tmp_path / "out" / "verl/ops/kernel.so").exists()
    assert not (tmp_path / "out" / "setup_helper.py").exists()
    written = tmp_path / "out" / "verl/trainer/main_ppo.py"
    assert not written.stat().st_mode & 0o111  # data, never made executable


@pytest.mark.parametrize(
    ("member", "message"),
    [
        (
            ("verl/trainer/config/../../../evil.yaml", b"x: 1\n", stat.S_IFREG | 0o644),
            "not a plain relative path",
        ),
        (
            ("verl/trainer/config//x.yaml", b"x: 1\n", stat.S_IFREG | 0o644),
            "not a plain relative path",
        ),
        (
            ("verl/trainer/config/link.yaml", b"/etc/passwd", stat.S_IFLNK | 0o777),
            "not a regular file",
        ),
        (
            ("verl/trainer/config/big.yaml", b"x" * (MAX_MEMBER_BYTES + 1), stat.S_IFREG | 0o644),
            "over the size limits",
        ),
        (
            ("verl/trainer/config/ppo_trainer.yaml", b"again: 1\n", stat.S_IFREG | 0o644),
            "listed twice",
        ),
    ],
    ids=["dot-dot", "empty-segment", "symlink", "oversized", "duplicate"],
)
def test_unpack_refuses_a_hostile_member(
    tmp_path: Path, member: tuple[str, bytes, int], message: str
) -> None:
    with (
        pytest.warns(UserWarning, match="Duplicate name")
        if message == "listed twice"
        else _nothing()
    ):
        wheel = _zip(tmp_path / "w.whl", [*GOOD, member])
    with pytest.raises(ReleaseError, match=message):
        unpack_wheel(wheel, tmp_path / "out", INDEX)
    assert not (tmp_path / "evil.yaml").exists() and not (tmp_path.parent / "evil.yaml").exists()


def test_unpack_needs_a_tree_and_a_version_file(tmp_path: Path) -> None:
    with pytest.raises(ReleaseError, match="no verl/trainer/config tree or no version file"):
        unpack_wheel(_zip(tmp_path / "w.whl", GOOD[1:]), tmp_path / "out", INDEX)
    (tmp_path / "not.whl").write_bytes(b"PK not a zip")
    with pytest.raises(ReleaseError, match="not a readable wheel"):
        unpack_wheel(tmp_path / "not.whl", tmp_path / "out2", INDEX)


def test_a_wheel_whose_tree_is_not_the_pinned_one_is_not_installed(tmp_path: Path) -> None:
    release = Release("0.0.1", "w.whl", "", tree_sha256="0" * 64)
    wheel = _zip(tmp_path / "w.whl", GOOD)
    import hashlib

    release = Release("0.0.1", "w.whl", hashlib.sha256(wheel.read_bytes()).hexdigest(), "0" * 64)
    index = ReleaseIndex((release,), INDEX.config_dir, INDEX.version_file, ())
    cache = tmp_path / "cache"
    with pytest.raises(ReleaseError, match="config tree has sha256"):
        install_wheel(release, wheel, cache / "0.0.1", index)
    assert list(cache.iterdir()) == []  # nothing half-written


def test_the_index_file_is_data(tmp_path: Path) -> None:
    raw = yaml.safe_load(RELEASES_FILE.read_text())
    assert raw["config_dir"] == MANIFEST["upstream"]["config_dir"]
    broken = tmp_path / "releases.yaml"
    broken.write_text("releases: [{version: 1}]\nconfig_dir: x\nversion_file: y\n")
    with pytest.raises(ReleaseError, match="malformed release index"):
        load_release_index(broken)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        return None
