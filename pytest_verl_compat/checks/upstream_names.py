"""Names upstream registers and keys it dropped, read from the pinned release's source.

Data, not logic: each entry cites the upstream file that defines it.
"""

from __future__ import annotations

FILTER_METRICS = ("acc", "score", "seq_reward", "seq_final_reward")

# The LoRA ranks vLLM serves (vllm/config/lora.py:24@vllm-0.18.0, :26@vllm-0.24.0, MaxLoRARanks;
# verl's own fallback list too, verl/workers/rollout/vllm_rollout/utils.py:92@0.9.0): verl asks
# vLLM for the smallest that holds the adapter's rank and refuses a rank above the largest
# (get_vllm_max_lora_rank, utils.py:81-100@0.9.0).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

# The asynchronous trainers' entry points: their own configs, their own task runners
# (verl/experimental/fully_async_policy/fully_async_main.py, one_step_off_policy/main_ppo.py).
FULLY_ASYNC_MODULE = "verl.experimental.fully_async_policy.fully_async_main"
ONE_STEP_OFF_MODULE = "verl.experimental.one_step_off_policy.main_ppo"

# The pinned release's registries, read from its source (file:line in each entry's evidence).
REGISTRIES: dict[str, tuple[tuple[str, ...], str]] = {
    "algorithm.adv_estimator": (
        (
            "gae",
            "grpo",
            "reinforce_plus_plus",
            "reinforce_plus_plus_baseline",
            "remax",
            "rloo",
            "opo",
            "grpo_passk",
            "gpg",
            "rloo_vectorized",
            "grpo_vectorized",
            "optimal_token_baseline",
            "tir_optimal_token_baseline",
            "gdpo",
        ),
        "verl/trainer/ppo/core_algos.py:88 (AdvantageEstimator)",
    ),
    "actor_rollout_ref.actor.policy_loss.loss_mode": (
        (
            "vanilla",
            "dppo_tv",
            "dppo_kl",
            "gspo",
            "sapo",
            "gpg",
            "clip_cov",
            "kl_cov",
            "geo_mean",
            "dro",
            "cispo",
            "bypass_mode",
        ),
        "verl/trainer/ppo/core_algos.py:1285-2412 (register_policy_loss)",
    ),
    "actor_rollout_ref.actor.kl_loss_type": (
        (
            "kl",
            "k1",
            "abs",
            "mse",
            "k2",
            "low_var_kl",
            "k3",
            "full",
            "kl+",
            "k1+",
            "abs+",
            "mse+",
            "k2+",
            "low_var_kl+",
            "k3+",
        ),
        "verl/trainer/ppo/core_algos.py:2227 (kl_penalty_forward; a trailing + selects straight-through)",
    ),
    "algorithm.kl_penalty": (
        ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full"),
        "verl/trainer/ppo/core_algos.py:2227 (kl_penalty_forward)",
    ),
    "reward.reward_manager.name": (
        ("naive", "batch", "dapo", "prime", "gdpo", "remote"),
        "verl/workers/reward_manager/*.py and verl/experimental/reward_loop/reward_manager/*.py (@register)",
    ),
    "actor_rollout_ref.rollout.name": (
        ("vllm", "sglang", "trtllm"),
        "verl/workers/rollout/base.py:88 (_ROLLOUT_REGISTRY)",
    ),
    "actor_rollout_ref.rollout.mode": (
        ("async",),
        "verl/workers/rollout/base.py:88 (_ROLLOUT_REGISTRY: async only)",
    ),
    # Looked up at the first generation for every row whose data names no agent loop of its own
    # (the row's agent_name): V1's AgentLoopWorkerTQ fills in the default
    # (verl/trainer/ppo/v1/agent_loop_tq.py:79-81), the worker asserts it is registered.
    "actor_rollout_ref.rollout.agent.default_agent_loop": (
        ("single_turn_agent", "tool_agent"),
        "verl/experimental/agent_loop/agent_loop.py:483-491 (_agent_loop_registry; @register in "
        "single_turn_agent_loop.py:28 and tool_agent_loop.py:99), asserted at the first "
        "generation for each row without an agent_name of its own (agent_loop.py:692; "
        "verl/trainer/ppo/v1/agent_loop_tq.py:79-81)",
    ),
    "actor_rollout_ref.actor.loss_agg_mode": (
        (
            "token-mean",
            "token-sum",
            "seq-mean-token-sum",
            "seq-mean-token-mean",
            "seq-mean-token-sum-norm",
        ),
        "verl/workers/config/actor.py:216 (valid_loss_agg_modes)",
    ),
}

# Registries that upstream looks a name up in only when another key selects them, by the
# registry's key: (the selecting key, the value that selects the registry, upstream's line). With
# any other value the name bypasses the registry (``source: importlib`` loads a class of the
# user's by that name instead) or the registry holds names of the user's too, so it is no
# registry name to check.
LOOKED_UP_WHEN: dict[str, tuple[str, str | None, str]] = {
    "reward.reward_manager.name": (
        "reward.reward_manager.source",
        "register",
        "verl/trainer/ppo/reward.py:92-96 (resolve_reward_manager_cls)",
    ),
    # A file of agent loop configs registers its names too (agent_loop.py:548-553): with one,
    # any name may be registered by the user's file, which is never read here.
    "actor_rollout_ref.rollout.agent.default_agent_loop": (
        "actor_rollout_ref.rollout.agent.agent_loop_config_path",
        None,
        "verl/experimental/agent_loop/agent_loop.py:548-553",
    ),
}

# Legacy top-level reward keys that the pinned release no longer reads, and the key that replaced
# each.
LEGACY_REWARD_KEYS: dict[str, str] = {
    "reward_model.reward_manager": "reward.reward_manager.name",
    "reward_model.reward_kwargs": "reward.reward_kwargs (via +reward.reward_kwargs.*)",
    "reward_model.enable": "reward.reward_model.enable",
    "reward_model.model.path": "reward.reward_model.model_path",
    "reward_model.enable_resource_pool": "reward.reward_model.enable_resource_pool",
    "custom_reward_function.path": "reward.custom_reward_function.path",
    "custom_reward_function.name": "reward.custom_reward_function.name",
}
