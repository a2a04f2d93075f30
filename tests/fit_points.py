"""Recorded configurations (published points, out-of-memory reports) as launches, forecast.

One way for every entry: the entry's overrides on top of its defaults class, written as the
launch script a user would have run, composed by the same session ``check`` uses, forecast
on the entry's GPU. Nothing here knows an entry by name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_verl_compat.cli.fit_common import NotComposed, composed_for_forecast
from pytest_verl_compat.memory.forecast import forecast
from pytest_verl_compat.memory.gpus import find_gpu
from pytest_verl_compat.memory.parts import gib
from pytest_verl_compat.memory.release_facts import ReleaseFacts, release_facts
from pytest_verl_compat.memory.runs import NotForecastable, Request
from pytest_verl_compat.pipeline.audit import AuditSession


@dataclass(frozen=True)
class Outcome:
    """A forecast's verdict on one entry: ``oom`` and the phases that exceed the GPU."""

    oom: bool
    phases: tuple[str, ...]
    peak_phase: str
    peak_gib: float
    not_forecast: str = ""
    # the most torch allocates in the actor's worker process in any phase (its parts and the
    # reference's, colocated in the same worker, and the weight sync's staging); servers, CUDA
    # contexts and communication buffers are other processes' or not torch's
    actor_process_gib: float = 0.0

    def describe(self) -> str:
        if self.not_forecast:
            return f"not forecast: {self.not_forecast}"
        verdict = "OOM in " + ", ".join(self.phases) if self.oom else "fits"
        return f"{verdict} (peak {self.peak_phase} {self.peak_gib:.1f} GiB)"


def merged(*layers: Sequence[str]) -> list[str]:
    """Hydra overrides, later layers winning per key (Hydra itself rejects a key given twice)."""
    out: dict[str, str] = {}
    for layer in layers:
        for item in layer:
            key = item.split("=", 1)[0].lstrip("+")
            out.pop(key, None)
            out[key] = item
    return list(out.values())


def launch(entry: Mapping[str, Any], overrides: Sequence[str]) -> str:
    """The launch script of ``entry`` with ``overrides`` (bash, one override a line)."""
    gpus = int(entry.get("gpus", 1))
    model = str(entry.get("model", ""))
    if entry.get("sft"):
        head = f"torchrun --nnodes=1 --nproc_per_node={gpus} -m verl.trainer.sft_trainer"
        lines = [f"model.path={model}", *overrides]
    else:
        nnodes = next(
            (int(o.split("=", 1)[1]) for o in overrides if o.startswith("trainer.nnodes=")), 1
        )
        per_node = next(
            (
                int(o.split("=", 1)[1])
                for o in overrides
                if o.startswith("trainer.n_gpus_per_node=")
            ),
            gpus // nnodes,
        )
        head = "python3 -m verl.trainer.main_ppo"
        if entry.get("config_name"):
            head += f" --config-name={entry['config_name']}"
        base = [f"trainer.nnodes={nnodes}", f"trainer.n_gpus_per_node={per_node}"]
        if model:
            base.insert(0, f"actor_rollout_ref.model.path={model}")
        lines = merged(base, overrides)
    return head + " \\\n" + " \\\n".join(f"    {line}" for line in lines) + "\n"


def forecast_entry(
    session: AuditSession,
    folder: Path,
    entry: Mapping[str, Any],
    overrides: Sequence[str],
    lengths: tuple[int, int] | None = None,
    script: Path | None = None,
    facts: ReleaseFacts | None = None,
) -> Outcome:
    """Compose ``entry``'s launch with ``overrides`` (or the upstream ``script`` as written) and
    forecast it on the entry's GPU, with ``facts`` (default: the session's release's)."""
    if script is None:
        digest = hashlib.sha1("\n".join(overrides).encode()).hexdigest()[:10]
        script = folder / f"{entry['id']}-{digest}.sh"
        script.write_text(launch(entry, overrides))
    case = session.case_for_script(script)
    outcome = session.outcome(case)
    try:
        # as `fit` composes it: a key of an older verl set aside, or placed where its section
        # moved (an entry may quote a report's launch as its verl took it)
        composition, _, _ = composed_for_forecast(session, case, outcome)
    except NotComposed as exc:
        return Outcome(False, (), "", 0.0, f"not composed: {exc}")
    try:
        result = forecast(
            composition.mapping,
            Request(
                gpu=find_gpu(str(entry["gpu"])),
                lengths=lengths,
                world=outcome.fields.world_size,
                facts=facts or release_facts(session.version),
            ),
            with_fixes=False,
        )
    except NotForecastable as exc:
        return Outcome(False, (), "", 0.0, str(exc))
    errors = tuple(sorted({v.phase for v in result.verdicts if v.level == "error"}))
    peak = max((p for rank in result.ranks for p in rank.phases), key=lambda p: p.total)
    actor_process = max(
        sum(part.bytes for part in phase.parts if part.key.split(".", 1)[0] in ACTOR_PROCESS)
        for rank in result.ranks
        for phase in rank.phases
    )
    return Outcome(bool(errors), errors, peak.phase, gib(peak.total), "", gib(actor_process))


# The parts the actor's worker allocates with torch: the actor's, the reference's (the same
# ActorRolloutRef worker) and the weight sync's staging copies.
ACTOR_PROCESS = ("actor", "ref", "sync")
