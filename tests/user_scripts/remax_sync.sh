#!/usr/bin/env bash
# ReMax on GSM8K, one node; keeps the exact command next to the checkpoints.
set -euo pipefail
export VLLM_ATTENTION_BACKEND=XFORMERS

DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}
MODEL=${MODEL:-Qwen/Qwen2.5-3B-Instruct}
PROJECT=verl_remax_example_gsm8k
EXP=qwen2.5_3b_function_rm_remax
CKPT=$HOME/checkpoints/$PROJECT/$EXP

mkdir -p "$CKPT"
echo "$0 $*" > "$CKPT/command.txt"

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=remax \
    data.train_files=$DATA_DIR/train.parquet \
    data.val_files=$DATA_DIR/test.parquet \
    data.train_batch_size=512 \
    data.max_prompt_length=512 \
    data.max_response_length=1024 \
    actor_rollout_ref.model.path=$MODEL \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.ppo_mini_batch_size=128 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30000 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.8 \
    actor_rollout_ref.rollout.n=4 \
    algorithm.use_kl_in_reward=True \
    algorithm.kl_penalty=kl \
    algorithm.kl_ctrl.kl_coef=0.001 \
    trainer.critic_warmup=0 \
    trainer.logger='["console","wandb"]' \
    trainer.project_name=$PROJECT \
    trainer.experiment_name=$EXP \
    trainer.default_local_dir=$CKPT \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.save_freq=-1 \
    trainer.test_freq=5 \
    trainer.total_epochs=5 "$@"
