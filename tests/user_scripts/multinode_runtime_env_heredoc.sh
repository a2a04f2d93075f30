#!/usr/bin/env bash
# Multi-node job: the Ray runtime environment is written inline as JSON and the job submitted.
set -euo pipefail

NNODES=${NNODES:-2}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
RAY_ADDRESS=${RAY_ADDRESS:-http://127.0.0.1:8265}
WANDB_PROJECT=verl-multinode

RUNTIME_ENV_JSON=$(cat <<EOF
{
  "env_vars": {
    "NCCL_DEBUG": "WARN",
    "VLLM_USE_V1": "1",
    "WANDB_PROJECT": "${WANDB_PROJECT}",
    "TOKENIZERS_PARALLELISM": "true"
  }
}
EOF
)

ray job submit --address="${RAY_ADDRESS}" \
    --runtime-env-json="${RUNTIME_ENV_JSON}" \
    --no-wait \
    -- python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=/mnt/shared/data/gsm8k/train.parquet \
    data.val_files=/mnt/shared/data/gsm8k/test.parquet \
    actor_rollout_ref.model.path=/mnt/shared/models/Qwen2.5-32B-Instruct \
    actor_rollout_ref.rollout.tensor_model_parallel_size=4 \
    trainer.nnodes="${NNODES}" \
    trainer.n_gpus_per_node="${GPUS_PER_NODE}" \
    trainer.project_name="${WANDB_PROJECT}"
