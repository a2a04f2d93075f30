#!/bin/bash
# The run's profile (small/large) is a file of its own; it fills an override array.
set -e

PROFILE=${PROFILE:-small}
cd "$(dirname "${BASH_SOURCE[0]}")"
source lib/profile_${PROFILE}.sh 8

echo "profile $PROFILE: ${#PROFILE_ARGS[@]} overrides for $PROFILE_GPUS GPUs"

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    "${PROFILE_ARGS[@]}" \
    trainer.n_gpus_per_node=$PROFILE_GPUS
