"""``verl-compat train CASE``: train a tiny model locally with the case's compiled config.

CASE is a manifest case id (``grpo``, ``ppo``, ...) or a launch-script path. The run folder gets
``metrics.jsonl``/``metrics.csv``/``metrics.png``, ``adaptations.json`` (every upstream field the
local run changes), ``checkpoints/`` and ``final/`` (the actor in HF format), plus what the case's
``trainer.logger`` asks for where it works offline (console, ``file_logger/``, ``tensorboard_log/``).
A run locks its folder; a fresh run refuses an earlier run's folder unless ``--overwrite``; a
``--resume`` with more ``--steps`` extends a finished run. Every bad input is one line naming its file.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

from pytest_verl_compat.checks.registry import SFT, family_of
from pytest_verl_compat.cli.train_sft import cmd_train_sft, is_sft_case
from pytest_verl_compat.model import StageFailed, StageUnavailable
from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
from reference_trainer.config import ReferenceTrainerConfig

INT_LIMIT = 2**31 - 1
"""No count or frequency of a CPU run comes near this; larger values overflow torch/numpy."""


def _integer(text: str, low: int, high: int) -> int:
    try:
        value = int(text) if len(text) <= 20 else None
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise argparse.ArgumentTypeError(
            f"expected an integer from {low} to {high}, got {text[:40]!r}"
        )
    return value


def _positive(text: str) -> int:
    return _integer(text, 1, INT_LIMIT)


def _frequency(text: str) -> int:
    return _integer(text, -1, INT_LIMIT)


def _seed(text: str) -> int:
    # numpy's legacy seeding takes 0 .. 2**32 - 1.
    return _integer(text, 0, 2**32 - 1)


def add_train_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``train`` on the ``verl-compat`` sub-command parser."""
    parser = subparsers.add_parser("train", help="train a tiny model with a case's config")
    parser.add_argument(
        "case",
        help="manifest case id or launch-script path; sft/CASE (corpus/sft_step.yaml) or sft "
        "trains supervised fine-tuning",
    )
    parser.add_argument("--steps", type=_positive, default=20, help="training steps (default 20)")
    parser.add_argument("--out", help="run folder (default runs/<case>)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the last checkpoint (more --steps than before extend a finished run)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier run's files in --out (a fresh run refuses them otherwise)",
    )
    parser.add_argument("--model", default="tiny", help="'tiny' or a local HF causal-LM folder")
    parser.add_argument("--seed", type=_seed, default=0, help="seed of init, data and sampling")
    parser.add_argument(
        "--reward",
        choices=("rule", "length", "reasoning-gym"),
        default="rule",
        help="rule: first integer equals the answer; length: learning-signal reward; "
        "reasoning-gym: the task's scorer (prompts from `verl-compat prompts`)",
    )
    parser.add_argument("--prompts", help="prompt file (default: the shipped arithmetic set)")
    parser.add_argument(
        "--reward-model",
        help="reward model folder for cases with a reward model; 'tiny' trains one in the run folder",
    )
    parser.add_argument("--train-batch-size", type=_positive, default=8, help="prompts per step")
    parser.add_argument("--response-length", type=_positive, default=16, help="max new tokens")
    parser.add_argument(
        "--prompt-length", type=_positive, default=64, help="max prompt tokens (default 64)"
    )
    parser.add_argument("--n", type=_positive, help="responses per prompt (default: upstream's)")
    parser.add_argument(
        "--save-freq", type=_frequency, help="checkpoint every N steps (default: upstream)"
    )
    parser.add_argument(
        "--test-freq", type=_frequency, help="validate every N steps (default: upstream)"
    )
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress output at all (transformers' bars included); without it, a bar on "
        "a terminal and one line per step otherwise",
    )
    # Supervised fine-tuning only (cli/train_sft.py).
    parser.add_argument(
        "--override",
        action="append",
        metavar="KEY=VALUE",
        help="SFT: a Hydra override of verl's sft_trainer_engine after the case's (repeatable)",
    )
    parser.add_argument(
        "--conversations",
        help="SFT: a JSONL of {messages: [...]} rows or a prompt file (default: shipped prompts)",
    )
    parser.set_defaults(func=cmd_train)
    assert isinstance(parser, argparse.ArgumentParser)
    return parser


def _config(
    target: str, manifest: str | None, upstream: str | None = None
) -> ReferenceTrainerConfig:
    """The case's ReferenceTrainerConfig, through the compile gate, from the manifest or a script."""
    session = AuditSession.start(AuditOptions(manifest=manifest, upstream=upstream))
    if session.manifest_error or session.manifest is None:
        raise ValueError(session.manifest_error)
    if Path(target).is_file():
        case = session.case_for_script(target)
    else:
        case = session.manifest.case(target)
    return session.reference_config(case)


def _sft_fields(target: str, manifest: str | None, upstream: str | None) -> list[str] | None:
    """The explicit fields of a manifest case or script that launches the SFT trainer (its tree
    is the SFT trainer's), else None."""
    session = AuditSession.start(AuditOptions(manifest=manifest, upstream=upstream))
    if session.manifest is None:
        return None
    try:
        case = (
            session.case_for_script(target)
            if Path(target).is_file()
            else session.manifest.case(target)
        )
        outcome = session.outcome(case)
    except (KeyError, StageFailed, StageUnavailable):
        return None
    if not outcome.composition.composed or family_of(outcome.composition.mapping) != SFT:
        return None
    return list(outcome.fields.fields)


def cmd_train(args: argparse.Namespace) -> int:
    """Run the reference trainer; 0 on success, 2 on a bad case or binding."""
    if is_sft_case(args.case):
        return cmd_train_sft(args)
    manifest, upstream = getattr(args, "manifest", None), getattr(args, "upstream", None)
    sft_fields = _sft_fields(args.case, manifest, upstream)
    if sft_fields is not None:
        # An SFT script or corpus case: its own fields, then --override, through the SFT loop.
        return cmd_train_sft(args, fields=sft_fields)
    try:
        cfg = _config(args.case, getattr(args, "manifest", None), getattr(args, "upstream", None))
    except (StageFailed, StageUnavailable, KeyError, ValueError) as exc:
        print(f"verl-compat train: {exc}", file=sys.stderr)
        return 2

    from reference_trainer.budget import LocalBudget
    from reference_trainer.checkpoint import CheckpointError
    from reference_trainer.reward import train_reward_model
    from reference_trainer.run_files import RunFolderError, TornLineWarning
    from reference_trainer.tracking import silence_library_bars
    from reference_trainer.trainer import ReferenceTrainer

    if args.no_progress:
        silence_library_bars()
    out = Path(args.out or Path("runs") / cfg.case_id)
    if out.exists() and not out.is_dir():
        print(f"verl-compat train: {out}: --out is a file, not a folder", file=sys.stderr)
        return 2
    reward_model = args.reward_model
    if reward_model == "tiny":
        reward_model = str(out / "reward_model")
        if not (Path(reward_model) / "config.json").is_file():
            print(f"training a tiny reward model in {reward_model}", file=sys.stderr)
            train_reward_model(reward_model, seed=args.seed)
    budget = LocalBudget(
        steps=args.steps,
        train_batch_size=args.train_batch_size,
        max_response_length=args.response_length,
        max_prompt_length=args.prompt_length,
        n=args.n,
        reward=args.reward,
        reward_model_path=reward_model,
        model=args.model,
        **({"prompts_path": args.prompts} if args.prompts else {}),
        save_freq=args.save_freq,
        test_freq=args.test_freq,
        seed=args.seed,
    )
    try:
        with warnings.catch_warnings():
            # A torn log line is a warning the user should read as one line, not a source dump.
            warnings.simplefilter("always", TornLineWarning)
            warnings.showwarning = _show_warning
            trainer = ReferenceTrainer(cfg, budget, out, progress=not args.no_progress)
            result = trainer.run(resume=args.resume, overwrite=args.overwrite)
    except (ImportError, ValueError, CheckpointError, RunFolderError) as exc:
        print(f"verl-compat train: {_one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"verl-compat train: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    scored = [row for row in result.metrics if "critic/score/mean" in row]
    if scored:
        first, last = scored[0]["critic/score/mean"], scored[-1]["critic/score/mean"]
        print(f"{cfg.case_id}: {result.final_step} steps, reward {first:.3f} -> {last:.3f}")
    print(f"run folder: {result.out}; HF export: {result.export}")
    return 0


def _show_warning(message: Warning | str, *_: Any, **__: Any) -> None:
    print(f"verl-compat train: warning: {message}", file=sys.stderr)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry until ``train`` is registered in ``verl-compat``."""
    parser = argparse.ArgumentParser(prog="verl-compat")
    add_train_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
