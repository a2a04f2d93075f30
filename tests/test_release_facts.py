"""Each supported release as data: chosen as a choice, its facts derived from its own files and
current, its patch points in its files, its lines its own, its environment built from pinned
wheels (``pytest_verl_compat/releases/``, ``verl-compat release``)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import zipfile
from pathlib import Path
from typing import Any

import pytest
from corpus_facts import PINNED_VERSION, needs_release, release_ready, release_root

from pytest_verl_compat import cli
from pytest_verl_compat.releases import choice
from pytest_verl_compat.releases.index import ReleaseError, load_release_index
from pytest_verl_compat.releases.lines import cite, line_map, source_files
from pytest_verl_compat.releases.patch_points import check, find, recorded_points

INDEX = load_release_index()
SUPPORTED = INDEX.supported_versions
KNOWN_UNSUPPORTED = next(r.version for r in INDEX.releases if not r.supported)
OTHER = next(v for v in SUPPORTED if v != INDEX.citations)


# --- which release ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sources", "version", "why"),
    [
        (dict(option=OTHER, setting=INDEX.citations, installed=INDEX.citations), OTHER, "option"),
        (dict(setting=OTHER, tree_version=INDEX.citations), OTHER, "setting"),
        (dict(tree_version=OTHER, installed=INDEX.citations), OTHER, "tree"),
        (dict(installed=OTHER, manifest_version=INDEX.citations), OTHER, "installed"),
        (dict(installed=None, manifest_version=OTHER), OTHER, "manifest"),
    ],
)
def test_the_first_source_that_names_a_release_chooses_it(
    sources: dict[str, Any], version: str, why: str
) -> None:
    said = {
        "option": choice.FROM_OPTION,
        "setting": choice.FROM_SETTING,
        "tree": choice.FROM_TREE,
        "installed": choice.FROM_INSTALLED,
        "manifest": choice.FROM_MANIFEST,
    }
    chosen = choice.choose_release(**{"installed": None, **sources})
    assert (chosen.version, chosen.why) == (version, said[why])
    assert chosen.describe() == f"verl {version} ({said[why]})"


def test_an_installed_verl_the_project_does_not_support_is_one_line_naming_the_supported() -> None:
    with pytest.raises(ReleaseError) as raised:
        choice.choose_release(installed=KNOWN_UNSUPPORTED, manifest_version=INDEX.citations)
    assert str(raised.value) == (
        f"the installed verl {KNOWN_UNSUPPORTED} is not a supported release; supported: "
        f"{', '.join(SUPPORTED)} (choose one with --release)"
    )
    # A flag outranks it: the installed verl is then not asked about.
    assert choice.choose_release(option=OTHER, installed=KNOWN_UNSUPPORTED).version == OTHER


@pytest.mark.parametrize("asked", [KNOWN_UNSUPPORTED, "0.0.1"])
def test_a_release_asked_for_that_is_not_supported_names_the_supported(asked: str) -> None:
    with pytest.raises(ReleaseError, match=f"supported: {', '.join(SUPPORTED)}") as raised:
        choice.choose_release(option=asked, installed=None)
    assert "\n" not in str(raised.value) and str(raised.value).endswith(f"({choice.FROM_OPTION})")


def test_check_says_the_release_it_checked_and_why(
    upstream_checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = cli.main(["check", "grpo", "--release", OTHER, "--no-upstream-checks"])
    err = capsys.readouterr().err
    assert status == 0
    assert f"verl-compat check: checked against verl {OTHER} (chosen with --release)" in err
    assert f"valid for verl {OTHER}: yes" in err


# --- a release's facts, derived and current ----------------------------------------------------

# The steps that read the release's files (and, for the annotated strings, run its code); the
# census, reads, golden answers and examples are kept current by their own tests.
CHEAP_STEPS = ("line-map", "rule-citations", "memory-facts", "statements", "annotated-strings")


@pytest.mark.parametrize("version", SUPPORTED)
def test_every_fact_derived_from_a_release_is_current(
    version: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``release derive VERSION --check``: a derived file that differs from what the release's
    files give now fails, naming the file (the command that re-derives it is in its message)."""
    if not release_ready(version):
        pytest.skip(f"the environment of verl {version} is not built")
    args = ["release", "derive", version, "--check"]
    for step in CHEAP_STEPS:
        args += ["--only", step]
    status = cli.main(args)
    out, err = capsys.readouterr()
    stale = [line for line in err.splitlines() if "stale:" in line]
    assert status == 0 and not stale, (
        f"{stale}: re-derive with `verl-compat release derive {version}` "
        + " ".join(f"--only {s}" for s in CHEAP_STEPS)
    )
    assert "need a person" not in out, out


def test_a_derive_step_that_does_not_exist_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["release", "derive", OTHER, "--check", "--only", "lines"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "no derive step lines; the steps: files, lock, line-map" in line


# --- patch points ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", SUPPORTED)
def test_every_patch_point_of_a_release_is_in_its_files(version: str) -> None:
    """The names the probes set on a release (recorded by ``release derive``) are each found in
    its own files, by content: a point that moved fails here, before any check runs."""
    points = recorded_points(version)
    assert len(points) > 20, f"no patch points recorded for {version}"
    missing = [
        f"{f.point}: {f.reason}" for f in check(release_root(version), points) if not f.where
    ]
    assert not missing, missing


def test_a_patch_point_a_release_lacks_is_named(tmp_path: Path) -> None:
    package = tmp_path / "verl" / "trainer"
    package.mkdir(parents=True)
    (package / "main_ppo.py").write_text(
        "from verl.utils import helper\n\nclass Runner:\n    def run(self):\n        self.state = 1\n"
    )
    assert find(tmp_path, "verl.trainer.main_ppo.Runner.run").where == "verl/trainer/main_ppo.py:4"
    assert find(tmp_path, "verl.trainer.main_ppo.Runner.state").where is not None
    assert find(tmp_path, "verl.trainer.main_ppo.helper").where is not None
    gone = find(tmp_path, "verl.trainer.main_ppo.create_rl_dataset")
    assert gone.where is None and gone.reason


@needs_release()
def test_a_patch_point_missing_at_run_time_says_the_release_is_not_supported() -> None:
    """In the release's own code: a probe patching a name the release does not have raises,
    naming the release and the point (never a skipped check)."""
    from release_python import run_in_release

    said = run_in_release(
        """
        import verl.trainer.main_ppo as entry
        from pytest_verl_compat.upstream.probes.patching import PatchPointMissing, patched

        try:
            with patched(entry, "no_such_function", None):
                result = "patched"
        except PatchPointMissing as exc:
            result = str(exc)
        """
    )
    assert said == (
        f"release {PINNED_VERSION} not supported: verl.trainer.main_ppo.no_such_function not found"
    )


class _UnsupportedOracle:
    """An oracle whose release lacks a patch point (what the oracle process answers then)."""

    def __init__(self, *args: Any, release: str, **kwargs: Any) -> None:
        self.release = release

    def submit(self, request_id: str, request: Any) -> None:
        pass

    def answer(self, request_id: str, request: Any, timeout: float = 600) -> dict[str, Any]:
        from pytest_verl_compat.upstream.oracle.client import KEY_UNSUPPORTED

        said = f"release {self.release} not supported: verl.trainer.main_ppo.create_rl_dataset not found"
        return {"ok": False, KEY_UNSUPPORTED: said, "error": said}

    def close(self) -> None:
        pass


def test_check_on_a_release_missing_a_patch_point_is_one_line_exit_2(
    upstream_checkout: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    from pytest_verl_compat.upstream.verdict import case, early

    monkeypatch.setattr(case, "UpstreamOracle", _UnsupportedOracle)
    monkeypatch.setattr(early, "UpstreamOracle", _UnsupportedOracle)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    # A key no recorded answer has: the question goes to the oracle.
    status = cli.main(["check", "grpo", "--set", "trainer.experiment_name=patch-point-test"])
    out, err = capsys.readouterr()
    assert status == 2 and not out
    assert err.strip().splitlines()[-1] == (
        f"verl-compat check: release {PINNED_VERSION} not supported: "
        "verl.trainer.main_ppo.create_rl_dataset not found"
    )


# --- the lines a text cites --------------------------------------------------------------------


def _moved_line() -> tuple[str, int, int]:
    """A line of the citations release that the other release has elsewhere, unchanged."""
    mapping = line_map(OTHER)
    assert mapping is not None
    for file, blocks in sorted(mapping.changed.items()):
        for base, other, size in blocks:
            if base != other and size > 3:
                return file, base + 1, other + 1
    raise AssertionError(f"no line moved between {INDEX.citations} and {OTHER}")


def test_a_cited_line_is_read_at_the_releases_own_line() -> None:
    file, base, other = _moved_line()
    base_text = (release_root(INDEX.citations) / file).read_text().splitlines()[base - 1]
    other_text = (release_root(OTHER) / file).read_text().splitlines()[other - 1]
    assert base_text == other_text
    assert cite(f"upstream's {file}:{base} says so", OTHER) == f"upstream's {file}:{other} says so"
    assert cite(f"{file}:{base}", INDEX.citations) == f"{file}:{base}"


def test_a_cited_line_the_release_changed_says_so_instead_of_a_wrong_line() -> None:
    mapping = line_map(OTHER)
    assert mapping is not None
    for file, blocks in sorted(mapping.changed.items()):
        kept = {n for base, _, size in blocks for n in range(base, base + size)}
        total = len((release_root(INDEX.citations) / file).read_text().splitlines())
        changed = [n for n in range(1, total + 1) if n not in kept]
        if blocks and changed:
            said = cite(f"{file}:{changed[0]}", OTHER)
            assert said == f"{file}:{changed[0]} (verl {INDEX.citations}; changed in {OTHER})"
            return
    raise AssertionError("no changed line found")


def test_the_line_map_covers_every_source_file_of_the_citations_release() -> None:
    mapping = line_map(OTHER)
    assert mapping is not None
    assert set(mapping.base_files) == set(source_files(release_root(INDEX.citations)))


# --- a release's environment -------------------------------------------------------------------


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal wheel of one empty module (a valid one: pip installs it)."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},,\n" for path in files) + f"{dist}/RECORD,,\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for member, data in {**files, f"{dist}/RECORD": record.encode()}.items():
            archive.writestr(member, data)
    path.write_bytes(buffer.getvalue())
    return path


def _fake_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A release whose lock pins one tiny wheel named verl, with its data beside the test."""
    from pytest_verl_compat.releases import environment, index

    home = tmp_path / "home"
    monkeypatch.setenv("VERL_COMPAT_HOME", str(home))
    data = tmp_path / "data"
    release = dataclasses.replace(INDEX.release(OTHER), version="9.9.9", supported=True)
    monkeypatch.setattr(index, "RELEASE_DATA", data)
    (data / "9.9.9").mkdir(parents=True)
    wheels = home / environment.WHEELS
    wheels.mkdir(parents=True)
    wheel = _wheel(wheels, "verl", "9.9.9")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    lock = environment.lock_path(release)
    lock.write_text(f"# a test's lock\nverl==9.9.9 --hash=sha256:{digest}\n")
    return release


def test_an_environment_is_built_once_from_its_pinned_wheels_with_a_progress_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_verl_compat.releases.environment import built, load_lock, release_environment

    release = _fake_release(tmp_path, monkeypatch)
    said: list[str] = []
    environment = release_environment(release, said.append)
    assert said[0].startswith("building the environment of verl 9.9.9 from 1 pinned wheels")
    assert said[1].startswith("environment of verl 9.9.9 built in ") and said[1].endswith(" s")
    assert built(load_lock(release)) == environment and environment.python.exists()
    assert os.path.commonpath([environment.folder, tmp_path / "home"]) == str(tmp_path / "home")
    said.clear()
    assert release_environment(release, said.append) == environment and not said


def test_a_wheel_whose_hash_is_not_the_pinned_one_is_never_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_verl_compat.releases import environment

    release = _fake_release(tmp_path, monkeypatch)
    lock = environment.lock_path(release)
    lock.write_text(f"verl==9.9.9 --hash=sha256:{'0' * 64}\n")
    # pip may not fetch it from an index either: a machine offline.
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with pytest.raises(ReleaseError) as raised:
        environment.release_environment(release)
    said = str(raised.value)
    assert "\n" not in said and said.startswith("cannot fetch the pinned wheels of verl 9.9.9")
    assert f"pip download --no-deps --require-hashes -r {lock}" in said
    assert environment.built(environment.load_lock(release)) is None


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("verl>=9.9.9", "expected `name==version --hash=sha256:HEX`"),
        ("verl==9.9.9 --hash=sha256:abc", "expected `name==version --hash=sha256:HEX`"),
        (f"torch==2.13.0 --hash=sha256:{'a' * 64}", "the lock does not pin verl==9.9.9"),
    ],
)
def test_a_lock_that_does_not_pin_every_wheel_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str, expected: str
) -> None:
    from pytest_verl_compat.releases import environment

    release = _fake_release(tmp_path, monkeypatch)
    environment.lock_path(release).write_text(line + "\n")
    with pytest.raises(ReleaseError, match=expected.replace("(", r"\(")):
        environment.load_lock(release)


def test_a_claim_citing_only_code_a_release_lacks_says_nothing_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check stands on the upstream lines it cites: where every cited file is gone in the
    release checked (0.8.0 has no V1 trainer), it does not apply (``checks.registry``)."""
    import json

    from pytest_verl_compat.releases import lines

    gone, kept = "verl/trainer/ppo/v1/trainer_base.py", "verl/utils/config.py"
    (tmp_path / "9.9.9").mkdir()
    (tmp_path / "9.9.9" / lines.LINES_FILE).write_text(
        json.dumps({"base_files": [gone, kept], "changed": {gone: []}})
    )
    monkeypatch.setattr(lines, "RELEASE_DATA", tmp_path)
    lines.line_map.cache_clear()
    try:
        assert lines.cites_only_gone(f"{gone}:199 (_resolve_filter_groups_metric)", "9.9.9")
        assert not lines.cites_only_gone(f"{kept}:186", "9.9.9")
        assert not lines.cites_only_gone(f"{gone}:199, {kept}:186", "9.9.9")
        assert not lines.cites_only_gone("no citation at all", "9.9.9")
        assert not lines.cites_only_gone(f"{gone}:199", INDEX.citations)
    finally:
        lines.line_map.cache_clear()
