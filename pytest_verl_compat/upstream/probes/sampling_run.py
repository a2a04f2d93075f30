"""What upstream's V1 trainer samples and which groups it keeps, computed by upstream's own code:
answered in the oracle process (``--serve``) for the run conformance of the sampling leaves
(tests/test_run_conformance_sampling.py).

A ``sampling_run`` question holds one resolved mapping; the answer holds:

- **generation**, for a training batch and for a validation batch (``TRAIN``, ``VALIDATE``): the
  V1 agent loop worker's own ``generate_sequences`` and ``_run_prompt``
  (verl/trainer/ppo/v1/agent_loop_tq.py:59-123) and the base worker's ``_run_agent_loop``
  (verl/experimental/agent_loop/agent_loop.py:675-708, the registry's look-up and the agent loop's
  construction), then the registered agent loop's own ``run``; only the LLM server's ``generate``
  is a stand-in, recording the sampling parameters it receives and the agent loop class that
  called it. Per prompt: the sessions started (the group size) and what each session sent.
- **groups kept**: the trainer's ``_resolve_filter_groups_metric`` (v1/trainer_base.py:190-215)
  and the replay buffer's ``_dapo_filtered_keys`` (v1/replay_buffer.py:248-297) over the finished
  groups the question gives (each a list of per-response rewards), each response's
  ``reward_extra_info`` as the reward loop builds it for a scorer returning one float
  (verl/experimental/reward_loop/reward_manager/naive.py:88-95); the uids kept, or upstream's
  refusal as an error.

The server's stand-in answers every request with the tokenizer's end-of-sequence token, so an
agent loop ends after its first turn; the tokenizer is a character vocabulary built here (no file
is read).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import io
import types
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from pytest_verl_compat.upstream.probes.patching import patched

KIND = "sampling_run"
# The question's keys.
KEY_MAPPING = "mapping"
KEY_GROUPS = "groups"  # uid → the rewards of its responses
KEY_PROMPTS = "prompts"  # how many prompts each generated batch holds
# The answer's keys.
TRAIN = "train"
VALIDATE = "validate"
KEPT = "kept"
KEY_ERROR = "error"
# Per prompt of a generated batch: its sessions' sampling parameters (in session order) and the
# agent loop class that sent them, with the names the registry holds it under.
SESSIONS = "sessions"
AGENT_LOOP = "agent loop"
REGISTERED_AS = "registered as"
SAMPLING_PARAMS = "sampling params"

_CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 +-*=?.,"


def _tokenizer() -> Any:
    """A character tokenizer with a chat template (the agent loop tokenizes each prompt)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers  # type: ignore[import-untyped]
    from transformers import PreTrainedTokenizerFast

    special = ["<pad>", "<eos>", "<unk>"]
    vocab = {token: i for i, token in enumerate([*special, *_ALPHABET])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    tokenizer.chat_template = _CHAT_TEMPLATE
    return tokenizer


class _Server:
    """The LLM server's stand-in: records what each request asks for, answers the end token."""

    def __init__(self, eos: int) -> None:
        self.eos = eos

    async def generate(self, *, sampling_params: dict[str, Any], **_: Any) -> Any:
        from verl.experimental.agent_loop.agent_loop import AgentLoopBase, _agent_loop_registry
        from verl.workers.rollout.replica import TokenOutput

        caller = _calling_agent_loop(AgentLoopBase)
        target = f"{type(caller).__module__}.{type(caller).__qualname__}"
        sent = {
            AGENT_LOOP: target,
            REGISTERED_AS: sorted(
                name
                for name, entry in _agent_loop_registry.items()
                if entry.get("_target_") == target
            ),
            SAMPLING_PARAMS: dict(sampling_params),
        }
        return TokenOutput(token_ids=[self.eos], extra_fields={"probe": sent})


def _calling_agent_loop(base: type) -> Any:
    """The agent loop whose ``run`` awaits the server (the nearest frame whose ``self`` is one)."""
    frame = inspect.currentframe()
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, base):
            return candidate
        frame = frame.f_back
    return None


def _transfer_queue_writes() -> Any:
    """TransferQueue's status writes, which the worker's ``_run_prompt`` makes: dropped."""
    import transfer_queue

    async def async_kv_put(*_: Any, **__: Any) -> None:
        return None

    return patched(transfer_queue, "async_kv_put", async_kv_put)


def _worker(cfg: Any, seen: list[dict[str, Any]]) -> Any:
    """The V1 agent loop worker's methods on a stand-in self: what they read of it, the server's
    stand-in as its LLM client; its post-processing (scoring, the TransferQueue write) records
    what each session's agent loop sent instead."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ
    from verl.utils.dataset.rl_dataset import get_dataset_class

    worker_class = getattr(AgentLoopWorkerTQ, "__ray_actor_class__", AgentLoopWorkerTQ)
    tokenizer = _tokenizer()

    async def postprocess(output: Any, validate: bool, **kwargs: Any) -> None:
        sent = output.extra_fields["probe"]
        seen.append({"uid": kwargs["uid"], "session": int(kwargs["session_id"]), **sent})

    worker = types.SimpleNamespace(
        config=cfg,
        llm_client=_Server(tokenizer.eos_token_id),
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=get_dataset_class(cfg.data),
        tools=[],
        background_tasks=set(),
        _agent_loop_postprocess=postprocess,
    )
    for name in ("generate_sequences", "_run_prompt", "_run_agent_loop"):
        setattr(worker, name, types.MethodType(getattr(worker_class, name), worker))
    return worker


def _generate(cfg: Any, prompts: int, validate: bool) -> dict[str, Any]:
    """One batch of ``prompts`` through the worker, as the trainer hands it over (a validation
    batch flagged ``validate``, trainer_base.py:981): per prompt, its sessions in order."""
    import numpy as np
    import torch
    from verl.utils import tensordict_utils as tu

    seen: list[dict[str, Any]] = []
    worker = _worker(cfg, seen)
    batch = tu.get_tensordict(
        {
            "uid": np.array([f"p{i}" for i in range(prompts)], dtype=object),
            "raw_prompt": np.array(
                [[{"role": "user", "content": f"what is {i} + {i}?"}] for i in range(prompts)],
                dtype=object,
            ),
            "index": torch.arange(prompts),
        }
    )
    tu.assign_non_tensor_data(batch, "global_steps", 1)
    if validate:
        tu.assign_non_tensor_data(batch, "validate", True)

    async def run() -> None:
        await worker.generate_sequences(batch)
        while worker.background_tasks:
            await asyncio.gather(*list(worker.background_tasks))

    with _transfer_queue_writes():
        asyncio.run(run())
    by_prompt: dict[str, list[dict[str, Any]]] = {}
    for record in sorted(seen, key=lambda r: (r["uid"], r["session"])):
        by_prompt.setdefault(record["uid"], []).append(
            {key: record[key] for key in (AGENT_LOOP, REGISTERED_AS, SAMPLING_PARAMS)}
        )
    return {uid: {SESSIONS: sessions} for uid, sessions in sorted(by_prompt.items())}


def _kept(cfg: Any, groups: Mapping[str, list[float]]) -> list[str]:
    """The finished groups the replay buffer keeps for training (those it does not filter)."""
    from collections import defaultdict

    import transfer_queue
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    metric = PPOTrainer._resolve_filter_groups_metric(types.SimpleNamespace(config=cfg))
    partition = "train"
    # Trajectory keys as the worker writes them, ``{uid}_{session}_{index}`` (agent_loop_tq.py).
    extra = {
        f"{uid}_{session}_0": {"reward_extra_info": {"acc": float(reward)}}
        for uid, rewards in groups.items()
        for session, reward in enumerate(rewards)
    }
    buffer = types.SimpleNamespace(
        filter_groups_metric=metric,
        finished_keys={partition: set(groups)},
        _dapo_classification_cache=defaultdict(dict),
        partitions={partition: dict.fromkeys(extra)},
    )

    def kv_batch_get(*, keys: list[str], **_: Any) -> dict[str, Any]:
        return {"extra_fields": [extra[key] for key in keys]}

    with patched(transfer_queue, "kv_batch_get", kv_batch_get):
        filtered, _ = ReplayBuffer._dapo_filtered_keys(buffer, partition)
    return sorted(uid for uid in groups if uid not in filtered)


def _stage(compute: Callable[[], Any]) -> Any:
    """A stage's value, or upstream's refusal as ``{KEY_ERROR: "Type: first line"}``."""
    try:
        return compute()
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        return {KEY_ERROR: f"{type(exc).__name__}: {first}"}


def answer(request: Mapping[str, Any]) -> dict[str, Any]:
    """The generation of a training and a validation batch, and the groups kept."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(dict(request[KEY_MAPPING]))
    prompts = int(request.get(KEY_PROMPTS, 2))
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {
            TRAIN: _stage(lambda: _generate(cfg, prompts, validate=False)),
            VALIDATE: _stage(lambda: _generate(cfg, prompts, validate=True)),
            KEPT: _stage(lambda: _kept(cfg, dict(request.get(KEY_GROUPS) or {}))),
        }


ORACLE_HANDLERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {KIND: answer}
