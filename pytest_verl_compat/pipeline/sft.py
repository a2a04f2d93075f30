"""Supervised fine-tuning: compose, compile and lower a `verl.trainer.sft_trainer` mapping.

verl's SFT entry point composes its own tree, `sft_trainer_engine` (`@hydra.main` at
verl/trainer/sft_trainer.py:460), from the same config folder as `ppo_trainer`, with the
`model`, `engine`, `optim` and `profiler` groups (`engine=fsdp` style selections are Hydra group
overrides, which `Composer` composes like any other). Its compile stage is the PPO one's leaf
classification against the SFT profile (`profiles/default_sft.txt` names it) with the SFT
trainer's own semantic checks instead of the PPO ones, and the same gate: `sft_config` lowers
only an accepted report.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_verl_compat.files.safe_input import load_yaml_file
from pytest_verl_compat.model import (
    ACCEPTED,
    SEMANTIC_REJECTION,
    CompileReport,
    Composition,
    Finding,
)
from pytest_verl_compat.pipeline.compile import classify, rejection_reasons
from pytest_verl_compat.pipeline.compose import Composer
from pytest_verl_compat.pipeline.entry_points import SFT_CONFIG_NAME
from pytest_verl_compat.pipeline.lower import NotAccepted
from pytest_verl_compat.pipeline.manifest import embedded_root
from pytest_verl_compat.pipeline.profile import Profile, default_sft_profile, load_profile
from pytest_verl_compat.releases.wheels import release_tree
from reference_trainer.config import (
    ModelConfig,
    OptimConfig,
    SFTConfig,
    SFTDataConfig,
    SFTLoopConfig,
)

# The frequency verl's SFT trainer reads as "the batches of one epoch".
EPOCH_FREQUENCY = "after_each_epoch"


def sft_cases_path() -> Path:
    """The SFT cases: `corpus/sft_step.yaml` (the SFT step oracle trains them too)."""
    return embedded_root() / "corpus" / "sft_step.yaml"


def sft_case_overrides(path: Path | None = None) -> dict[str, list[str]]:
    """Each SFT case's id and its Hydra overrides of `sft_trainer_engine`, in file order."""
    path = path or sft_cases_path()
    raw = load_yaml_file(path, what="SFT case file")
    cases = raw.get("cases") if isinstance(raw, dict) else None
    if not isinstance(cases, list):
        raise ValueError(f"{path}: expected a mapping with a 'cases' list")
    found: dict[str, list[str]] = {}
    for entry in cases:
        if not isinstance(entry, dict) or not isinstance(entry.get("overrides"), list):
            raise ValueError(f"{path}: every case needs an id and an overrides list")
        if entry["id"] in found:
            raise ValueError(f"{path}: duplicate SFT case id {entry['id']!r}")
        base = _base_fields(str(entry["base"])) if entry.get("base") else []
        found[str(entry["id"])] = [*base, *(str(line) for line in entry["overrides"])]
    return found


def _base_fields(case_id: str) -> list[str]:
    """The explicit fields of a case of the embedded manifest (its script's, else its golden
    file's): a step case trains the corpus case itself, at the step's shape."""
    from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession

    session = AuditSession.start(AuditOptions())
    if session.manifest is None:
        raise ValueError(f"no manifest: {session.manifest_error}")
    return list(session.read_fields(session.manifest.case(case_id)).fields)


def sft_composer(config_dir: Path | None = None, release: str | None = None) -> Composer:
    """A composer of `sft_trainer_engine` on `config_dir`, by default the tree of ``release``
    (the embedded manifest's release when none is named), from its own files."""
    if config_dir is None:
        from pytest_verl_compat.pipeline.manifest import default_manifest_path, load_manifest

        version = release or load_manifest(default_manifest_path()).upstream.version
        config_dir = release_tree(version).config_dir
    return Composer(config_dir, SFT_CONFIG_NAME)


def compose_sft(
    fields: Sequence[str],
    variables: Mapping[str, str] | None = None,
    *,
    composer: Composer | None = None,
) -> Composition:
    """The SFT trainer's composition of `fields` (Hydra overrides, group selections included)."""
    return (composer or sft_composer()).compose(list(fields), dict(variables or {}))


# --------------------------------------------------------------------------- checks

SFTCheck = Callable[[Mapping[str, Any]], list[Finding]]


def _world(resolved: Mapping[str, Any]) -> int:
    trainer = resolved["trainer"]
    return int(trainer["nnodes"]) * int(trainer["n_gpus_per_node"])


def _batch_per_rank(resolved: Mapping[str, Any]) -> list[Finding]:
    data = resolved["data"]
    world = _world(resolved)
    if int(data["train_batch_size"]) >= world:
        return []
    return [
        Finding(
            "error",
            "data.train_batch_size",
            f"data.train_batch_size={data['train_batch_size']} gives each of the {world} ranks "
            "no sequence (train_batch_size // dp_size)",
            fix=f"set data.train_batch_size to a multiple of {world}",
            evidence="verl/trainer/sft_trainer.py:240-253",
            check="sft.batch-per-rank",
        )
    ]


def _static_micro_batches(resolved: Mapping[str, Any]) -> list[Finding]:
    data = resolved["data"]
    if data["use_dynamic_bsz"]:
        return []
    per_rank = int(data["train_batch_size"]) // _world(resolved)
    micro = int(data["micro_batch_size_per_gpu"])
    if per_rank and per_rank % micro == 0:
        return []
    return [
        Finding(
            "error",
            "data.micro_batch_size_per_gpu, data.train_batch_size",
            f"each rank's {per_rank} sequences do not split into micro-batches of "
            f"{micro}: the engine asserts it",
            fix="make train_batch_size // dp_size a multiple of micro_batch_size_per_gpu, or "
            "use data.use_dynamic_bsz=True",
            evidence="verl/workers/engine/utils.py:122-128",
            check="sft.static-micro-batch",
        )
    ]


# What verl's SFT trainer refuses or breaks on, each citing the line that does.
SFT_CHECKS: tuple[SFTCheck, ...] = (_batch_per_rank, _static_micro_batches)


def compile_sft(
    resolved: Mapping[str, Any], *, case_id: str, profile: Profile | None = None
) -> CompileReport:
    """Classify every leaf against the SFT profile and run the SFT checks; a problem rejects."""
    profile = profile or load_profile(default_sft_profile())
    leaves = classify(profile, resolved)
    findings = [finding for check in SFT_CHECKS for finding in check(resolved)]
    reasons = rejection_reasons(leaves, findings)
    if reasons:
        more = f" (and {len(reasons) - 3} more)" if len(reasons) > 3 else ""
        return CompileReport(
            case_id,
            profile.name,
            SEMANTIC_REJECTION,
            "; ".join(reasons[:3]) + more,
            tuple(leaves),
            tuple(findings),
        )
    return CompileReport(
        case_id,
        profile.name,
        ACCEPTED,
        "every leaf is understood by the reference trainer's SFT step",
        tuple(leaves),
        tuple(findings),
    )


# --------------------------------------------------------------------------- lowering


def sft_config(resolved: Mapping[str, Any], report: CompileReport) -> SFTConfig:
    """The typed SFT config of an accepted case (the compile gate: a rejected one raises)."""
    if not report.accepted:
        raise NotAccepted(
            f"[{report.case_id}] rejected by profile {report.profile}: {report.reason}"
        )
    data, model, optim, trainer = (resolved[k] for k in ("data", "model", "optim", "trainer"))
    dynamic = bool(data["use_dynamic_bsz"])
    targets, excluded = model["target_modules"], model["exclude_modules"]
    logger = trainer["logger"]
    return SFTConfig(
        case_id=report.case_id,
        profile=report.profile,
        data=SFTDataConfig(
            train_batch_size=int(data["train_batch_size"]),
            micro_batch_size=None if dynamic else int(data["micro_batch_size_per_gpu"]),
            max_token_len=int(data["max_token_len_per_gpu"]) if dynamic else None,
            max_length=int(data["max_length"]),
            truncation=str(data["truncation"]),
            pad_mode=str(data["pad_mode"]),
        ),
        model=ModelConfig(
            path=str(model["path"]),
            lora_rank=int(model["lora_rank"] or 0),
            lora_alpha=int(model["lora_alpha"]),
            target_modules=tuple(targets) if isinstance(targets, list) else targets,
            exclude_modules=tuple(excluded) if isinstance(excluded, list) else excluded,
            enable_gradient_checkpointing=bool(model["enable_gradient_checkpointing"]),
        ),
        optim=OptimConfig(
            lr=float(optim["lr"]),
            weight_decay=float(optim["weight_decay"]),
            betas=(float(optim["betas"][0]), float(optim["betas"][1])),
            grad_clip=float(optim["clip_grad"]),
            lr_warmup_steps=int(optim["lr_warmup_steps"]),
            lr_warmup_steps_ratio=float(optim["lr_warmup_steps_ratio"]),
            # A deprecated warmup_style, when set, replaces lr_scheduler_type
            # (verl/workers/config/optimizer.py:117-122).
            lr_scheduler_type=str(optim["warmup_style"] or optim["lr_scheduler_type"]),
            # None is 0 in the cosine schedule (verl/utils/torch_functional.py:748).
            min_lr_ratio=float(optim["min_lr_ratio"] or 0.0),
            num_cycles=float(optim["num_cycles"]),
            zero_indexed_step=bool(optim["zero_indexed_step"]),
        ),
        trainer=SFTLoopConfig(
            total_epochs=int(trainer["total_epochs"]),
            total_training_steps=trainer["total_training_steps"],
            save_freq=_frequency(trainer["save_freq"]),
            test_freq=_frequency(trainer["test_freq"]),
            resume_mode=str(trainer["resume_mode"]),
            resume_from_path=(
                None if trainer["resume_from_path"] is None else str(trainer["resume_from_path"])
            ),
            project_name=str(trainer["project_name"]),
            experiment_name=str(trainer["experiment_name"]),
            logger=(str(logger),) if isinstance(logger, str) else tuple(map(str, logger or ())),
        ),
        optimizer=str(optim["optimizer"]),
        use_remove_padding=bool(model["use_remove_padding"]),
        bindings=tuple(report.bindings),
        lowered=dict(report.lowered),
        lowered_values={leaf.path: leaf.value for leaf in report.leaves if leaf.klass == "lowered"},
    )


def _frequency(value: Any) -> int | str:
    """A step count, or verl's ``after_each_epoch`` (verl/trainer/sft_trainer.py:190-196)."""
    return value if value == EPOCH_FREQUENCY else int(value)


def lower_sft(
    fields: Sequence[str],
    *,
    case_id: str,
    variables: Mapping[str, str] | None = None,
    composer: Composer | None = None,
) -> tuple[CompileReport, SFTConfig]:
    """Compose, compile and lower one SFT override list: the report and the accepted config.

    Raises `NotAccepted` (a ValueError) when composition or compilation rejects it.
    """
    composition = compose_sft(fields, variables, composer=composer)
    if not composition.composed:
        raise NotAccepted(f"[{case_id}] composition rejected: {composition.reason}")
    report = compile_sft(composition.mapping, case_id=case_id)
    return report, sft_config(composition.mapping, report)
