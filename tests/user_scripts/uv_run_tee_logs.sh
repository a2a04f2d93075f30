#!/usr/bin/env bash
# uv-managed environment, output kept in a log per experiment.
set -eo pipefail

export HF_HUB_OFFLINE=1
export WANDB_MODE=${WANDB_MODE:-offline}

project=verl-uv
exp=remax-qwen2.5-3b
log_dir="logs/${project}"
mkdir -p "$log_dir"

uv run --frozen --extra vllm \
    python -m verl.trainer.main_ppo \
    algorithm.adv_estimator=remax \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct \
    actor_rollout_ref.rollout.n=2 \
    trainer.project_name=$project \
    trainer.experiment_name=$exp \
    trainer.logger='["console","wandb"]' "$@" 2>&1 | tee "$log_dir/$exp.log"

echo "exit status ${PIPESTATUS[0]}"
