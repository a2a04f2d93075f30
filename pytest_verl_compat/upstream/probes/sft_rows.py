"""The rows an SFT run trains on, computed by upstream's own data set: answered in the oracle
process (``--serve``) for the run conformance of the SFT tree's data leaves
(tests/test_run_conformance_sft_data.py).

An ``sft_rows`` question holds conversations (``{"messages": [...]}`` rows), a tokenizer's files
and a list of ``data`` nodes of the SFT tree. The probe writes the conversations as a parquet
file and the tokenizer to a folder of its own, loads the tokenizer as the trainer's model config
does (``hf_tokenizer``, verl/workers/config/model.py:161), and for each ``data`` node builds the
trainer's data set (``create_sft_dataset``, verl/trainer/sft_trainer.py:467-484, as
``_build_dataset`` does at :200-210: ``MultiTurnSFTDataset``) and reads every row with its
``__getitem__`` (verl/utils/dataset/multiturn_sft_dataset.py:291-423): per conversation its token
ids, loss mask and position ids, or the error the row raises.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pytest_verl_compat.upstream.probes.prompt_stream import (
    answer_in_own_folder,
    request_tokenizer,
)

KIND = "sft_rows"
KEY_CONVERSATIONS = "conversations"
KEY_DATA = "data"
KEY_RESULTS = "results"
KEY_ERROR = "error"
# What one row records.
INPUT_IDS = "input_ids"
LOSS_MASK = "loss_mask"
POSITION_IDS = "position_ids"
ATTENTION_MASK = "attention_mask"
# The tensors a row may hold (no_padding rows have no attention mask, :413-418).
ROW_KEYS = (INPUT_IDS, LOSS_MASK, POSITION_IDS, ATTENTION_MASK)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _rows(data: Mapping[str, Any], parquet: Path, tokenizer: Any) -> Any:
    from omegaconf import OmegaConf, open_dict
    from verl.trainer.sft_trainer import create_sft_dataset

    cfg = OmegaConf.create(dict(data))
    with open_dict(cfg):
        cfg.train_files = cfg.val_files = str(parquet)
    try:
        dataset = create_sft_dataset(cfg.train_files, cfg, tokenizer, None)
    except Exception as exc:
        return {KEY_ERROR: _error(exc)}
    rows = []
    for index in range(len(dataset)):
        try:
            row = dataset[index]
        except Exception as exc:
            rows.append({KEY_ERROR: _error(exc)})
            continue
        rows.append({key: row[key].tolist() for key in ROW_KEYS if key in row})
    return rows


def rows(request: Mapping[str, Any], folder: Path) -> dict[str, Any]:
    import datasets

    tokenizer = request_tokenizer(request, folder)
    parquet = folder / "conversations.parquet"
    conversations = [{"messages": list(messages)} for messages in request[KEY_CONVERSATIONS]]
    datasets.Dataset.from_list(conversations).to_parquet(str(parquet))
    return {KEY_RESULTS: [_rows(data, parquet, tokenizer) for data in request[KEY_DATA]]}


def answer(request: Mapping[str, Any]) -> dict[str, Any]:
    """Each ``data`` node's rows (or upstream's refusal), as ``prompt_stream`` answers: in a
    folder of the probe's own, printing nothing."""
    return answer_in_own_folder(request, rows, "sft-rows-")


ORACLE_HANDLERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {KIND: answer}
