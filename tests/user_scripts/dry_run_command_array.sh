#!/usr/bin/env bash
# Builds the command once, prints it, then runs it (unless DRY_RUN is set).
set -eu

PYTHON=${PYTHON:-python3}
CMD=("$PYTHON" -u -m verl.trainer.main_ppo)
CMD+=(
    algorithm.adv_estimator=reinforce_plus_plus
    data.train_files="$HOME/data/gsm8k/train.parquet"
    data.val_files="$HOME/data/gsm8k/test.parquet"
    actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct
    actor_rollout_ref.actor.use_kl_loss=True
    trainer.val_before_train=False
)

echo "+ ${CMD[*]}"
if [ -n "${DRY_RUN:-}" ]; then
    exit 0
fi
exec "${CMD[@]}" "$@"
