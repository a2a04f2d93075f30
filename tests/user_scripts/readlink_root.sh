#!/usr/bin/env bash
set -euo pipefail
HERE=$(dirname "$(readlink -f "$0")")
ROOT=$(realpath "$HERE/../..")
CFG_DIR="$HERE/config"
NAME=$(basename "${BASH_SOURCE[0]%.sh}")

PY=${PY:-python}
"$PY" -m verl.trainer.main_ppo \
    --config-path="$CFG_DIR" \
    --config-name=ppo_trainer \
    data.train_files="$ROOT/data/train.parquet" \
    data.val_files="$ROOT/data/val.parquet" \
    trainer.experiment_name="$NAME" \
    trainer.default_local_dir="${ROOT}/outputs/${NAME}"
