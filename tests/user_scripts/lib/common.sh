# Shared settings of the experiments in this folder; sourced, not run.
COMMON_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PROJECT_ROOT=$(cd "${COMMON_DIR}/../.." && pwd)

export VLLM_ATTENTION_BACKEND=XFORMERS
export HYDRA_FULL_ERROR=1

DATA_DIR=${DATA_DIR:-$PROJECT_ROOT/data}
MODEL_DIR=${MODEL_DIR:-$HOME/models}

common_overrides() {
    COMMON_ARGS=(
        data.train_files="${DATA_DIR}/gsm8k/train.parquet"
        data.val_files="${DATA_DIR}/gsm8k/test.parquet"
        trainer.logger='["console"]'
        trainer.n_gpus_per_node="${GPUS_PER_NODE:-8}"
    )
}
