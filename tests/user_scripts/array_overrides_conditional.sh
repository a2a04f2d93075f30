#!/usr/bin/env bash
# Overrides collected in an array, with optional blocks switched by variables.
set -euo pipefail

USE_LORA=${USE_LORA:-1}
USE_DYNAMIC_BSZ=${USE_DYNAMIC_BSZ:-true}
ROLLOUT=${ROLLOUT:-vllm}
max_prompt_length=512
max_response_length=1024

ARGS=()
ARGS+=(algorithm.adv_estimator=grpo)
ARGS+=(data.train_files="$HOME/data/gsm8k/train.parquet" data.val_files="$HOME/data/gsm8k/test.parquet")
ARGS+=(data.max_prompt_length=$max_prompt_length data.max_response_length=$max_response_length)
ARGS+=(actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct)
ARGS+=(actor_rollout_ref.rollout.name=$ROLLOUT)

if [[ "$USE_LORA" == "1" ]]; then
    ARGS+=(
        actor_rollout_ref.model.lora_rank=64
        actor_rollout_ref.model.lora_alpha=32
        actor_rollout_ref.model.target_modules=all-linear
    )
fi

if [ "$USE_DYNAMIC_BSZ" = true ]; then
    ARGS+=("actor_rollout_ref.actor.use_dynamic_bsz=True")
    ARGS+=("actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$(( (max_prompt_length + max_response_length) * 4 ))")
fi

[[ $ROLLOUT == sglang ]] && ARGS+=(actor_rollout_ref.rollout.mode=async)

echo "overrides (${#ARGS[@]}):"
for ((i = 0; i < ${#ARGS[@]}; i++)); do
    echo "  [$i] ${ARGS[$i]}"
done

python3 -m verl.trainer.main_ppo "${ARGS[@]}" trainer.total_epochs=2 "$@"
