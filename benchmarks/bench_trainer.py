"""Our GRPO step against TRL's `GRPOTrainer`, side by side on the same model, data and workload.

Workload (the issue's): 8 prompts x 4 responses per step, at most 32 new tokens, rule reward,
1 epoch, one torch thread, float32 on CPU, KL loss against a reference model (beta 0.001 =
the GRPO case's kl_loss_coef), token-mean loss, clip 0.2 / 0.28. Both sides load the same
exported tiny Qwen2 model and tokenizer and the same shipped prompts. Two update schedules:

- `--updates 4`: the GRPO case's own schedule (train_batch_size / ppo_mini_batch_size = 4
  optimizer steps per generated batch); TRL: `steps_per_generation=4`.
- `--updates 1`: one optimizer step over all 32 responses.

A "step" is one generated batch and its updates; TRL logs each optimizer step, so its steps are
summed per generation. Each side runs in its own process (TRL in its own virtual environment:
it wants a newer transformers than verl 0.9.0 allows) and reports the median seconds per step
(the first step, which warms caches, is dropped) and its peak resident memory.

    python benchmarks/bench_trainer.py --setup-trl benchmarks/.trl-venv   # once, ~2 min
    python benchmarks/bench_trainer.py [--steps 10] [--repeat 3] [--updates 4 1] [--trl-python PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_TRL_VENV = HERE / ".trl-venv"
TRL_REQUIREMENTS = ["torch==2.13.0", "trl==1.16.0"]
PROMPTS_PER_STEP, RESPONSES, MAX_NEW_TOKENS = 8, 4, 32


def export_workload(folder: Path) -> tuple[Path, Path]:
    """The tiny model and tokenizer as a HF folder, and the training prompts as JSONL."""
    from reference_trainer.data import PROMPTS_PATH, load_prompts
    from reference_trainer.tiny import build_tiny_policy, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    model_dir = folder / "model"
    build_tiny_policy(tokenizer, seed=0).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    prompts = folder / "prompts.jsonl"
    with prompts.open("w", encoding="utf-8") as out:
        for p in load_prompts(str(PROMPTS_PATH), "train"):
            out.write(json.dumps({"prompt": p.prompt, "answer": p.answer}) + "\n")
    return model_dir, prompts


def run_ours(model_dir: str, steps: int, updates: int) -> dict:
    """Our side, in this process (the parent starts it as a subprocess)."""
    from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
    from reference_trainer.budget import LocalBudget
    from reference_trainer.trainer import ReferenceTrainer

    session = AuditSession.start(AuditOptions(upstream=None))
    cfg = session.reference_config(session.manifest.case("grpo"))
    if updates == 1:
        # A launch with ppo_mini_batch_size = train_batch_size: one update per step.
        actor = dataclasses.replace(cfg.actor, ppo_mini_batch_size=cfg.data.train_batch_size)
        cfg = dataclasses.replace(cfg, actor=actor)
    budget = LocalBudget(
        steps=steps,
        train_batch_size=PROMPTS_PER_STEP,
        n=RESPONSES,
        max_response_length=MAX_NEW_TOKENS,
        reward="rule",
        model=model_dir,
        test_freq=-1,
        val_before_train=False,
        save_freq=-1,
    )
    out = tempfile.mkdtemp(prefix="bench_trainer_")
    result = ReferenceTrainer(cfg, budget, out, progress=False).run()
    rows = [row for row in result.metrics if "timing_s/step" in row]
    seconds = [row["timing_s/step"] for row in rows]
    phases = sorted(k for k in rows[-1] if k.startswith("timing_s/") and k != "timing_s/step")
    return {
        "side": "ours",
        "step_seconds": seconds,
        "median_step_seconds": statistics.median(seconds[1:]),
        "mean_response_length": statistics.mean(r["response_length/mean"] for r in rows),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "optimizer_steps": int(rows[-1]["actor/num_updates"]),
        "phases": {k: statistics.median(r[k] for r in rows[1:]) for k in phases},
    }


def child(cmd: list[str]) -> dict | None:
    """Run one side; its result is the last stdout line (JSON)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stderr[-3000:])
        return None
    return json.loads(lines[-1])


def summary(runs: list[dict | None]) -> dict | None:
    """Median over runs of each run's median step time; the largest peak memory."""
    done = [r for r in runs if r is not None]
    if not done:
        return None
    return {
        **done[-1],
        "runs": [r["median_step_seconds"] for r in done],
        "median_step_seconds": statistics.median(r["median_step_seconds"] for r in done),
        "peak_rss_mib": max(r["peak_rss_mib"] for r in done),
    }


def setup_trl(venv: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin/python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, *TRL_REQUIREMENTS], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="training steps per run")
    parser.add_argument("--updates", type=int, nargs="+", default=[4, 1], choices=[1, 4])
    parser.add_argument("--repeat", type=int, default=3, help="alternating runs of each side")
    parser.add_argument(
        "--trl-python",
        default=os.environ.get("TRL_PYTHON", str(DEFAULT_TRL_VENV / "bin/python")),
        help="python of a virtual environment with trl (default: $TRL_PYTHON, benchmarks/.trl-venv)",
    )
    parser.add_argument("--setup-trl", type=Path, metavar="VENV", help="create TRL's venv and exit")
    parser.add_argument("--worker", choices=["ours"], help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.setup_trl:
        setup_trl(args.setup_trl)
        return 0
    if args.worker == "ours":
        print(json.dumps(run_ours(args.model, args.steps, args.updates[0])))
        return 0

    have_trl = Path(args.trl_python).exists()
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
        model_dir, prompts = export_workload(Path(tmp))
        print(
            f"workload: {PROMPTS_PER_STEP} prompts x {RESPONSES} responses, <= {MAX_NEW_TOKENS} "
            f"new tokens, {args.steps} steps, 1 thread, tiny Qwen2 from {model_dir.name}/"
        )
        header = (
            f"{'updates':>7} | {'side':>4} | {'s/step':>7} | {'peak MiB':>8} | {'resp len':>8} | "
            "median s/step of each run"
        )
        print(header)
        print("-" * len(header))
        for updates in args.updates:
            ours_runs, trl_runs = [], []
            # Alternate the two sides: a shared machine's load then hits both alike.
            for _ in range(args.repeat):
                ours_runs.append(
                    child(
                        [
                            *(sys.executable, __file__, "--worker", "ours"),
                            *("--model", str(model_dir), "--steps", str(args.steps)),
                            *("--updates", str(updates)),
                        ]
                    )
                )
                if have_trl:
                    trl_runs.append(
                        child(
                            [
                                *(args.trl_python, str(HERE / "trl_grpo_worker.py")),
                                *("--model", str(model_dir), "--prompts", str(prompts)),
                                *("--steps", str(args.steps), "--updates", str(updates)),
                                *("--prompts-per-step", str(PROMPTS_PER_STEP)),
                                *("--n", str(RESPONSES), "--max-new-tokens", str(MAX_NEW_TOKENS)),
                            ]
                        )
                    )
            ours, trl = summary(ours_runs), summary(trl_runs)
            for result in (ours, trl):
                if result is None:
                    continue
                runs = ", ".join(f"{x:.3f}" for x in result["runs"])
                print(
                    f"{updates:>7} | {result['side']:>4} | {result['median_step_seconds']:7.3f} | "
                    f"{result['peak_rss_mib']:8.0f} | {result['mean_response_length']:8.1f} | {runs}"
                )
            if ours and trl:
                time_ratio = ours["median_step_seconds"] / trl["median_step_seconds"]
                memory_ratio = ours["peak_rss_mib"] / trl["peak_rss_mib"]
                print(
                    f"{updates:>7} | ours/TRL: time {time_ratio:.2f}x, memory {memory_ratio:.2f}x "
                    f"(target: time <= 0.50x, memory <= 1.00x; TRL {trl.get('version')}, "
                    f"transformers {trl.get('transformers')})"
                )
            if ours:
                phases = ", ".join(f"{k[9:]} {v:.3f}" for k, v in ours["phases"].items())
                print(f"{'':>7} | ours by phase (s, last run): {phases}")
        if not have_trl:
            print(
                f"TRL not run: no python at {args.trl_python}; create it with "
                f"`python benchmarks/bench_trainer.py --setup-trl {DEFAULT_TRL_VENV}`"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
