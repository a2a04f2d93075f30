"""Upstream's side of the VeOmni model-state test: what verl's own VeOmni engine holds on rank 0.

Run only as ``python -I -m pytest_verl_compat.upstream.probes.veomni_states_probe`` through
``release_runner(version)``, in the release's own environment, with a JSON request on stdin:
``veomni`` (a folder holding VeOmni's package, unpacked from a wheel the caller checked by hash:
verl pins no VeOmni, and its environment has none), ``config`` (a tiny model's config.json
numbers) and ``cases`` (each a world size and the engine's keys, as VeOmniEngineConfig fields).

For each case it joins a *fake* process group of that world size as rank 0
(``torch.testing._internal.distributed.fake_pg``: collectives return at once, shapes are real),
builds verl's ``VeOmniEngineWithLMHead`` from the tiny model saved with random weights (an
``HFModelConfig`` of its folder, the case's engine config, an optimizer config) and calls its
``initialize()``, as the worker does. It answers, per case: the bytes of rank 0's parameter
shards and their dtype; and, for a case without expert parallel (a forward's all-to-all of
routed tokens needs real peers), after one forward of the engine's module which FSDP units still
hold their gathered parameters, then, after its backward and the optimizer's step, the bytes of
the gradient shards and of the optimizer's states.

The CPU stand-ins are those of a run without a GPU: torch.cuda's memory queries (verl logs the
memory it sees) answer zero, and the kernels are VeOmni's eager ones with torch's SDPA attention
(the engine keys a user sets for a CPU run).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

ANSWER_MARK = "veomni-states: "


def join_fake_group(world: int) -> None:
    """Rank 0 of a fake group of ``world`` ranks, as a launcher would describe it."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(world))
    os.environ.update(LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)


def _no_gpu_memory_queries() -> None:
    import torch

    def zero(*_: Any, **__: Any) -> int:
        return 0

    torch.cuda.mem_get_info = lambda *_, **__: (0, 0)
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated"):
        setattr(torch.cuda, name, zero)


def _save_tiny_model(config: dict[str, Any], folder: str) -> None:
    import transformers

    built = transformers.AutoConfig.for_model(**config)
    transformers.AutoModelForCausalLM.from_config(built).save_pretrained(folder)


def _held(module: Any) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor

    local = [p.to_local() if isinstance(p, DTensor) else p for p in module.parameters()]
    return {
        "params": sum(t.numel() * t.element_size() for t in local),
        "dtypes": sorted({str(t.dtype).removeprefix("torch.") for t in local}),
    }


def _bytes(tensors: Any) -> int:
    from torch.distributed.tensor import DTensor

    local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in local)


def _step(engine: Any, vocab: int) -> dict[str, Any]:
    """One forward (which FSDP units then still hold their gathered parameters), its backward
    and the optimizer's step: the gradient shards it steps on and its states after it (the 0-dim
    ``step`` counters left out)."""
    import torch
    from torch.distributed.fsdp import FSDPModule

    module = engine.module
    logits = module(input_ids=torch.randint(0, vocab, (1, 16))).logits
    gathered = []
    for name, sub in module.named_modules():
        group = sub._get_fsdp_state()._fsdp_param_group if isinstance(sub, FSDPModule) else None
        if group is not None and group.is_unsharded:
            gathered.append(name or "<root>")
    logits.float().sum().backward()
    grads = _bytes(p.grad for p in module.parameters() if p.grad is not None)
    engine.optimizer.step()
    states = [
        value
        for state in engine.optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor) and value.dim() > 0
    ]
    return {"gathered_after_forward": gathered, "grads": grads, "optimizer": _bytes(states)}


def _case(case: dict[str, Any], model_dir: str, vocab: int) -> dict[str, Any]:
    import torch.distributed as dist
    from veomni.distributed.parallel_state import clear_parallel_state
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import HFModelConfig, VeOmniEngineConfig, VeOmniOptimizerConfig
    from verl.workers.engine.veomni.transformer_impl import VeOmniEngineWithLMHead

    join_fake_group(case["world"])
    try:
        engine = VeOmniEngineWithLMHead(
            model_config=HFModelConfig(path=model_dir),
            engine_config=VeOmniEngineConfig(**case["engine"]),
            optimizer_config=VeOmniOptimizerConfig(lr=1e-5, total_training_steps=10),
            checkpoint_config=CheckpointConfig(),
        )
        engine.initialize()
        answer = {"case": case, **_held(engine.module)}
        if int(case["engine"].get("expert_parallel_size", 1)) == 1:
            answer.update(_step(engine, vocab))
        return answer
    finally:
        dist.destroy_process_group()
        clear_parallel_state()


def main() -> int:
    request = json.loads(sys.stdin.read())
    sys.path.insert(0, request["veomni"])
    _no_gpu_memory_queries()
    with tempfile.TemporaryDirectory(prefix="veomni-tiny-") as model_dir:
        _save_tiny_model(request["config"], model_dir)
        vocab = int(request["config"]["vocab_size"])
        results = [_case(case, model_dir, vocab) for case in request["cases"]]
    # verl and VeOmni print as they build; the answer is the last line, marked.
    print(ANSWER_MARK + json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
