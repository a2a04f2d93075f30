"""The first training step's batch arithmetic, run on the workers the trainer probe constructed.

V1's first step (verl/trainer/ppo/v1/trainer_base.py) pads the batch to the multiple
``_get_required_batch_multiple`` asks (called here, on the constructed trainer), then asks each
worker for the log-prob passes (``TrainingWorker.infer_batch``) and the updates
(``TrainingWorker.train_mini_batch``: its mini-batch assertion, upstream's ``make_iterator``, then
``train_batch`` per mini-batch). Each worker is the real one built by ``_setup``, with its real
engine and data-parallel mesh; it gets the rows one data-parallel rank holds and the knobs the
trainer sets (``_update_actor``/``_update_critic``/``_compute_old_log_prob``, repeated here from
the cited lines because the trainer hands them over through TransferQueue).

Below the engine's micro-batch split nothing runs: ``engine.train_batch``/``infer_batch`` call
upstream's own ``prepare_micro_batches`` on the mini-batch (what ``FSDPEngine.forward_backward_batch``
does first, verl/workers/engine/fsdp/transformer_impl.py:713) and stop where a model would compute;
the train and eval mode switches (they move weights), the scheduler step and the outputs'
post-processing (MFU from a model's FLOPs) are stood in. Rows are placeholders: only their count
matters to these checks.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping
from typing import Any

from pytest_verl_compat.upstream.probes import megatron_step, tiny_batch
from pytest_verl_compat.upstream.probes.patching import all_patched, patched
from pytest_verl_compat.upstream.probes.records import Collector

FIRST_UPDATE = "first update: TrainingWorker.train_mini_batch"
FIRST_LOG_PROB = "first step: TrainingWorker.infer_batch"
ADVANTAGE = "first step: PPOTrainer._compute_advantage"
LOSS = "first update: the loss"
LOGITS_PROCESSOR = "first update: the top-k distillation loss in the logits processor"
OPTIMIZER = "first update: the optimizer and its scheduler"
STEP = "first step: PPOTrainer.step"
# Optimizer modules the probe imports to build the optimizer a configuration names
# (``build_optimizer`` imports ``optim.optimizer_impl`` by name, verl/workers/config/optimizer.py:341);
# any other module name is not imported here, whatever package it would load.
SAFE_OPTIMIZER_MODULES = frozenset({"torch.optim"})


def _rows(count: int, **non_tensor: Any) -> Any:
    import torch
    from verl.utils import tensordict_utils as tu

    return tu.get_tensordict(
        tensor_dict={"rows": torch.zeros(count, 1)}, non_tensor_dict=dict(non_tensor)
    )


def _split(data: Any, loss_function: Any = None, **_: Any) -> dict[str, Any]:
    """The engine's step up to its micro-batch split (upstream's ``prepare_micro_batches``)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.utils import prepare_micro_batches

    # A dynamic split packs by token counts, which placeholder rows do not have.
    if not tu.get_non_tensor_data(data=data, key="use_dynamic_bsz", default=True):
        prepare_micro_batches(data=data, dp_group=None, same_micro_num_in_dp=True)
    return {"metrics": {}, "model_output": {}}


def _no_outputs(output: Any, **_: Any) -> Any:
    """``_postprocess_output`` without a model's outputs or FLOPs: empty metrics."""
    from verl.utils import tensordict_utils as tu

    return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": {}})


@contextlib.contextmanager
def _no_model(worker: Any) -> Iterator[dict[str, Any]]:
    """What needs the model's weights, stood in on one worker's engine; yields the first batch the
    worker handed each of the engine's steps (``infer_batch``, ``train_batch``), by the step's name
    (the later mini-batches carry the same knobs)."""
    engine = worker.engine
    handed: dict[str, Any] = {}

    def split(name: str) -> Any:
        def step(data: Any, loss_function: Any = None, **kwargs: Any) -> dict[str, Any]:
            handed.setdefault(name, data)
            return _split(data, loss_function, **kwargs)

        return step

    with contextlib.ExitStack() as stack:
        for name, value in (
            ("train_batch", split("train_batch")),
            ("infer_batch", split("infer_batch")),
            ("train_mode", lambda **_: contextlib.nullcontext()),
            ("eval_mode", lambda **_: contextlib.nullcontext()),
            ("lr_scheduler_step", lambda: 0.0),
        ):
            stack.enter_context(patched(engine, name, value))
        stack.enter_context(patched(worker, "_postprocess_output", _no_outputs))
        yield handed


def _padded_rows(trainer: Any, plain: Mapping[str, Any], dp: int) -> int:
    """train_batch_size × n padded to the trainer's own required multiple (V1's _balance_batch)."""
    trainer.global_steps = 1  # the first step (V1 counts from 1 once training starts)
    rows = int(plain["data"]["train_batch_size"]) * int(plain["actor_rollout_ref"]["rollout"]["n"])
    multiple = trainer._get_required_batch_multiple(dp)
    return -(-rows // multiple) * multiple if multiple > 0 else rows


def _distillation_use_topk(trainer: Any) -> bool:
    """What ``_update_actor`` hands the actor as ``distillation_use_topk`` (trainer_base.py:1679-1683):
    the distillation loss's ``use_topk`` when ``_setup`` built the distillation config (:339-348)."""
    config = getattr(trainer, "distillation_config", None)
    return bool(config.distillation_loss.loss_settings.use_topk) if config is not None else False


def _update_knobs(section: Mapping[str, Any], n: int, temperature: float) -> dict[str, Any]:
    """What ``_update_actor``/``_update_critic`` set (trainer_base.py:1651-1660 and 1674-1700)."""
    mini = int(section["ppo_mini_batch_size"]) * n
    return {
        "global_batch_size": mini,
        "mini_batch_size": mini,
        "epochs": section["ppo_epochs"],
        "seed": section["data_loader_seed"],
        "dataloader_kwargs": {"shuffle": section["shuffle"]},
        "temperature": temperature,
    }


ARR = "actor_rollout_ref"
# Where each role's sections live: (update section or None, its log-prob micro-batch keys).
_ROLES = {
    "actor": (
        f"{ARR}.actor",
        (
            f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu",
            f"{ARR}.rollout.log_prob_max_token_len_per_gpu",
        ),
    ),
    "reference": (
        None,
        (
            f"{ARR}.ref.log_prob_micro_batch_size_per_gpu",
            f"{ARR}.ref.log_prob_max_token_len_per_gpu",
        ),
    ),
    "critic": ("critic", ("critic.ppo_infer_max_token_len_per_gpu",)),
}


# Knobs the probe hands a worker beside the update's (``_distillation_use_topk``), with their keys.
_HANDED_KNOBS = {
    "distillation_use_topk": ("distillation.enabled", "distillation.distillation_loss.loss_mode"),
}
# Each role's engine section (the engine reads its attributes from it in ``__init__``).
_ENGINE_SECTIONS = {
    "actor": f"{ARR}.actor.megatron",
    "reference": f"{ARR}.ref.megatron",
    "critic": "critic.megatron",
}


def _workers(trainer: Any) -> Iterator[tuple[str, Any, Mapping[str, Any] | None]]:
    """(role, constructed TrainingWorker, its section for an update or None) of each role."""
    plain_config = trainer.config
    actor_group = getattr(trainer, "actor_rollout_wg", None)
    hybrid = getattr(actor_group, "instance", None)
    if hybrid is not None and getattr(hybrid, "actor", None) is not None:
        yield "actor", hybrid.actor, plain_config.actor_rollout_ref.actor
    if hybrid is not None and getattr(hybrid, "ref", None) is not None:
        yield "reference", hybrid.ref, None
    critic_group = getattr(trainer, "critic_wg", None)
    if critic_group is not None:
        yield "critic", critic_group.instance, plain_config.critic


def _knobs(role: str) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    """The batch knobs of a role's log-prob pass and update, with the keys they come from."""
    section, infer = _ROLES[role]
    rows = ("data.train_batch_size", f"{ARR}.rollout.n")
    infer_knobs = {
        "total_data_size": rows,
        "micro_batch_size_per_gpu": infer[:1],
        "max_token_len_per_gpu": infer[-1:],
    }
    if section is None:
        return infer_knobs, {}
    update = {
        "mini_batch_size": (f"{section}.ppo_mini_batch_size", f"{ARR}.rollout.n"),
        "batch_size_per_dp": rows,
        "total_data_size": (f"{section}.ppo_mini_batch_size", f"{ARR}.rollout.n"),
        "micro_batch_size_per_gpu": (f"{section}.ppo_micro_batch_size_per_gpu",),
        "max_token_len_per_gpu": (f"{section}.ppo_max_token_len_per_gpu",),
        "epochs": (f"{section}.ppo_epochs",),
    }
    return infer_knobs, update


def _advantage(trainer: Any, plain: Mapping[str, Any]) -> None:
    """The trainer's own ``_compute_advantage`` (KL in reward, rollout correction, the advantage
    estimator) on a tiny batch; TransferQueue's get and put hand it over and take it back."""
    rollout = plain["actor_rollout_ref"]["rollout"]
    tiny_batch.through_transfer_queue(
        lambda meta: trainer._compute_advantage(meta, {}),
        rollout["n"],
        bool(rollout.get("calculate_log_probs")),
    )


def _actor_loss_inputs(plain: Mapping[str, Any], dp: int) -> tuple[Any, Any]:
    """(model output, micro-batch) of the actor's loss on the first step's tiny batch."""
    batch = tiny_batch.shape(plain["actor_rollout_ref"]["rollout"]["n"])
    fields = {"old_log_probs": (-1.0, 1.6), "advantages": (0.0, 1.0), "ref_log_prob": (-1.1, 0.9)}
    output = tiny_batch.StandInOutput(
        log_probs=tiny_batch.model_output(batch, -1.0)[1],
        entropy=tiny_batch.model_output(batch, 0.7)[1],
    )
    return output, tiny_batch.micro_batch(batch, dp, fields)


def _actor_loss(hybrid: Any, plain: Mapping[str, Any], dp: int) -> None:
    """The actor's loss as the engine calls it on a micro-batch (``loss_function(model_output,
    data)``, fsdp/transformer_impl.py:1534): ``ppo_loss`` with the actor's own config."""
    output, data = _actor_loss_inputs(plain, dp)
    hybrid.loss_fn(model_output=output, data=data)


# The student's vocabulary in the top-k logits processor's stand-in logits (any size: the
# processor's checks read the configuration, not the logits).
_STUDENT_VOCABULARY = 8


def _topk_logits_processor(hybrid: Any, plain: Mapping[str, Any], dp: int) -> None:
    """The actor's loss as the engine's logits processor under top-k distillation: the engine
    calls it with the student's logits of the micro-batch's tokens when the update's
    ``distillation_use_topk`` is set (fsdp/transformer_impl.py:1374-1375,
    megatron/transformer_impl.py:1218-1219), and ``distillation_ppo_loss`` hands them to
    ``compute_topk_loss`` (trainer/distillation/losses.py:204-205)."""
    import torch

    _, data = _actor_loss_inputs(plain, dp)
    tokens = int(data["prompts"].offsets()[-1] + data["responses"].offsets()[-1])
    hybrid.loss_fn(student_logits=torch.zeros(1, tokens, _STUDENT_VOCABULARY), data=data)


def _critic_loss(worker: Any, plain: Mapping[str, Any], dp: int) -> None:
    """The critic's ``value_loss`` with the critic's config (``_setup`` sets it, trainer_base.py:300)."""
    batch = tiny_batch.shape(plain["actor_rollout_ref"]["rollout"]["n"])
    data = tiny_batch.micro_batch(batch, dp, {"values": (0.2, 0.3), "returns": (0.4, 0.8)})
    output = tiny_batch.StandInOutput(values=tiny_batch.model_output(batch, 0.25)[1])
    worker.loss_fn(model_output=output, data=data)


def _optimizer(worker: Any) -> None:
    """The engine's own optimizer and scheduler builders on a two-parameter module, then one
    ``optimizer_step`` (the gradient clip) and one ``lr_scheduler_step`` as ``train_batch`` makes
    them, the engine holding the module, optimizer and scheduler as ``_build_model_optimizer``
    sets them (fsdp/transformer_impl.py:599-606)."""
    import torch
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    if not isinstance(worker.engine, FSDPEngine):
        # Megatron's optimizer (get_megatron_optimizer) is built over a built Megatron model.
        raise ImportError(
            f"not evaluated here: {type(worker.engine).__name__} builds its optimizer over its model"
        )
    engine: Any = worker.engine
    module_name = str(engine.optimizer_config.optimizer_impl)
    if module_name not in SAFE_OPTIMIZER_MODULES:
        raise ImportError(
            f"not evaluated here: optim.optimizer_impl={module_name!r} is not imported"
        )
    module = torch.nn.Linear(2, 1)
    optimizer = engine._build_optimizer(module)
    scheduler = engine._build_lr_scheduler(optimizer)
    module(torch.ones(1, 2)).sum().backward()
    held = [
        (engine, "module", module),
        (engine, "optimizer", optimizer),
        (engine, "lr_scheduler", scheduler),
    ]
    with all_patched(held, provided=True):
        engine.optimizer_step()
        engine.lr_scheduler_step()


def _no_prompts(self: Any) -> Any:
    raise ImportError("not evaluated here: the step's prompts come from the data set's loader")


def _step(trainer: Any) -> None:
    """``PPOTrainer.step`` as ``fit`` calls it (trainer_base.py:453): its batch split over
    ``parameter_sync_step`` (:509-515), then ``_add_batch_to_generate``'s ``_next_train_batch``
    (:1328-1340), up to the data set's loader, which is not read (``_fetch_one_gen_batch``)."""
    with patched(type(trainer), "_fetch_one_gen_batch", _no_prompts):
        trainer.step({}, {})


def first_step(out: Collector, plain: Mapping[str, Any], trainer: Any) -> None:
    """Each constructed worker's log-prob pass and update on the first step's rows."""
    if trainer is None:
        return
    out.run(
        ADVANTAGE, functools.partial(_advantage, trainer, plain), "PPOTrainer._compute_advantage"
    )
    n = int(plain["actor_rollout_ref"]["rollout"]["n"])
    temperature = plain["actor_rollout_ref"]["rollout"]["temperature"]
    for role, worker, section in _workers(trainer):
        engine = getattr(worker, "engine", None)
        if engine is None:
            continue
        dp = int(engine.get_data_parallel_size())
        rows = out.run(
            "first step: PPOTrainer._get_required_batch_multiple",
            functools.partial(_padded_rows, trainer, plain, dp),
            role,
        )
        if rows is None or rows % dp:
            continue  # the dispatch splits the batch evenly; validate_config reports this
        per_rank = rows // dp
        infer_knobs, update_knobs = _knobs(role)
        with _no_model(worker) as handed:
            knobs = {"calculate_entropy": True, "compute_loss": False, "temperature": temperature}
            out.run(
                f"{FIRST_LOG_PROB} ({role})",
                functools.partial(worker.infer_batch, _rows(per_rank, **knobs)),
                "TrainingWorker.infer_batch",
                infer_knobs,
            )
            if section is not None:
                extra = {"distillation_use_topk": _distillation_use_topk(trainer)}
                data = _rows(per_rank, **_update_knobs(section, n, temperature), **extra)
                out.run(
                    f"{FIRST_UPDATE} ({role})",
                    functools.partial(worker.train_mini_batch, data),
                    "TrainingWorker.train_mini_batch",
                    update_knobs,
                )
        if megatron_step.is_megatron(engine):
            for step_name, batch in handed.items():
                out.run(
                    f"{megatron_step.FORWARD_STEP} ({role}, {step_name})",
                    functools.partial(megatron_step.forward_step, engine, batch),
                    f"{type(engine).__name__}.forward_step",
                    {**megatron_step.engine_knobs(_ENGINE_SECTIONS[role]), **_HANDED_KNOBS},
                    partial_batch=True,
                )
        if section is None:
            continue
        out.run(f"{OPTIMIZER} ({role})", functools.partial(_optimizer, worker), "build_optimizer")
        if role == "actor":
            hybrid = trainer.actor_rollout_wg.instance
            loss = functools.partial(_actor_loss, hybrid, plain, dp)
        else:
            loss = functools.partial(_critic_loss, worker, plain, dp)
        out.run(f"{LOSS} ({role})", loss, "the worker's loss_fn", partial_batch=True)
        if role == "actor" and _distillation_use_topk(trainer):
            out.run(
                f"{LOGITS_PROCESSOR} ({role})",
                functools.partial(
                    _topk_logits_processor, trainer.actor_rollout_wg.instance, plain, dp
                ),
                "the worker's loss_fn as the logits processor",
                partial_batch=True,
            )
        if role == "actor" and megatron_step.is_megatron(engine):
            output, data = _actor_loss_inputs(plain, dp)
            out.run(
                f"{megatron_step.POSTPROCESS} ({role})",
                functools.partial(
                    megatron_step.postprocess,
                    engine,
                    trainer.actor_rollout_wg.instance.loss_fn,
                    output,
                    data,
                ),
                f"{type(engine).__name__}.postprocess_micro_batch_func",
                megatron_step.tf_config_knobs(_ENGINE_SECTIONS[role]),
                partial_batch=True,
            )
    # The trainer reads parameter_sync_step from its mode's section in __init__
    # (trainer_base.py:133-134), a method before the one that checks it.
    mode = plain["trainer"]["v1"]["trainer_mode"]
    sync_step = {"parameter_sync_step": (f"trainer.v1.{mode}.parameter_sync_step",)}
    out.run(STEP, functools.partial(_step, trainer), "PPOTrainer.step", sync_step)
