#!/usr/bin/env bash
# Three seeds, one after the other; each run is a call of the same function.
set -uo pipefail

BASE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

run_seed() {
    local seed=$1
    local tag
    tag=$(printf 'seed%02d' "$seed")
    local extra=()
    if (( seed > 1 )); then
        extra+=(trainer.resume_mode=disable)
    fi
    timeout 12h python3 -m verl.trainer.main_ppo \
        data.seed="$seed" \
        data.train_files="$BASE/data/train.parquet" \
        data.val_files="$BASE/data/test.parquet" \
        actor_rollout_ref.model.path="${MODEL:-Qwen/Qwen2.5-0.5B}" \
        trainer.experiment_name="ppo-${tag}" \
        "${extra[@]}" || return $?
}

for seed in 1 2 3; do
    run_seed "$seed" || echo "seed $seed failed" >&2
done
