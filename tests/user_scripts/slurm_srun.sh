#!/bin/bash
#SBATCH --job-name=verl-ppo
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --time=24:00:00
set -x

export HYDRA_FULL_ERROR=1
export WANDB_MODE=${WANDB_MODE:-offline}
CKPT=${CKPT:-$HOME/ckpt/ppo-qwen2.5-7b}

srun --nodes=1 --ntasks=1 --gpus-per-node=8 --cpus-per-task=64 \
    --export=ALL,RAY_DEDUP_LOGS=0 -l \
    python3 -m verl.trainer.main_ppo \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    data.train_batch_size=1024 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    critic.model.path=Qwen/Qwen2.5-7B-Instruct \
    critic.optim.lr=1e-5 \
    trainer.default_local_dir=$CKPT \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=$SLURM_NNODES_DEFAULT_1 \
    trainer.logger=['console','wandb']
