"""Upstream's side of the SFT step oracle: verl 0.9.0's SFT steps on its FSDP engine, on a CPU.

Run only as ``python -I -m pytest_verl_compat.conformance.step.sft_upstream OUT_DIR`` through
`pytest_verl_compat.upstream.oracle.runner.run_module`, once for every SFT step case (verl is imported
once); the request arrives on stdin (`sft.request_json`). Each case is built and fed the way
`verl/trainer/sft_trainer.py` does it, minus its data set and loader:

- the config: verl's own `sft_trainer_engine` tree composed with the case's overrides, the
  optimizer variant's and the CPU's (`upstream_patches.cpu_overrides`, the same as the RL step's);
- the worker as `SFTTrainer._build_config`/`_build_engine`/`_init_engine` build it
  (:138-198): the model, engine, optimizer and checkpoint dataclasses from the config, a
  `TrainingWorker` of a language model with `sft_loss` (`config=None`), the optimizer's
  horizon set to the trainer's total steps, `reset()`;
- each step's batch as the no-padding collator makes it (jagged nested `input_ids`,
  `position_ids`, `loss_mask`: verl/utils/dataset/dataset_utils.py:59-80) with the trainer's
  `meta_info` (:343-352), `global_token_num` and `update_lr_scheduler=True` (:374-379), then
  `train_batch` (:385).

Rank 0 writes ``OUT_DIR/<key>.pt``: per step the worker's metrics and every trainable parameter.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from typing import Any

from pytest_verl_compat.conformance.step import upstream_patches


def _compose(model_dir: str, request: dict[str, Any]) -> Any:
    import verl
    from hydra import compose, initialize_config_dir

    # The case's own overrides first (a corpus case names its model and its engine group), then
    # the tiny local model and the CPU settings, which win.
    overrides = [
        *request["overrides"],
        f"model.path={os.path.join(model_dir, 'policy')}",
        "model.enable_gradient_checkpointing=False",
        "+model.override_config.attn_implementation=eager",
        *upstream_patches.cpu_overrides("engine"),
    ]
    if request["adapter"]:
        overrides.append(f"model.lora_adapter_path={os.path.join(model_dir, request['adapter'])}")
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="sft_trainer_engine", overrides=overrides)


def _worker(config: Any, total_steps: int) -> Any:
    """sft_trainer.SFTTrainer._build_config, _build_engine and _init_engine (:138-198)."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import TrainingWorkerConfig
    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils.losses import sft_loss

    optimizer_config = omega_conf_to_dataclass(config.optim)
    worker = TrainingWorker(
        config=TrainingWorkerConfig(
            model_type="language_model",
            model_config=omega_conf_to_dataclass(config.model),
            engine_config=omega_conf_to_dataclass(config.engine),
            optimizer_config=optimizer_config,
            checkpoint_config=omega_conf_to_dataclass(config.checkpoint),
        )
    )
    # verl's trainer passes no config (sft_trainer.py:163); sft_loss never reads it.
    worker.set_loss_fn(loss_fn=functools.partial(sft_loss, config=None))
    optimizer_config.total_training_steps = total_steps
    worker.reset()
    return worker


def _batch(config: Any, rows: list[dict[str, list[int]]], pad_token_id: int) -> Any:
    """The collated no-padding batch with the trainer's meta_info (sft_trainer.py:343-379)."""
    import torch
    from tensordict.tensorclass import NonTensorData
    from verl.utils import tensordict_utils as tu

    def nested(key: str) -> Any:
        return torch.nested.as_nested_tensor(
            [torch.tensor(row[key], dtype=torch.long) for row in rows], layout=torch.jagged
        )

    meta_info = {
        "use_remove_padding": config.model.use_remove_padding,
        "use_dynamic_bsz": config.data.use_dynamic_bsz,
        "max_token_len_per_gpu": config.data.max_token_len_per_gpu,
        "micro_batch_size_per_gpu": config.data.micro_batch_size_per_gpu,
        "temperature": 1.0,
        "global_batch_size": config.data.train_batch_size,
        "pad_mode": config.data.pad_mode,
        "pad_token_id": pad_token_id,
    }
    data = tu.get_tensordict(
        tensor_dict={
            "input_ids": nested("input_ids"),
            "position_ids": torch.nested.as_nested_tensor(
                [torch.arange(len(row["input_ids"])) for row in rows], layout=torch.jagged
            ),
            "loss_mask": nested("loss_mask"),
        },
        non_tensor_dict=meta_info,
    )
    seqlens = [len(row["input_ids"]) for row in rows]
    tu.assign_non_tensor(data, update_lr_scheduler=True, global_token_num=NonTensorData(seqlens))
    return data


def _trainable(engine: Any) -> dict[str, Any]:
    names = {n for n, p in engine.module.named_parameters() if p.requires_grad}
    out = {}
    for key, value in engine.module.state_dict().items():
        if key in names:
            full = value.full_tensor() if hasattr(value, "full_tensor") else value
            out[key] = full.detach().clone()
    return out


def run_case(model_dir: str, request: dict[str, Any]) -> dict[str, Any]:
    import torch
    from verl.utils import tensordict_utils as tu

    torch.manual_seed(0)
    config = _compose(model_dir, request)
    worker = _worker(config, request["total_steps"])
    pad = int(worker.model_config.tokenizer.pad_token_id)
    steps = []
    for rows in request["batches"]:
        started = time.perf_counter()
        output = worker.train_batch(_batch(config, rows, pad))
        metrics = tu.get(output, "metrics")
        steps.append(
            {
                "metrics": {
                    f"train/{key}": float(metrics[key]) for key in ("loss", "grad_norm", "lr")
                },
                "weights": _trainable(worker.engine),
                "seconds": time.perf_counter() - started,
            }
        )
    return {"steps": steps}


def main(argv: list[str]) -> int:
    import torch
    import torch.distributed as dist

    out_dir = argv[0]
    torch.set_num_threads(1)
    upstream_patches.install()
    request = json.loads(sys.stdin.read())
    for case in request["cases"]:
        started = time.perf_counter()
        result = run_case(request["model_dir"], case)
        result["seconds"] = time.perf_counter() - started
        if dist.get_rank() == 0:
            torch.save(result, os.path.join(out_dir, f"{case['key']}.pt"))
            print(json.dumps({"case": case["key"], "seconds": round(result["seconds"], 2)}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
