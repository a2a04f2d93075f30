#!/bin/bash
# Submit a GRPO run with its environment in the runtime env, not in this shell.
set -euo pipefail

MODEL=${MODEL:-$HOME/models/Qwen2.5-3B-Instruct}
GSM8K=${GSM8K:-$HOME/data/gsm8k}
HEAD=${RAY_HEAD:-127.0.0.1}

export VLLM_ATTENTION_BACKEND=XFORMERS   # stays in this shell: the job never sees it

RUNTIME_ENV_JSON='{"env_vars": {"TOKENIZERS_PARALLELISM": "true", "NCCL_DEBUG": "WARN", "VLLM_LOGGING_LEVEL": "WARN"}}'

ray job submit \
  --address="http://${HEAD}:8265" \
  --runtime-env-json="${RUNTIME_ENV_JSON}" \
  --entrypoint-num-cpus=1 \
  --submission-id "grpo-qwen25-3b" \
  --log-style=record \
  -- python3 -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
  data.train_files="$GSM8K/train.parquet" \
  data.val_files="$GSM8K/test.parquet" \
  data.train_batch_size=256 \
  data.max_prompt_length=512 \
  data.max_response_length=1024 \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=64 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.actor.use_kl_loss=True \
  actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.n=5 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
  trainer.logger='["console"]' \
  trainer.n_gpus_per_node=4 \
  trainer.nnodes=1 \
  trainer.total_epochs=3 "$@"
