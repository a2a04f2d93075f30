"""Sampling and the model passes over a rollout batch.

`generate` samples the responses of a step (or of validation) from the rollout engine
(`rollout.py`, a KV-cache decoder) when it covers the model, else from the HF model with its own
cache, always with an explicit seeded generator (`sampling_generator`). `response_logits` and
`response_values` are the training-side passes over a `Batch` (padding removed, see `packing`);
`inference_logits` is the no-gradient old/reference log-prob pass, which may run on the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from reference_trainer.batching import Batch
from reference_trainer.config import RolloutConfig
from reference_trainer.data import Prompt, prompt_token_ids
from reference_trainer.packing import pack, packing_supported, unpack
from reference_trainer.rollout import DecoderSnapshot, KVCacheDecoder


def sampling_generator(*parts: int) -> torch.Generator:
    """A generator seeded from a tuple such as (seed, step, purpose): no hidden global state."""
    seed = 0
    for part in parts:
        seed = (seed * 1_000_003 + part) % (2**63 - 1)
    return torch.Generator().manual_seed(seed)


# The registered agent loop `generate` is: one completion per session of a prompt, no tool calls
# (verl/experimental/agent_loop/single_turn_agent_loop.py:28-110); the profile accepts no other
# rollout.agent.default_agent_loop.
AGENT_LOOP = "single_turn_agent"
# vLLM decodes greedily below this temperature (its ``_SAMPLING_EPS``), ignoring top_k and top_p.
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingSettings:
    """What the rollout server is asked for: responses per prompt and how each token is drawn."""

    n: int
    temperature: float
    top_k: int
    top_p: float

    @property
    def greedy(self) -> bool:
        """A zero temperature decodes greedily (vLLM's documented semantics)."""
        return self.temperature < GREEDY_BELOW


def sampling_settings(rollout: RolloutConfig, *, validate: bool) -> SamplingSettings:
    """The sampling of a training or a validation batch, as verl's V1 agent loop asks for it.

    verl/trainer/ppo/v1/agent_loop_tq.py:61-76 sends temperature, top_p and top_k (val_kwargs'
    for validation) and starts ``n`` sessions per prompt (val_kwargs.n for validation, :115);
    neither ``do_sample`` reaches the server (only REMAX's per-prompt ``__do_sample__`` does,
    :116-120), so a greedy rollout is a zero temperature.
    """
    if validate:
        return SamplingSettings(
            rollout.val_n, rollout.val_temperature, rollout.val_top_k, rollout.val_top_p
        )
    return SamplingSettings(rollout.n, rollout.temperature, rollout.top_k, rollout.top_p)


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """vLLM's conventions: top_k <= 0 and top_p >= 1 disable the filter."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        # As vLLM's and transformers' top-p (ascending, so ties break as theirs do): a token goes
        # when the mass up to it from the least likely is at most 1 - top_p; the most likely
        # always stays.
        sorted_logits, order = torch.sort(logits, descending=False, dim=-1)
        drop = sorted_logits.softmax(-1).cumsum(-1) <= 1 - top_p
        drop[..., -1] = False
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


class _HFSteps:
    """Next-token logits from the HF model with its own key/value cache."""

    def __init__(
        self, policy: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor
    ) -> None:
        self.policy = policy
        self.attention = prompt_mask.clone()
        self.cache = None
        self.first = self._run(prompt_ids, (prompt_mask.cumsum(-1) - 1).clamp_min(0))

    def _run(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        output = self.policy(
            input_ids=ids,
            attention_mask=self.attention,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
        )
        self.cache = output.past_key_values
        return output.logits[:, -1, :]

    def __call__(self, tokens: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        # The new token's position is the count of real tokens before it.
        positions = self.attention.sum(-1, keepdim=True)
        self.attention = torch.cat([self.attention, live[:, None].long()], dim=1)
        return self._run(tokens[:, None], positions)


class _EngineSteps:
    """Next-token logits from the rollout engine's static cache."""

    def __init__(self, decoder: KVCacheDecoder) -> None:
        self.decoder = decoder
        self.first = decoder.logits

    def __call__(self, tokens: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
        return self.decoder.advance(tokens, live)


@torch.no_grad()
def generate(
    policy: torch.nn.Module,
    tokenizer: Any,
    prompts: list[Prompt],
    *,
    sampling: SamplingSettings,
    max_new_tokens: int,
    generator: torch.Generator,
    uid_prefix: str = "",
    fast: bool = True,
    max_prompt_length: int | None = None,
) -> Batch:
    """Sample `sampling.n` responses per prompt; masks come from positions, never from token
    values.

    A prompt keeps its last `max_prompt_length` tokens (`data.prompt_token_ids`; None keeps them
    all). A response has at most `max_new_tokens` tokens, as verl's agent loop keeps
    ``response_ids[:response_length]`` (single_turn_agent_loop.py:97).
    `fast=False` forces the HF model's own forward (the engine's reference in tests).
    """
    n = sampling.n
    expanded = [p for p in prompts for _ in range(n)]
    limit = max_prompt_length if max_prompt_length is not None else 1 << 62
    encoded = tokenizer.pad(
        {"input_ids": [prompt_token_ids(tokenizer, p, limit) for p in prompts]},
        padding=True,
        return_tensors="pt",
    )
    # Row i of the rollout is response i % n of prompt i // n.
    prompt_rows = torch.arange(len(prompts)).repeat_interleave(n)
    prompt_ids = encoded["input_ids"][prompt_rows]
    prompt_mask = encoded["attention_mask"][prompt_rows]
    rows = len(expanded)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    responses = torch.full((rows, max_new_tokens), pad, dtype=torch.long)
    response_mask = torch.zeros(rows, max_new_tokens)
    finished = torch.zeros(rows, dtype=torch.bool)
    # The rollout engine (`rollout.py`) when it covers the model, else the HF model with its
    # own cache; both encode the prompt once, then one token per row per step.
    snapshot = DecoderSnapshot.from_model(policy) if fast else None
    next_logits = (
        # The n responses of a prompt share its prompt pass.
        _EngineSteps(
            snapshot.start(
                encoded["input_ids"], encoded["attention_mask"], max_new_tokens, prompt_rows
            )
        )
        if snapshot is not None
        else _HFSteps(policy, prompt_ids, prompt_mask)
    )
    logits = next_logits.first
    for t in range(max_new_tokens):
        if sampling.greedy:
            token = logits.argmax(-1)
        else:
            scaled = logits / sampling.temperature
            probs = filter_logits(scaled, sampling.top_k, sampling.top_p).softmax(-1)
            token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        live = ~finished
        responses[:, t] = torch.where(live, token, torch.full_like(token, pad))
        # The stop token itself is in the mask, so stopping is learned (nanochat #810).
        response_mask[:, t] = live.float()
        finished |= live & (token == eos)
        if bool(finished.all()) or t + 1 == max_new_tokens:
            break
        logits = next_logits(responses[:, t], response_mask[:, t])
    uids = np.array([f"{uid_prefix}{p.uid}" for p in expanded])
    return Batch(prompt_ids, prompt_mask, responses, response_mask, ~finished, uids, expanded)


# ---------------------------------------------------------------------------------------------
# Model passes


def _response_outputs(model: torch.nn.Module, batch: Batch, pad_id: int | None) -> torch.Tensor:
    """Model outputs at the positions that predict each response token, `(batch, width, ...)`.

    With `pad_id` the real tokens are packed (padding removed, see `packing`); without it the
    padded rectangle runs as is (models whose forward reads the attention mask itself).
    """
    width = batch.responses.shape[1]
    if pad_id is None or not packing_supported(model):
        return model(**batch.model_inputs()).logits[:, -width - 1 : -1]
    packed = pack(batch.prompt_ids, batch.prompt_mask, batch.responses, batch.response_mask, pad_id)
    # No cache: transformers only derives the block-causal mask when none is passed.
    outputs = model(
        input_ids=packed.input_ids,
        position_ids=packed.position_ids,
        attention_mask=packed.attention_mask,
        use_cache=False,
    ).logits
    return unpack(outputs, packed)


def response_logits(
    model: torch.nn.Module, batch: Batch, pad_id: int | None = None
) -> torch.Tensor:
    """Logits `(batch, response_length, vocab)` predicting each response token."""
    return _response_outputs(model, batch, pad_id)


def response_values(
    critic: torch.nn.Module, batch: Batch, pad_id: int | None = None
) -> torch.Tensor:
    """Values `(batch, response_length)` of the state before each response token (verl's slice)."""
    return _response_outputs(critic, batch, pad_id)[..., 0]


def inference_logits(model: torch.nn.Module, batch: Batch, pad_id: int | None) -> torch.Tensor:
    """Old and reference log-prob passes: no gradient, so the rollout engine may run them.

    verl, too, computes these in a separate no-grad pass whose kernels and micro-batches
    differ from the update's; the engine computes the same float32 function (tested against
    the HF forward), at about twice the speed of the packed HF pass here.
    """
    snapshot = DecoderSnapshot.from_model(model)
    if snapshot is None:
        return response_logits(model, batch, pad_id)
    return snapshot.response_logits(
        batch.prompt_ids, batch.prompt_mask, batch.responses, batch.response_mask
    )
