"""``validate_config`` and every config dataclass the selected path converts, each on its own.

``main_ppo.main`` runs ``validate_config`` first (verl/trainer/main_ppo.py:176-180). The config
dataclasses' ``__post_init__`` checks run where 0.9.0 converts each section with
``omega_conf_to_dataclass``: actor and critic in ``validate_config`` and ``_setup``; the profiler,
reference (rewritten as ``init_model`` rewrites it, engine_workers.py:546-553), rollout and
checkpoint engine in ``init_model``; the reward model's rollout in each ``RolloutReplica``; the
distillation section in ``_setup``. The trainer probe meets them too, in order, and stops at the
first; converting each here on its own reports every section that fails, not only the first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pytest_verl_compat.checks.roles import need_critic, reference_worker
from pytest_verl_compat.upstream.probes.records import Collector

TRAINER_START = "trainer start: validate_config"
WORKER_START = "worker start: ActorRolloutRefWorker.init_model"
REWARD_MODEL_START = "worker start: RolloutReplica.__init__ (reward model)"
VALIDATE_CONFIG = "validate_config"
CONVERT = "omega_conf_to_dataclass"


def _ref_as_init_model_builds_it(out: Collector, arr: Any) -> Any:
    """``config.ref`` as ``init_model`` rewrites it before converting it (engine_workers.py)."""
    from omegaconf import open_dict

    ref = arr.ref.copy()
    out.reads.alias(ref, "actor_rollout_ref.ref")
    with open_dict(ref):
        ref.ppo_mini_batch_size = arr.actor.ppo_mini_batch_size
        ref.ppo_micro_batch_size = ref.pop("log_prob_micro_batch_size", None)
        ref.ppo_micro_batch_size_per_gpu = ref.pop("log_prob_micro_batch_size_per_gpu", None)
        ref.use_dynamic_bsz = ref.pop("log_prob_use_dynamic_bsz", False)
        ref.ppo_max_token_len_per_gpu = ref.pop("log_prob_max_token_len_per_gpu", None)
    return ref


def config_load(
    out: Collector, mapping: Mapping[str, Any], validate: Callable[[Any], None]
) -> None:
    """validate_config, then omega_conf_to_dataclass on each section the selected path converts."""
    from omegaconf import OmegaConf
    from verl.trainer.distillation.losses import is_distillation_enabled
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.profiler import ProfilerConfig

    plain = dict(mapping)
    out.run(TRAINER_START, lambda: validate(OmegaConf.create(plain)), VALIDATE_CONFIG)
    cfg = OmegaConf.create(plain)
    arr = cfg.actor_rollout_ref
    out.run(TRAINER_START, lambda: omega_conf_to_dataclass(arr.actor), CONVERT)
    if need_critic(plain):
        out.run(TRAINER_START, lambda: omega_conf_to_dataclass(cfg.critic), CONVERT)
    out.run(
        WORKER_START,
        lambda: omega_conf_to_dataclass(arr.actor.get("profiler", {}), ProfilerConfig),
        CONVERT,
    )
    if reference_worker(plain):
        ref = _ref_as_init_model_builds_it(out, arr)
        out.run(WORKER_START, lambda: omega_conf_to_dataclass(ref), CONVERT)
    out.run(WORKER_START, lambda: omega_conf_to_dataclass(arr.rollout), CONVERT)
    out.run(WORKER_START, lambda: omega_conf_to_dataclass(arr.rollout.checkpoint_engine), CONVERT)
    reward_model = cfg.get("reward", {}).get("reward_model", {})
    if reward_model.get("enable"):
        # RewardModelManager builds one RolloutReplica per server, each converting the reward
        # model's rollout section (workers/rollout/replica.py, RolloutReplica.__init__).
        out.run(REWARD_MODEL_START, lambda: omega_conf_to_dataclass(reward_model.rollout), CONVERT)
    distillation = cfg.get("distillation")
    if distillation is not None and distillation.get("enabled"):
        out.run(
            WORKER_START,
            lambda: is_distillation_enabled(omega_conf_to_dataclass(distillation)),
            CONVERT,
        )
