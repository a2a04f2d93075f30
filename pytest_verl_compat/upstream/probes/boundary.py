"""What a laptop lacks, stood in for, so that upstream's own constructors run on one configuration.

The probes run verl's real worker and engine construction (``ActorRolloutRefWorker.__init__`` and
``init_model``, ``TrainingWorker.__init__``, the engines' ``__init__``) with the configuration's
own world size. Everything below the line that needs a GPU, ``torch.distributed``, Ray, a model's
files, vLLM or the user's own modules is replaced, inside ``laptop()`` only, by a stand-in that
does no work and keeps upstream's contract:

- the process group: ``Worker.__init__`` reads ``WORLD_SIZE``/``RANK`` from the environment
  (verl/single_controller/base/worker.py:193-194); rank 0 of the configuration's world is set
  there, ``torch.distributed.get_rank``/``get_world_size`` answer the same, and
  ``initialize_global_process_group_ray``/``set_numa_affinity`` do nothing;
- device meshes: ``init_device_mesh`` returns a mesh object of the asked shape after torch's own
  rule (the shape's product is the world size, torch/distributed/device_mesh.py), raised as a
  ``LibraryCheck`` so that the verl line asking names the keys;
- the engine registry's device: ``VERL_ENGINE_DEVICE=cuda`` (verl/workers/engine/base.py:403), the
  key under which verl registers its GPU engines; no tensor is placed anywhere;
- the model: ``HFModelConfig.__post_init__`` runs, but its file reads (``copy_to_local``,
  ``hf_tokenizer``, ``hf_processor``, ``get_generation_config``, ``AutoConfig.from_pretrained``)
  answer with stand-ins (a one-architecture ``PretrainedConfig``), and ``import_external_libs``
  imports nothing: a configuration may name any module, and the oracle never imports the user's
  code;
- what builds weights or servers: ``TrainingWorker.reset`` (it builds the model and optimizer),
  the rollout, replica and checkpoint engine classes (their registries map every registered name
  to a stand-in class, so ``get_rollout_class``, ``RolloutReplicaRegistry.get`` and
  ``CheckpointEngineRegistry.new`` run their own "not found" checks and import no vLLM or
  SGLang), ``aggressive_empty_cache``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pytest_verl_compat.upstream.probes.patching import (
    all_patched,
    environment,
    library_state_cleared,
)
from pytest_verl_compat.upstream.probes.recorder import note_read

# The keys that make the world size a stand-in reports (Worker.world_size, a mesh's size).
WORLD_KEYS = ("trainer.n_gpus_per_node", "trainer.nnodes")
# The environment a worker process is started with, for rank 0 of the configuration's world.
_WORKER_ENV_KEYS = (
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


class LibraryCheck(Exception):
    """A rule of a library upstream calls (torch's device mesh), checked by its stand-in: a
    configuration failure at the verl line that called it, not a failure of the probe."""


class StandIn:
    """What upstream gets instead of a server, a data loader or a manager: any attribute or call
    answers another stand-in; it iterates as empty. A failure whose message names it is this
    probe's limit, never the configuration's (``records.Collector``)."""

    def __init__(self, *_: Any, **known: Any) -> None:
        self.__dict__.update(known)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return StandIn()

    def __call__(self, *args: Any, **kwargs: Any) -> StandIn:
        return StandIn()

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "StandIn()"


class FakeMesh:
    """A device mesh of the asked shape on rank 0: sizes, names and sub-meshes, no processes.

    ``keys``: the configuration keys that make the world size (none under torchrun, whose world
    is its command line's). ``grouped``: a dimension's group is rank 0's along it (a
    ``FakeGroup`` of its ranks, whose size collectives answer) rather than a stand-in."""

    def __init__(
        self,
        shape: tuple[int, ...],
        names: tuple[str, ...],
        keys: tuple[str, ...] = WORLD_KEYS,
        grouped: bool = False,
    ) -> None:
        self.mesh_shape, self.mesh_dim_names = shape, names
        self.keys, self.grouped = keys, grouped

    def size(self, dim: int | None = None) -> int:
        note_read(*self.keys)
        return math.prod(self.mesh_shape) if dim is None else self.mesh_shape[dim]

    def get_local_rank(self, mesh_dim: Any = None) -> int:
        return 0

    def get_rank(self) -> int:
        return 0

    def get_group(self, mesh_dim: Any = None) -> Any:
        if not self.grouped:
            return StandIn()
        dim = self.mesh_dim_names.index(mesh_dim) if isinstance(mesh_dim, str) else mesh_dim or 0
        # Row-major ranks: rank 0's neighbours along ``dim`` are multiples of its stride.
        stride = math.prod(self.mesh_shape[dim + 1 :])
        return FakeGroup(range(0, stride * self.mesh_shape[dim], stride))

    @property
    def ndim(self) -> int:
        return len(self.mesh_shape)

    def __getitem__(self, names: Any) -> FakeMesh:
        wanted = (names,) if isinstance(names, str) else tuple(names)
        index = [self.mesh_dim_names.index(name) for name in wanted]
        return FakeMesh(tuple(self.mesh_shape[i] for i in index), wanted, self.keys, self.grouped)


def world_size(mapping: Mapping[str, Any]) -> int:
    trainer = mapping["trainer"]
    return int(trainer["n_gpus_per_node"]) * int(trainer["nnodes"])


def _init_device_mesh(world: int, keys: tuple[str, ...] = WORLD_KEYS, grouped: bool = False) -> Any:
    def init_device_mesh(
        device_type: str, mesh_shape: Any, *, mesh_dim_names: Any = None, **_: Any
    ) -> FakeMesh:
        shape = tuple(int(size) for size in mesh_shape)
        note_read(*keys)
        if math.prod(shape) != world:
            raise LibraryCheck(
                f"torch init_device_mesh: mesh shape {shape} (product {math.prod(shape)}) must "
                f"multiply to the world size {world}"
            )
        names = tuple(mesh_dim_names or (f"dim{i}" for i in range(len(shape))))
        return FakeMesh(shape, names, keys, grouped)

    return init_device_mesh


class FakeGroup:
    """A process group of the configuration's world by its ranks (Megatron-Core's
    ``initialize_model_parallel`` makes dozens): sizes and rank 0's place are its ranks'."""

    def __init__(self, ranks: Any) -> None:
        self.ranks = [int(rank) for rank in ranks]

    def size(self) -> int:
        return len(self.ranks)

    def rank(self) -> int:
        return self.ranks.index(0) if 0 in self.ranks else -1

    def __repr__(self) -> str:
        return f"FakeGroup({self.ranks})"


def _gather_self(output: list[Any], obj: Any, *_: Any, **__: Any) -> None:
    output[:] = [obj] * len(output)


def _no_process_group(*_: Any, **__: Any) -> None:
    # A stand-in that was missed would wait here for peers that never come: fail instead.
    raise ImportError("not evaluated here: it would start a torch.distributed process group")


def _auto_config(*_: Any, **__: Any) -> Any:
    from transformers import PretrainedConfig

    config = PretrainedConfig()
    config.architectures = ["StandInForCausalLM"]
    return config


def _stand_in_class() -> type:
    return StandIn


# Where each registered rollout and checkpoint engine class is looked up, it is this stand-in:
# upstream's own lookup runs (its "not found" checks), the serving engine is never imported.
STAND_IN_CLASS = f"{__name__}.StandIn"


def _engine_cls(real: Any) -> Any:
    """``EngineRegistry.get_engine_cls``, except that a backend whose engine package verl ships
    but cannot import here (Megatron-Core, VeOmni, MindSpeed, … are not installed) is a step not
    evaluated rather than the "Unknown backend" a misspelt name gets."""

    def get_engine_cls(cls: Any, model_type: str, backend: str) -> Any:
        if backend not in cls._engines.get(model_type, {}):
            _require_engine_package(backend)
        return real.__func__(cls, model_type, backend)

    return classmethod(get_engine_cls)


def _require_engine_package(backend: str) -> None:
    import importlib
    import importlib.util

    package = f"verl.workers.engine.{backend.split('_')[0]}"
    if importlib.util.find_spec(package) is None:
        return  # not an engine verl ships: upstream's own assertion says so
    try:
        importlib.import_module(package)
    except ImportError as exc:
        raise ImportError(f"not evaluated here: the {backend} engine needs {exc.name}") from exc


def _checkpoint_engines(mapping: Mapping[str, Any]) -> dict[str, type]:
    """The checkpoint engine registry as a run on a GPU machine has it: every live name, and every
    name a module registers only where its optional package imports (``optional``), each a
    stand-in; with ``custom_backend_module`` set, the user's module (never imported) may register
    any name, so any is taken as registered and not evaluated."""
    import verl
    from verl.checkpoint_engine import CheckpointEngineRegistry

    from pytest_verl_compat.upstream.probes.optional import optional_names, stand_in_for

    registry: dict[str, type] = dict.fromkeys(CheckpointEngineRegistry._registry, StandIn)
    name = "CheckpointEngineRegistry"
    root = Path(verl.__file__).resolve().parent
    for backend, optional in optional_names(root, "checkpoint_engine", name).items():
        registry.setdefault(backend, stand_in_for(optional, name, StandIn))
    rollout = mapping.get("actor_rollout_ref", {}).get("rollout", {})
    custom = (rollout.get("checkpoint_engine") or {}).get("custom_backend_module")
    if custom:
        return _UserRegistry(registry, str(custom))
    return registry


class _UserRegistry(dict[str, type]):
    """A registry a module of the user's may extend: a name it lacks is not evaluated here."""

    def __init__(self, known: Mapping[str, type], module: str) -> None:
        super().__init__(known)
        self.module = module

    def __contains__(self, name: object) -> bool:
        if not super().__contains__(name):
            raise ImportError(
                f"not evaluated here: {name!r} may be registered by custom_backend_module "
                f"{self.module!r}, which is not imported"
            )
        return True


@contextlib.contextmanager
def laptop(
    mapping: Mapping[str, Any],
    world: int | None = None,
    world_keys: tuple[str, ...] = WORLD_KEYS,
    grouped: bool = False,
) -> Iterator[None]:
    """Upstream's worker and engine constructors runnable here, for rank 0 of the config's world.

    ``world``: the world size when the launcher, not the configuration, decides it (torchrun's
    ``--nnodes`` × ``--nproc_per_node``), with ``world_keys`` the keys to name for it (none);
    ``grouped``: meshes answer groups of ranks (``FakeMesh``)."""
    import torch.distributed
    import torch.distributed.device_mesh
    from verl.checkpoint_engine import CheckpointEngineRegistry
    from verl.single_controller.base import Worker
    from verl.workers import engine_workers
    from verl.workers.config import model as model_config
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp import utils as fsdp_utils
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    per_node = str(world) if world is not None else str(mapping["trainer"]["n_gpus_per_node"])
    world = world if world is not None else world_size(mapping)
    env = {
        "WORLD_SIZE": str(world),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": per_node,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "VERL_ENGINE_DEVICE": "cuda",
    }
    mesh = _init_device_mesh(world, world_keys, grouped)

    def get_world_size(group: Any = None, *_: Any, **__: Any) -> int:
        note_read(*world_keys)
        return group.size() if isinstance(group, FakeGroup) else world

    def get_rank(group: Any = None, *_: Any, **__: Any) -> int:
        return group.rank() if isinstance(group, FakeGroup) else 0

    def new_group(ranks: Any = None, *_: Any, **__: Any) -> FakeGroup:
        return FakeGroup(range(world) if ranks is None else ranks)

    def worker_world_size(self: Any) -> int:
        note_read(*world_keys)
        return int(self._world_size)

    patches = [
        (torch.distributed, "get_rank", get_rank),
        (torch.distributed, "new_group", new_group),
        (torch.distributed, "get_process_group_ranks", lambda group: list(group.ranks)),
        (torch.distributed, "get_world_size", get_world_size),
        (Worker, "world_size", property(worker_world_size)),
        (torch.distributed, "is_initialized", lambda: True),
        (torch.distributed, "init_process_group", _no_process_group),
        # Collectives over the data-parallel group: rank 0 keeps its own values (a value, never a
        # configuration check, depends on the other ranks').
        (torch.distributed, "all_reduce", lambda *a, **k: None),
        (torch.distributed, "all_gather_object", _gather_self),
        (torch.distributed, "broadcast", lambda *a, **k: None),
        (torch.distributed, "barrier", lambda *a, **k: None),
        (torch.distributed.device_mesh, "init_device_mesh", mesh),
        (engine_workers, "init_device_mesh", mesh),
        (fsdp_utils, "init_device_mesh", mesh),
        (engine_workers, "initialize_global_process_group_ray", lambda *a, **k: None),
        (engine_workers, "set_numa_affinity", lambda *a, **k: None),
        (engine_workers, "aggressive_empty_cache", lambda *a, **k: None),
        (engine_workers, "import_external_libs", lambda *a, **k: None),
        (engine_workers.TrainingWorker, "reset", lambda self: None),
        (
            rollout_base,
            "_ROLLOUT_REGISTRY",
            dict.fromkeys(rollout_base._ROLLOUT_REGISTRY, STAND_IN_CLASS),
        ),
        (CheckpointEngineRegistry, "_registry", _checkpoint_engines(mapping)),
        # The replica loaders import vLLM or SGLang (SGLang's also installs mock vllm modules in
        # sys.modules, verl/workers/rollout/replica.py:331-360): each answers a stand-in class.
        (
            RolloutReplicaRegistry,
            "_registry",
            dict.fromkeys(RolloutReplicaRegistry._registry, _stand_in_class),
        ),
        (EngineRegistry, "get_engine_cls", _engine_cls(EngineRegistry.get_engine_cls)),
        (model_config, "import_external_libs", lambda *a, **k: None),
        (model_config, "copy_to_local", lambda path, *a, **k: path),
        (model_config, "hf_tokenizer", lambda *a, **k: StandIn(chat_template=None)),
        (model_config, "hf_processor", lambda *a, **k: None),
        (model_config, "get_generation_config", lambda *a, **k: None),
        (model_config.AutoConfig, "from_pretrained", staticmethod(_auto_config)),
    ]
    with library_state_cleared(), environment(env), all_patched(patches):
        yield
