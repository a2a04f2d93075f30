# A small run; $1 is the number of GPUs.
PROFILE_GPUS=${1:-1}
PROFILE_ARGS=(
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct
    data.train_batch_size=64
    actor_rollout_ref.actor.ppo_mini_batch_size=16
)
if [ "$PROFILE_GPUS" -gt 4 ]; then
    PROFILE_ARGS+=(actor_rollout_ref.rollout.tensor_model_parallel_size=2)
    return 0
fi
PROFILE_ARGS+=(actor_rollout_ref.rollout.tensor_model_parallel_size=1)
