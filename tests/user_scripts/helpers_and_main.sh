#!/usr/bin/env bash
# A recipe with helper functions and a main(), as experiment folders often grow them.
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)
REPO_ROOT=$(cd -- "${SCRIPT_DIR}/../.." &>/dev/null && pwd)

log() {
    echo "[$(date '+%F %T')] $*" >&2
}

now() { date +%s; }

die() {
    log "error: $*"
    exit 1
}

gpu_count() {
    local n=${NGPUS:-8}
    echo "$n"
}

join_by() {
    local IFS_CHAR=$1
    shift
    local out=$1
    shift
    for item in "$@"; do
        out="${out}${IFS_CHAR}${item}"
    done
    printf '%s' "$out"
}

main() {
    local model=${1:?usage: $0 MODEL [OVERRIDES...]}
    shift
    local n_gpus
    n_gpus=$(gpu_count)
    [[ $n_gpus -ge 1 ]] || die "no GPUs"
    local loggers
    loggers="[$(join_by , console wandb)]"
    log "training $model on $n_gpus GPUs from ${REPO_ROOT}"
    START=$(now)
    python3 -m verl.trainer.main_ppo \
        algorithm.adv_estimator=grpo \
        data.train_files="${REPO_ROOT}/data/gsm8k/train.parquet" \
        data.val_files="${REPO_ROOT}/data/gsm8k/test.parquet" \
        actor_rollout_ref.model.path="$model" \
        actor_rollout_ref.rollout.n=8 \
        reward.custom_reward_function.path="${SCRIPT_DIR}/reward.py" \
        trainer.n_gpus_per_node="$n_gpus" \
        trainer.logger="$loggers" \
        trainer.project_name="$(basename "$SCRIPT_DIR")" \
        trainer.experiment_name="${FUNCNAME[0]}-$(basename "${BASH_SOURCE[0]}" .sh)" \
        "$@"
    log "done after $(($(now) - START)) s"
}

main "${MODEL_PATH:-$HOME/models/Qwen3-4B}" "$@"
