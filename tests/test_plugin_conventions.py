"""The plugin keeps pytest's conventions: node ids that paste back, the user's own tests kept,
JUnit that pytest's schema accepts, golden folders guarded, usage errors as usage errors."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from corpus_facts import release_ready

from pytest_verl_compat.pipeline.manifest import embedded_root
from pytest_verl_compat.pipeline.snapshot import write_atomic
from pytest_verl_compat.plugin.collect import embedded_golden_refusal
from pytest_verl_compat.plugin.golden import UnsafeCaseId, golden_file, golden_orphans
from pytest_verl_compat.plugin.nodes import NODE_PREFIX, STAGES

STAGES_MODULE = Path(__file__).resolve().parents[1] / "pytest_verl_compat" / "plugin" / "stages.py"


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """The audit in a subprocess, fast: no trusted stage, no conformance, no cache."""
    return pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--verl-corpus-trusted=off", *args
    )


def copy_corpus(tmp: Path) -> tuple[Path, Path]:
    """A writable copy of the embedded manifest and golden files (its golden_dir names them)."""
    root = embedded_root()
    shutil.copytree(root / "corpus", tmp / "corpus")
    shutil.copytree(root / "golden", tmp / "golden")
    manifest = tmp / "corpus" / "manifest.yaml"
    data = yaml.safe_load(manifest.read_text())
    data["golden_dir"] = "../golden"
    manifest.write_text(yaml.safe_dump(data, sort_keys=False))
    return manifest, tmp / "golden"


@pytest.fixture
def tree(monkeypatch: pytest.MonkeyPatch) -> None:
    """A config tree for the embedded default: the installed verl (no checkout from the env)."""
    if not release_ready():
        pytest.skip("needs the installed verl (the [upstream] extra)")
    monkeypatch.delenv("VERL_UPSTREAM", raising=False)


# --- options -------------------------------------------------------------------------------


def test_help_shows_the_trusted_choices_and_every_stage() -> None:
    functions = {
        node.name.removeprefix("test_")
        for node in ast.parse(STAGES_MODULE.read_text()).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }
    assert set(STAGES) == functions, "plugin.STAGES lists every stage test of plugin/stages.py"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--help"], capture_output=True, text=True, check=True
    )
    text = " ".join(result.stdout.split())
    assert "--verl-corpus-trusted={auto,off,require}" in text
    for stage in STAGES:
        assert stage in text.split("--verl-corpus-upstream")[0], stage


def test_a_missing_manifest_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--verl-corpus", "--verl-corpus-manifest", "nope.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--verl-corpus-manifest: 'nope.yaml': file not found*"])
    pytester.makeini("[pytest]\nverl_corpus_manifest = missing.yaml\n")
    from_ini = run(pytester, "--verl-corpus")
    assert from_ini.ret == pytest.ExitCode.USAGE_ERROR
    from_ini.stderr.fnmatch_lines(["*verl_corpus_manifest = missing.yaml: file not found*"])


# --- node ids and collection ---------------------------------------------------------------


def test_a_failure_node_id_pastes_back_to_rerun_exactly_that_test(
    pytester: pytest.Pytester, tree: None
) -> None:
    manifest, golden = copy_corpus(pytester.path)
    grpo = golden / "compose" / "grpo.json"
    data = json.loads(grpo.read_text())
    data["resolved"]["trainer"]["nnodes"] = 2
    grpo.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    args = ("--verl-corpus", f"--verl-corpus-manifest={manifest}", "-rf")
    first = run(pytester, *args, "-k", "snapshot and grpo and not lora and not reward")
    failed = [line.split()[1] for line in first.outlines if line.startswith("FAILED ")]
    assert failed == [f"{NODE_PREFIX}::test_snapshot[grpo]"], first.stdout.str()[-2000:]

    again = run(pytester, *args, failed[0])
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines([f"rootdir: {pytester.path}*"])
    assert [line.split()[1] for line in again.outlines if line.startswith("FAILED ")] == failed
    # The module's own path works too, without adding the whole module again.
    by_path = run(pytester, *args, f"{STAGES_MODULE}::test_snapshot[grpo]")
    by_path.assert_outcomes(failed=1)


def test_user_tests_and_testpaths_stay_when_the_audit_is_in_addopts(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini("[pytest]\ntestpaths = mine\naddopts = --verl-corpus\n")
    pytester.mkdir("mine")
    (pytester.path / "mine" / "test_mine.py").write_text("def test_mine():\n    pass\n")
    result = run(pytester, "-k", "test_mine or golden_orphans", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*mine/test_mine.py::test_mine PASSED*"])
    # Given on the command line alone, --verl-corpus runs only the audit (the README's command).
    pytester.makeini("[pytest]\ntestpaths = mine\n")
    alone = run(pytester, "--verl-corpus", "-k", "test_mine or golden_orphans")
    alone.assert_outcomes(passed=1)


def test_the_audit_alone_loads_no_conftest_of_the_tests_it_does_not_run(
    pytester: pytest.Pytester,
) -> None:
    # A project whose test conftests import test-only packages (this repository's imports
    # hypothesis, which only the [test] extra installs): the README's first command must not
    # need them, and the project's own test run must still load them.
    pytester.makeini("[pytest]\ntestpaths = mine\n")
    for folder in ("mine", "tests"):
        pytester.mkdir(folder)
        (pytester.path / folder / "conftest.py").write_text("import not_installed_test_extra\n")
        (pytester.path / folder / "test_mine.py").write_text("def test_mine():\n    pass\n")
    # The project's own root conftest still applies to the audit (its hooks, its settings).
    marker = pytester.path / "root-conftest-loaded"
    pytester.makeconftest(f"open({str(marker)!r}, 'a').write('x')\n")
    alone = run(pytester, "--verl-corpus", "-k", "golden_orphans")
    alone.assert_outcomes(passed=1)
    assert marker.read_text() == "x"
    pasted = run(pytester, "--verl-corpus", f"{NODE_PREFIX}::test_golden_orphans")
    pasted.assert_outcomes(passed=1)
    assert marker.read_text() == "xx"
    for args in ((), ("--verl-corpus", "mine"), ("-o", "addopts=--verl-corpus")):
        tests_too = run(pytester, *args)
        assert tests_too.ret == pytest.ExitCode.USAGE_ERROR, args
        tests_too.stderr.fnmatch_lines(["*No module named 'not_installed_test_extra'*"])


# --- summary --------------------------------------------------------------------------------


def test_a_run_with_nothing_to_audit_says_so(pytester: pytest.Pytester) -> None:
    selected_none = run(pytester, "--verl-corpus", "-k", "no_such_case")
    selected_none.stdout.fnmatch_lines(
        ["no corpus case audited: no corpus case was selected (check -k, -m or the node ids given)"]
    )
    empty = pytester.mkdir("empty")
    no_tree = run(pytester, "--verl-corpus", f"--verl-corpus-upstream={empty}", "-k", "grpo")
    no_tree.stdout.fnmatch_lines(
        ["no corpus case audited: no upstream config tree (*is not an upstream*"]
    )


def test_a_partial_selection_says_its_totals_are_partial(
    pytester: pytest.Pytester, tree: None
) -> None:
    from corpus_facts import MANIFEST

    result = run(pytester, "--verl-corpus", f"{NODE_PREFIX}::test_compile[grpo]")
    result.assert_outcomes(passed=1)
    total = len(MANIFEST["cases"])
    result.stdout.fnmatch_lines(
        [f"partial run: 1 of {total} corpus cases selected; the totals below count only these"]
    )


# --- JUnit -------------------------------------------------------------------------------------

# What pytest's JUnit schema (junit-10.xsd, which pytest's own tests validate xunit2 files
# with) allows the elements this plugin touches to hold.
TESTCASE_CHILDREN = {"skipped", "error", "failure", "system-out", "system-err"}
TESTCASE_ATTRIBUTES = {"name", "time", "classname", "group"}


def test_junit_is_valid_xunit2_with_stage_classnames_and_short_properties(
    pytester: pytest.Pytester, tree: None
) -> None:
    junit = pytester.path / "junit.xml"
    result = run(
        pytester, "--verl-corpus", f"--junitxml={junit}", "-k", "not conformance", "-n", "2"
    )
    assert result.ret == 0, result.stdout.str()[-2000:]
    suite = ET.parse(junit).getroot().find("testsuite")
    cases = list(suite.iter("testcase"))
    assert cases
    for case in cases:
        assert {child.tag for child in case} <= TESTCASE_CHILDREN, ET.tostring(case)[:300]
        assert set(case.attrib) <= TESTCASE_ATTRIBUTES
        stage = case.get("name").split("[")[0].removeprefix("test_")
        assert case.get("classname") == f"verl_corpus.{stage}"
    suite_props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert suite_props["verl_case:grpo"] == "accepted"
    assert suite_props["verl_case:derived/missing-filter-metric"] == "semantic_rejection"
    assert max(len(value) for value in suite_props.values()) < 300
    assert junit.stat().st_size < 100_000, "no JSON payloads travel inside the XML"


def test_junit_xunit1_has_short_per_case_properties(pytester: pytest.Pytester, tree: None) -> None:
    junit = pytester.path / "junit.xml"
    run(
        pytester,
        "--verl-corpus",
        f"--junitxml={junit}",
        "-o",
        "junit_family=xunit1",
        "-k",
        "compile and grpo",
    )
    suite = ET.parse(junit).getroot().find("testsuite")
    case = next(c for c in suite.iter("testcase") if c.get("name") == "test_compile[grpo]")
    props = {p.get("name"): p.get("value") for p in case.find("properties")}
    assert props["verl_case"] == "grpo" and props["outcome"] == "accepted"
    assert int(props["leaves_unknown"]) == 0
    assert max(len(value) for value in props.values()) <= 300


# --- golden folders ----------------------------------------------------------------------------


def test_snapshot_update_refuses_the_golden_files_inside_the_installed_package(
    tmp_path: Path,
) -> None:
    package = tmp_path / "site-packages" / "pytest_verl_compat"
    golden = package / "_embedded" / "golden"
    message = embedded_golden_refusal(golden, named=False, package_dir=package)
    assert message and "--verl-corpus-golden DIR" in message
    assert embedded_golden_refusal(golden, named=True, package_dir=package) is None
    assert embedded_golden_refusal(tmp_path / "golden", named=False, package_dir=package) is None


@pytest.mark.parametrize(
    "case_id", ["x/../../victim", "../victim", "derived/..", "a//b", "derived/.hidden", "a\\..\\b"]
)
def test_a_case_id_cannot_name_a_file_outside_its_golden_folder(
    tmp_path: Path, case_id: str
) -> None:
    with pytest.raises(UnsafeCaseId):
        golden_file(tmp_path, "compose", case_id)
    assert golden_file(tmp_path, "compose", "derived/my-lower-clip.v2") == (
        tmp_path / "compose" / "derived" / "my-lower-clip.v2.json"
    )


def test_the_schema_rejects_dot_segments_and_update_writes_nothing_outside(
    pytester: pytest.Pytester, tree: None
) -> None:
    manifest, _ = copy_corpus(pytester.path)
    data = yaml.safe_load(manifest.read_text())
    data["cases"].append(
        {"id": "derived/../../../victim", "kind": "derived", "base": "grpo", "overrides": []}
    )
    manifest.write_text(yaml.safe_dump(data, sort_keys=False))
    result = run(
        pytester,
        "--verl-corpus",
        f"--verl-corpus-manifest={manifest}",
        # An unsafe id is never used, not even as a test id: the case is named by its index.
        "-k",
        "cases",
        "--snapshot-update",
    )
    result.stdout.fnmatch_lines(["*case 'cases[[]*[]]': field cases*id*does not match*"])
    assert not list(pytester.path.rglob("victim*")), "nothing written for a hostile id"


def test_orphans_follow_syrupys_options_for_unused_snapshots(pytester: pytest.Pytester) -> None:
    manifest, golden = copy_corpus(pytester.path)
    ghosts = [golden / "compose" / "derived" / "ghost.json", golden / "compile" / "ghost.json"]
    for ghost in ghosts:
        ghost.write_text("{}\n")
    shown = [str(ghost.relative_to(pytester.path)) for ghost in ghosts]
    args = ("--verl-corpus", f"--verl-corpus-manifest={manifest}", "-k", "golden_orphans")
    accept = f"pytest --verl-corpus --verl-corpus-manifest {manifest} --snapshot-update"
    again = f"Re-run {accept} to delete unused golden files."

    # Unused golden files fail the run; the summary counts them and says how to delete them.
    reported = run(pytester, *args)
    reported.assert_outcomes(failed=1)
    reported.stdout.fnmatch_lines(["2 golden files unused.", again])
    assert not [line for line in reported.outlines if line.startswith("Unused ")]
    # --snapshot-details lists them; --snapshot-warn-unused does not fail on them.
    details = run(pytester, *args, "--snapshot-details")
    details.assert_outcomes(failed=1)
    details.stdout.fnmatch_lines(["2 golden files unused.", *(f"Unused {p}" for p in shown), again])
    warned = run(pytester, *args, "--snapshot-warn-unused")
    warned.assert_outcomes(passed=1)
    warned.stdout.fnmatch_lines(["2 golden files unused.", again])
    # --snapshot-update deletes and lists them, unless --snapshot-no-cleanup.
    kept = run(pytester, *args, "--snapshot-update", "--snapshot-no-cleanup")
    kept.assert_outcomes(passed=1)
    kept.stdout.fnmatch_lines(["2 golden files unused.", *(f"Unused {p}" for p in shown)])
    assert all(ghost.exists() for ghost in ghosts)
    removed = run(pytester, *args, "--snapshot-update")
    removed.assert_outcomes(passed=1)
    removed.stdout.fnmatch_lines(
        ["2 unused golden files deleted.", *(f"Deleted {p}" for p in shown)]
    )
    assert not any(ghost.exists() for ghost in ghosts)
    assert (golden / "compose" / "grpo.json").exists() and (
        golden / "compile" / "grpo.json"
    ).exists()
    clean = run(pytester, *args)
    clean.assert_outcomes(passed=1)
    assert not [line for line in clean.outlines if "unused golden" in line]


def test_golden_orphans_are_found_by_case_id(tmp_path: Path) -> None:
    (tmp_path / "compile" / "derived").mkdir(parents=True)
    for name in ("grpo.json", "derived/x.json", "derived/y.json"):
        (tmp_path / "compile" / name).write_text("{}")
    assert golden_orphans(tmp_path, "compile", {"grpo", "derived/x"}) == [
        tmp_path / "compile" / "derived" / "y.json"
    ]


def test_written_files_get_the_usual_mode_not_0600(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        write_atomic(tmp_path / "golden.json", "{}\n")
    finally:
        os.umask(umask)
    assert (tmp_path / "golden.json").stat().st_mode & 0o777 == 0o644
