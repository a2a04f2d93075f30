#!/bin/bash
# Start a Ray head, wait until it answers, submit the job from the repository root.
set -euo pipefail

ROOT=$(dirname "$(dirname "$(readlink -f "$0")")")
HEAD_PORT=6379
DASHBOARD_PORT=8265

ray stop --force || true
ray start --head --port=$HEAD_PORT --dashboard-port=$DASHBOARD_PORT --num-gpus=8

for i in $(seq 1 30); do
    if ray status >/dev/null 2>&1; then
        break
    fi
    echo "waiting for ray ($i)"
    sleep 2
done

cd "$ROOT"
ray job submit --address="http://127.0.0.1:${DASHBOARD_PORT}" \
    --working-dir . \
    --entrypoint-num-cpus=1 \
    -- python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=data/gsm8k/train.parquet \
    data.val_files=data/gsm8k/test.parquet \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1
