#!/bin/sh
# POSIX sh habits: env -C to run from the repository, variables passed through env.
ROOT=`cd "\`dirname "$0"\`/.." && pwd`
exec_env="env -C $ROOT TOKENIZERS_PARALLELISM=false"
$exec_env python3 -m verl.trainer.main_ppo \
    data.train_files=data/train.parquet \
    data.val_files=data/test.parquet \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B \
    trainer.project_name=envc
