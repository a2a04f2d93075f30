#!/usr/bin/env bash
#SBATCH --job-name=rl-gspo-3B
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:4
#SBATCH --time=10:00:00

set -xeuo pipefail

export NCCL_IBEXT_DISABLE=1
export NCCL_NVLS_ENABLE=1
export GPUS_PER_NODE=4
export VLLM_USE_V1=1
export HYDRA_FULL_ERROR=1

project_name='RL-GSPO'
exp_name="gspo-qwen2.5-3b-$(whoami 2>/dev/null || echo user)"

LOG_DIR=${LOG_DIR:-$HOME/logs/${project_name}}
mkdir -p "${LOG_DIR}"
exec > >(tee -a "${LOG_DIR}/train.log") 2>&1

loss_mode=gspo
clip_ratio_low=0.0003
clip_ratio_high=0.0004
train_batch_size=512
ppo_mini_batch_size=128

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.actor.policy_loss.loss_mode=${loss_mode} \
    actor_rollout_ref.actor.clip_ratio_low=${clip_ratio_low} \
    actor_rollout_ref.actor.clip_ratio_high=${clip_ratio_high} \
    data.train_batch_size=${train_batch_size} \
    actor_rollout_ref.actor.ppo_mini_batch_size=${ppo_mini_batch_size} \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct \
    trainer.n_gpus_per_node=${GPUS_PER_NODE} \
    trainer.project_name="${project_name}" \
    trainer.experiment_name="${exp_name}" 2>&1 | tee "${LOG_DIR}/${exp_name}.log"
