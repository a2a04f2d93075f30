"""`trainer.logger` honoured as verl 0.9.0 does for the backends that work offline, and progress.

verl's `Tracking` (verl/utils/tracking.py:37-188) opens one logger per name in `trainer.logger`
and logs every step's metrics to each (`log(data, step)`, tracking.py:190-193):
- ``console``: `LocalLogger` prints ``step:N - key:value - ...`` (utils/logger/aggregate_logger.py:25-50);
- ``file``: `FileLogger` writes ``{"step": N, "data": {...}}`` lines to
  ``$VERL_FILE_LOGGER_PATH`` or ``$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl``
  (tracking.py:420-440); here the root is the run folder's ``file_logger/``;
- ``tensorboard``: a `torch.utils.tensorboard.SummaryWriter` in ``$TENSORBOARD_DIR`` or
  ``tensorboard_log/<project>/<experiment>``, one `add_scalar` per key (tracking.py:443-460);
  here under the run folder;
- ``wandb`` (tracking.py:75-85): `wandb.init(project, name, config)`; it runs here only when it is
  installed and ``WANDB_MODE=offline`` (no network), writing the run under the run folder.
Every other backend verl knows (mlflow, swanlab, ...) needs a service: it is recorded in the
run's ledger, not silently dropped. A name verl does not know fails as verl's assert does
(tracking.py:70).

`Progress` reports steps on stderr: a tqdm bar on a terminal, one plain line per step otherwise
(no carriage-return frames in logs), nothing at all with ``--no-progress`` (transformers' own bars
included).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Protocol

from reference_trainer.budget import Adaptation

SUPPORTED = (
    "wandb",
    "mlflow",
    "swanlab",
    "vemlp_wandb",
    "tensorboard",
    "console",
    "clearml",
    "trackio",
    "file",
    "rl_insight",
)
"""verl 0.9.0's `Tracking.supported_backend` (tracking.py:48-59), plus the deprecated 'tracking'."""
OFFLINE = ("console", "file", "tensorboard")


class Backend(Protocol):
    def log(self, data: dict[str, float], step: int) -> None: ...

    def finish(self) -> None: ...


class ConsoleBackend:
    """verl's LocalLogger line: ``step:N - key:value - ...`` on stdout."""

    def log(self, data: dict[str, float], step: int) -> None:
        fields = [f"step:{step}"] + [f"{k}:{v!r}" for k, v in data.items()]
        print(" - ".join(fields), flush=True)

    def finish(self) -> None:
        pass


class FileBackend:
    """verl's FileLogger: one ``{"step": N, "data": {...}}`` JSON line per step, appended."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # verl opens with "wb" (a fresh file per process); appending keeps a resumed run's rows.
        self.stream = path.open("a", encoding="utf-8")

    def log(self, data: dict[str, float], step: int) -> None:
        clean = {k: (v if math.isfinite(v) else str(v)) for k, v in data.items()}
        self.stream.write(json.dumps({"step": step, "data": clean}) + "\n")
        self.stream.flush()

    def finish(self) -> None:
        self.stream.close()


class TensorboardBackend:
    """verl's _TensorboardAdapter: one scalar per key per step."""

    def __init__(self, folder: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        folder.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(str(folder))

    def log(self, data: dict[str, float], step: int) -> None:
        for key, value in data.items():
            self.writer.add_scalar(key, value, step)

    def finish(self) -> None:
        self.writer.close()


class WandbOfflineBackend:
    """verl's wandb backend in offline mode, writing under the run folder."""

    def __init__(self, out: Path, project: str, experiment: str, config: dict[str, Any]) -> None:
        import wandb

        self.run = wandb.init(
            project=project, name=experiment, config=config, dir=str(out), mode="offline"
        )

    def log(self, data: dict[str, float], step: int) -> None:
        self.run.log(data, step=step)

    def finish(self) -> None:
        self.run.finish()


class Tracking:
    """The run's loggers; `ledger` lists the backends not run here, with the reason."""

    def __init__(
        self,
        names: tuple[str, ...],
        out: Path,
        project: str,
        experiment: str,
        config: dict[str, Any],
    ) -> None:
        self.backends: dict[str, Backend] = {}
        self.ledger: list[Adaptation] = []
        for name in dict.fromkeys(names):
            if name not in SUPPORTED and name != "tracking":
                raise ValueError(
                    f"trainer.logger: {name!r} is not a verl 0.9.0 backend "
                    f"(one of {', '.join(SUPPORTED)}; verl/utils/tracking.py:48)"
                )
            self._open(name, out, project, experiment, config)

    def _open(
        self, name: str, out: Path, project: str, experiment: str, config: dict[str, Any]
    ) -> None:
        field = f"trainer.logger[{name}]"
        if name == "console":
            self.backends[name] = ConsoleBackend()
        elif name == "file":
            path = out / "file_logger" / project / f"{experiment}.jsonl"
            self.backends[name] = FileBackend(path)
            self._note(
                field, name, str(path), "verl writes under the working folder; here the run folder"
            )
        elif name == "tensorboard":
            folder = out / "tensorboard_log" / project / experiment
            self.backends[name] = TensorboardBackend(folder)
            self._note(
                field,
                name,
                str(folder),
                "verl writes under the working folder; here the run folder",
            )
        elif name in ("wandb", "tracking") and _wandb_offline():
            self.backends["wandb"] = WandbOfflineBackend(out, project, experiment, config)
            self._note(
                field, name, "wandb offline", "WANDB_MODE=offline: written under the run folder"
            )
        elif name in ("wandb", "tracking"):
            reason = (
                "needs the network; set WANDB_MODE=offline to write an offline run"
                if importlib.util.find_spec("wandb")
                else "wandb is not installed"
            )
            self._note(field, name, None, f"not run: {reason}; metrics are in metrics.jsonl")
        else:
            self._note(
                field, name, None, "not run: needs a tracking service; metrics are in metrics.jsonl"
            )

    def _note(self, field: str, upstream: Any, local: Any, reason: str) -> None:
        self.ledger.append(Adaptation(field, upstream, local, reason))

    def log(self, data: dict[str, float], step: int) -> None:
        for backend in self.backends.values():
            backend.log(data, step)

    def finish(self) -> None:
        for backend in self.backends.values():
            backend.finish()
        self.backends = {}


def _wandb_offline() -> bool:
    mode = os.environ.get("WANDB_MODE", "")
    return mode in ("offline", "dryrun") and importlib.util.find_spec("wandb") is not None


class Progress:
    """Steps on stderr: tqdm on a terminal, a line per step elsewhere, nothing when disabled."""

    def __init__(self, enabled: bool, initial: int, total: int, case: str) -> None:
        self.enabled, self.step, self.total, self.case = enabled, initial, total, case
        self.bar: Any = None
        if not enabled or not sys.stderr.isatty():
            # Off a terminal, transformers' bars (e.g. the export's "Writing model shards")
            # would write carriage-return frames into the log.
            silence_library_bars()
            return
        from tqdm import tqdm

        self.bar = tqdm(total=total, initial=initial, desc=f"train {case}", unit="step")

    def update(self, steps: int = 1) -> None:
        self.step += steps
        if self.bar is not None:
            self.bar.update(steps)

    def set_postfix(self, live: dict[str, str]) -> None:
        """The step's live numbers: on the bar, or as the step's line off a terminal."""
        if self.bar is not None:
            self.bar.set_postfix(live)
        elif self.enabled:
            fields = " ".join(f"{k}={v}" for k, v in live.items())
            print(f"train {self.case}: step {self.step}/{self.total} {fields}", file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def silence_library_bars() -> None:
    """transformers' and huggingface_hub's progress bars off (e.g. loading checkpoint shards)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    from huggingface_hub.utils import disable_progress_bars  # type: ignore[attr-defined]

    disable_progress_bars()
