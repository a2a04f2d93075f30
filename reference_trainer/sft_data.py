"""Supervised fine-tuning data: conversations → token ids and a loss mask, and the batch order.

verl 0.9.0 reads conversations (`data.messages_key`) with its multi-turn dataset, tokenising
each turn and concatenating them; assistant turns are trained, every other token is not
(verl/utils/dataset/multiturn_sft_dataset.py:207-241, :302-318). Here the conversations are
local: a JSONL file of `{"messages": [...]}` rows, or the shipped arithmetic prompts turned into
one user turn and one assistant turn each (`conversations_from_prompts`). With a chat template
(a real model) each turn is the template's text of the conversation up to it minus the text
before it, the assistant's generation prompt untrained; without one (the tiny character
tokenizer) a conversation is BOS, then each turn's text, an assistant turn ending in EOS.

The order of the batches is `DistributedSampler`'s with one rank (shuffle, seed 0, reseeded by
the epoch, verl/trainer/sft_trainer.py:236-238 and :357), the tail dropped (`drop_last`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from reference_trainer.data import PROMPTS_PATH, load_prompts

Messages = list[dict[str, str]]
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class TokenizedConversation:
    """One tokenised conversation: its ids and which of them are trained, `(length,)` each."""

    input_ids: torch.Tensor
    loss_mask: torch.Tensor


def conversations_from_prompts(
    path: str | Path = PROMPTS_PATH, split: str = "train"
) -> list[Messages]:
    """Each prompt of a prompt file as a user turn answered by its reference answer."""
    return [
        [{"role": "user", "content": p.prompt}, {"role": "assistant", "content": p.answer}]
        for p in load_prompts(path, split)
    ]


def load_conversations(path: str | Path, split: str = "train") -> list[Messages]:
    """A JSONL file of `{"messages": [{"role", "content"}, ...]}` rows (an optional `split`
    field keeps the rows of `split`), or a prompt file (rows with `prompt` and `answer`)."""
    rows = [
        json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line
    ]
    if rows and "messages" not in rows[0]:
        return conversations_from_prompts(path, split)
    found: list[Messages] = []
    for number, row in enumerate(rows, 1):
        if row.get("split", split) != split:
            continue
        messages = row.get("messages")
        if (
            not isinstance(messages, list)
            or not messages
            or not all(
                isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)
                for m in messages
            )
        ):
            raise ValueError(
                f"{path}:{number}: messages must be a non-empty list of "
                f"{{role: {'|'.join(ROLES)}, content: str}}"
            )
        found.append(messages)
    return found


def _plain_turns(tokenizer: Any, messages: Messages) -> list[tuple[list[int], bool]]:
    """BOS, then each turn's text; an assistant turn ends in EOS and is trained."""
    turns: list[tuple[list[int], bool]] = [([tokenizer.bos_token_id], False)]
    for message in messages:
        ids = tokenizer(message["content"], add_special_tokens=False)["input_ids"]
        if message["role"] == "assistant":
            turns.append(([*ids, tokenizer.eos_token_id], True))
        else:
            turns.append((ids, False))
    return turns


def _template_ids(tokenizer: Any, messages: Messages, **kwargs: Any) -> list[int]:
    """The template's token ids of `messages`. Asked as a dict, as verl asks (return_dict=True,
    verl/utils/dataset/multiturn_sft_dataset.py:214-226): transformers 5 returns an encoding,
    not a list of ids, for a bare `tokenize=True`."""
    encoded = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, **kwargs)
    return [int(i) for i in encoded["input_ids"]]


def _template_turns(tokenizer: Any, messages: Messages) -> list[tuple[list[int], bool]]:
    """Each turn as the template's tokens of the conversation up to it minus those before it;
    an assistant turn's generation prompt is not trained (multiturn_sft_dataset.py:235-239)."""
    turns: list[tuple[list[int], bool]] = []
    before: list[int] = []
    for k, message in enumerate(messages):
        upto = _template_ids(tokenizer, messages[: k + 1])
        ids = upto[len(before) :]
        if message["role"] == "assistant":
            prompt = _template_ids(tokenizer, messages[:k], add_generation_prompt=True)
            header = len(prompt) - len(before)
            turns.append((ids[:header], False))
            turns.append((ids[header:], True))
        else:
            turns.append((ids, False))
        before = list(upto)
    return turns


def tokenize_conversation(
    tokenizer: Any, messages: Messages, *, max_length: int, truncation: str
) -> TokenizedConversation:
    """The conversation's ids and loss mask; longer than `max_length`: an error, or its first
    `max_length` tokens with `truncation=right` (the no-padding branch,
    multiturn_sft_dataset.py:404-412)."""
    builder = _template_turns if getattr(tokenizer, "chat_template", None) else _plain_turns
    ids: list[int] = []
    mask: list[int] = []
    for turn, trained in builder(tokenizer, messages):
        ids += turn
        mask += [int(trained)] * len(turn)
    if len(ids) > max_length:
        if truncation == "error":
            raise ValueError(
                f"data.max_length={max_length}: a conversation has {len(ids)} tokens "
                "(data.truncation=right keeps the first max_length)"
            )
        ids, mask = ids[:max_length], mask[:max_length]
    return TokenizedConversation(
        torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)
    )


def tokenize_all(
    tokenizer: Any, conversations: Sequence[Messages], *, max_length: int, truncation: str
) -> list[TokenizedConversation]:
    return [
        tokenize_conversation(tokenizer, m, max_length=max_length, truncation=truncation)
        for m in conversations
    ]


class SFTSampler:
    """The batches of one data-parallel rank, as verl's DistributedSampler and loader give them.

    Epoch `e`'s order is `torch.randperm(size)` from a generator seeded with `seed + e`
    (torch's DistributedSampler with shuffle); batches are consecutive `batch_size` slices,
    the tail dropped. The state is (epoch, position), so a resumed run continues exactly.
    """

    def __init__(self, size: int, batch_size: int, *, seed: int = 0) -> None:
        if batch_size > size:
            raise ValueError(f"data.train_batch_size={batch_size} exceeds the {size} conversations")
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self.epoch, self.position = 0, 0

    @property
    def batches_per_epoch(self) -> int:
        return self.size // self.batch_size

    def order(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.size, generator=generator).tolist()

    def next_batch(self) -> list[int]:
        if self.position + self.batch_size > self.size:
            self.epoch, self.position = self.epoch + 1, 0
        batch = self.order(self.epoch)[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return batch

    @property
    def next_epoch(self) -> int:
        """The epoch the next batch comes from (the current one's tail is dropped)."""
        return self.epoch + (self.position + self.batch_size > self.size)

    def resumed(self) -> None:
        """As verl's loader resumes: a state saved after an epoch's last batch makes the next
        epoch's iteration empty (torchdata's StatefulDataLoader has yielded every batch of its
        state's epoch; verl/trainer/sft_trainer.py:341, :356-370 iterate it as epoch
        ``step // batches_per_epoch``), so the run goes on with the epoch after it."""
        if self.position + self.batch_size > self.size:
            self.epoch += 1

    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "size": self.size,
            "batch_size": self.batch_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("seed", "size", "batch_size"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"sampler checkpoint has {key}={state[key]!r}, run has {getattr(self, key)!r}"
                )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
