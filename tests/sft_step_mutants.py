"""Seeded bugs in the reference trainer's SFT step, each caught by the SFT step oracle.

A helper module for `test_sft_step.py`, not a test file. Each is a one-line source edit
applied as `step_mutants.SourceMutant` applies the RL loop's, naming the (case, variant) pairs
of `corpus/sft_step.yaml` whose steps must fail with it. The schedule, LoRA's wrapping and the
shared math are the RL oracle's mutants already (`step_mutants.py`, `conformance_mutants.py`).
"""

from __future__ import annotations

from step_mutants import SourceMutant

STEP = "reference_trainer.sft_step"
SFT_MATH = "reference_trainer.math.sft"
FULL, BUDGET, LORA = "sft/full", "sft/token-budget", "sft/lora"

SFT_SOURCE_MUTANTS = (
    SourceMutant(
        "sft-loss-normalised-per-micro-batch",
        f"{STEP}:sft_update",
        "loss = sft_loss(log_prob, mask, batch_num_tokens=tokens)",
        "loss = sft_loss(log_prob, mask)",
        ((FULL, "sgd"), (BUDGET, "sgd"), (LORA, "sgd")),
    ),
    SourceMutant(
        "sft-gradients-averaged-over-micro-batches",
        f"{STEP}:sft_update",
        "loss.backward()",
        "(loss / len(groups)).backward()",
        ((FULL, "sgd"), (LORA, "adamw")),
    ),
    SourceMutant(
        "sft-scheduler-never-stepped",
        f"{STEP}:sft_update",
        "scheduler.step()",
        "pass",
        ((FULL, "sgd"), (BUDGET, "adamw")),
    ),
    SourceMutant(
        "sft-gradient-clip-ignored",
        f"{STEP}:sft_update",
        "clip_grad_norm_(params, grad_clip)",
        "clip_grad_norm_(params, float('inf'))",
        ((FULL, "sgd"), (LORA, "sgd")),
    ),
    SourceMutant(
        "sft-loss-mask-not-shifted",
        f"{SFT_MATH}:next_token_loss_mask",
        "shifted[:, :-1] = loss_mask[:, 1:]",
        "shifted[:, :] = loss_mask",
        ((FULL, "sgd"), (BUDGET, "sgd"), (LORA, "sgd")),
    ),
    SourceMutant(
        "sft-packed-positions-run-on",
        f"{STEP}:next_token_log_probs",
        "positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)",
        "positions = torch.arange(sum(lengths)).unsqueeze(0)",
        ((FULL, "sgd"), (FULL, "adamw")),
    ),
    SourceMutant(
        "sft-sgd-weight-decay-dropped",
        f"{STEP}:build_sft_optimizer",
        "torch.optim.SGD(params, lr=optim.lr, weight_decay=optim.weight_decay)",
        "torch.optim.SGD(params, lr=optim.lr)",
        ((FULL, "sgd"),),
    ),
    SourceMutant(
        "sft-adamw-default-betas",
        f"{STEP}:build_sft_optimizer",
        "params, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay",
        "params, lr=optim.lr, weight_decay=optim.weight_decay",
        ((FULL, "adamw"),),
    ),
)
