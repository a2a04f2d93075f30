"""Every workaround the step oracle needs to run verl 0.9.0's FSDP engine on one CPU, in one process.

None of them touches the training math: they choose a device, satisfy imports verl does not
declare, and pick an attention kernel that exists on a CPU. Each cites the verl 0.9.0 line it
works around. `install()` applies all of them; it is called only inside the sandboxed upstream
subprocess (`step_upstream`), never in the auditing process.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import types
from collections.abc import Iterator
from typing import Any


def _cpu_device_module() -> types.SimpleNamespace:
    import torch

    def zero(*_: Any, **__: Any) -> int:
        return 0

    def noop(*_: Any, **__: Any) -> None:
        return None

    return types.SimpleNamespace(
        is_available=lambda: True,
        current_device=lambda: "cpu",
        device_count=lambda: 1,
        synchronize=noop,
        empty_cache=noop,
        manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed,
        max_memory_allocated=zero,
        max_memory_reserved=zero,
        memory_allocated=zero,
        memory_reserved=zero,
        reset_peak_memory_stats=noop,
        set_device=noop,
        get_device_name=lambda *_, **__: "CPU",
        mem_get_info=lambda *_, **__: (0, 0),
        is_initialized=lambda: True,
        get_rng_state=torch.get_rng_state,
        set_rng_state=torch.set_rng_state,
    )


def install_cpu_platform() -> None:
    """A CPU platform through verl's own hook.

    verl/plugin/platform/platform_manager.py:117 falls back to "nvidia" when no accelerator is
    found; set_platform (platform_manager.py:150) is the documented way to register another one.
    The FSDP engine is registered for devices "cuda"/"npu" only
    (verl/workers/engine/fsdp/transformer_impl.py:1115 and :1562); the registry reads the device
    from VERL_ENGINE_DEVICE first (verl/workers/engine/base.py:403), so it is set to "cuda" as a
    registry key only — every tensor stays on the CPU platform chosen here.
    """
    import torch
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import set_platform

    cpu_module = _cpu_device_module()

    class PlatformCPU(PlatformBase):  # type: ignore[misc]  # verl is not followed (pyproject.toml)
        device_name = "cpu"
        vendor_name = "cpu"
        device_module = cpu_module  # a torch.cuda-like namespace

        def is_available(self) -> bool:
            return True

        def current_device(self) -> str:
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, index: Any) -> None:
            return None

        def synchronize(self, index: Any = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: Any) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, index: int = 0) -> tuple[None, None]:
            return (None, None)

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, message: str) -> Iterator[None]:
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> None:
            return None

    set_platform(PlatformCPU())
    os.environ["VERL_ENGINE_DEVICE"] = "cuda"


def stub_server_modules() -> None:
    """Empty `uvicorn`, `fastapi` and `cachetools` modules when they are not installed.

    verl/workers/rollout/utils.py:20 and :22 import them at module level; engine_workers reaches
    that module through the checkpoint engine, and verl 0.9.0 does not declare either package.
    verl/workers/rollout/llm_server.py:29 imports `cachetools.LRUCache`, reached through
    verl/trainer/ppo/ray_trainer.py:74 (where `apply_kl_penalty` lives). No server is started
    and no cache is used in a training step.
    """
    stubs: dict[str, dict[str, Any]] = {
        "uvicorn": {"Server": type("Server", (), {}), "Config": type("Config", (), {})},
        "fastapi": {"FastAPI": type("FastAPI", (), {})},
        "cachetools": {"LRUCache": type("LRUCache", (dict,), {})},
    }
    for name, attributes in stubs.items():
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            module = types.ModuleType(name)
            for key, value in attributes.items():
                setattr(module, key, value)
            sys.modules[name] = module


def eager_value_model() -> None:
    """The value model with eager attention.

    verl/utils/model.py:645 hard-codes attn_implementation="flash_attention_2" for the value head
    (loaded at verl/workers/engine/fsdp/transformer_impl.py:281), which needs a GPU. Same class,
    same weights, same dtype; only the attention kernel differs, and the policy already runs with
    `override_config.attn_implementation=eager`.
    """
    import verl.utils.model as model_utils
    from transformers import AutoModelForTokenClassification

    def load_valuehead_model(
        local_path: str, torch_dtype: Any, model_config: Any, trust_remote_code: bool
    ) -> Any:
        return AutoModelForTokenClassification.from_pretrained(
            local_path,
            torch_dtype=torch_dtype,
            config=model_config,
            attn_implementation="eager",
            trust_remote_code=trust_remote_code,
        )

    model_utils.load_valuehead_model = load_valuehead_model


def unpinned_cpu_offload() -> None:
    """The reference model's FSDP2 offload without pinned memory.

    A forward-only engine (the reference policy) offloads with `CPUOffloadPolicy(pin_memory=True)`
    (verl/workers/engine/fsdp/transformer_impl.py:440-443); pinning page-locks host memory for
    faster copies to a GPU and fails without an accelerator. The parameters stay on the CPU
    either way.
    """
    import verl.workers.engine.fsdp.transformer_impl as engine

    policy = getattr(engine, "CPUOffloadPolicy")  # noqa: B009  # imported, not exported, there

    def unpinned(*args: Any, **kwargs: Any) -> Any:
        return policy(*args, **{**kwargs, "pin_memory": False})

    setattr(engine, "CPUOffloadPolicy", unpinned)  # noqa: B010


def init_process_group() -> None:
    """A gloo process group, Ray not involved: one rank, or the rank the runner gave this process
    (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), so the FSDP engine meets its peers."""
    import socket

    import torch.distributed as dist

    if dist.is_initialized():
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(probe.getsockname()[1])
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", os.environ["RANK"])
    os.environ.setdefault("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])
    dist.init_process_group(
        "gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"])
    )


def freeze_heap() -> None:
    """Everything allocated so far out of the garbage collector's full collections.

    The FSDP engine runs a full `gc.collect()` each time it moves to the device
    (verl/workers/engine/fsdp/transformer_impl.py:834), twice per worker call through its
    train/eval mode switch on a CPU platform (verl/workers/engine/base.py:312-336); with verl,
    Megatron and transformers imported that is ~0.6 s over ~10^6 objects, which measured a
    third of the SFT step oracle's process. Frozen objects are only never collected (this
    process is short-lived); nothing a step computes changes.
    """
    import gc

    gc.freeze()


def no_collection_on_device_moves() -> None:
    """The FSDP engine's moves to the device without the full collection that follows each.

    `FSDPEngine.to` runs `gc.collect()` after loading the model and the optimizer to the device
    (verl/workers/engine/fsdp/transformer_impl.py:834), so that device memory the move left
    unreferenced is freed; on a CPU platform that is twice per worker call (`freeze_heap`). A CPU
    has no device memory to free, and a collection changes nothing a step computes: with it
    skipped, every tensor the one-rank run writes was equal and only its timings, MFU and memory
    metrics moved, while its CPU time went from 85-93 s to 74-80 s (benchmarks/README.md,
    "Stop 42"). The collector's own automatic collections still run.
    """
    from verl.workers.engine.fsdp import transformer_impl

    transformer_impl.gc = types.SimpleNamespace(collect=lambda generation=2: 0)


def install() -> None:
    init_process_group()
    install_cpu_platform()
    stub_server_modules()
    eager_value_model()
    unpinned_cpu_offload()
    freeze_heap()
    no_collection_on_device_moves()


def cpu_overrides(section: str) -> list[str]:
    """Engine settings a CPU needs, for an FSDP section (`actor_rollout_ref.actor.fsdp_config`,
    `actor_rollout_ref.ref.fsdp_config`, `critic.fsdp`); none of them changes the update's math.

    - fp32 mixed precision: the engine autocasts to bf16 unless told otherwise, even with an fp32
      model (verl/workers/engine/fsdp/transformer_impl.py:374 defaults param_dtype to bf16);
    - no torch.compile (no inductor toolchain is assumed);
    - fsdp2 (fsdp1 would need `sync_module_states` checks patched out);
    - no parameter offload (the reference's default; its parameters already live on the CPU).
    """
    return [
        f"+{section}.mixed_precision={{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}}",
        f"{section}.use_torch_compile=False",
        f"{section}.strategy=fsdp2",
        f"{section}.param_offload=False",
    ]
