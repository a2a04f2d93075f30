#!/usr/bin/env bash
# Writes the reward function's settings next to the checkpoints, prints usage on -h.
set -euo pipefail

usage() {
    cat <<-USAGE
	usage: $(basename "$0") [-h] [EXTRA_OVERRIDES...]
	  trains GRPO on GSM8K with a custom reward function
	USAGE
}

if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    usage
    exit 0
fi

CKPT_DIR=${CKPT_DIR:-$HOME/checkpoints/grpo-custom-reward}
mkdir -p "$CKPT_DIR"
cat > "$CKPT_DIR/reward.json" <<EOF
{"format_weight": 0.1, "answer_weight": 1.0}
EOF

REWARD_FN=$(cat <<'PY'
custom_reward.py
PY
)

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct \
    custom_reward_function.path="$HOME/rewards/$REWARD_FN" \
    custom_reward_function.name=compute_score \
    trainer.default_local_dir="$CKPT_DIR" "$@"
