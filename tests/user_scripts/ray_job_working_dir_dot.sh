#!/usr/bin/env bash
set -x
cd "$(dirname "$0")/.."
ray job submit --address="http://127.0.0.1:8265" \
    --runtime-env=verl/trainer/runtime_env.yaml \
    --no-wait \
    -- python3 -m verl.trainer.main_ppo \
    trainer.n_gpus_per_node=4 \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    critic.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    trainer.project_name=verl_example \
    trainer.total_epochs=15
