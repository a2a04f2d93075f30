#!/usr/bin/env bash
set -euo pipefail
declare -A COEF=( [low]=0.0 [mid]=0.001 [high]=0.01 )
LEVEL=${LEVEL:-mid}
if [[ -z "${COEF[$LEVEL]+x}" ]]; then
    echo "unknown level $LEVEL (choose from: ${!COEF[*]})" >&2
    exit 2
fi
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct \
    actor_rollout_ref.actor.entropy_coeff=${COEF[$LEVEL]} \
    trainer.experiment_name="entropy-${LEVEL}"
