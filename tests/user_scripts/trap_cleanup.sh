#!/usr/bin/env bash
# Starts a local Ray head, always stops it again, and trains in between.
set -eo pipefail

WORK=${WORK:-$HOME/.cache/verl-run}
mkdir -p "$WORK"

cleanup() {
    echo "stopping ray" >&2
    ray stop --force >/dev/null 2>&1 || true
    rm -rf "$WORK/tmp"
}
trap cleanup EXIT
trap 'echo "interrupted" >&2; exit 130' INT TERM

ray start --head --num-gpus=8 --disable-usage-stats >/dev/null

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct \
    actor_rollout_ref.rollout.n=5 \
    trainer.default_local_dir="$WORK/checkpoints" \
    trainer.total_epochs=3
