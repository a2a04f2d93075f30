"""The asynchronous trainers' own construction, run: ``fully_async_main`` and ``one_step_off_policy``.

Their launches never meet main_ppo's trainer: each entry point's ``main`` copies the rollout's
world into ``actor_rollout_ref.rollout`` (and fully_async_main migrates the legacy reward keys,
verl/experimental/fully_async_policy/fully_async_main.py:222-240), then hands the config to a task
runner of its own through main_ppo's ``run_ppo``:

- ``FullyAsyncTaskRunner._initialize_components`` (fully_async_main.py:51-112) builds the
  ``FullyAsyncTrainer`` (fully_async_trainer.py:60-215: ``assert not hybrid_engine``) and its
  workers, the ``FullyAsyncRollouter`` (fully_async_rollouter.py:337-476: the train and generation
  batch sizes, the staleness and sync-step bounds, the reward model's pool, the rollout's log
  probabilities), its servers and agent loop, the message queue, and both sides' resume;
- ``OneStepTaskRunner.run`` (one_step_off_policy/main_ppo.py:35-106) runs ``validate_config``, the
  resource pools' asserts (separation/utils.py:22-59), the ``OneStepOffRayTrainer`` constructor
  (one_step_off_policy/ray_trainer.py:50-139, with the data loaders' batch arithmetic of
  ``RayPPOTrainer._create_dataloader``, verl/trainer/ppo/ray_trainer.py:374-451) and its workers.

The probe runs those functions themselves: ``main`` with ``run_ppo`` caught (no cluster is
started), then the runner's own method, in which every Ray actor the runner starts is its real
class constructed in this process (``LocalActorClass``) and every remote call a direct call. What
would move weights or generate (the weight sync and validation before ``fit``, and ``fit``) is
not run; the cluster, the data, the model's files and the user's modules are stood in as for
main_ppo (``trainer.ray_free``). Runs only inside ``oracle_process``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import io
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pytest_verl_compat.pipeline.entry_points import FULLY_ASYNC_MODULE, ONE_STEP_OFF_MODULE
from pytest_verl_compat.upstream.probes.boundary import StandIn
from pytest_verl_compat.upstream.probes.patching import all_patched
from pytest_verl_compat.upstream.probes.records import (
    KEY_ADMITTED,
    KEY_EFFECTS,
    KEY_MESSAGE,
    KEY_NOT_EVALUATED,
    KEY_NOTES,
    KEY_PATH,
    KEY_PHASE,
    KEY_REASON,
    KEY_STEP,
    KEY_TYPES,
    Collector,
    leaves_of,
    path_of_run,
)

# The runner's method the probe calls: fully_async's ``run`` is this, then the training loop
# (fully_async_main.py:46-49); one_step_off's ``run`` ends in ``fit`` (:106), which is stood in.
RUNNER_METHODS = {FULLY_ASYNC_MODULE: "_initialize_components", ONE_STEP_OFF_MODULE: "run"}
# The phases, as main_ppo's probes name them: ``main`` starts the trainer (main_ppo's calls
# validate_config there), the runner constructs it and its workers.
TRAINER_START = "trainer start"
TRAINER_INIT = "trainer init"
# The remote methods the probe does not run, with why: each moves weights, generates or trains.
NOT_RUN = {
    "_fit_update_weights": "the first weight sync moves the trainer's weights to the rollout "
    "servers (NCCL)",
    "_fit_validate": "validation before training generates on the rollout servers",
    "fit": "the training loop",
}
AGENT_LOOP = (
    "the agent loop workers (AgentLoopWorker, verl/experimental/agent_loop/agent_loop.py:507-570) "
    "start on the cluster's nodes and load the user's tool and agent loop files: not built here"
)


class _Done:
    """A remote call's result, already there: awaitable as Ray's ``ObjectRef`` is, and what the
    probe's ``ray.get`` gives back (a coroutine's result is awaited where it is asked for)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __await__(self) -> Any:
        if inspect.iscoroutine(self.value):
            return (yield from self.value.__await__())
        return self.value
        yield  # a generator, as ``__await__`` must be


def _resolved(value: Any) -> Any:
    if isinstance(value, _Done):
        if inspect.iscoroutine(value.value):
            value.value = asyncio.run(value.value)
        return value.value
    return value


def _local_get(object_refs: Any, *_: Any, **__: Any) -> Any:
    """``ray.get`` of the local actors' results."""
    if isinstance(object_refs, list):
        return [_resolved(ref) for ref in object_refs]
    return _resolved(object_refs)


class _LocalMethod:
    """A local actor's method: ``.remote(...)`` calls it (a method of ``NOT_RUN`` is noted)."""

    def __init__(self, function: Any, name: str, skipped: list[dict[str, str]]) -> None:
        self.function, self.name, self.skipped = function, name, skipped

    def remote(self, *args: Any, **kwargs: Any) -> _Done:
        if self.name in NOT_RUN:
            owner = type(self.function.__self__).__name__
            step = {KEY_STEP: f"{owner}.{self.name}", KEY_REASON: NOT_RUN[self.name]}
            if step not in self.skipped:
                self.skipped.append(step)
            return _Done(None)
        return _Done(self.function(*args, **kwargs))


class LocalActor:
    """A Ray actor's handle on an instance built here: ``handle.method.remote(...)`` calls it."""

    def __init__(self, instance: Any, skipped: list[dict[str, str]]) -> None:
        self._instance, self._skipped = instance, skipped

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._instance, name)
        if callable(attribute):
            return _LocalMethod(attribute, name, self._skipped)
        return attribute


class LocalActorClass:
    """A ``@ray.remote`` class whose ``.remote(...)`` constructs its real class in this process."""

    def __init__(self, actor_class: Any, skipped: list[dict[str, str]]) -> None:
        self.cls = getattr(actor_class, "__ray_actor_class__", actor_class)
        self.skipped = skipped

    def options(self, *_: Any, **__: Any) -> LocalActorClass:
        return self

    def remote(self, *args: Any, **kwargs: Any) -> LocalActor:
        return LocalActor(self.cls(*args, **kwargs), self.skipped)


def _tracking() -> type:
    """``Tracking`` with its own check of the logger names (verl/utils/tracking.py:63-70) and no
    backend started: each would reach a service of the user's (wandb, mlflow, …)."""
    from verl.utils.tracking import Tracking

    class StandInTracking(Tracking):  # type: ignore[misc]  # verl is not followed (pyproject.toml)
        def __init__(
            self,
            project_name: Any,
            experiment_name: Any,
            default_backend: Any = "console",
            config: Any = None,
        ) -> None:
            named = [default_backend] if isinstance(default_backend, str) else default_backend
            unknown = [b for b in named if b != "tracking" and b not in self.supported_backend]
            super().__init__(project_name, experiment_name, unknown, config)

    return StandInTracking


class _Launched:
    """What ``main`` handed to ``run_ppo``: the config as main left it, and the runner class."""

    config: Any = None
    runner: Any = None


def _entry_main(module: Any, cfg: Any, launched: _Launched) -> None:
    """The entry point's ``main`` body (under Hydra's decorator), with main_ppo's ``run_ppo``
    caught: it would start the cluster."""
    from verl.trainer import main_ppo

    def run_ppo(config: Any, task_runner_class: Any = None) -> None:
        launched.config, launched.runner = config, task_runner_class

    with all_patched([(main_ppo, "run_ppo", run_ppo)]):
        module.main.__wrapped__(cfg)


def _stand_in_data(mapping: Mapping[str, Any]) -> Any:
    """Data sets of a known length with no rows read: two batches of the loader's batch size."""
    from pytest_verl_compat.upstream.probes.trainer import StandInDataset

    data = mapping["data"]
    batch = max(int(data.get("gen_batch_size") or 0), int(data.get("train_batch_size") or 0), 1)
    return lambda *a, **k: StandInDataset(batch * 2)


@contextlib.contextmanager
def async_free(mapping: Mapping[str, Any], skipped: list[dict[str, str]]) -> Iterator[None]:
    """The asynchronous runners runnable here: main_ppo's stand-ins (``ray_free``), and each actor
    class the runners start built locally."""
    import ray
    import verl.utils as verl_utils
    from verl.experimental import reward_loop, teacher_loop
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager
    from verl.experimental.fully_async_policy import (
        fully_async_main,
        fully_async_rollouter,
        fully_async_trainer,
    )
    from verl.experimental.one_step_off_policy import main_ppo as one_step_off_main
    from verl.experimental.one_step_off_policy import ray_trainer as one_step_off_trainer
    from verl.experimental.separation import ray_trainer as separation
    from verl.single_controller import ray as single_controller
    from verl.trainer.ppo import ray_trainer
    from verl.utils import fs

    from pytest_verl_compat.upstream.probes.trainer import (
        LocalWorkerGroup,
        ray_free,
        reward_loop_manager,
    )

    data = _stand_in_data(mapping)

    async def fit(self: Any) -> None:
        # fit's first lines resume the run (separation/ray_trainer.py:293-295); the loop trains.
        self._load_checkpoint()
        step = {KEY_STEP: f"{type(self).__name__}.fit", KEY_REASON: NOT_RUN["fit"]}
        if step not in skipped:
            skipped.append(step)

    async def no_agent_loop_workers(self: Any) -> None:
        # What upstream's method sets (agent_loop.py:1201-1223), with no worker started.
        self.agent_loop_workers = []
        step = {KEY_STEP: "AgentLoopManager._init_agent_loop_workers", KEY_REASON: AGENT_LOOP}
        if step not in skipped:
            skipped.append(step)

    def local(actor_class: Any) -> LocalActorClass:
        return LocalActorClass(actor_class, skipped)

    patches = [
        # Every actor the runners start is its class built here, every remote call a call.
        (ray, "get", _local_get),
        (fully_async_main, "FullyAsyncTrainer", local(fully_async_main.FullyAsyncTrainer)),
        (fully_async_main, "FullyAsyncRollouter", local(fully_async_main.FullyAsyncRollouter)),
        (fully_async_main, "MessageQueue", local(fully_async_main.MessageQueue)),
        # The data sets, their samplers and the checkpoints, as for main_ppo's trainer: the
        # user's files (a resume path is taken as data: its name is checked, nothing is read).
        (fully_async_rollouter, "create_rl_dataset", data),
        (fully_async_rollouter, "create_rl_sampler", lambda *a, **k: None),
        (one_step_off_main, "create_rl_dataset", data),
        (one_step_off_main, "create_rl_sampler", lambda *a, **k: None),
        (fully_async_rollouter, "find_latest_ckpt_path", lambda *a, **k: None),
        (fully_async_trainer, "find_latest_ckpt_path", lambda *a, **k: None),
        (ray_trainer, "find_latest_ckpt_path", lambda *a, **k: None),
        (fully_async_trainer, "Tracking", _tracking()),
        # The worker groups, as main_ppo's trainer gets them (``trainer.ray_free``): the class
        # the runners import by name (separation/utils.py:74), and the colocation.
        (single_controller, "RayWorkerGroup", LocalWorkerGroup),
        (separation, "create_colocated_worker_cls", lambda class_dict: class_dict),
        # The reward and teacher managers the runners import by name (fully_async_rollouter.py:758,
        # :780, separation/ray_trainer.py:264), as main_ppo's trainer gets them.
        (reward_loop, "RewardLoopManager", reward_loop_manager),
        (teacher_loop, "MultiTeacherModelManager", StandIn),
        (AgentLoopManager, "_init_agent_loop_workers", no_agent_loop_workers),
        (one_step_off_trainer.OneStepOffRayTrainer, "fit", fit),
        # The runners load the tokenizer from the model's files themselves (fully_async_main.py:
        # 55-64, one_step_off_policy/main_ppo.py:58-69); the data sets that use it are stood in.
        (fs, "copy_to_local", lambda path, *a, **k: path),
        (verl_utils, "hf_tokenizer", lambda *a, **k: StandIn(chat_template=None)),
        (verl_utils, "hf_processor", lambda *a, **k: None),
    ]
    with ray_free(mapping), all_patched(patches):
        yield


def _runner_class(launched: _Launched) -> Any:
    """The task runner class ``main`` handed to ``run_ppo`` (a ``@ray.remote`` class's own)."""
    return getattr(launched.runner, "__ray_actor_class__", launched.runner)


def _run_runner(launched: _Launched, module: str) -> None:
    """The runner's own method on the config ``main`` left: fully_async's components (its
    ``run`` then starts the loop), one_step_off's ``run`` (its ``fit`` stood in)."""
    getattr(_runner_class(launched)(), RUNNER_METHODS[module])(launched.config)


def run_entry(
    mapping: Mapping[str, Any],
    world_size: int | None = None,
    explicit: Sequence[str] = (),
    timings: list[tuple[str, float]] | None = None,
    entry: str = FULLY_ASYNC_MODULE,
) -> dict[str, Any]:
    """An asynchronous entry point's probes on one resolved mapping: the answer
    ``phases.run_all`` gives for main_ppo (its verdict the entry's ``main``'s)."""
    import importlib

    from omegaconf import OmegaConf

    from pytest_verl_compat.upstream.probes.types import explicit_types, wrong_types

    plain = dict(mapping)
    leaves = leaves_of(plain)
    out = Collector(leaves)
    skipped: list[dict[str, str]] = []
    module = entry
    entry_module = importlib.import_module(module)
    launched = _Launched()
    cfg = OmegaConf.create(plain)
    start = time.perf_counter()
    # The trainers' progress bars write to stderr (tqdm), the oracle's channel for its errors.
    with async_free(plain, skipped), contextlib.redirect_stderr(io.StringIO()):
        main = f"{module.rpartition('.')[2]}.main"
        out.run(f"{TRAINER_START}: {main}", lambda: _entry_main(entry_module, cfg, launched), main)
        if launched.config is not None:
            runner = f"{_runner_class(launched).__name__}.{RUNNER_METHODS[module]}"
            out.run(f"{TRAINER_INIT}: {runner}", lambda: _run_runner(launched, module), runner)
    if timings is not None:
        timings.append(("asynchronous trainers", time.perf_counter() - start))
    out.not_run.extend(step for step in skipped if step not in out.not_run)
    refused, admitted = explicit_types(plain, leaves, explicit)
    types = wrong_types(out.reads.tagged(), leaves)
    types += [r for r in refused if all(t["key"] != r["key"] for t in types)]
    types.sort(key=lambda record: record["key"])
    starting = [f for f in out.records if str(f[KEY_PHASE]).startswith(TRAINER_START)]
    return {
        "verdict": "fails" if starting else "passes",
        "message": starting[0][KEY_MESSAGE] if starting else "",
        "failures": out.records,
        KEY_NOT_EVALUATED: out.not_run,
        KEY_TYPES: types,
        KEY_ADMITTED: admitted,
        KEY_EFFECTS: [],
        # What the sandbox decided rather than the configuration (a stand-in's limit): info notes.
        KEY_NOTES: [n for i, n in enumerate(out.reads.notes) if n not in out.reads.notes[:i]],
        KEY_PATH: path_of_run(out.reads, leaves, [str(key) for key in explicit]),
    }
