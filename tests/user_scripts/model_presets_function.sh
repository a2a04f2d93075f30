#!/usr/bin/env bash
# Model presets kept in functions; a config builder appends to a global override list.
set -euo pipefail

OVERRIDES=()
add() { OVERRIDES+=("$1=$2"); }

preset_qwen3_8b() {
    add actor_rollout_ref.model.path Qwen/Qwen3-8B
    add actor_rollout_ref.rollout.tensor_model_parallel_size 2
    add actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu 2
}

preset_qwen3_4b() {
    add actor_rollout_ref.model.path Qwen/Qwen3-4B
    add actor_rollout_ref.rollout.tensor_model_parallel_size 1
    add actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu 4
}

PRESET=${1:-qwen3_8b}
shift || true

if ! declare -F "preset_${PRESET}" >/dev/null; then
    echo "no preset ${PRESET}" >&2
    exit 1
fi
"preset_${PRESET}"

add algorithm.adv_estimator grpo
add data.train_files "$HOME/data/gsm8k/train.parquet"
add data.val_files "$HOME/data/gsm8k/test.parquet"
add trainer.experiment_name "grpo-${PRESET//_/-}"

python3 -m verl.trainer.main_ppo "${OVERRIDES[@]}" "$@"
