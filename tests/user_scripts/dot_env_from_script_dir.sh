#!/bin/bash
# Runs from its own folder and reads the environment file next to it.
cd "$(dirname "$0")"
. ./lib/env.sh

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=../data/train.parquet \
    data.val_files=../data/test.parquet \
    actor_rollout_ref.model.path="$MODEL" \
    trainer.default_local_dir="$(pwd)/checkpoints"
