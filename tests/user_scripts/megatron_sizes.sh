#!/usr/bin/env bash
# Megatron recipe: parallel sizes derived from the node layout, exported settings.
set -xeuo pipefail

export CUDA_DEVICE_MAX_CONNECTIONS=1
export VLLM_ALLREDUCE_USE_SYMM_MEM=0

NODES=${NODES:-4}
GPUS_PER_NODE=8
WORLD=$(( NODES * GPUS_PER_NODE ))

TP=4
PP=2
CP=1
EP=8
DP=$(( WORLD / (TP * PP * CP) ))
readonly TP PP CP EP

if (( DP < 1 )); then
    echo "world size $WORLD too small for tp=$TP pp=$PP" >&2
    exit 1
fi

printf -v EXP_NAME 'qwen3-30b-a3b-tp%d-pp%d-ep%d-dp%d' "$TP" "$PP" "$EP" "$DP"
gen_tp=$(( TP * 2 ))
train_bsz=$(( DP * 16 ))

python3 -m verl.trainer.main_ppo --config-path=config \
    --config-name='ppo_megatron_trainer.yaml' \
    algorithm.adv_estimator=grpo \
    data.train_batch_size=$train_bsz \
    actor_rollout_ref.model.path=Qwen/Qwen3-30B-A3B \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=$TP \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=$PP \
    actor_rollout_ref.actor.megatron.context_parallel_size=$CP \
    actor_rollout_ref.actor.megatron.expert_model_parallel_size=$EP \
    actor_rollout_ref.rollout.tensor_model_parallel_size=$gen_tp \
    trainer.nnodes=$NODES \
    trainer.n_gpus_per_node=$GPUS_PER_NODE \
    trainer.experiment_name=$EXP_NAME
