"""``fit RUN/.hydra/config.yaml`` (or ``fit RUN``): the run that ran out of memory forecast from the
resolved configuration Hydra wrote, the same forecast as its launch script's, each finding at its
key's line of the file; a file that is not a resolved configuration is one line, and an SFT run's
world comes from ``--world-size`` as ``compile`` takes it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from test_compile_resolved import run_folder
from test_fit_cli import GRPO, _one_line_error, _schema, _script, run

from pytest_verl_compat.pipeline.audit import AuditSession

FINDING = re.compile(r"^\S+:\d+(:\d+)?: (error|warning|info)\[")


def _tables(out: str) -> str:
    """The forecast without its first line (which names the script or the file) and without its
    located findings (whose locations differ): the tables and the KV-cache line."""
    lines = out.split("\n")[1:]
    return "\n".join(line for line in lines if not FINDING.match(line)).rstrip()


def _folder(session: AuditSession, script: str, folder: Path, overrides: bool = True) -> Path:
    outcome = session.outcome(session.case_for_script(script))
    assert outcome.composition.composed, outcome.composition.reason
    fields = outcome.fields.fields if overrides else None
    return run_folder(folder, outcome.composition.mapping, fields)


def test_a_run_folder_forecasts_as_its_launch_script(
    here: Path, upstream_session: AuditSession, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _script(GRPO)
    folder = _folder(upstream_session, str(here / script), here / "run")
    status, by_script, _ = run(capsys, "fit", script, "--gpu", "RTX4090", "--brief")
    assert status == 1
    for given in (str(folder), str(folder / ".hydra" / "config.yaml")):
        status, by_run, err = run(capsys, "fit", given, "--gpu", "RTX4090", "--brief")
        assert status == 1, err
        assert by_run.startswith("run/.hydra/config.yaml: Qwen/Qwen3-8B"), by_run[:200]
        assert _tables(by_run) == _tables(by_script)
        # each finding at the line of its first key in the resolved file
        findings = [line for line in by_run.splitlines() if "error[memory." in line]
        assert findings and all(f.startswith("run/.hydra/config.yaml:") for f in findings)
    status, out, _ = run(capsys, "fit", str(folder), "--gpu", "H100", "--format", "json")
    assert status == 0
    jsonschema.validate(json.loads(out), _schema())


def test_a_resolved_file_without_overrides_and_an_sft_run_take_what_they_say(
    here: Path, upstream_session: AuditSession, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without Hydra's overrides.yaml the forecast is the same (it reads resolved values); an SFT
    run's world is --world-size (a resolved file records no torchrun)."""
    folder = _folder(upstream_session, str(here / _script(GRPO)), here / "bare", overrides=False)
    _, with_none, _ = run(capsys, "fit", str(folder), "--gpu", "H100", "--brief")
    _, by_script, _ = run(capsys, "fit", _script(GRPO), "--gpu", "H100", "--brief")
    assert _tables(with_none) == _tables(by_script)
    assert upstream_session.manifest is not None
    case = upstream_session.manifest.case("sft_gsm8k")
    outcome = upstream_session.outcome(case)
    assert outcome.composition.composed and outcome.fields.world_size, outcome.composition.reason
    sft_run = run_folder(here / "sft", outcome.composition.mapping, outcome.fields.fields)
    world = str(outcome.fields.world_size)
    status, out, err = run(capsys, "fit", str(sft_run), "--gpu", "H100", "--world-size", world)
    assert status in (0, 1) and "SFT update" in out and f"; {world} GPUs in the" in out, err
    _, by_case, _ = run(capsys, "fit", "sft_gsm8k", "--gpu", "H100")
    assert _tables(out) == _tables(by_case)


def test_a_file_that_is_not_a_resolved_configuration_is_one_line(
    here: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = here / "config.yaml"
    bad.write_text("- just\n- a list\n")
    status, out, err = run(capsys, "fit", str(bad), "--gpu", "H100")
    _one_line_error(status, err, str(bad))
    assert out == ""
    # a _target_ the tree does not name is refused as compile refuses it (never the tree's
    # defaults forecast in its place)
    nested = here / "broken.yaml"
    nested.write_text(yaml.safe_dump({"actor_rollout_ref": {"actor": {"_target_": "os.system"}}}))
    status, out, err = run(capsys, "fit", str(nested), "--gpu", "H100")
    _one_line_error(status, err, "composition rejected", "os.system")
    assert out == ""
