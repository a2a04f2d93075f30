"""Scoring: the rule reward, the length reward for learning-signal tests, and a reward model.

All scorers map (prompt text, response text, response length in tokens) to one float per
trajectory; `score_batch` (the trainer's score phase) puts it on the last valid token, as verl's
reward managers do.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedModel

from reference_trainer.batching import Batch
from reference_trainer.data import Prompt, load_prompts
from reference_trainer.reasoning_gym_prompts import reasoning_gym_reward
from reference_trainer.tiny import (
    ATTENTION,
    FROM_PRETRAINED_SAFELY,
    build_tiny_reward_model,
    build_tiny_tokenizer,
    refuse_pickled_weights,
)

# The scorers' floats as they are: verl's replay buffer filters groups on them in float64
# (replay_buffer.py:285, :295), where three responses all scoring 0.1 have a std of about 1e-17,
# not 0 (in float32 it is 0: the group would be dropped).
SCORE_DTYPE = torch.float64

_INTEGER = re.compile(r"-?\d+")


def rule_correct(response: str, answer: str) -> bool:
    """The first integer in the response is the answer (a lenient gsm8k-style check)."""
    match = _INTEGER.search(response)
    return match is not None and match.group() == answer


def rule_reward(response: str, answer: str) -> float:
    return 1.0 if rule_correct(response, answer) else 0.0


def length_reward(length: int, target: int, max_length: int) -> float:
    """1 at exactly `target` tokens (EOS included), falling linearly to 0 at distance max_length.

    A freshly initialised model almost never stops early, so this rewards learning to stop:
    a signal a tiny model can pick up in a few dozen steps, unlike arithmetic.
    """
    return max(0.0, 1.0 - abs(length - target) / max_length)


@dataclass
class RewardModelScorer:
    """A local `AutoModelForSequenceClassification` folder scoring prompt + response text.

    The response is decoded by the policy's tokenizer and re-encoded by the reward model's own,
    as verl does when the two tokenizers differ.
    """

    model: PreTrainedModel
    tokenizer: object
    folder: str

    @classmethod
    def load(cls, folder: str | Path) -> RewardModelScorer:
        path = Path(folder)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"reward.reward_model.model_path: {str(folder)!r} is not a local reward model "
                "folder (no config.json)"
            )
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        tokenizer.padding_side = "right"
        refuse_pickled_weights(path, "reward.reward_model.model_path")
        model = AutoModelForSequenceClassification.from_pretrained(
            path, **FROM_PRETRAINED_SAFELY, attn_implementation=ATTENTION, dtype=torch.float32
        )
        model.eval()
        return cls(model, tokenizer, str(path))

    def reward_input(self, prompt: Prompt, response: str) -> str:
        """What the reward model reads, as verl's reward loop builds it.

        verl appends the response as an assistant message to the prompt's messages and applies
        the reward model's chat template without a generation prompt, dropping a leading BOS
        that the tokenizer adds again (verl/experimental/reward_loop/reward_loop.py:203-228).
        A tokenizer without a chat template reads prompt and response as plain text.
        """
        tokenizer: Any = self.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            return prompt.prompt + response
        chat = [{"role": "user", "content": prompt.prompt}]
        if prompt.system:
            chat.insert(0, {"role": "system", "content": prompt.system})
        chat.append({"role": "assistant", "content": response})
        text = str(tokenizer.apply_chat_template(chat, add_generation_prompt=False, tokenize=False))
        bos = tokenizer.bos_token
        return text[len(bos) :] if bos is not None and text.startswith(bos) else text

    @torch.no_grad()
    def score(self, prompts: Sequence[Prompt], responses: Sequence[str]) -> list[float]:
        texts = [self.reward_input(p, r) for p, r in zip(prompts, responses, strict=True)]
        encoded = self.tokenizer(texts, return_tensors="pt", padding=True)  # type: ignore[operator]
        logits = self.model(**encoded).logits
        return logits[:, 0].tolist()


def score_batch(
    batch: Batch,
    tokenizer: Any,
    *,
    scorer: RewardModelScorer | None,
    reward: str,
    length_target: int,
) -> None:
    """Token-level scores: the sequence reward on the last valid token, as verl places it.

    `scorer` (a reward model) wins over `reward` (``length``, ``reasoning-gym``, else the rule).
    Also fills the batch's ``acc``, ``score`` and decoded texts.
    """
    lengths = batch.response_mask.sum(-1).long()
    texts = [
        tokenizer.decode(row[: int(n)], skip_special_tokens=True)
        for row, n in zip(batch.responses, lengths, strict=True)
    ]
    pairs = list(zip(texts, batch.prompts, strict=True))
    acc = [float(rule_correct(t, p.answer)) for t, p in pairs]
    if scorer is not None:
        rewards = scorer.score(batch.prompts, texts)
    elif reward == "length":
        width = batch.responses.shape[1]
        rewards = [length_reward(int(n), length_target, width) for n in lengths]
    elif reward == "reasoning-gym":
        rewards = [reasoning_gym_reward(t, p) for t, p in pairs]
        # The task's scorer decides correctness; full marks count as accurate.
        acc = [float(r >= 1.0) for r in rewards]
    else:
        rewards = [rule_reward(t, p.answer) for t, p in pairs]
    scores = torch.zeros_like(batch.response_mask)
    scores[torch.arange(len(batch)), (lengths - 1).clamp_min(0)] = torch.tensor(rewards)
    batch.tensors["token_level_scores"] = scores
    batch.tensors["acc"] = torch.tensor(acc)
    batch.tensors["score"] = torch.tensor(rewards, dtype=SCORE_DTYPE)
    batch.texts = texts


def preference_pairs(prompts: Sequence[Prompt], seed: int) -> list[tuple[str, str]]:
    """(chosen, rejected) texts: the right answer beats a wrong one, as the rule reward says."""
    rng = random.Random(seed)
    pairs = []
    for prompt in prompts:
        wrong = str(int(prompt.answer) + rng.choice((-3, -2, -1, 1, 2, 3)))
        pairs.append((prompt.prompt + prompt.answer, prompt.prompt + wrong))
    return pairs


def train_reward_model(
    out: str | Path, *, seed: int = 0, epochs: int = 3, batch_size: int = 32, lr: float = 3e-3
) -> dict[str, float]:
    """Train a tiny Bradley-Terry reward model on rule-reward preference pairs; save to `out`.

    Returns the held-out pairwise accuracy (share of val pairs where chosen scores higher).
    """
    # One thread: on a shared 2-core machine two threads ran this tiny model 3-10x slower.
    torch.set_num_threads(1)
    tokenizer = build_tiny_tokenizer()
    tokenizer.padding_side = "right"
    model = build_tiny_reward_model(tokenizer, seed)
    generator = torch.Generator().manual_seed(seed)
    train_pairs = preference_pairs(load_prompts(split="train"), seed)
    val_pairs = preference_pairs(load_prompts(split="val"), seed + 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    def scores(texts: list[str]) -> torch.Tensor:
        encoded = tokenizer(texts, return_tensors="pt", padding=True)
        return model(**encoded).logits[:, 0]

    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(train_pairs), generator=generator).tolist()
        for start in range(0, len(order), batch_size):
            batch = [train_pairs[i] for i in order[start : start + batch_size]]
            chosen = scores([c for c, _ in batch])
            rejected = scores([r for _, r in batch])
            loss = -torch.nn.functional.logsigmoid(chosen - rejected).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        accuracy = float(
            (scores([c for c, _ in val_pairs]) > scores([r for _, r in val_pairs])).float().mean()
        )
    Path(out).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"val_pair_accuracy": accuracy, "final_loss": float(loss.detach())}


if __name__ == "__main__":
    import sys

    print(train_reward_model(sys.argv[1] if len(sys.argv) > 1 else "tiny_reward_model"))
