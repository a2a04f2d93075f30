"""``verl-compat train sft/CASE`` (or ``train sft --override K=V ...``): supervised fine-tuning.

The case's Hydra overrides of verl's ``sft_trainer_engine`` (``corpus/sft_step.yaml``; ``sft``
alone is the tree's defaults), plus each ``--override`` (an SFT script's argv, one field each),
are composed, compiled against the SFT profile and lowered (only an accepted case trains), then
the reference trainer runs verl's SFT loop on the tiny model (or ``--model``) with the local
conversations (``--conversations``: ``{"messages": [...]}`` rows, or a prompt file). The run
folder is the RL runs' (metrics, adaptations, checkpoints, ``final/hf``); ``--resume`` continues
bit-identically.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytest_verl_compat.pipeline.sft import lower_sft, sft_case_overrides

SFT_PREFIX = "sft"


def is_sft_case(case: str) -> bool:
    return case == SFT_PREFIX or case.startswith(f"{SFT_PREFIX}/")


def cmd_train_sft(args: argparse.Namespace, fields: list[str] | None = None) -> int:
    """Train an SFT case (of corpus/sft_step.yaml, or the ``fields`` of an SFT script or corpus
    case); 0 on success, 2 on a bad case, binding or run folder."""
    from reference_trainer.checkpoint import CheckpointError
    from reference_trainer.run_files import RunFolderError
    from reference_trainer.sft import SFTBudget, SFTTrainer

    try:
        if fields is not None:
            overrides = [*fields, *(args.override or [])]
        else:
            cases = sft_case_overrides()
            if args.case != SFT_PREFIX and args.case not in cases:
                known = ", ".join(sorted(cases))
                raise ValueError(f"unknown SFT case {args.case!r}; known: {SFT_PREFIX}, {known}")
            overrides = [*cases.get(args.case, []), *(args.override or [])]
        _, cfg = lower_sft(overrides, case_id=args.case)
    except (KeyError, ValueError, FileNotFoundError) as exc:
        print(f"verl-compat train: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out or Path("runs") / Path(args.case).stem)
    budget = SFTBudget(
        steps=args.steps,
        train_batch_size=args.train_batch_size,
        model=args.model,
        seed=args.seed,
        save_freq=args.save_freq,
        test_freq=args.test_freq,
        **({"conversations": args.conversations} if args.conversations else {}),
    )
    try:
        trainer = SFTTrainer(cfg, budget, out, progress=not args.no_progress)
        history = trainer.run(resume=args.resume, overwrite=args.overwrite)
    except (ImportError, ValueError, CheckpointError, RunFolderError, OSError) as exc:
        text = str(exc).strip()
        print(f"verl-compat train: {text.splitlines()[0] if text else exc!r}", file=sys.stderr)
        return 2
    if history:
        first, last = history[0]["train/loss"], history[-1]["train/loss"]
        print(f"{args.case}: {trainer.step} steps, loss {first:.3f} -> {last:.3f}")
    print(f"run folder: {out}; HF export: {out / 'final' / 'hf'}")
    return 0
