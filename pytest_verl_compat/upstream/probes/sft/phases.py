"""The probes' run on one ``sft_trainer_engine`` mapping: ``run_sft``'s order, its reads recorded.

``torchrun … -m verl.trainer.sft_trainer`` runs ``run_sft`` (verl/trainer/sft_trainer.py:451-457)
on every rank of torchrun's world; the probes run rank 0's, with the launch's world size:

1. ``config load``: ``SFTTrainer._build_config`` (:138-157), each section's
   ``omega_conf_to_dataclass`` on its own (model, engine, optim, checkpoint, profiler: their
   ``__post_init__`` checks), then the profiler interval's asserts; the answer's verdict is this
   phase's;
2. ``trainer init``: the rest of ``SFTTrainer.__init__`` (``sft_trainer``): the data sets, the
   ``TrainingWorker`` and its FSDP engine on rank 0 of the world, the data loaders' batch
   arithmetic, the engine's model, optimizer and schedule, the checkpoint handler and its resume;
3. ``first update``: fit's first step on a tiny batch (``sft_step``): the micro-batches,
   ``sft_loss``, the clipped optimizer step and the schedule's step;

then the explicit keys' types (``types``, by the dataclasses' annotations) and effects
(``sft_effects``). Runs only inside ``oracle_process``, on a mapping whose every ``_target_`` the
installed tree names.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pytest_verl_compat.pipeline.entry_points import SFT_ENTRY_MODULE
from pytest_verl_compat.upstream.probes.records import (
    KEY_ADMITTED,
    KEY_EFFECTS,
    KEY_KEYS,
    KEY_MESSAGE,
    KEY_NOT_EVALUATED,
    KEY_PATH,
    KEY_PHASE,
    KEY_REASON,
    KEY_STEP,
    KEY_TYPES,
    Collector,
    leaves_of,
    path_of_run,
)

CONFIG_LOAD = "config load: SFTTrainer._build_config"
CONVERT = "omega_conf_to_dataclass"
PROFILER_INTERVAL = "SFTTrainer._validate_profiler_interval"
# The sections ``_build_config`` converts, in its order (sft_trainer.py:141-145).
SECTIONS = ("model", "engine", "optim", "checkpoint", "profiler")
# When the launch's world size is not known (a launcher that is not torchrun's), one process.
DEFAULT_WORLD = 1
UNKNOWN_WORLD = {
    KEY_STEP: "run_sft: initialize_global_process_group",
    KEY_REASON: "the launch's world size is not known: one process (torchrun's RANK/WORLD_SIZE, "
    "verl/utils/distributed.py:62-74) was assumed",
}


@contextlib.contextmanager
def _timed(timings: list[tuple[str, float]] | None, name: str) -> Iterator[None]:
    """Wall seconds of one phase into ``timings`` (``benchmarks/bench_check.py --phases``)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        if timings is not None:
            timings.append((name, time.perf_counter() - start))


def _quoted_values(message: str, leaves: Mapping[str, Any]) -> list[str]:
    """The leaves whose text the message quotes (``unexpected precision: bf17``), for a failure
    whose statements read no key: a value that reached upstream inside a plain dict field
    (``engine.mixed_precision``) or an attribute it was copied to."""
    text = message.rstrip()
    return sorted(
        key
        for key, value in leaves.items()
        if isinstance(value, str)
        and len(value) > 1
        and (f"'{value}'" in text or text.endswith(f": {value}"))
    )


def _profiler_interval(cfg: Any) -> None:
    """``_build_config``'s last lines (sft_trainer.py:148-149) on a trainer of this config."""
    from verl.trainer.sft_trainer import SFTTrainer

    trainer: Any = SFTTrainer.__new__(SFTTrainer)
    trainer.config = cfg
    trainer.profiler_interval = cfg.trainer.profile_interval
    trainer._validate_profiler_interval()


def config_load(out: Collector, mapping: Mapping[str, Any]) -> None:
    """``_build_config``: each section's conversion on its own, then the profiler interval."""
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    from pytest_verl_compat.upstream.probes.sft.trainer import KNOBS

    cfg = OmegaConf.create(dict(mapping))
    for section in SECTIONS:
        out.run(CONFIG_LOAD, functools.partial(omega_conf_to_dataclass, cfg[section]), CONVERT)
    out.run(CONFIG_LOAD, functools.partial(_profiler_interval, cfg), PROFILER_INTERVAL, KNOBS)


def run_entry(
    mapping: Mapping[str, Any],
    world_size: int | None = None,
    explicit: Sequence[str] = (),
    timings: list[tuple[str, float]] | None = None,
    entry: str = SFT_ENTRY_MODULE,
) -> dict[str, Any]:
    """``run_sft``'s probes (``validate.ENTRY_PROBES``; ``entry`` is its one entry point): every
    SFT probe on one resolved mapping, for rank 0 of a world of ``world_size`` processes: the
    answer ``phases.run_all`` gives for main_ppo, with the config-load phase's ``verdict`` and
    ``message``."""
    if entry != SFT_ENTRY_MODULE:
        raise ValueError(f"the SFT trainer's probes answer {SFT_ENTRY_MODULE}, not {entry!r}")
    from pytest_verl_compat.upstream.probes.sft.effects import without_effect
    from pytest_verl_compat.upstream.probes.sft.keys import narrowed
    from pytest_verl_compat.upstream.probes.sft.step import first_step
    from pytest_verl_compat.upstream.probes.sft.trainer import sft_trainer_probes, torchrun_free
    from pytest_verl_compat.upstream.probes.types import explicit_types, wrong_types

    plain = dict(mapping)
    leaves = leaves_of(plain)
    out = Collector(leaves)
    timed = functools.partial(_timed, timings)
    if world_size is None or world_size < 1:
        out.not_run.append(dict(UNKNOWN_WORLD))
        world_size = None
    with torchrun_free(plain, world_size or DEFAULT_WORLD) as notes:
        with timed("config load (SFTTrainer._build_config)"):
            config_load(out, plain)
        with timed("trainer init (SFTTrainer.__init__)"):
            trainer = sft_trainer_probes(out, plain)
        with timed("first update (fit's first step)"):
            first_step(out, plain, trainer)
    out.not_run.extend(note for note in notes if note not in out.not_run)
    for record in out.records:
        record[KEY_KEYS] = narrowed(record, out.reads) or _quoted_values(
            str(record[KEY_MESSAGE]), leaves
        )
    with timed("types (the dataclasses' annotations)"):
        refused, admitted = explicit_types(plain, leaves, explicit)
        types = wrong_types(out.reads.tagged(), leaves)
        types += [r for r in refused if all(t["key"] != r["key"] for t in types)]
        types.sort(key=lambda record: record["key"])
    with timed("effects (never read, overridden)"):
        effects = without_effect(out, plain, leaves, [str(key) for key in explicit])
    loading = [f for f in out.records if str(f[KEY_PHASE]).startswith("config load")]
    return {
        "verdict": "fails" if loading else "passes",
        "message": loading[0][KEY_MESSAGE] if loading else "",
        "failures": out.records,
        KEY_NOT_EVALUATED: out.not_run,
        KEY_TYPES: types,
        KEY_ADMITTED: admitted,
        KEY_EFFECTS: effects,
        KEY_PATH: path_of_run(out.reads, leaves, [str(key) for key in explicit]),
    }
