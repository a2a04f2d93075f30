#!/bin/bash
# usage: getopts_launcher.sh [-m MODEL] [-n GPUS] [-e EPOCHS] [-l] [-- HYDRA_OVERRIDES...]
set -e

MODEL=Qwen/Qwen2.5-0.5B-Instruct
NGPUS=8
EPOCHS=15
USE_LORA=0

usage() {
    echo "usage: $0 [-m MODEL] [-n GPUS] [-e EPOCHS] [-l]" >&2
    exit 1
}

while getopts ":m:n:e:lh" opt; do
    case "$opt" in
        m) MODEL="$OPTARG" ;;
        n) NGPUS="$OPTARG" ;;
        e) EPOCHS="$OPTARG" ;;
        l) USE_LORA=1 ;;
        h) usage ;;
        \?) echo "unknown option -$OPTARG" >&2; usage ;;
        :) echo "-$OPTARG needs a value" >&2; usage ;;
    esac
done
shift $((OPTIND - 1))

LORA_ARGS=""
if [ "$USE_LORA" -eq 1 ]; then
    LORA_ARGS="actor_rollout_ref.model.lora_rank=32 actor_rollout_ref.model.lora_alpha=32"
fi

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    actor_rollout_ref.model.path=$MODEL \
    trainer.n_gpus_per_node=$NGPUS \
    trainer.total_epochs=$EPOCHS \
    $LORA_ARGS "$@"
