#!/usr/bin/env bash
# PRIME-style recipe that shares its paths and exports with the other runs of the folder.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "${SCRIPT_DIR}/lib/common.sh"

common_overrides

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=rloo \
    "${COMMON_ARGS[@]}" \
    data.train_batch_size=256 \
    actor_rollout_ref.model.path="${MODEL_DIR}/Eurus-2-7B-SFT" \
    actor_rollout_ref.rollout.n=4 \
    trainer.project_name=prime \
    trainer.experiment_name="prime-$(basename "${SCRIPT_DIR}")" \
    trainer.total_epochs=15
