#!/usr/bin/env bash
# Long options parsed by hand; whatever is not an option is passed on to Hydra.
set -euo pipefail

model="Qwen/Qwen3-8B"
nnodes=1
algo=grpo
extra=()

while [[ $# -gt 0 ]]; do
    case "$1" in
        --model=*) model="${1#*=}"; shift ;;
        --model) model="$2"; shift 2 ;;
        --nnodes) nnodes="$2"; shift 2 ;;
        --algo|-a) algo="$2"; shift 2 ;;
        --dry-run) DRY_RUN=1; shift ;;
        --) shift; extra+=("$@"); break ;;
        *) extra+=("$1"); shift ;;
    esac
done

model_name=${model##*/}
exp_name="${algo}-${model_name,,}-n${nnodes}"

cmd=(
    python3 -m verl.trainer.main_ppo
    algorithm.adv_estimator="${algo}"
    data.train_files="$HOME/data/gsm8k/train.parquet"
    data.val_files="$HOME/data/gsm8k/test.parquet"
    actor_rollout_ref.model.path="${model}"
    trainer.nnodes="${nnodes}"
    trainer.experiment_name="${exp_name}"
    "${extra[@]}"
)

if [[ "${DRY_RUN:-0}" == 1 ]]; then
    printf '%q ' "${cmd[@]}"
    echo
    exit 0
fi

"${cmd[@]}"
