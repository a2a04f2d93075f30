#!/bin/bash
set -x
# builds the override list in a function that prints one override per line
overrides() {
  cat <<EOF
algorithm.adv_estimator=rloo
data.train_batch_size=${BSZ:-256}
actor_rollout_ref.rollout.n=${N:-4}
actor_rollout_ref.model.path=${MODEL:-Qwen/Qwen2.5-Math-1.5B}
trainer.project_name=prm
EOF
}

mapfile -t OVR < <(overrides)
python3 -m verl.trainer.main_ppo \
  data.train_files=$HOME/data/math/train.parquet \
  data.val_files=$HOME/data/math/test.parquet \
  "${OVR[@]}"
