#!/bin/bash
set -euo pipefail
LOGGERS='["console"]'
if [[ -n "${WANDB_API_KEY:-}" ]]; then
    LOGGERS='["console","wandb"]'
fi
TAGS=()
TAGS+=("model=qwen7b")
TAGS+=("algo=grpo")
printf 'tag: %s\n' "${TAGS[@]}"
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct \
    trainer.logger="$LOGGERS" \
    trainer.experiment_name="$(IFS=_; echo "${TAGS[*]}")"
