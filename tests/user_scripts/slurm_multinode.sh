#!/bin/bash
#SBATCH --job-name=verl-ray
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64

set -eo pipefail

: "${SLURM_JOB_NUM_NODES:=2}"
: "${SLURM_GPUS_PER_NODE:=8}"

MODEL_PATH=/shared/models/Qwen2.5-14B-Instruct
DATA=/shared/data

declare -A PARALLEL=(
    [tp]=4
    [sp]=2
    [micro]=2
)

WORLD=$(( SLURM_JOB_NUM_NODES * SLURM_GPUS_PER_NODE ))
BSZ=$(( WORLD * 32 ))

echo "world=$WORLD bsz=$BSZ tp=${PARALLEL[tp]}"

srun --nodes=1 --ntasks=1 --overlap \
    python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=$DATA/gsm8k/train.parquet \
    data.val_files=$DATA/gsm8k/test.parquet \
    data.train_batch_size=$BSZ \
    actor_rollout_ref.model.path=$MODEL_PATH \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=${PARALLEL[micro]} \
    actor_rollout_ref.actor.ulysses_sequence_parallel_size=${PARALLEL[sp]} \
    actor_rollout_ref.rollout.tensor_model_parallel_size=${PARALLEL[tp]} \
    trainer.nnodes=$SLURM_JOB_NUM_NODES \
    trainer.n_gpus_per_node=$SLURM_GPUS_PER_NODE 2>&1 | tee "verl-${SLURM_JOB_ID:-local}.log"
