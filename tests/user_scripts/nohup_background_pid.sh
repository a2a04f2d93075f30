#!/bin/bash
# Detached run: log to a file, remember the pid, wait for it.
set -x

EXP=ppo-qwen2.5-0.5b
LOG_DIR=$HOME/logs
mkdir -p $LOG_DIR

nohup python3 -m verl.trainer.main_ppo \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    critic.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    trainer.experiment_name=$EXP \
    trainer.logger=console > $LOG_DIR/$EXP.log 2>&1 &

PID=$!
echo "started $EXP as pid $PID, logging to $LOG_DIR/$EXP.log"
echo $PID > $LOG_DIR/$EXP.pid
wait $PID
