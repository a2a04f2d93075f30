"""Upstream's side of the model-state oracle: the bytes a release's FSDP engine holds per rank.

Run only as ``python -I -m pytest_verl_compat.conformance.step.memory_states`` through
`pytest_verl_compat.upstream.oracle.runner.release_runner(version)`, in the release's own
environment, with a JSON request on stdin (the tiny model's folder, the world size, the role, the
engine settings: any key of the release's FSDP engine section, set on the actor's and the
critic's as a Hydra override of the release's own tree). It joins a *fake* process group of that
world size as rank 0 (``torch.testing._internal.distributed.fake_pg``: collectives return at
once, shapes are real), builds the role's worker as verl's V1 trainer does
(`engine_workers.ActorRolloutRefWorker(role="actor"|"ref")`, or the critic's `TrainingWorker`),
runs one forward-only pass and one update of two micro-batches through the worker's own
``infer_batch`` and ``train_mini_batch``, and prints JSON: the bytes of unique storages of

- ``params``: the parameters as the engine holds them (DTensor shards for FSDP2, FlatParameter
  shards for FSDP1);
- ``grads``: the sharded gradients the optimizer steps on (measured as ``optimizer.step`` starts);
- ``optimizer``: the optimizer's state tensors after the step (the 0-dim ``step`` counters left
  out: torch keeps them on the host unless the optimizer is fused or capturable);
- ``accumulated``: the unsharded gradients FSDP holds after a micro-batch that is not the last:
  those of a micro-batch that skipped gradient synchronisation
  (`FSDPEngine._gradient_sync_context`), none when the engine synchronises every micro-batch
  (0.9.1's use_no_sync_for_gradient_accumulation=False; the shards it then holds are ``grads``);

``moves``: every ``engine.to(device, model, optimizer, grad)`` call with the phase it came from
(``init``, ``infer``, ``train``), which is what offloading does on this engine; and ``config``:
the actor's and the critic's sections as the release's tree composed them, resolved (what the
forecast reads, so that the test reads them as the forecast does).

The CPU workarounds are those of the step oracle (`conformance/step/upstream_patches.py`) plus
FSDP1's GPU-only module-state check, skipped as the step sketch skips it.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from typing import Any

ACTOR = "actor_rollout_ref.actor"
ANSWER_MARK = "memory-states: "


def _fake_group(world: int) -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    for key, value in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }.items():
        os.environ[key] = value
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)


def _skip_fsdp1_gpu_state_check() -> None:
    """FSDP1's ``sync_module_states=True`` (transformer_impl.py:404) checks that every module
    state is on a GPU; a CPU run has none. Nothing it would check changes the bytes held."""
    import torch.distributed.fsdp._init_utils as init_utils

    init_utils._check_module_states_for_sync_module_states = lambda module_states: None


def _unpinned_host_copies() -> None:
    """FSDP1's parameter offload (the reference policy's forced ``CPUOffload``,
    transformer_impl.py:391-394) pins its host shards (torch _flat_param.py, pin_memory), which
    needs an accelerator; an unpinned host tensor holds the same bytes."""
    import torch

    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self  # type: ignore[method-assign]


def _fsdp1_loads_to_cpu_zero() -> None:
    """FSDP1's load to the device names it ``f"{device}:{index}"`` (verl/utils/fsdp_utils.py:217),
    "cpu:cpu" on a CPU platform; index 0 ("cpu:0") is the same host memory."""
    import verl.utils.fsdp_utils as fsdp_utils
    from verl.workers.engine.fsdp import transformer_impl

    original = fsdp_utils.load_fsdp_model_to_gpu

    def load(model: Any) -> Any:
        if fsdp_utils.fsdp_version(model) != 1:
            return original(model)
        saved = fsdp_utils.get_device_id
        fsdp_utils.get_device_id = lambda: 0
        try:
            return original(model)
        finally:
            fsdp_utils.get_device_id = saved

    fsdp_utils.load_fsdp_model_to_gpu = load
    transformer_impl.load_fsdp_model_to_gpu = load


def _compose(request: dict[str, Any]) -> Any:
    import verl
    from hydra import compose, initialize_config_dir

    model = request["model_dir"]
    strategy = request["strategy"]
    overrides = [
        f"actor_rollout_ref.model.path={model}",
        f"critic.model.path={request.get('critic_dir', model)}",
        "actor_rollout_ref.model.use_remove_padding=True",
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",
        "+critic.model.override_config.attn_implementation=eager",
        f"actor_rollout_ref.model.lora_rank={request.get('lora_rank', 0)}",
        f"actor_rollout_ref.model.lora_alpha={request.get('lora_alpha', 16)}",
        f"critic.model.lora_rank={request.get('lora_rank', 0)}",
        f"critic.model.lora_alpha={request.get('lora_alpha', 16)}",
        f"{ACTOR}.strategy={strategy}",
        "actor_rollout_ref.ref.strategy=" + strategy,
        f"critic.strategy={strategy}",
        f"{ACTOR}.use_dynamic_bsz=False",
        f"{ACTOR}.ppo_micro_batch_size_per_gpu=1",
        f"{ACTOR}.ppo_mini_batch_size={request['world']}",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=False",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.n=1",
        f"{ACTOR}.use_kl_loss=True",
        "critic.use_dynamic_bsz=False",
        "critic.ppo_micro_batch_size_per_gpu=1",
        f"critic.ppo_mini_batch_size={request['world']}",
    ]
    for section in (f"{ACTOR}.fsdp_config", "actor_rollout_ref.ref.fsdp_config", "critic.fsdp"):
        overrides += [
            f"{section}.use_torch_compile=False",
            f"{section}.strategy={strategy}",
            f"{section}.fsdp_size={request.get('fsdp_size', -1)}",
        ]
    for section in (f"{ACTOR}.fsdp_config", "critic.fsdp"):
        overrides += [
            f"{section}.param_offload={request.get('param_offload', False)}",
            f"{section}.optimizer_offload={request.get('optimizer_offload', False)}",
            f"{section}.offload_policy={request.get('offload_policy', False)}",
        ]
        overrides += [f"{section}.{k}={v}" for k, v in sorted(request.get("engine", {}).items())]
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def _storages(tensors: Any) -> dict[int, int]:
    """Unique storages (by data pointer) of tensors, DTensors' local shards included."""
    found: dict[int, int] = {}
    for tensor in tensors:
        if tensor is None:
            continue
        local = getattr(tensor, "_local_tensor", tensor)
        storage = local.untyped_storage()
        if storage.nbytes():
            found[storage.data_ptr()] = storage.nbytes()
    return found


def _accumulated(module: Any) -> dict[int, int]:
    """The unsharded gradients FSDP holds between micro-batches: FSDP2's (accumulated) ones,
    FSDP1's flat gradient while it is unsharded (once a micro-batch synchronised, it is the
    shard the optimizer steps on, as large as the flat parameter's shard: not counted here)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    tensors = []
    for sub in module.modules():
        if isinstance(sub, FSDPModule):
            group = sub._get_fsdp_state()._fsdp_param_group
            for param in group.fsdp_params if group is not None else ():
                tensors.append(param.unsharded_accumulated_grad)
                tensors.append(
                    param._unsharded_param.grad if param._unsharded_param is not None else None
                )
        elif isinstance(sub, FSDP) and sub._handle is not None:
            flat = sub._handle.flat_param
            if flat.grad is not None and flat.grad.numel() != flat.numel():
                tensors.append(flat.grad)
    return _storages(tensors)


class _Recorder:
    """What the engine holds at the moments the oracle reports; installed on the engine class
    before any worker is built, so the moves of the engine's own initialisation are seen too."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.phase = "init"
        self.direction = "offload"
        self.moves: list[dict[str, Any]] = []
        self.grads: dict[int, int] = {}
        self.optimizer: dict[int, int] = {}
        self.accumulated: dict[int, int] = {}
        self.summoned = 0

    def install(self) -> None:
        import contextlib

        from torch.distributed.fsdp import FullyShardedDataParallel
        from verl.workers.engine.base import BaseEngineCtx
        from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

        recorder = self
        summon = FullyShardedDataParallel.summon_full_params

        @contextlib.contextmanager
        def summoning(module: Any, *args: Any, **kwargs: Any) -> Any:
            # what the model's parameters hold while every unit is unsharded (the largest call)
            with summon(module, *args, **kwargs):
                held = sum(_storages(module.parameters()).values())
                recorder.summoned = max(recorder.summoned, held)
                yield

        FullyShardedDataParallel.summon_full_params = staticmethod(summoning)  # type: ignore[method-assign]
        original_to = FSDPEngine.to
        context = FSDPEngine._gradient_sync_context

        def to(
            engine: Any, device: str, model: bool = True, optimizer: bool = True, grad: bool = True
        ) -> Any:
            recorder.moves.append(
                {
                    "phase": recorder.phase,
                    "direction": "load" if recorder.direction == "load" else "offload",
                    "model": model,
                    "optimizer": optimizer,
                    "grad": grad,
                }
            )
            return original_to(engine, device=device, model=model, optimizer=optimizer, grad=grad)

        @contextlib.contextmanager
        def sync_context(engine: Any, *, is_last_micro_batch: bool) -> Any:
            with context(engine, is_last_micro_batch=is_last_micro_batch):
                yield
            if not is_last_micro_batch:
                recorder.accumulated = _accumulated(engine.module)

        def entering(ctx: Any) -> None:
            recorder.direction = "load"
            try:
                enter(ctx)
            finally:
                recorder.direction = "offload"

        enter = BaseEngineCtx.__enter__
        FSDPEngine.to = to
        FSDPEngine._gradient_sync_context = sync_context
        BaseEngineCtx.__enter__ = entering

    def watch_optimizer(self, optimizer: Any) -> None:
        step = optimizer.step

        @functools.wraps(step)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            self.grads = _storages(p.grad for p in params)
            out = step(*args, **kwargs)
            states = [
                value
                for state in optimizer.state.values()
                for value in state.values()
                if hasattr(value, "untyped_storage") and value.dim() > 0
            ]
            self.optimizer = _storages(states)
            return out

        optimizer.step = wrapped


_RECORDER = _Recorder()
# One sequence per micro-batch, whatever the role's engine config defaults to (the critic's
# TrainingWorker config is built here, not by the trainer, and leaves the budgets unset).
_ONE_PER_MICRO_BATCH = {"use_dynamic_bsz": False, "micro_batch_size_per_gpu": 1}


def _batch(rows: int, vocab: int) -> Any:
    import torch
    from verl.utils import tensordict_utils as tu

    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, vocab, (3,), generator=generator) for _ in range(rows)]
    responses = [torch.randint(4, vocab, (4,), generator=generator) for _ in range(rows)]
    ids = [torch.cat([p, r]) for p, r in zip(prompts, responses, strict=True)]

    def nested(xs: Any) -> Any:
        return torch.nested.as_nested_tensor(list(xs), layout=torch.jagged)

    ones = [torch.ones(len(x), dtype=torch.int64) for x in ids]
    return tu.get_tensordict(
        {
            "prompts": nested(prompts),
            "responses": nested(responses),
            "input_ids": nested(ids),
            "position_ids": nested(torch.arange(len(x)) for x in ids),
            "response_mask": nested(torch.ones(len(r), dtype=torch.int64) for r in responses),
            "loss_mask": nested(ones),
        }
    )


def _value_loss(model_output: Any, data: Any, dp_group: Any = None) -> Any:
    return model_output["values"].values().sum(), {}


def _sections(config: Any) -> dict[str, Any]:
    """The actor's and the critic's sections as the tree composed them, resolved."""
    from omegaconf import OmegaConf

    return {
        key: OmegaConf.to_container(config[key], resolve=True)
        for key in ("actor_rollout_ref", "critic")
    }


def measure(request: dict[str, Any]) -> dict[str, Any]:
    import torch
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import CriticConfig, TrainingWorkerConfig
    from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker
    from verl.workers.utils.losses import sft_loss

    torch.manual_seed(0)
    config = _compose(request)
    role = request["role"]
    recorder = _RECORDER
    recorder.reset()  # a fresh record per case; the class hooks stay installed
    if role == "critic":
        critic_cfg = omega_conf_to_dataclass(config.critic)
        assert isinstance(critic_cfg, CriticConfig)
        trainer = TrainingWorker(
            config=TrainingWorkerConfig(
                model_type="value_model",
                model_config=critic_cfg.model,
                engine_config=critic_cfg.engine,
                optimizer_config=critic_cfg.optim,
                checkpoint_config=critic_cfg.checkpoint,
            )
        )
        trainer.reset()
        trainer.set_loss_fn(_value_loss)
    else:
        outer = ActorRolloutRefWorker(config=config.actor_rollout_ref, role=role)
        outer.init_model()
        trainer = outer.ref if role == "ref" else outer.actor
        if role == "actor":
            trainer.set_loss_fn(functools.partial(sft_loss, None))
    engine = trainer.engine
    params = _storages(engine.module.parameters())
    vocab = int(request["vocab"])
    world = int(request["world"])
    rows = 2  # per rank: two micro-batches of one sequence
    recorder.phase = "infer"
    query = _batch(rows, vocab)
    tu.assign_non_tensor(
        query, temperature=1.0, compute_loss=False, calculate_entropy=False, **_ONE_PER_MICRO_BATCH
    )
    trainer.infer_batch(query)
    if role != "ref":
        recorder.watch_optimizer(engine.optimizer)
        recorder.phase = "train"
        data = _batch(rows, vocab)
        tu.assign_non_tensor(
            data,
            temperature=1.0,
            calculate_entropy=False,
            global_batch_size=rows * world,
            mini_batch_size=rows * world,
            epochs=1,
            seed=0,
            dataloader_kwargs={"shuffle": False},
            **_ONE_PER_MICRO_BATCH,
        )
        trainer.train_mini_batch(data)
    moves = list(recorder.moves)
    if role == "actor" and request.get("lora_rank"):
        # the hybrid engine's weight sync of the adapters, as engine_workers.py:770-771 calls it
        # with rollout.layered_summon at its default (false)
        recorder.phase = "sync"
        engine.get_per_tensor_param(layered_summon=False, base_sync_done=True)
    return {
        "params": sum(params.values()),
        "grads": sum(recorder.grads.values()),
        "optimizer": sum(recorder.optimizer.values()),
        "accumulated": sum(recorder.accumulated.values()),
        "summoned": recorder.summoned,
        "moves": moves,
        "config": _sections(config),
    }


def main() -> int:
    import torch
    import torch.distributed as dist

    from pytest_verl_compat.conformance.step import upstream_patches

    request = json.loads(sys.stdin.read())
    torch.set_num_threads(1)
    upstream_patches.install_cpu_platform()
    upstream_patches.stub_server_modules()
    upstream_patches.eager_value_model()
    upstream_patches.unpinned_cpu_offload()
    upstream_patches.no_collection_on_device_moves()
    _skip_fsdp1_gpu_state_check()
    _unpinned_host_copies()
    _fsdp1_loads_to_cpu_zero()
    _RECORDER.install()
    results = []
    # one fake process group per world size, in the order the cases ask for them
    for world in dict.fromkeys(int(case["world"]) for case in request["cases"]):
        _fake_group(world)
        for case in request["cases"]:
            if int(case["world"]) == world:
                results.append(dict(measure({**request, **case}), case=case))
        dist.destroy_process_group()
    # verl prints to stdout as it builds; the answer is the last line, marked.
    print(ANSWER_MARK + json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
