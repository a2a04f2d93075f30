#!/bin/bash
# Background a long run on a shared box: pin GPUs, cap the wall time, keep a log.
set -e
PYTHON_BIN=${PYTHON_BIN:-python3}
GPUS=${GPUS:-0,1,2,3}
RUN_NAME=qwen3-1.7b-reinforce-pp
LOG=/tmp/${RUN_NAME}.log
commas=${GPUS//[^,]/}

nohup env -u WANDB_API_KEY CUDA_VISIBLE_DEVICES="$GPUS" RAY_DEDUP_LOGS=0 \
    timeout --signal=INT 47h \
    ${PYTHON_BIN} -u -m verl.trainer.main_ppo \
    algorithm.adv_estimator=reinforce_plus_plus \
    data.train_files=$HOME/data/math/train.parquet \
    data.val_files=$HOME/data/math/test.parquet \
    actor_rollout_ref.model.path=Qwen/Qwen3-1.7B \
    actor_rollout_ref.rollout.n=1 \
    trainer.experiment_name=$RUN_NAME \
    trainer.n_gpus_per_node=$(( ${#commas} + 1 )) \
    > "$LOG" 2>&1 &
echo "started, log in $LOG"
