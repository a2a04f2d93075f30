#!/usr/bin/env bash
set -uo pipefail
MAX_TRIES=${MAX_TRIES:-3}
try=1
until timeout 23h python3 -m verl.trainer.main_ppo \
      algorithm.adv_estimator=grpo \
      data.train_files=$HOME/data/gsm8k/train.parquet \
      data.val_files=$HOME/data/gsm8k/test.parquet \
      actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct \
      trainer.resume_mode=auto; do
  if (( try >= MAX_TRIES )); then
    echo "giving up after $try tries"
    exit 1
  fi
  try=$((try + 1))
  echo "retry $try"
done
