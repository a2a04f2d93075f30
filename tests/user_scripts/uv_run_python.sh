#!/usr/bin/env bash
set -euo pipefail
cd "$(dirname "$0")"
LOG_DIR=${LOG_DIR:-$PWD/logs}
mkdir -p "$LOG_DIR"

uv run --directory .. --extra vllm python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=rloo \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    actor_rollout_ref.model.path=$HOME/models/Qwen2.5-1.5B \
    actor_rollout_ref.rollout.n=4 \
    trainer.default_local_dir="$LOG_DIR/ckpt" \
    trainer.logger='[console,tensorboard]'
