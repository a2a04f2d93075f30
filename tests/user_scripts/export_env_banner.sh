#!/bin/bash
# PPO with a critic; the environment the cluster needs, and a banner for the log.
set -x

export VLLM_ATTENTION_BACKEND=XFORMERS PYTHONUNBUFFERED=1
export RAY_DEDUP_LOGS=0 \
       NCCL_DEBUG=WARN
unset ROCR_VISIBLE_DEVICES
ulimit -n 65535 || true

[[ -z "${WANDB_API_KEY:-}" ]] && export WANDB_MODE=offline

echo "verl $(python3 -c 'import verl; print(verl.__version__)' 2>/dev/null || echo unknown) on $(uname -n)"
echo "=============================================="

gsm8k=$HOME/data/gsm8k
math=$HOME/data/math

python3 -m verl.trainer.main_ppo \
    data.train_files="['$gsm8k/train.parquet', '$math/train.parquet']" \
    data.val_files="['$gsm8k/test.parquet', '$math/test.parquet']" \
    data.train_batch_size=1024 \
    actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct \
    critic.model.path=Qwen/Qwen2-7B-Instruct \
    critic.optim.lr=1e-5 \
    trainer.logger='["console","wandb"]' \
    trainer.project_name='verl_example_gsm8k' \
    trainer.experiment_name='qwen2-7b_ppo' \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.save_freq=-1 \
    trainer.test_freq=10 \
    trainer.total_epochs=15 $@
