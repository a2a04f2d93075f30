#!/bin/bash
# Several datasets joined into Hydra lists; GPUs counted from CUDA_VISIBLE_DEVICES.
set -euo pipefail

export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1,2,3}
IFS=',' read -ra GPU_IDS <<< "$CUDA_VISIBLE_DEVICES"
NGPUS=${#GPU_IDS[@]}

DATA=$HOME/data
TRAIN_SETS=(gsm8k math dapo)
train_files=()
val_files=()
for name in "${TRAIN_SETS[@]}"; do
    train_files+=("'$DATA/$name/train.parquet'")
    val_files+=("'$DATA/$name/test.parquet'")
done
TRAIN_LIST="[$(IFS=,; echo "${train_files[*]}")]"
VAL_LIST="[$(IFS=,; echo "${val_files[*]}")]"

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$TRAIN_LIST" \
    data.val_files="$VAL_LIST" \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct \
    trainer.n_gpus_per_node=$NGPUS \
    trainer.nnodes=1
