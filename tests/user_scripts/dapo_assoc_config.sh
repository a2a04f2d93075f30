#!/usr/bin/env bash
# DAPO-style recipe whose knobs live in an associative array, turned into Hydra overrides.
set -xeuo pipefail

declare -A CFG=(
    ["algorithm.adv_estimator"]=grpo
    ["algorithm.use_kl_in_reward"]=False
    ["actor_rollout_ref.actor.clip_ratio_low"]=0.2
    ["actor_rollout_ref.actor.clip_ratio_high"]=0.28
    ["actor_rollout_ref.actor.loss_agg_mode"]=token-mean
    ["data.max_prompt_length"]=$((1024 * 2))
    ["data.max_response_length"]=$((1024 * 8))
)
CFG["actor_rollout_ref.rollout.n"]=16
CFG["trainer.experiment_name"]="dapo-qwen2.5-7b"

declare -a OVERRIDES=()
for key in "${!CFG[@]}"; do
    OVERRIDES+=("${key}=${CFG[$key]}")
done

echo "launching with ${#OVERRIDES[@]} overrides"

python3 -m verl.trainer.main_ppo \
    data.train_files="$HOME/data/dapo-math-17k.parquet" \
    data.val_files="$HOME/data/aime-2024.parquet" \
    actor_rollout_ref.model.path="$HOME/models/Qwen2.5-Math-7B" \
    "${OVERRIDES[@]}" \
    trainer.project_name=DAPO
