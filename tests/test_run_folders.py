"""Run folders as users expect them: a lock, no silent overwrite, torn lines survived, runs
extended, loggers honoured as verl does, progress fit for logs, one-line errors naming the file.

Every run is the tiny grpo budget (2 steps of 8 prompts, 8 new tokens); a finished run is made
once per module and copied.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from run_folder_fixtures import copy_run, grpo_config, tiny_budget, train

from reference_trainer.checkpoint import CheckpointError
from reference_trainer.config import ReferenceTrainerConfig
from reference_trainer.run_files import (
    RunFolderError,
    TornLineWarning,
    locked_run_folder,
    metrics_figure,
)
from reference_trainer.trainer import ReferenceTrainer


@pytest.fixture(scope="module")
def cfg() -> ReferenceTrainerConfig:
    return grpo_config()


@pytest.fixture(scope="module")
def finished(cfg: ReferenceTrainerConfig, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    train(cfg, out, tiny_budget())
    return out


def _cli(*argv: str) -> int:
    from pytest_verl_compat.cli.train import add_train_parser

    parser = argparse.ArgumentParser()
    add_train_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["train", *argv])
    return int(args.func(args))


def _rows(path: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- the lock ----------------------------------------------------------------------------------


def test_a_second_run_on_a_locked_folder_fails_at_once(
    cfg: ReferenceTrainerConfig, finished: Path, tmp_path: Path
) -> None:
    out = copy_run(finished, tmp_path / "run")
    before = (out / "metrics.jsonl").read_bytes()
    with locked_run_folder(out):
        with pytest.raises(RunFolderError, match=rf"^{out}: another run is using this run folder"):
            train(cfg, out, tiny_budget(), resume=True)
    assert (out / "metrics.jsonl").read_bytes() == before, "the locked folder was written"
    # Released with the first holder: the same resume now runs.
    assert train(cfg, out, tiny_budget(), resume=True).final_step == 2


def test_cli_run_on_a_folder_another_process_holds_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
            str(out / ".lock"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        code = _cli("grpo", "--steps", "1", "--out", str(out), "--no-progress", "--test-freq", "-1")
    finally:
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.close()
        holder.wait(timeout=30)
        holder.stdout.close()
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().splitlines() == [
        f"verl-compat train: {out}: another run is using this run folder (it holds {out / '.lock'})"
    ]


# -- fresh runs do not take over an earlier run's folder ---------------------------------------


def test_a_fresh_run_refuses_an_earlier_run_unless_told_to_overwrite(
    cfg: ReferenceTrainerConfig, finished: Path, tmp_path: Path
) -> None:
    out = copy_run(finished, tmp_path / "run")
    before = (out / "metrics.jsonl").read_bytes()
    with pytest.raises(RunFolderError, match=rf"^{out}: the run folder holds an earlier run"):
        train(cfg, out, tiny_budget(steps=1))
    assert (out / "metrics.jsonl").read_bytes() == before
    result = train(cfg, out, tiny_budget(steps=1), overwrite=True)
    assert [r["step"] for r in result.metrics] == [1]
    # The earlier run's later checkpoint is gone, so the new one is not pruned in its favour.
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["global_step_1"]


def test_overwrite_removes_only_run_files(
    cfg: ReferenceTrainerConfig, finished: Path, tmp_path: Path
) -> None:
    out = copy_run(finished, tmp_path / "run")
    (out / "notes.txt").write_text("mine\n")
    with pytest.raises(RunFolderError, match=r"'notes\.txt' is not one"):
        train(cfg, out, tiny_budget(steps=1), overwrite=True)
    assert (out / "notes.txt").read_text() == "mine\n"
    assert (out / "checkpoints" / "global_step_2").is_dir()


def test_train_help_documents_overwrite() -> None:
    from pytest_verl_compat.cli.train import add_train_parser

    parser = argparse.ArgumentParser()
    sub = add_train_parser(parser.add_subparsers(dest="command"))
    assert "--overwrite" in sub.format_help()


# -- a killed run's torn JSONL line -------------------------------------------------------------


@pytest.mark.parametrize("name", ["metrics.jsonl", "samples.jsonl"])
def test_a_torn_last_line_is_dropped_with_a_warning_and_resume_proceeds(
    name: str, cfg: ReferenceTrainerConfig, finished: Path, tmp_path: Path
) -> None:
    out = copy_run(finished, tmp_path / "run")
    lines = (out / name).read_text().splitlines()
    with (out / name).open("a") as handle:
        handle.write('{"step": 3, "critic/sco')  # what a kill mid-write leaves
    with pytest.warns(TornLineWarning, match=rf"{out / name}:{len(lines) + 1}: dropped a torn"):
        result = train(cfg, out, tiny_budget(), resume=True)
    assert result.final_step == 2
    assert [r["step"] for r in _rows(out / "metrics.jsonl")] == [1, 2]
    assert all(isinstance(r, dict) for r in _rows(out / "samples.jsonl"))


def test_a_broken_line_before_the_end_names_file_and_line(
    cfg: ReferenceTrainerConfig, finished: Path, tmp_path: Path
) -> None:
    out = copy_run(finished, tmp_path / "run")
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("\n".join(["{not json", *lines]) + "\n")
    with pytest.raises(RunFolderError, match=rf"^{out / 'metrics.jsonl'}:1: not a JSON row"):
        train(cfg, out, tiny_budget(), resume=True)


# -- extending a finished run; configs that really differ ---------------------------------------


def test_a_finished_run_is_extended_by_more_steps(
    cfg: ReferenceTrainerConfig, finished: Path, tmp_path: Path
) -> None:
    out = copy_run(finished, tmp_path / "run")
    result = train(cfg, out, tiny_budget(steps=3), resume=True)
    assert result.final_step == 3
    assert [r["step"] for r in result.metrics] == [1, 2, 3]
    assert (out / "checkpoints" / "global_step_3" / "COMPLETE").is_file()


def test_a_really_different_config_names_the_differing_fields(
    cfg: ReferenceTrainerConfig, finished: Path, tmp_path: Path
) -> None:
    out = copy_run(finished, tmp_path / "run")
    other = dataclasses.replace(
        cfg, algorithm=dataclasses.replace(cfg.algorithm, gamma=0.5, lam=0.5)
    )
    with pytest.raises(CheckpointError) as raised:
        train(other, out, tiny_budget(), resume=True)
    message = str(raised.value)
    assert message.startswith(f"{out / 'checkpoints' / 'global_step_2' / 'config.json'}: ")
    assert message.endswith("differs from this run's in algorithm.gamma, algorithm.lam")


# -- trainer.logger as verl honours it --------------------------------------------------------


def test_offline_loggers_write_what_verl_writes_and_the_rest_is_in_the_ledger(
    cfg: ReferenceTrainerConfig,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.delenv("WANDB_MODE", raising=False)
    names = ("console", "file", "tensorboard", "mlflow", "wandb")
    logged = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, logger=names))
    train(logged, tmp_path, tiny_budget(steps=2, save_freq=-1))
    trainer_cfg = logged.trainer
    console = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step:")]
    assert [line.split(" - ")[0] for line in console] == ["step:1", "step:2"]
    assert " - critic/score/mean:" in console[0]
    jsonl = tmp_path / "file_logger" / trainer_cfg.project_name
    rows = _rows(jsonl / f"{trainer_cfg.experiment_name}.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and "critic/score/mean" in rows[0]["data"]
    board = tmp_path / "tensorboard_log" / trainer_cfg.project_name / trainer_cfg.experiment_name
    events = EventAccumulator(str(board))
    events.Reload()
    assert [e.step for e in events.Scalars("critic/score/mean")] == [1, 2]
    ledger = json.loads((tmp_path / "adaptations.json").read_text())["adaptations"]
    reasons = {a["field"]: a["reason"] for a in ledger if a["field"].startswith("trainer.logger")}
    assert set(reasons) == {
        "trainer.logger[file]",
        "trainer.logger[tensorboard]",
        "trainer.logger[mlflow]",
        "trainer.logger[wandb]",
    }
    assert reasons["trainer.logger[mlflow]"].startswith("not run: needs a tracking service")
    # wandb is no extra of ours: where it is installed it runs only offline, when asked.
    if importlib.util.find_spec("wandb") is None:
        assert reasons["trainer.logger[wandb]"].startswith("not run: wandb is not installed")
    else:
        assert "WANDB_MODE=offline" in reasons["trainer.logger[wandb]"]


def test_a_logger_verl_does_not_know_fails_like_verl(
    cfg: ReferenceTrainerConfig, tmp_path: Path
) -> None:
    bad = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, logger=("consol",)))
    with pytest.raises(ValueError, match=r"^trainer\.logger: 'consol' is not a verl 0\.9\.0"):
        train(bad, tmp_path, tiny_budget(steps=1))


def test_the_case_config_carries_the_scripts_logger(cfg: ReferenceTrainerConfig) -> None:
    # examples/grpo_trainer/run_qwen2-7b_math.sh (the grpo case): trainer.logger='["console","wandb"]'
    assert cfg.trainer.logger == ("console", "wandb")


# -- progress output ----------------------------------------------------------------------------


@pytest.fixture
def library_bars() -> Iterator[None]:
    from huggingface_hub.utils import enable_progress_bars
    from transformers.utils import logging as hf_logging

    # Bars on at the start (an earlier test may have silenced them) and again afterwards.
    hf_logging.enable_progress_bar()
    enable_progress_bars()
    yield
    hf_logging.enable_progress_bar()
    enable_progress_bars()


def test_progress_is_one_line_per_step_without_carriage_returns_off_a_terminal(
    library_bars: None,
    cfg: ReferenceTrainerConfig,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ReferenceTrainer(cfg, tiny_budget(steps=2), tmp_path, progress=True).run()
    err = capsys.readouterr().err
    assert "\r" not in err
    steps = [line for line in err.splitlines() if line.startswith("train grpo: step ")]
    assert [line.split()[3] for line in steps] == ["1/2", "2/2"]


def test_no_progress_silences_transformers_bars(
    library_bars: None, cfg: ReferenceTrainerConfig, tmp_path: Path
) -> None:
    from huggingface_hub.utils import are_progress_bars_disabled
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()
    ReferenceTrainer(cfg, tiny_budget(steps=1), tmp_path, progress=False)
    assert not hf_logging.is_progress_bar_enabled()
    assert are_progress_bars_disabled()


def test_metrics_png_has_integer_steps_and_the_validation_reward() -> None:
    rows = [
        {"step": 0, "val/reward/mean": 0.1},
        {"step": 1, "critic/score/mean": 0.2},
        {"step": 2, "critic/score/mean": 0.3, "val/reward/mean": 0.4},
    ]
    figure = metrics_figure(rows)
    reward = figure.axes[0]
    lines = {line.get_label(): list(line.get_xdata()) for line in reward.get_lines()}
    assert lines == {"train": [1, 2], "validation": [0, 2]}
    figure.canvas.draw()
    ticks = [t for t in reward.get_xticks() if reward.get_xlim()[0] <= t <= reward.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


# -- one-line errors naming the file ------------------------------------------------------------


def _prompt_file(tmp_path: Path, rows: list[str] | bytes) -> Path:
    path = tmp_path / "prompts.jsonl"
    if isinstance(rows, bytes):
        path.write_bytes(rows)
    else:
        path.write_text("".join(row + "\n" for row in rows))
    return path


GOOD = '{"uid": "t0", "prompt": "1+1=", "answer": "2", "split": "train"}'


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ([GOOD, '{"uid": "t1", "prompt": "2+2=", "split": "train"}'], ":2: missing key 'answer'"),
        ([GOOD, GOOD[:-1] + ', "label": "x"}'], ":2: unknown key 'label'"),
        ([GOOD, '{"uid": 1' + "0" * 5000 + "}"], ":2: not a JSON row"),
        (GOOD.encode() + b"\n\xff\xfe\n", ": not UTF-8 (byte "),
        ([GOOD, "[1, 2]"], ":2: a prompt row is a JSON object"),
    ],
    ids=["missing-key", "extra-key", "huge-int", "invalid-utf8", "not-an-object"],
)
def test_bad_prompt_files_are_one_line_naming_the_file(
    content: list[str] | bytes,
    expected: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = _prompt_file(tmp_path, content)
    code = _cli("grpo", "--prompts", str(path), "--out", str(tmp_path / "run"), "--no-progress")
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"verl-compat train: {path}{expected}"), err


def test_out_that_is_a_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "taken"
    out.write_text("not a folder\n")
    assert _cli("grpo", "--steps", "1", "--out", str(out), "--no-progress") == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"verl-compat train: {out}: --out is a file, not a folder"]


def test_lock_file_is_released_when_the_process_ends(tmp_path: Path) -> None:
    with locked_run_folder(tmp_path):
        pass
    fd = os.open(tmp_path / ".lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no BlockingIOError: released
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("option", "value"),
    [("--seed", "9" * 30), ("--seed", "-1"), ("--steps", "9" * 30), ("--save-freq", "9" * 30)],
)
def test_huge_integers_on_the_command_line_are_one_line(
    option: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        _cli("grpo", option, value, "--out", str(tmp_path / "run"), "--no-progress")
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"error: argument {option}: expected an integer from " in err.strip().splitlines()[-1]
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_wandb_runs_offline_under_the_run_folder_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    from reference_trainer.tracking import Tracking

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    tracking = Tracking(("wandb",), tmp_path, "project", "experiment", {"seed": 0})
    tracking.log({"critic/score/mean": 0.5}, 1)
    tracking.finish()
    assert [(a.field, a.local) for a in tracking.ledger] == [
        ("trainer.logger[wandb]", "wandb offline")
    ]
    assert list(tmp_path.glob("wandb/offline-run-*/run-*.wandb")), "no offline run written"


def test_cli_resume_over_a_torn_line_warns_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = (
        "--out",
        str(tmp_path),
        "--no-progress",
        "--test-freq",
        "-1",
        "--response-length",
        "8",
    )
    assert _cli("grpo", "--steps", "1", *common) == 0
    metrics = tmp_path / "metrics.jsonl"
    torn = len(metrics.read_text().splitlines()) + 1
    with metrics.open("a") as handle:
        handle.write('{"step": 2, "crit')
    capsys.readouterr()
    assert _cli("grpo", "--steps", "2", "--resume", *common) == 0
    err = capsys.readouterr().err.splitlines()
    expected = f"verl-compat train: warning: {metrics}:{torn}: dropped a torn last line"
    assert [line for line in err if "warning" in line] == [f"{expected} (an interrupted write)"]
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()][-2:] == [1, 2]
