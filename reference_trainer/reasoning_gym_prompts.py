"""Prompt files from reasoning-gym's problem generators, and its scoring as the reward.

reasoning-gym (Apache-2.0, PyPI) generates verifiable problems offline from a seed, e.g.
`gsm_symbolic` (GSM8K-style word problems) or `basic_arithmetic`, and scores an answer per task.
A prompt file written here has the shipped prompt file's columns plus the task and where the
problem came from (seed, size, index): entries hold values JSON cannot carry (fractions), so the
scorer regenerates the entry instead of reading it back. `--prompts FILE --reward reasoning-gym`
then trains on it with the same loop.

The package is an optional extra (`pip install 'pytest-verl-compat[smollm2]'`): nothing here is
imported unless such a run asks for it.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reference_trainer.data import Prompt

INSTALL_HINT = "reasoning-gym is not installed: pip install 'pytest-verl-compat[smollm2]'"


def _reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return reasoning_gym


def write_prompt_file(task: str, out: str | Path, *, train: int, val: int, seed: int) -> Path:
    """`train` then `val` problems of `task` from one seeded generation, written atomically."""
    gym = _reasoning_gym()
    from reasoning_gym.utils import SYSTEM_PROMPTS

    if task not in gym.factory.DATASETS:
        raise ValueError(f"reasoning-gym has no task {task!r}; e.g. gsm_symbolic, basic_arithmetic")
    # One generation split by index: reasoning-gym seeds item i from seed + i, so two splits
    # from neighbouring seeds would share problems.
    size = train + val
    lines = []
    for index, entry in enumerate(_dataset(task, size, seed)):
        split = "train" if index < train else "val"
        row = {
            "uid": f"{task}-{split}-{index:05d}",
            "prompt": entry["question"],
            "answer": str(entry["answer"]),
            "split": split,
            "system": SYSTEM_PROMPTS["default"],
            "task": task,
            "source": json.dumps({"seed": seed, "size": size, "index": index}),
        }
        lines.append(json.dumps(row, sort_keys=True) + "\n")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    with os.fdopen(handle, "w", encoding="utf-8") as stream:
        stream.writelines(lines)
    os.replace(tmp, out)
    return out


@functools.cache
def _dataset(task: str, size: int, seed: int) -> Any:
    """Generation is deterministic in (task, size, seed); one object per triple is kept."""
    return _reasoning_gym().create_dataset(task, size=size, seed=seed)


@functools.cache
def _scorer(task: str) -> Callable[[str | None, dict[str, Any]], float]:
    return _reasoning_gym().get_score_answer_fn(task)


def check_reasoning_gym_prompts(prompts: list[Prompt], path: str | Path) -> None:
    """Before training: every prompt names its task, and reasoning-gym is importable."""
    untasked = [p.uid for p in prompts if not p.task]
    if untasked:
        raise ValueError(
            f"data.train_files: {str(path)!r} is not a reasoning-gym prompt file ({len(untasked)} "
            f"prompts name no task, e.g. {untasked[0]!r}); write one with `verl-compat prompts`"
        )
    _reasoning_gym()


def reasoning_gym_reward(response: str, prompt: Prompt) -> float:
    """The task's own score of the answer inside `<answer>` tags (0 without tags)."""
    if not prompt.task:
        raise ValueError(
            f"reward: reasoning-gym needs a prompt file written by `verl-compat prompts`; "
            f"prompt {prompt.uid!r} names no task"
        )
    from reasoning_gym.utils import extract_answer

    source = json.loads(prompt.source)
    entry = _dataset(prompt.task, source["size"], source["seed"])[source["index"]]
    if entry["question"] != prompt.prompt:
        raise ValueError(
            f"data.train_files: prompt {prompt.uid!r} is not what reasoning-gym {prompt.task} "
            f"generates for {source} (another reasoning-gym version?)"
        )
    return float(_scorer(prompt.task)(extract_answer(response), entry))
