"""The shipped prompt set, the prompt-length filter and a checkpointable prompt sampler.

`data/prompts.jsonl` holds arithmetic and word problems with integer answers, split into
``train`` and ``val``. It was generated once by `generate_prompts(seed=0)` (run this module as a
script to regenerate it) and is committed, so runs never depend on generation code changing.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

PROMPTS_PATH = Path(__file__).parent / "data" / "prompts.jsonl"
NAMES = ("ann", "bob", "cy", "dee", "eve", "max", "sam", "tom")
THINGS = ("pens", "cups", "eggs", "hats", "keys", "nuts")


@dataclass(frozen=True)
class Prompt:
    uid: str
    prompt: str
    answer: str
    split: str
    system: str = ""
    """A system message, used when the tokenizer has a chat template."""
    task: str = ""
    """The reasoning-gym task that scores this prompt; empty: the rule reward."""
    source: str = ""
    """Where the reasoning-gym problem came from (JSON: seed, size, index)."""


def prompt_text(tokenizer: Any, prompt: Prompt) -> str:
    """What the policy reads: the chat-templated prompt when the tokenizer has a template.

    verl's data set applies the chat template with a generation prompt; the tiny tokenizer
    has none, so its prompts are the raw text.
    """
    if not getattr(tokenizer, "chat_template", None):
        return prompt.prompt
    messages = [{"role": "user", "content": prompt.prompt}]
    if prompt.system:
        messages.insert(0, {"role": "system", "content": prompt.system})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def prompt_token_ids(tokenizer: Any, prompt: Prompt, max_prompt_length: int) -> list[int]:
    """The prompt's tokens as the rollout reads them: the chat-templated text, its last
    ``max_prompt_length`` tokens when longer. verl 0.9.0 never refuses an over-long text prompt:
    its agent loop left-truncates it to rollout.prompt_length (= data.max_prompt_length,
    verl/experimental/agent_loop/agent_loop.py:370-378, :449-460) whatever data.truncation says
    (verl/utils/dataset/rl_dataset.py:118 stores it and nothing reads it)."""
    ids = tokenizer(prompt_text(tokenizer, prompt), add_special_tokens=False)["input_ids"]
    return list(ids[-max_prompt_length:]) if len(ids) > max_prompt_length else list(ids)


def fitting_prompts(
    prompts: list[Prompt], tokenizer: Any, limit: int, *, drop_overlong: bool
) -> list[Prompt]:
    """The prompts the run samples from: with filter_overlong_prompts, those of at most
    max_prompt_length tokens (verl/utils/dataset/rl_dataset.py:197-273); without it, all of them
    (an over-long one is left-truncated when it is read, `prompt_token_ids`)."""
    if not drop_overlong:
        return prompts
    return [
        p
        for p in prompts
        if len(tokenizer(prompt_text(tokenizer, p), add_special_tokens=False)["input_ids"]) <= limit
    ]


def generate_prompts(seed: int = 0, train: int = 320, val: int = 40) -> list[dict[str, str]]:
    """Deterministic problems: two thirds arithmetic, one third word problems."""
    rng = random.Random(seed)
    rows: list[dict[str, str]] = []
    seen: set[str] = set()
    while len(rows) < train + val:
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        kind = rng.choice(("add", "sub", "mul", "word", "word"))
        if kind == "add":
            text, answer = f"{a}+{b}=", a + b
        elif kind == "sub":
            a, b = max(a, b), min(a, b)
            text, answer = f"{a}-{b}=", a - b
        elif kind == "mul":
            a, b = a % 10, b % 10
            text, answer = f"{a}*{b}=", a * b
        else:
            name, thing = rng.choice(NAMES), rng.choice(THINGS)
            text = f"{name} has {a} {thing} and gets {b} more. how many {thing}? "
            answer = a + b
        if text in seen:
            continue
        seen.add(text)
        split = "train" if len(rows) < train else "val"
        rows.append(
            {
                "uid": f"{split}-{len(rows):04d}",
                "prompt": text,
                "answer": str(answer),
                "split": split,
            }
        )
    return rows


PROMPT_FIELDS = frozenset(f.name for f in dataclasses.fields(Prompt))
REQUIRED_FIELDS = ("uid", "prompt", "answer", "split")
MAX_PROMPT_FILE_BYTES = 256 << 20


def load_prompts(path: str | Path = PROMPTS_PATH, split: str = "train") -> list[Prompt]:
    """Rows of one split; a bad file or row fails naming the file, line and field."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"data.train_files: prompt file {str(path)!r} does not exist")
    if not path.is_file():
        raise ValueError(f"{path}: data.train_files: the prompt file is not a regular file")
    if path.stat().st_size > MAX_PROMPT_FILE_BYTES:
        raise ValueError(f"{path}: larger than {MAX_PROMPT_FILE_BYTES} bytes")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 (byte {exc.start})") from None
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        prompts.append(_prompt_row(line, f"{path}:{number}"))
    prompts = [p for p in prompts if p.split == split]
    if not prompts:
        raise ValueError(f"data.train_files: {str(path)!r} has no {split!r} rows")
    return prompts


def _prompt_row(line: str, where: str) -> Prompt:
    try:
        row = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{where}: not a JSON row ({str(exc)[:200]})") from None
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a prompt row is a JSON object")
    extra = sorted(set(row) - PROMPT_FIELDS)
    if extra:
        raise ValueError(
            f"{where}: unknown key {extra[0]!r} (a row has {', '.join(sorted(PROMPT_FIELDS))})"
        )
    missing = [k for k in REQUIRED_FIELDS if k not in row]
    if missing:
        raise ValueError(f"{where}: missing key {missing[0]!r}")
    wrong = [k for k, v in row.items() if not isinstance(v, str)]
    if wrong:
        raise ValueError(f"{where}: {wrong[0]!r} must be a string")
    return Prompt(**row)


class PromptSampler:
    """Yields batches of prompt indices, epoch after epoch, as verl's train loader does.

    verl samples with one generator for the whole run, seeded with data.seed (left at torch's
    default seed when it is null), each epoch the generator's next permutation
    (verl/trainer/ppo/utils.py:140-167, torchdata's RandomSampler), in batches of
    train_batch_size with the short tail dropped (drop_last, verl/trainer/ppo/v1/
    trainer_base.py:688-695); without data.shuffle, in order. The state is (epoch, position): a
    resumed sampler replays the generator's permutations up to its epoch.
    """

    def __init__(self, size: int, batch_size: int, *, seed: int | None, shuffle: bool) -> None:
        if batch_size > size:
            raise ValueError(f"data.train_batch_size={batch_size} exceeds the {size} prompts")
        self.size, self.batch_size, self.seed, self.shuffle = size, batch_size, seed, shuffle
        self.epoch, self.position = 0, 0
        self._generator: torch.Generator | None = None
        self._drawn: list[int] = []  # the latest permutation drawn, of epoch _drawn_epoch
        self._drawn_epoch = -1

    def _order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.size))
        if self._generator is None or epoch < self._drawn_epoch:
            self._generator = torch.Generator()
            if self.seed is not None:
                self._generator.manual_seed(self.seed)
            self._drawn_epoch = -1
        while self._drawn_epoch < epoch:
            self._drawn = torch.randperm(self.size, generator=self._generator).tolist()
            self._drawn_epoch += 1
        return self._drawn

    def next_batch(self) -> list[int]:
        """The next `batch_size` indices; a short tail is dropped, as verl's drop_last does."""
        if self.position + self.batch_size > self.size:
            self.epoch, self.position = self.epoch + 1, 0
        batch = self._order(self.epoch)[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "size": self.size,
            "batch_size": self.batch_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("seed", "shuffle", "size", "batch_size"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"sampler checkpoint has {key}={state[key]!r}, run has {getattr(self, key)!r}"
                )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


if __name__ == "__main__":
    PROMPTS_PATH.parent.mkdir(exist_ok=True)
    PROMPTS_PATH.write_text("".join(json.dumps(row) + "\n" for row in generate_prompts()))
    print(f"wrote {PROMPTS_PATH}")
