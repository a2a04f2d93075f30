#!/bin/bash
# Split the visible GPUs: rollout on the first half.
set -u
GPUS=${CUDA_VISIBLE_DEVICES:-0,1,2,3,4,5,6,7}
IFS=, read -r -a ALL <<< "$GPUS"
HALF=$(( ${#ALL[@]} / 2 ))
TRAIN_GPUS=$(IFS=,; echo "${ALL[*]:0:$HALF}")
echo "training on $TRAIN_GPUS"
CUDA_VISIBLE_DEVICES=$TRAIN_GPUS python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=gae \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    critic.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    trainer.n_gpus_per_node=$HALF
