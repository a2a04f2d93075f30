"""Run conformance of the data.* settings (corpus/run_conformance/data.yaml).

For each case, from the same prompt rows and the same tiny tokenizer (a chat template over the
tiny character vocabulary), the prompts the run trains on over ``STEPS`` steps (three epochs:
each prompt's token ids, in the order the run samples them) and the response tokens kept from a
model that never stops:

- ours: the reference trainer built on the case's lowered config (its prompt filter and sampler,
  ``ReferenceTrainer.next_prompts``, and the ``generate`` call of its rollout, trainer.py);
- upstream: verl 0.9.0's own data path in the oracle's sandbox (``probes/prompt_stream.py``:
  RLHFDataset, create_rl_sampler and the V1 trainer's loader, the single-turn agent loop).

Each case must agree, and each leaf it sets must change upstream's result when put back at
verl's default (else the case shows nothing). A wrong variant of ours fails some case.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from corpus_facts import needs_release
from run_conformance import SandboxQuestions, model_files, tiny_chat_model

from pytest_verl_compat.upstream.probes import prompt_stream
from reference_trainer import data as our_data
from reference_trainer import trainer as our_trainer
from reference_trainer.budget import LocalBudget
from reference_trainer.generation import SamplingSettings, generate, sampling_generator

pytestmark = [needs_release()]

CASES_PATH = Path(__file__).parents[1] / "corpus" / "run_conformance" / "data.yaml"
CASES = yaml.safe_load(CASES_PATH.read_text())
BASE_CASE = "grpo"
# The area's leaves: the base run puts each back at verl 0.9.0's default (the grpo example sets
# some), and the cases move them from there.
AREA = (
    "data.filter_overlong_prompts",
    "data.max_prompt_length",
    "data.max_response_length",
    "data.seed",
    "data.shuffle",
    "data.truncation",
)
# 4 prompts a step (9 rows: 2 steps an epoch, the last row dropped), in one mini-batch of 8
# responses, one for each of the example's 8 GPUs.
BASE_SETS = {
    "data.train_batch_size": 4,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
    "actor_rollout_ref.rollout.n": 2,
}
STEPS = 5
# Role initials and the generation prompt, all in the tiny vocabulary.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'][0] }} {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}a {% endif %}"
)
# Contents of 8 to 60 tokens (one a character); two with a system message.
ROWS = [
    ("2+3=", "5", ""),
    ("ann has 4 pens and gets 3 more. how many pens? ", "7", ""),
    ("7*8=", "56", "be brief."),
    ("bob has 12 cups and gets 9 more. how many cups? think step by step.", "21", ""),
    ("15-6=", "9", ""),
    ("cy has 2 hats and gets 11 more. how many hats? ", "13", "answer with one number."),
    ("9+9=", "18", ""),
    ("3*4=", "12", ""),
    ("dee has 5 keys and gets 6 more. how many keys? ", "11", ""),
]


def _dotted(sets: dict[str, Any]) -> tuple[str, ...]:
    def literal(value: Any) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        return "null" if value is None else str(value)

    return tuple(f"{key}={literal(value)}" for key, value in sets.items())


def _verl_default(key: str) -> Any:
    """The leaf's value in verl 0.9.0's own default tree (main_ppo's generated config)."""
    node: Any = _default_tree()
    for part in key.split("."):
        node = node[part]
    return node


def _default_tree() -> dict[str, Any]:
    from corpus_facts import release_root

    path = release_root() / "verl" / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    return dict(yaml.safe_load(path.read_text()))


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny policy and its tokenizer, with a chat template, as a local model folder."""
    return tiny_chat_model(tmp_path_factory.mktemp("data-model") / "tiny-chat", CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rows in the reference trainer's prompt file (and one validation row it needs)."""
    path = tmp_path_factory.mktemp("data-prompts") / "prompts.jsonl"
    rows = [
        {"uid": f"train-{i}", "prompt": p, "answer": a, "split": "train", "system": s}
        for i, (p, a, s) in enumerate(ROWS)
    ]
    rows.append({"uid": "val-0", "prompt": "1+1=", "answer": "2", "split": "val"})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def upstream_rows() -> list[dict[str, Any]]:
    """The same rows in verl's parquet layout (its gsm8k preprocessing's columns)."""
    out = []
    for index, (prompt, answer, system) in enumerate(ROWS):
        messages = [{"role": "user", "content": prompt}]
        if system:
            messages.insert(0, {"role": "system", "content": system})
        out.append(
            {
                "data_source": "arithmetic",
                "prompt": messages,
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"index": index, "split": "train"},
            }
        )
    return out


class Upstream(SandboxQuestions):
    """The oracle that answers ``prompt_stream`` questions, each distinct question once."""

    def __init__(self, release: str, tokenizer_files: dict[str, str]) -> None:
        super().__init__(("pytest_verl_compat.upstream.probes.prompt_stream",), release)
        self.tokenizer_files = tokenizer_files

    def request(self, mapping: dict[str, Any]) -> dict[str, Any]:
        return {
            "kind": prompt_stream.KIND,
            "mapping": mapping,
            "rows": upstream_rows(),
            "tokenizer": self.tokenizer_files,
            prompt_stream.KEY_STEPS: STEPS,
        }

    def result(self, mapping: dict[str, Any]) -> dict[str, Any]:
        return self.ask(self.request(mapping))


@pytest.fixture(scope="module")
def upstream(upstream_session: Any, model_folder: Path) -> Iterator[Upstream]:
    files = model_files(model_folder)
    served = Upstream(upstream_session.version, files)
    try:
        yield served
    finally:
        served.close()


def composed(session: Any, case_id: str, sets: dict[str, Any]) -> Any:
    base = session.manifest.case(BASE_CASE)
    defaults = {key: _verl_default(key) for key in AREA}
    return session.with_overrides(base, _dotted({**defaults, **BASE_SETS, **sets}), case_id=case_id)


def ours(
    cfg: Any, model_folder: Path, prompts_file: Path, out: Path
) -> dict[str, list[list[dict[str, Any]]]]:
    """What the reference trainer trains on: its prompts step by step (``next_prompts``) and the
    rollout's ``generate`` call on them, from a policy that never stops (its final norm zeroed:
    every logit 0, so greedy decoding picks token 0, never the stop token)."""
    data = cfg.data
    budget = LocalBudget(
        steps=STEPS,
        train_batch_size=data.train_batch_size,
        max_prompt_length=data.max_prompt_length,
        max_response_length=data.max_response_length,
        model=str(model_folder),
        prompts_path=str(prompts_file),
        val_prompts=1,
        n=1,
    )
    trainer = our_trainer.ReferenceTrainer(cfg, budget, out, progress=False)
    # The budget keeps every data setting: the trainer runs on the case's own values.
    assert trainer.cfg.data == data, [e for e in trainer.ledger if e.field.startswith("data.")]
    with torch.no_grad():
        trainer.policy.model.norm.weight.zero_()
    steps = []
    for step in range(STEPS):
        batch = generate(
            trainer.policy,
            trainer.tokenizer,
            trainer.next_prompts(),
            # Greedy: a zero temperature, as verl's server reads it.
            sampling=SamplingSettings(n=1, temperature=0.0, top_k=-1, top_p=1.0),
            max_prompt_length=trainer.cfg.data.max_prompt_length,
            max_new_tokens=trainer.cfg.data.max_response_length,
            generator=sampling_generator(0, step),
        )
        steps.append(
            [
                {
                    prompt_stream.PROMPT_IDS: batch.prompt_ids[row][
                        batch.prompt_mask[row].bool()
                    ].tolist(),
                    prompt_stream.RESPONSE_TOKENS: int(batch.response_mask[row].sum()),
                }
                for row in range(batch.prompt_ids.shape[0])
            ]
        )
    return {prompt_stream.KEY_STEPS: steps}


@pytest.fixture(scope="module")
def submitted(upstream_session: Any, upstream: Upstream) -> None:
    """Every case's questions (the case and each leaf back at verl's default) asked at once, so
    the oracle answers them while ours computes."""
    for case in CASES:
        upstream.submit(upstream.request(_mapping(upstream_session, case["id"], case["sets"])))
        for key in case["sets"]:
            sets = {**case["sets"], key: _verl_default(key)}
            upstream.submit(
                upstream.request(_mapping(upstream_session, f"{case['id']}@default", sets))
            )


def _mapping(session: Any, case_id: str, sets: dict[str, Any]) -> dict[str, Any]:
    return dict(session.outcome(composed(session, case_id, sets)).composition.mapping)


def _case_config(session: Any, case: dict[str, Any]) -> Any:
    return session.reference_config(composed(session, case["id"], case["sets"]))


def test_every_data_leaf_is_set_off_its_default(upstream_session: Any) -> None:
    """Each leaf of the area but data.truncation (no value changes verl 0.9.0's result, see
    test_truncation_changes_nothing) is set off verl's default by some case."""
    area = set(AREA) - {"data.truncation"}
    moved = {
        key for case in CASES for key, value in case["sets"].items() if value != _verl_default(key)
    }
    assert area <= moved, sorted(area - moved)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_run_conformance_data(
    case: dict[str, Any],
    upstream_session: Any,
    upstream: Upstream,
    submitted: None,
    model_folder: Path,
    prompts_file: Path,
    tmp_path: Path,
) -> None:
    result = upstream.result(_mapping(upstream_session, case["id"], case["sets"]))
    assert prompt_stream.KEY_STEPS in result, result
    mine = ours(_case_config(upstream_session, case), model_folder, prompts_file, tmp_path)
    assert mine == result, case["id"]
    for key in case["sets"]:
        default = _verl_default(key)
        back = {**case["sets"], key: default}
        at_default = upstream.result(_mapping(upstream_session, f"{case['id']}@default", back))
        assert at_default != result, f"{case['id']}: {key} back at {default!r} changes nothing"


def test_truncation_changes_nothing(upstream_session: Any, upstream: Upstream) -> None:
    """verl 0.9.0 stores data.truncation (rl_dataset.py:118) and never reads it: with over-long
    prompts kept, every value gives the same prompts (left-truncated by the agent loop), which is
    why no case sets it."""
    results = [
        upstream.result(
            _mapping(
                upstream_session,
                f"data/truncation-{value}",
                {"data.max_prompt_length": 16, "data.truncation": value},
            )
        )
        for value in ("error", "left", "right", "middle")
    ]
    assert prompt_stream.KEY_STEPS in results[0], results[0]
    assert all(r == results[0] for r in results[1:])


def _old_sampler_order(self: Any, epoch: int) -> list[int]:
    # The sampler before it followed verl: one generator per epoch from (seed, epoch).
    if not self.shuffle:
        return list(range(self.size))
    generator = torch.Generator().manual_seed((self.seed or 0) * 1_000_003 + epoch)
    return torch.randperm(self.size, generator=generator).tolist()


def _refusing_overlong(prompts: list[Any], tokenizer: Any, limit: int, **_: Any) -> list[Any]:
    # The filter before it followed verl: an unfiltered over-long prompt kept whole.
    return our_data.fitting_prompts(prompts, tokenizer, limit, drop_overlong=False)


MUTANTS: dict[str, tuple[Any, str, Callable[..., Any]]] = {
    "sampler seeded per epoch": (our_data.PromptSampler, "_order", _old_sampler_order),
    "filter_overlong_prompts ignored": (our_trainer, "fitting_prompts", _refusing_overlong),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_wrong_reference_trainer_fails_some_case(
    mutant: str,
    upstream_session: Any,
    upstream: Upstream,
    submitted: None,
    model_folder: Path,
    prompts_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    owner, name, wrong = MUTANTS[mutant]
    monkeypatch.setattr(owner, name, wrong)
    # The first case it fails is enough (each case costs ours a run).
    killed = any(
        ours(
            _case_config(upstream_session, case), model_folder, prompts_file, tmp_path / case["id"]
        )
        != upstream.result(_mapping(upstream_session, case["id"], case["sets"]))
        for case in CASES
    )
    assert killed, f"the mutant {mutant!r} agrees with upstream on every case"
