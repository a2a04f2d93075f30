"""The trainer's own construction, run: ``get_trainer_cls``, ``PPOTrainer.__init__`` and ``_setup``.

``TaskRunnerV1.run`` (verl/trainer/main_ppo.py:130-156) picks the trainer class by
``trainer.v1.trainer_mode``, constructs it (the KL controller, the replay buffer) and calls
``init()``, whose ``_setup`` (verl/trainer/ppo/v1/trainer_base.py:229-369) builds the tokenizer, the
data loaders' batch arithmetic, the resource pools, the critic's ``TrainingWorker``, the actor's
``ActorRolloutRefWorker`` and its ``init_model`` (engines, reference, rollout and checkpoint engine
configs), the rollout replicas (their constructor), the reward manager and the checkpoint resume.
The probe runs those methods themselves; ``ray_free`` stands in for what needs a cluster (the
worker groups run their workers in this process, rank 0 of the configuration's world, under
``boundary.laptop``), for the rollout servers (``_replica_class``), for the data files
(datasets of a stand-in length), and for what would load the user's files or modules (custom
samplers, reward modules of ``source: importlib``, checkpoints: ``torch.load`` is refused).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from pytest_verl_compat.upstream.probes.boundary import StandIn, laptop
from pytest_verl_compat.upstream.probes.patching import all_patched
from pytest_verl_compat.upstream.probes.records import Collector

TRAINER_START = "trainer start: TaskRunnerV1.run"
TRAINER_INIT = "trainer init: PPOTrainer._setup"
# A stand-in data set's length: two steps' prompts, so that steps per epoch is positive.
_STAND_IN_STEPS = 2


class StandInDataset:
    """A data set of a known length with no rows read (the data files are the user's)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length


class LocalWorker:
    """One worker of a group, constructed here with its real ``__init__`` (rank 0)."""

    def __init__(self, spec: Any) -> None:
        self.instance = spec.cls(*spec.args, **spec.kwargs)
        self.world_size = int(getattr(self.instance, "world_size", 1) or 1)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.instance, name)


class LocalWorkerGroup:
    """``RayWorkerGroup`` without Ray: ``spawn`` gives one local worker per colocated role."""

    def __init__(
        self, resource_pool: Any = None, ray_cls_with_init: Any = None, *_: Any, **__: Any
    ) -> None:
        self.class_dict = ray_cls_with_init

    def spawn(self, prefix_set: Any) -> dict[str, LocalWorker]:
        return {prefix: LocalWorker(self.class_dict[prefix]) for prefix in prefix_set}


def reward_loop_manager(config: Any, rm_resource_pool: Any = None) -> StandIn:
    """The reward manager's class lookup (``RewardLoopManager.__init__``,
    verl/experimental/reward_loop/reward_loop.py:309) and the custom reward function's, as each
    reward loop worker makes it (``get_custom_reward_fn``, verl/trainer/ppo/reward.py:70-79), up to
    the import of the user's module, which is refused (``_refuse_user_module``)."""
    from verl.trainer.ppo.reward import get_custom_reward_fn, resolve_reward_manager_cls

    resolve_reward_manager_cls(config)
    get_custom_reward_fn(config)
    return StandIn()


def _refuse_user_module(*_: Any, **__: Any) -> Any:
    raise ImportError("not evaluated here: it would import a module of the user's")


def _own_classes_only(real: Any) -> Any:
    """``load_class_from_fqn`` for verl's own classes (the release's code, already trusted);
    any other name would import a module of the user's, refused as ``load_extern_type`` is
    (0.9.1's ``trainer.checkpoint_callback_class``, an agent loop manager, a router class)."""

    def load_class_from_fqn(fqn: Any, description: str = "class") -> Any:
        if isinstance(fqn, str) and fqn.startswith("verl."):
            return real(fqn, description)
        return _refuse_user_module()

    return load_class_from_fqn


def everywhere(function: Any, stand_in: Any) -> list[tuple[Any, str, Any]]:
    """Patches of ``function`` in every loaded verl module that holds it, under any name: a module
    that imported it by name (``from verl.utils.import_utils import load_class_from_fqn``) calls
    its own binding, so the stand-in must be there too. Found by identity, in whatever modules
    the release has (0.9.1's checkpoint_callback, which 0.9.0 lacks, among them)."""
    found = []
    for name, module in sorted(sys.modules.items()):
        if module is None or not (name == "verl" or name.startswith("verl.")):
            continue
        for attribute, value in sorted(vars(module).items()):
            if value is function:
                found.append((module, attribute, stand_in))
    return found


def _local_remote(*args: Any, **_: Any) -> Any:
    """``ray.remote`` for this process: ``@ray.remote`` gives the class itself, and
    ``@ray.remote(num_cpus=…)`` a decorator that does."""
    if len(args) == 1 and callable(args[0]):
        return args[0]
    return lambda cls: cls


def _local_get(object_refs: Any, *_: Any, **__: Any) -> Any:
    """``ray.get`` for this process: what the stand-in actors' calls returned, as is."""
    return object_refs


def _local_put(value: Any, *_: Any, **__: Any) -> Any:
    return value


def _local_wait(object_refs: Any, *_: Any, num_returns: int = 1, **__: Any) -> Any:
    refs = list(object_refs)
    return refs[:num_returns], refs[num_returns:]


def _no_cluster(*_: Any, **__: Any) -> Any:
    # ray.get on anything but an object reference of a started cluster starts one (Ray's
    # auto_init_hook): every Ray call the trainer makes is stood in, and a missed one fails here.
    raise ImportError("not evaluated here: it would start a Ray cluster")


def _create_resource_pool(self: Any) -> None:
    self.resource_pool_dict = {name: StandIn(name=name) for name in self.resource_pool_spec}


async def _no_servers(self: Any, *_: Any, **__: Any) -> None:
    """No global load balancer: it routes requests to servers that are not started. What the
    real method sets (``self.global_load_balancer``, verl/workers/rollout/llm_server.py:600-611)
    is set, to a stand-in: a trainer that hands it on (0.9.1's separate-async trainer adds its
    replicas to it) meets what it would meet, never a missing attribute of the sandbox's."""
    self.global_load_balancer = StandIn(name="global load balancer")


def _replica_class() -> type:
    """A rollout replica class with upstream's own constructor and no server, for
    ``LLMServerManager._initialize_llm_servers`` (verl/workers/rollout/llm_server.py:517-575) to
    build its replicas with: ``RolloutReplica.__init__`` runs its layout check
    (verl/workers/rollout/replica.py:107-116) on the rollout config; the ``init_*`` that would
    start the servers start none.

    The replicas differ only in their rank (llm_server.py:556-562), so the first one constructed
    runs upstream's constructor and the rest copy what it set, with their own rank (each
    conversion of the rollout config costs ~12 ms). The ``init_*`` set what upstream's set
    (replica.py:60-147: the mode, the workers, the resource pool) with no worker group built."""
    from verl.workers.rollout.replica import RolloutMode, RolloutReplica

    class StandInReplica(RolloutReplica):  # type: ignore[misc]  # verl is not followed (pyproject.toml)
        first: dict[str, Any] | None = None

        def __init__(self, replica_rank: int, *args: Any, **kwargs: Any) -> None:
            if StandInReplica.first is None:
                super().__init__(replica_rank, *args, **kwargs)
                StandInReplica.first = dict(self.__dict__)
            self.__dict__.update(StandInReplica.first)
            # What the manager reads back from each replica (llm_server.py:579-580, 597).
            self.__dict__.update(
                replica_rank=replica_rank, _server_handle=None, _server_address=None
            )

        async def launch_servers(self) -> None:
            return None

        workers: list[Any]
        bundle_indices: list[int]

        async def init_hybrid(self, worker_group: Any) -> None:
            self.rollout_mode, self.workers = RolloutMode.HYBRID, []

        async def init_hybrid_colocated(self, worker_group: Any, resource_pool: Any) -> None:
            self.rollout_mode, self.workers = RolloutMode.HYBRID, []
            self.resource_pool, self.bundle_indices = resource_pool, []

        async def init_colocated(self, resource_pool: Any) -> None:
            self.rollout_mode, self.workers = RolloutMode.COLOCATED, []
            self.resource_pool = resource_pool

        async def init_standalone(self) -> None:
            self.rollout_mode, self.workers = RolloutMode.STANDALONE, []
            self.resource_pool = StandIn(name="rollout resource pool")

    return StandInReplica


def _refuse_load(*_: Any, **__: Any) -> Any:
    raise ImportError("not evaluated here: it would unpickle a checkpoint file of the user's")


def _checkpoint_not_read(*_: Any, **__: Any) -> None:
    return None


# The modules `ray_free` imports and patches: with them, V1's trainer, the engines and Megatron's
# import chain (~1 900 modules, ~8 s). A process that forks answering children imports them first
# (`oracle_process.prepare_children`), or every child would import them for its first answer.
PATCHED_MODULES = (
    "ray",
    "torch",
    "verl.single_controller.ray.base",
    "verl.trainer.ppo.v1.trainer_base",
    "verl.utils.import_utils",
    "verl.workers.engine_workers",
    "verl.workers.rollout.llm_server",
    "verl.workers.rollout.replica",
)


@contextlib.contextmanager
def ray_free(mapping: Mapping[str, Any]) -> Iterator[None]:
    """``_setup`` runnable in this process: the cluster, the data and the user's files stood in."""
    import ray
    import torch
    from verl.single_controller.ray import base as ray_base
    from verl.trainer.ppo.v1 import trainer_base
    from verl.utils import import_utils
    from verl.workers import engine_workers
    from verl.workers.rollout import llm_server
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    length = int(mapping["data"]["train_batch_size"]) * _STAND_IN_STEPS
    replica = _replica_class()
    patches = [
        (ray, "remote", _local_remote),
        # The separate-async trainer hands its standalone replicas to the load balancer actor
        # (trainer_separate_async.py:199): a stand-in here, whose calls ray.get takes as they are.
        (ray, "get", _local_get),
        (ray, "put", _local_put),
        (ray, "wait", _local_wait),
        (ray, "kill", lambda *a, **k: None),
        (ray, "init", _no_cluster),
        (trainer_base, "create_rl_dataset", lambda *a, **k: StandInDataset(length)),
        (trainer_base, "create_rl_sampler", lambda *a, **k: None),
        (trainer_base, "StatefulDataLoader", StandIn),
        (trainer_base, "create_colocated_worker_cls", lambda class_dict: class_dict),
        (trainer_base, "RayWorkerGroup", LocalWorkerGroup),
        (trainer_base, "RewardLoopManager", reward_loop_manager),
        (trainer_base, "MultiTeacherModelManager", StandIn),
        # Every registered backend's replica is the stand-in (the real ones import vLLM, SGLang
        # or TensorRT-LLM); upstream's own lookup runs first (replica.py:312-317).
        (
            RolloutReplicaRegistry,
            "_registry",
            dict.fromkeys(RolloutReplicaRegistry._registry, lambda: replica),
        ),
        # It would write the Prometheus config file the configuration names and reload the
        # server (verl/workers/rollout/utils.py:141-175).
        (llm_server, "update_prometheus_config", lambda *a, **k: None),
        (llm_server.LLMServerManager, "_init_global_load_balancer", _no_servers),
        (llm_server.LLMServerManager, "get_replicas", lambda self: []),
        (trainer_base, "CheckpointEngineManager", StandIn),
        (trainer_base, "find_latest_ckpt_path", lambda *a, **k: None),
        (ray_base.ResourcePoolManager, "create_resource_pool", _create_resource_pool),
        (torch, "load", _refuse_load),
        # A resumed run's checkpoint files are the user's data, not configuration: the worker's
        # load (engine_workers.py:442, the engine's checkpoint manager) reads none of them.
        (engine_workers.TrainingWorker, "load_checkpoint", _checkpoint_not_read),
        (import_utils, "load_extern_object", _refuse_user_module),
        (import_utils, "load_extern_type", _refuse_user_module),
        (trainer_base, "load_extern_type", _refuse_user_module),
        (import_utils, "import_external_libs", _refuse_user_module),
        *everywhere(
            import_utils.load_class_from_fqn, _own_classes_only(import_utils.load_class_from_fqn)
        ),
    ]
    with laptop(mapping), all_patched(patches):
        yield


def _construct(cfg: Any) -> Any:
    from verl.trainer.ppo.v1 import get_trainer_cls

    trainer_cls = get_trainer_cls(cfg.trainer.v1.trainer_mode)
    return trainer_cls(config=cfg)


def trainer_probes(out: Collector, mapping: Mapping[str, Any]) -> Any:
    """``get_trainer_cls`` and ``PPOTrainer.__init__``, then ``_setup`` (workers and engines);
    the trainer as far as it was built (inside ``ray_free``), or None."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(dict(mapping))
    trainer = out.run(TRAINER_START, lambda: _construct(cfg), "PPOTrainer.__init__")
    if trainer is not None:
        out.run(TRAINER_INIT, trainer._setup, "PPOTrainer._setup")
    return trainer
