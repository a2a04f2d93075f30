"""Time the reference trainer's GRPO step: 8 prompts x 4 responses, 32 new tokens, 1 epoch.

Prints the median seconds per step (the first step, which warms caches, is dropped) and the
peak resident memory. One torch thread, as the trainer always runs. A TRL comparison needs its
own virtual environment (TRL is not installed here) and is not attempted.

    python benchmarks/bench_trainer.py [--steps 6] [--out /tmp/bench_trainer]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile

from pytest_verl_compat.session import AuditOptions, AuditSession
from reference_trainer.trainer import LocalBudget, ReferenceTrainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    session = AuditSession.start(AuditOptions(upstream=None))
    cfg = session.reference_config(session.manifest.case("grpo"))
    budget = LocalBudget(
        steps=args.steps,
        train_batch_size=8,
        n=4,
        max_response_length=32,
        # The rule reward: an untrained model rarely stops, so responses stay near 32 tokens.
        reward="rule",
        test_freq=-1,
        val_before_train=False,
        save_freq=-1,
    )
    out = args.out or tempfile.mkdtemp(prefix="bench_trainer_")
    result = ReferenceTrainer(cfg, budget, out, progress=False).run()
    steps = [row for row in result.metrics if "timing_s/step" in row]
    seconds = [row["timing_s/step"] for row in steps[1:]]
    lengths = [row["response_length/mean"] for row in steps]
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"grpo step, 8 prompts x 4, 32 new tokens, 1 thread: median {statistics.median(seconds):.2f} s/step"
        f" over {len(seconds)} steps (min {min(seconds):.2f}, max {max(seconds):.2f});"
        f" mean response length {statistics.mean(lengths):.1f}; peak RSS {peak_mb:.0f} MB"
    )
    phases = sorted(k for k in steps[-1] if k.startswith("timing_s/") and k != "timing_s/step")
    for key in phases:
        print(f"  {key}: median {statistics.median(r[key] for r in steps[1:]):.2f} s")
    print("TRL: not installed here; compare in its own venv with the same budget.")


if __name__ == "__main__":
    main()
