"""Byte-identical results across xdist, ``PYTHONHASHSEED``, snapshot updates and machines."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_verl_compat.pipeline.compose import Composer

REPO = Path(__file__).resolve().parents[1]
UPSTREAM = Path(os.environ.get("VERL_UPSTREAM") or REPO.parent / "shared/upstream/verl-v0.9.0")
CLI = (sys.executable, "-m", "pytest_verl_compat.cli", "--upstream", str(UPSTREAM))
FAST = ("-k", "not conformance and not verdict")

pytestmark = pytest.mark.skipif(
    not UPSTREAM.is_dir(), reason=f"no verl v0.9.0 checkout at {UPSTREAM} (VERL_UPSTREAM)"
)


def corpus_copy(tmp: Path) -> Path:
    """The manifest and its tolerance file, without golden files (``golden_dir`` unset)."""
    folder = tmp / "corpus"
    folder.mkdir(parents=True)
    shutil.copy(REPO / "corpus/manifest.yaml", folder / "manifest.yaml")
    shutil.copy(REPO / "corpus/conformance.yaml", folder / "conformance.yaml")
    return folder / "manifest.yaml"


def audit(
    pytester: pytest.Pytester, name: str, manifest: Path, *args: str
) -> tuple[pytest.RunResult, Path, Path, Path]:
    """An audit that writes snapshots into a fresh folder; (result, report, junit, golden)."""
    out = pytester.path / name
    out.mkdir()
    report, junit, golden = out / "audit.json", out / "junit.xml", out / "golden"
    golden.mkdir()
    result = pytester.runpytest_subprocess(
        "--verl-corpus",
        f"--verl-corpus-upstream={UPSTREAM}",
        f"--verl-corpus-manifest={manifest}",
        f"--verl-corpus-golden={golden}",
        f"--verl-corpus-report={report}",
        f"--junitxml={junit}",
        "--verl-corpus-trusted=off",
        "--snapshot-update",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        *FAST,
        *args,
        timeout=900,
    )
    return result, report, junit, golden


def outcomes(result: pytest.RunResult) -> dict[str, int]:
    parsed = result.parseoutcomes()
    # `-k` deselects on the xdist workers, so only the controller of a serial run counts them.
    return {k: v for k, v in parsed.items() if k not in {"seconds", "second", "deselected"}}


def case_outcomes(junit: Path) -> dict[str, str]:
    """Each test's outcome from the JUnit file: passed, skipped, failure or error."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in {"skipped", "failure", "error"}]
        out[f"{case.get('classname')}::{case.get('name')}"] = kinds[0] if kinds else "passed"
    return out


def global_properties(junit: Path) -> list[tuple[str, str]]:
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    assert suite is not None
    props = suite.find("properties")
    return [(p.get("name", ""), p.get("value", "")) for p in props] if props is not None else []


def files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_serial_and_xdist_write_the_same_bytes(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("xdist")
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    manifest = corpus_copy(pytester.path / "input")
    serial = audit(pytester, "serial", manifest)
    parallel = audit(pytester, "xdist", manifest, "-n", "2")
    assert serial[0].ret == 0, serial[0].stdout.str()[-3000:]
    assert parallel[0].ret == 0, parallel[0].stdout.str()[-3000:]
    assert outcomes(serial[0]) == outcomes(parallel[0])
    assert case_outcomes(serial[2]) == case_outcomes(parallel[2])
    assert serial[1].read_bytes() == parallel[1].read_bytes()
    props = global_properties(serial[2])
    assert props, "no JUnit global properties"
    assert props == global_properties(parallel[2])
    written = files(serial[3])
    assert any(name.startswith("compose/") for name in written), sorted(written)
    assert written == files(parallel[3])


def test_hash_seed_does_not_change_the_audit(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = corpus_copy(pytester.path / "input")
    reports = []
    for seed in ("1", "4242"):
        monkeypatch.setenv("PYTHONHASHSEED", seed)
        result, report, _, golden = audit(pytester, f"seed{seed}", manifest)
        assert result.ret == 0, result.stdout.str()[-3000:]
        reports.append((report.read_bytes(), files(golden)))
    assert reports[0] == reports[1]


MACHINES = [
    {"HOME": "/home/alice", "USER": "alice", "LANG": "C", "LC_ALL": "C"},
    {
        "HOME": "/nonexistent/bob",
        "USER": "bob",
        "LANG": "tr_TR.UTF-8",
        "LC_ALL": "tr_TR.UTF-8",
        "VERL_LOGGING_LEVEL": "DEBUG",
        "VERL_DEVICE": "npu",
        "HYDRA_FULL_ERROR": "1",
        "HYDRA_MAIN_MODULE": "nope",
        "NNODES": "16",
        "MODEL_PATH": "/machine/specific/model",
        "TRAIN_BATCH_SIZE": "7",
    },
]


@pytest.mark.parametrize("case", ["grpo", "ppo"])
def test_resolved_mapping_does_not_depend_on_the_machine(tmp_path: Path, case: str) -> None:
    outputs = []
    for index, machine in enumerate(MACHINES):
        cwd = tmp_path / f"cwd{index}"
        cwd.mkdir()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **machine}
        proc = subprocess.run(
            [*CLI, "compose", case],
            cwd=cwd,
            env=env,
            capture_output=True,
            check=False,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr.decode()[-2000:]
        outputs.append(proc.stdout)
    assert outputs[0] == outputs[1]
    assert b"/home/verl/" in outputs[0]  # the manifest's HOME, not the machine's


def test_no_target_is_instantiated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    composer = Composer(UPSTREAM / "verl/trainer/config", "ppo_trainer")
    fields = [
        "+trainer.evil={_target_: builtins.exec, _args_: [\"open('PWNED','w')\"]}",
        "+trainer.evil2._target_=os.system",
        "+trainer.evil2._args_=['touch PWNED2']",
    ]
    composition = composer.compose(fields, {})
    # A _target_ the tree does not name is a composition rejection, with its path.
    assert not composition.composed
    assert composition.reason.startswith("trainer.evil._target_='builtins.exec'")
    assert "; 1 more" in composition.reason
    assert not (tmp_path / "PWNED").exists()
    assert not (tmp_path / "PWNED2").exists()
