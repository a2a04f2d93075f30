"""TRL's side of `bench_trainer.py`: GRPOTrainer on the exported tiny model, one torch thread.

Runs in TRL's own virtual environment (TRL wants a newer transformers than verl 0.9.0 allows),
so it imports nothing from this project: the model folder, the prompts and the workload arrive
as arguments, and the result leaves as one JSON line on stdout.

    TRL_PYTHON benchmarks/trl_grpo_worker.py --model DIR --prompts FILE.jsonl --steps 8 \
        --prompts-per-step 8 --n 4 --updates 4 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import sys
import tempfile
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", required=True, help="JSONL rows with prompt and answer")
    parser.add_argument("--steps", type=int, required=True, help="training steps (generations)")
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--updates", type=int, default=1, help="optimizer steps per generation")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--beta", type=float, default=0.001)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = [json.loads(line) for line in open(args.prompts, encoding="utf-8")]
    dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
    tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    tokenizer.padding_side = "left"

    def rule_reward(completions: list[str], answer: list[str], **_: object) -> list[float]:
        # The same rule as the reference trainer's: the first integer equals the answer.
        out = []
        for text, expected in zip(completions, answer, strict=True):
            found = re.search(r"-?\d+", text)
            out.append(1.0 if found and found.group() == expected else 0.0)
        return out

    completions = args.prompts_per_step * args.n
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-grpo-"),
        per_device_train_batch_size=completions // args.updates,
        steps_per_generation=args.updates,
        num_generations=args.n,
        max_completion_length=args.max_new_tokens,
        max_steps=args.steps * args.updates,
        num_train_epochs=1,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=args.beta,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",  # verl's token-mean over the mini-batch's tokens
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_grad_norm=1.0,
        bf16=False,
        use_cpu=True,
        seed=0,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
        log_completions=False,
        model_init_kwargs={"dtype": "float32"},  # transformers picks the attention (sdpa)
    )

    class StepClock(TrainerCallback):
        """Wall time of each optimizer step; a generation happens inside the first of `updates`."""

        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.start = 0.0

        def on_step_begin(self, *_: object, **__: object) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, *_: object, **__: object) -> None:
            self.seconds.append(time.perf_counter() - self.start)

    clock = StepClock()
    trainer = GRPOTrainer(
        model=args.model,
        reward_funcs=rule_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[clock],
    )
    trainer.train()
    # One training step = one generation of prompts_per_step x n and its `updates` updates.
    per_step = [
        sum(clock.seconds[i : i + args.updates])
        for i in range(0, len(clock.seconds) - args.updates + 1, args.updates)
    ]
    lengths = [
        row["completions/mean_length"]
        for row in trainer.state.log_history
        if "completions/mean_length" in row
    ]
    result = {
        "side": "trl",
        "version": __import__("trl").__version__,
        "transformers": __import__("transformers").__version__,
        "step_seconds": per_step,
        "median_step_seconds": statistics.median(per_step[1:]),
        "mean_response_length": statistics.mean(lengths) if lengths else None,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "optimizer_steps": trainer.state.global_step,
        "threads": torch.get_num_threads(),
    }
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown of datasets/accelerate (seconds, no output)


if __name__ == "__main__":
    raise SystemExit(main())
