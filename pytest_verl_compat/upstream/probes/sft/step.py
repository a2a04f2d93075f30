"""The SFT trainer's first step on a tiny batch, through the engine the trainer probe built.

``SFTTrainer.fit`` (verl/trainer/sft_trainer.py:308-385) collates one rank's
``train_batch_size // dp_size`` rows with upstream's ``SFTTensorCollator``, adds the batch's meta
info (:343-352) and each row's token count (:374-379), and calls ``TrainingWorker.train_batch``
(verl/workers/engine_workers.py:337-389): the engine's ``train_batch`` zeroes the gradients,
splits the rows into micro-batches (``prepare_micro_batches``, verl/workers/engine/utils.py:92-130:
by count, or by the token budget), runs ``forward_step`` on each (the inputs as the pad mode and
sequence parallel lay them out, the stand-in model's logits, the log-probs, ``sft_loss``) and its
backward, then ``optimizer_step`` (the gradient clip) and the schedule's step.

The rows are what ``MultiTurnSFTDataset.__getitem__`` gives (multiturn_sft_dataset.py:367-423):
in the ``no_padding`` layout, or padded to ``data.max_length`` under ``right``/``left_right``;
the first row is ``data.max_length`` tokens long, the longest a row may be (longer ones are
truncated or refused there), so that a token budget that cannot hold it fails here as on the
cluster; the others are a few tokens. Everything runs on rank 0 of the launch's world (the
collectives over the data-parallel and sequence-parallel groups answer with rank 0's own values).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping
from typing import Any

from pytest_verl_compat.upstream.probes.patching import all_patched
from pytest_verl_compat.upstream.probes.records import KEY_REASON, KEY_STEP, Collector
from pytest_verl_compat.upstream.probes.sft import model as sft_model

FIRST_UPDATE = "first update: TrainingWorker.train_batch"
# The first row's length is capped: a budget check needs the row, not a model's worth of tokens.
MAX_ROW_TOKENS = 1 << 16
_SHORT_ROWS = (3, 4, 5)
# What fit hands the engine under another name, with the keys it comes from (sft_trainer.py:343-352,
# :240-241), so that a failure on the engine's side names them; and what decides a row's length.
KNOBS = {
    "micro_batch_size_per_gpu": ("data.micro_batch_size_per_gpu",),
    "use_dynamic_bsz": ("data.use_dynamic_bsz",),
    "total_data_size": ("data.train_batch_size",),
    "max_token_len": ("data.max_token_len_per_gpu", "engine.ulysses_sequence_parallel_size"),
    "max_token_len_per_gpu": ("data.max_token_len_per_gpu",),
    "max_seq_len": ("data.max_length",),
    "pad_mode": ("data.pad_mode",),
    "ulysses_sequence_parallel_size": ("engine.ulysses_sequence_parallel_size",),
}
_PADDED = ("right", "left_right")


def _no_rows(max_length: Any, rows: Any) -> str:
    """Why no tiny batch of ``rows`` rows up to ``max_length`` tokens is built, or ""."""
    if not (isinstance(max_length, int) and isinstance(rows, int)) or isinstance(max_length, bool):
        return f"data.max_length={max_length!r} and {rows!r} rows per rank make no batch here"
    if max_length < 2:
        # A row is a prompt token and a trained one; shorter rows are the data set's to refuse
        # (multiturn_sft_dataset.py:390-406), on the data the probe does not read.
        return f"a row of data.max_length={max_length} tokens holds no trained token"
    if max_length > MAX_ROW_TOKENS:
        return (
            f"a row of data.max_length={max_length} tokens is more than the probe builds "
            f"({MAX_ROW_TOKENS}): the first step was not run"
        )
    return ""


def _row_lengths(rows: int, max_length: int) -> list[int]:
    return [max_length, *(min(_SHORT_ROWS[i % 3], max_length) for i in range(rows - 1))]


def _rows(pad_mode: Any, lengths: list[int], max_length: int) -> list[dict[str, Any]]:
    """One rank's rows as the data set gives them (multiturn_sft_dataset.py:367-423)."""
    import torch

    out = []
    for length in lengths:
        input_ids = torch.arange(length) % (sft_model.VOCAB - 3) + 3
        loss_mask = torch.ones(length, dtype=torch.long)
        loss_mask[0] = 0  # the prompt's token
        row = {"input_ids": input_ids, "position_ids": torch.arange(length), "loss_mask": loss_mask}
        if pad_mode in _PADDED:
            pad = max_length - length
            row = {
                "input_ids": torch.nn.functional.pad(input_ids, (0, pad), value=sft_model.PAD),
                "attention_mask": torch.nn.functional.pad(
                    torch.ones(length, dtype=torch.long), (0, pad)
                ),
                "position_ids": torch.nn.functional.pad(row["position_ids"], (0, pad)),
                "loss_mask": torch.nn.functional.pad(loss_mask, (0, pad)),
            }
        out.append(row)
    return out


def _meta_info(trainer: Any, plain: Mapping[str, Any]) -> dict[str, Any]:
    """fit's meta info (sft_trainer.py:343-352), from the plain mapping: the engine's reads of it
    are the batch's, named through ``KNOBS``."""
    data = plain["data"]
    return {
        "use_remove_padding": plain["model"]["use_remove_padding"],
        "use_dynamic_bsz": data["use_dynamic_bsz"],
        "max_token_len_per_gpu": data["max_token_len_per_gpu"],
        "micro_batch_size_per_gpu": data["micro_batch_size_per_gpu"],
        "temperature": 1.0,
        "global_batch_size": trainer.global_batch_size,
        "pad_mode": data["pad_mode"],
        "pad_token_id": trainer.model_config.tokenizer.pad_token_id,
    }


def first_batch(trainer: Any, plain: Mapping[str, Any], lengths: list[int]) -> Any:
    """The first step's batch on one rank: collated by the trainer's own collator, with fit's
    meta info and token counts (sft_trainer.py:374-379)."""
    from tensordict.tensorclass import NonTensorData
    from verl.utils import tensordict_utils as tu

    max_length = max(lengths)
    rows = _rows(plain["data"]["pad_mode"], lengths, max_length)
    data = tu.get_tensordict(
        tensor_dict=trainer.collate_fn(rows), non_tensor_dict=_meta_info(trainer, plain)
    )
    tu.assign_non_tensor(
        data, update_lr_scheduler=True, global_token_num=NonTensorData(list(lengths))
    )
    return data


def _gather_into(output: Any, tensor: Any, *_: Any, **__: Any) -> None:
    """An all-gather over rank 0's group: every rank's part is rank 0's (the shapes upstream
    reassembles are the same; the values are not the configuration's concern)."""
    import torch

    output.copy_(torch.cat([tensor] * (output.shape[0] // max(tensor.shape[0], 1)), dim=0))


def _metrics_only(output: Any, **_: Any) -> Any:
    """``_postprocess_output`` (engine_workers.py:180-239) without the device's memory counters
    or a model's FLOPs: the step's loss and metrics."""
    from verl.utils import tensordict_utils as tu

    metrics = dict(output.pop("metrics"))
    metrics["loss"] = float(sum(output.pop("loss")))
    return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics})


@contextlib.contextmanager
def _one_process(worker: Any) -> Iterator[None]:
    import torch.distributed

    patches = [
        (torch.distributed, "all_gather_into_tensor", _gather_into),
        (worker, "_postprocess_output", _metrics_only),
    ]
    with all_patched(patches):
        yield


def _train_batch(trainer: Any, data: Any) -> Any:
    with _one_process(trainer.training_client):
        return trainer.training_client.train_batch(data=data)


def first_step(out: Collector, plain: Mapping[str, Any], trainer: Any) -> Any:
    """fit's first step on the trainer the probe built (inside ``torchrun_free``): its output
    (the loss, ``grad_norm`` and ``lr``), or None."""
    engine = getattr(trainer, "engine", None)
    if engine is None or getattr(engine, "module", None) is None:
        return None  # the trainer probe recorded why the engine was not built
    max_length = plain["data"]["max_length"]
    rows = trainer.train_batch_size_per_dp
    reason = _no_rows(max_length, rows)
    if reason:
        out.not_run.append({KEY_STEP: FIRST_UPDATE, KEY_REASON: reason})
        return None
    lengths = _row_lengths(rows, max_length)
    data = out.run(
        FIRST_UPDATE,
        functools.partial(first_batch, trainer, plain, lengths),
        "SFTTensorCollator",
        KNOBS,
    )
    if data is None:
        return None
    return out.run(
        FIRST_UPDATE,
        functools.partial(_train_batch, trainer, data),
        "TrainingWorker.train_batch",
        KNOBS,
    )
