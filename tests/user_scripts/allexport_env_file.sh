#!/usr/bin/env bash
# Variables from a dotenv-style file next to the script, exported for the trainer.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" >/dev/null 2>&1 && pwd)"

set -a
source "$HERE/lib/train.env"
set +a

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$DATA_ROOT/train.parquet" \
    data.val_files="$DATA_ROOT/test.parquet" \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    trainer.project_name="$WANDB_PROJECT" \
    trainer.logger='["console","wandb"]'
