#!/bin/bash
# Picks parallel sizes from the number of GPUs the user asks for.
set -x

NGPUS=${NGPUS:-8}
MODEL_SIZE=${MODEL_SIZE:-7b}

case "$NGPUS" in
    1|2)
        TP=1; SP=1; OFFLOAD=True ;;
    4)
        TP=2; SP=2; OFFLOAD=True ;;
    8)
        TP=2; SP=4; OFFLOAD=False ;;
    *)
        echo "unsupported GPU count: $NGPUS" >&2
        exit 1 ;;
esac

case $MODEL_SIZE in
    0.5b|1.5b) MODEL=Qwen/Qwen2.5-${MODEL_SIZE^^}-Instruct; MICRO=16 ;;
    7b) MODEL=Qwen/Qwen2.5-7B-Instruct; MICRO=4 ;;
    *) MODEL=Qwen/Qwen2.5-${MODEL_SIZE}-Instruct; MICRO=1 ;;
esac

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=gae \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    actor_rollout_ref.model.path=$MODEL \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$MICRO \
    actor_rollout_ref.actor.ulysses_sequence_parallel_size=$SP \
    actor_rollout_ref.actor.fsdp_config.param_offload=$OFFLOAD \
    actor_rollout_ref.rollout.tensor_model_parallel_size=$TP \
    critic.model.path=$MODEL \
    trainer.n_gpus_per_node=$NGPUS \
    trainer.nnodes=1 $@
