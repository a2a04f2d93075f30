#!/bin/bash
set -e
REQUIRED=(MODEL_PATH TRAIN_FILE VAL_FILE)
MODEL_PATH=${MODEL_PATH:-/models/qwen}
TRAIN_FILE=${TRAIN_FILE:-/data/train.parquet}
VAL_FILE=${VAL_FILE:-/data/val.parquet}
for v in "${REQUIRED[@]}"; do
  if [ -z "${!v}" ]; then echo "missing $v"; exit 1; fi
done
python_bin=$(command -v python3 || command -v python)
"$python_bin" -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  data.train_files="$TRAIN_FILE" \
  data.val_files="$VAL_FILE" \
  actor_rollout_ref.model.path="$MODEL_PATH"
