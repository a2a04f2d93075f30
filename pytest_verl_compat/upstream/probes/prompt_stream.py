"""The prompts a run trains on, step by step, computed by upstream's own data path: answered in
the oracle process (``--serve``) for the run conformance of the ``data.*`` settings
(tests/test_run_conformance_data.py).

A ``prompt_stream`` question holds a resolved mapping, the rows of a prompt file (verl's parquet
layout: chat ``prompt`` messages, ``data_source``, ``reward_model``, ``extra_info``), a
tokenizer's files and a number of steps. The probe writes the rows as a parquet file and the
tokenizer to a folder of its own, loads the tokenizer as the trainer's model config does
(``hf_tokenizer``, verl/workers/config/model.py:161), and then, as a V1 run:

- builds the data sets and the train loader with the trainer's own ``_init_dataloader``
  (verl/trainer/ppo/v1/trainer_base.py:653-731: ``RLHFDataset`` filters over-long prompts at
  rl_dataset.py:197-273, ``create_rl_sampler`` orders them, verl/trainer/ppo/utils.py:140-167),
  on a stand-in ``self`` holding the configuration, the tokenizer and the trainer's mode;
- draws ``steps`` batches as ``_fetch_one_gen_batch`` does (trainer_base.py:1315-1323: a new
  pass over the loader when one ends);
- runs each prompt through the single-turn agent loop (single_turn_agent_loop.py:38-110: chat
  template, the prompt capped at rollout.prompt_length, the response at rollout.response_length)
  against a stand-in server whose model never stops (``NEVER_STOPS`` tokens, more than any
  response bound a case sets).

The answer holds, per step, each prompt's token ids and the number of response tokens kept; a
stage upstream refuses is answered as its error.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import tempfile
import types
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

KIND = "prompt_stream"
KEY_STEPS = "steps"
KEY_ERROR = "error"
# What one prompt of a step records.
PROMPT_IDS = "prompt ids"
RESPONSE_TOKENS = "response tokens"
# The stand-in server's response: longer than any response bound a question sets, so only the
# bounds upstream applies end it.
NEVER_STOPS = 4096
MAX_STEPS = 64


class _NeverStoppingServer:
    """The agent loop's server (``LLMServerClient.generate``): a model that never emits its stop
    token, so the response is as long as upstream lets it be."""

    async def generate(self, **_: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        return TokenOutput(token_ids=[4 + i % 7 for i in range(NEVER_STOPS)])


def _loader(cfg: Any, tokenizer: Any) -> Any:
    """The train loader the V1 trainer builds (its own ``_init_dataloader`` on a stand-in)."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    trainer = types.SimpleNamespace(
        config=cfg,
        tokenizer=tokenizer,
        processor=None,
        trainer_mode=cfg.trainer.v1.trainer_mode,
        parameter_sync_step=1,
    )
    PPOTrainer._init_dataloader(trainer)
    return trainer.train_dataloader


def _batches(loader: Any, steps: int) -> list[Any]:
    """``steps`` batches, a new pass over the loader when one ends (trainer_base.py:1318-1323)."""
    out: list[Any] = []
    iterator: Any = None
    while len(out) < steps:
        try:
            if iterator is None:
                iterator = iter(loader)
            out.append(next(iterator))
        except StopIteration:
            iterator = iter(loader)
            out.append(next(iterator))
    return out


async def _agent_loop(cfg: Any, tokenizer: Any, raw_prompt: Any) -> dict[str, Any]:
    """One prompt through the single-turn agent loop (built in the running event loop, which
    its tokenization runs in)."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
    from verl.utils.dataset.rl_dataset import RLHFDataset

    agent = SingleTurnAgentLoop(
        trainer_config=DictConfigWrap(cfg),
        server_manager=_NeverStoppingServer(),
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(cfg.data),
    )
    output = await agent.run(sampling_params={}, raw_prompt=list(raw_prompt))
    return {
        PROMPT_IDS: [int(t) for t in output.prompt_ids],
        RESPONSE_TOKENS: len(output.response_ids),
    }


def request_tokenizer(request: Mapping[str, Any], folder: Path) -> Any:
    """verl's tokenizer of the request's tokenizer files, written under ``folder`` (each by its
    base name only)."""
    from verl.utils import hf_tokenizer

    tokenizer_dir = folder / "tokenizer"
    tokenizer_dir.mkdir()
    for name, text in dict(request["tokenizer"]).items():
        (tokenizer_dir / Path(str(name)).name).write_text(str(text))
    return hf_tokenizer(str(tokenizer_dir))


def stream(request: Mapping[str, Any], folder: Path) -> dict[str, Any]:
    import datasets
    from omegaconf import OmegaConf, open_dict

    tokenizer = request_tokenizer(request, folder)
    parquet = folder / "prompts.parquet"
    datasets.Dataset.from_list([dict(row) for row in request["rows"]]).to_parquet(str(parquet))
    cfg = OmegaConf.create(dict(request["mapping"]))
    with open_dict(cfg):
        cfg.data.train_files = cfg.data.val_files = str(parquet)
        cfg.data.cache_dir = str(folder / "cache")
        # The profile's lowering (single-process data loading): the sampler, not the workers,
        # orders the prompts.
        cfg.data.dataloader_num_workers = 0
    steps = max(1, min(int(request[KEY_STEPS]), MAX_STEPS))
    try:
        batches = _batches(_loader(cfg, tokenizer), steps)
    except Exception as exc:
        return {KEY_ERROR: f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}

    async def prompts_of(batch: Any) -> list[dict[str, Any]]:
        return [await _agent_loop(cfg, tokenizer, raw) for raw in batch["raw_prompt"]]

    try:
        return {KEY_STEPS: [asyncio.run(prompts_of(batch)) for batch in batches]}
    except Exception as exc:
        return {KEY_ERROR: f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}


def answer_in_own_folder(
    request: Mapping[str, Any],
    compute: Callable[[Mapping[str, Any], Path], dict[str, Any]],
    prefix: str,
) -> dict[str, Any]:
    """``compute(request, folder)`` in a temp folder of the probe's own, with the datasets
    library's cache in it too, printing nothing; its answer as plain JSON."""
    with (
        tempfile.TemporaryDirectory(prefix=prefix) as folder,
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        import datasets

        cache = datasets.config.HF_DATASETS_CACHE
        datasets.config.HF_DATASETS_CACHE = Path(folder) / "hf-datasets"
        try:
            out = compute(request, Path(folder))
        finally:
            datasets.config.HF_DATASETS_CACHE = cache
    plain: dict[str, Any] = json.loads(json.dumps(out))
    return plain


def answer(request: Mapping[str, Any]) -> dict[str, Any]:
    """The question's steps, each prompt's token ids and response length (or upstream's
    refusal)."""
    return answer_in_own_folder(request, stream, "prompt-stream-")


ORACLE_HANDLERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {KIND: answer}
