#!/usr/bin/env bash
set -e
cd "$(dirname "$0")"
[ -f .env ] && source .env
: ${LORA_RANK:=32}
: ${LORA_ALPHA:=$((LORA_RANK * 2))}
: ${BASE_MODEL:=Qwen/Qwen2.5-7B-Instruct}

python3 -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  data.train_files=$HOME/data/gsm8k/train.parquet \
  data.val_files=$HOME/data/gsm8k/test.parquet \
  actor_rollout_ref.model.path=$BASE_MODEL \
  actor_rollout_ref.model.lora_rank=$LORA_RANK \
  actor_rollout_ref.model.lora_alpha=$LORA_ALPHA \
  actor_rollout_ref.model.target_modules=all-linear \
  actor_rollout_ref.rollout.load_format=safetensors \
  trainer.experiment_name="lora_r${LORA_RANK}"
