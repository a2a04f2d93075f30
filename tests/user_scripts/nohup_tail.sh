#!/bin/sh
# plain sh style
LOG=train_$(date +%Y%m%d).log
nohup python3 -m verl.trainer.main_ppo \
  data.train_files=$HOME/data/gsm8k/train.parquet \
  data.val_files=$HOME/data/gsm8k/test.parquet \
  actor_rollout_ref.model.path=Qwen/Qwen2.5-1.5B-Instruct \
  critic.model.path=Qwen/Qwen2.5-1.5B-Instruct \
  trainer.logger=console > "$LOG" 2>&1 &
echo "pid $!; tail -f $LOG"
