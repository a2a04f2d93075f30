#!/usr/bin/env bash
# The dataset list lives in a here-document, one path per line.
set -euo pipefail

DATA=${DATA:-$HOME/data}

mapfile -t TRAIN <<EOF
$DATA/gsm8k/train.parquet
$DATA/math/train.parquet
EOF

readarray -t VAL <<EOF
$DATA/gsm8k/test.parquet
$DATA/math/test.parquet
EOF

quote_list() {
    local out="" item
    for item in "$@"; do
        out+="${out:+,}'$item'"
    done
    echo "[$out]"
}

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$(quote_list "${TRAIN[@]}")" \
    data.val_files="$(quote_list "${VAL[@]}")" \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-7B \
    trainer.experiment_name="math-${#TRAIN[@]}sets"
