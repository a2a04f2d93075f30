#!/bin/bash
# SPPO-style: the long override lists kept in here-documents.
set -x

gsm8k_train_path=$HOME/data/math/train.parquet
gsm8k_test_path=$HOME/data/math/test.parquet
train_files="['$gsm8k_train_path']"
test_files="['$gsm8k_test_path']"

read -r -d '' ROLLOUT_ARGS <<EOF
actor_rollout_ref.rollout.name=vllm
actor_rollout_ref.rollout.tensor_model_parallel_size=2
actor_rollout_ref.rollout.gpu_memory_utilization=0.5
actor_rollout_ref.rollout.n=1
EOF

read -r -d '' TRAINER_ARGS << 'EOF' || true
trainer.logger=['console','wandb']
trainer.project_name=sppo
trainer.experiment_name=qwen2.5-7b_sppo
trainer.n_gpus_per_node=8
EOF

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$train_files" \
    data.val_files="$test_files" \
    data.train_batch_size=1024 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct \
    $ROLLOUT_ARGS \
    $TRAINER_ARGS \
    trainer.total_epochs=20 "$@"
