#!/usr/bin/env bash
set -xeuo pipefail
HERE=$(dirname "$(realpath "$0")")
CONFIG_NAME=${CONFIG_NAME:-my_ppo}
python3 -m verl.trainer.main_ppo \
    --config-path "$HERE/configs" \
    --config-name "$CONFIG_NAME" \
    data.train_files="$HOME/data/gsm8k/train.parquet" \
    data.val_files="$HOME/data/gsm8k/test.parquet" \
    hydra.run.dir="$HERE/outputs"
