#!/usr/bin/env bash
# Resume from a given checkpoint step if asked to.
set -euo pipefail

RESUME_STEP=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --resume-step) RESUME_STEP=$2; shift 2 ;;
    *) break ;;
  esac
done

CKPT_ROOT=$HOME/ckpts/ppo_gsm8k
EXTRA=()
if [[ -n "$RESUME_STEP" ]]; then
  EXTRA+=(trainer.resume_mode=resume_path "trainer.resume_from_path=${CKPT_ROOT}/global_step_${RESUME_STEP}")
else
  EXTRA+=(trainer.resume_mode=disable)
fi

python3 -m verl.trainer.main_ppo \
  data.train_files=$HOME/data/gsm8k/train.parquet \
  data.val_files=$HOME/data/gsm8k/test.parquet \
  actor_rollout_ref.model.path=deepseek-ai/deepseek-llm-7b-chat \
  critic.model.path=deepseek-ai/deepseek-llm-7b-chat \
  trainer.default_local_dir=$CKPT_ROOT \
  "${EXTRA[@]}" "$@"
