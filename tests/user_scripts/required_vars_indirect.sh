#!/usr/bin/env bash
# Checks that every required setting is there before launching, by name.
set -euo pipefail

MODEL_PATH=${MODEL_PATH:-$HOME/models/Qwen2.5-7B-Instruct}
TRAIN_FILE=${TRAIN_FILE:-$HOME/data/gsm8k/train.parquet}
VAL_FILE=${VAL_FILE:-$HOME/data/gsm8k/test.parquet}
PROJECT=${PROJECT:-verl_examples}

for var in MODEL_PATH TRAIN_FILE VAL_FILE PROJECT; do
    if [[ -z "${!var:-}" ]]; then
        echo "error: $var is not set" >&2
        exit 1
    fi
    echo "$var=${!var}"
done

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$TRAIN_FILE" \
    data.val_files="$VAL_FILE" \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    trainer.project_name="$PROJECT" \
    trainer.experiment_name="$(basename "$MODEL_PATH")-grpo"
