"""``verl-compat prompts`` and ``verl-compat model``: local inputs for real-model training runs.

Both need the optional ``smollm2`` extra; the trainer's embedded default needs neither.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_asset_parsers(subparsers: Any) -> None:
    prompts = subparsers.add_parser(
        "prompts", help="write a prompt file from reasoning-gym's problem generators"
    )
    prompts.add_argument("source", choices=["reasoning-gym"])
    prompts.add_argument("task", help="reasoning-gym task, e.g. gsm_symbolic, basic_arithmetic")
    prompts.add_argument("--out", required=True, help="prompt file to write (JSONL)")
    prompts.add_argument("--train", type=int, default=256, help="training problems (default 256)")
    prompts.add_argument("--val", type=int, default=32, help="held-out problems (default 32)")
    prompts.add_argument("--seed", type=int, default=0)
    prompts.set_defaults(func=cmd_prompts)

    model = subparsers.add_parser("model", help="export a packaged model as a local HF folder")
    model.add_argument("name", choices=["smollm2"])
    model.add_argument("--out", required=True, help="folder to write")
    model.set_defaults(func=cmd_model)


def cmd_prompts(args: argparse.Namespace) -> int:
    from reference_trainer.reasoning_gym_prompts import write_prompt_file

    try:
        path = write_prompt_file(
            args.task, args.out, train=args.train, val=args.val, seed=args.seed
        )
    except (ImportError, ValueError) as exc:
        print(f"verl-compat prompts: {exc}", file=sys.stderr)
        return 2
    print(
        f"verl-compat prompts: wrote {args.train} train and {args.val} val {args.task} problems "
        f"to {path}",
        file=sys.stderr,
    )
    return 0


def cmd_model(args: argparse.Namespace) -> int:
    from reference_trainer.smollm2 import export_smollm2

    try:
        path = export_smollm2(args.out)
    except (ImportError, FileNotFoundError) as exc:
        print(f"verl-compat model: {exc}", file=sys.stderr)
        return 2
    print(
        f"verl-compat model: wrote SmolLM2-135M-Instruct (float32, dequantised from Q4_1) to {path}",
        file=sys.stderr,
    )
    return 0
