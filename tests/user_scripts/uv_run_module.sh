#!/usr/bin/env bash
# Run from a uv-managed checkout: uv picks the project's interpreter.
set -eu

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PROJECT_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"

data_dir="${DATA_DIR:-$HOME/data/gsm8k}"
model="${MODEL_PATH:-Qwen/Qwen2.5-0.5B-Instruct}"

uv run --project "${PROJECT_ROOT}" --with "vllm==0.8.5" --no-sync \
    -m verl.trainer.main_ppo \
    data.train_files="${data_dir}/train.parquet" \
    data.val_files="${data_dir}/test.parquet" \
    data.train_batch_size=64 \
    actor_rollout_ref.model.path="${model}" \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    critic.model.path="${model}" \
    critic.ppo_micro_batch_size_per_gpu=4 \
    trainer.default_local_dir="${PROJECT_ROOT}/checkpoints/$(basename "$0" .sh)" \
    trainer.n_gpus_per_node=1 \
    trainer.nnodes=1 \
    trainer.logger=console
