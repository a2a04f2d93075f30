#!/bin/bash
# LoRA rank sweep; each run gets its own experiment name.
set -u

declare -a RANKS=(8 16 32)
declare -A ALPHA=([8]=16 [16]=32 [32]=64)
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-1.5B-Instruct}

for rank in "${RANKS[@]}"; do
    alpha=${ALPHA[$rank]}
    echo "=== rank $rank alpha $alpha ==="
    python3 -m verl.trainer.main_ppo \
        algorithm.adv_estimator=grpo \
        data.train_files=$HOME/data/gsm8k/train.parquet \
        data.val_files=$HOME/data/gsm8k/test.parquet \
        actor_rollout_ref.model.path=$MODEL_PATH \
        actor_rollout_ref.model.lora_rank=$rank \
        actor_rollout_ref.model.lora_alpha=$alpha \
        trainer.experiment_name=lora-r${rank}-a${alpha} || echo "rank $rank failed"
done
