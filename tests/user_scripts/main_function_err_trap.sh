#!/usr/bin/env bash
# main() style with a cleanup trap that removes the scratch folder it made.
set -Eeuo pipefail

SCRATCH=$HOME/.scratch/verl-$$
mkdir -p "$SCRATCH"
trap 'rm -rf "$SCRATCH"' EXIT

function log {
    printf '[%s] %s\n' "run" "$*" >&2
}

function main() {
    local algo=${1:-gae}
    local epochs=${2:-15}
    log "algo=$algo epochs=$epochs"
    python3 -m verl.trainer.main_ppo \
        algorithm.adv_estimator="$algo" \
        data.train_files="$HOME/data/gsm8k/train.parquet" \
        data.val_files="$HOME/data/gsm8k/test.parquet" \
        actor_rollout_ref.model.path=deepseek-ai/deepseek-llm-7b-chat \
        critic.model.path=deepseek-ai/deepseek-llm-7b-chat \
        trainer.total_epochs="$epochs"
    log "done"
}

main "$@"
