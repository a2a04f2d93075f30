"""A launch script's regular expressions never hang the checks or the forecast.

peft full-matches a string LoRA target and Megatron-Bridge a wildcard target against module
names; matching a script's pattern as they do, a pattern whose backtracking never ends under
``re`` (``(.*)*x``) is bounded (``files/patterns.py``): it matches nothing, in a moment.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_verl_compat.files.patterns import fullmatches

NAME = "model.language_model.layers.10.mlp.gate"
ENDLESS = r"(.*)*x"  # re.fullmatch never returns on NAME
# no "*" (Megatron-Bridge's wildcard turns each into "(.*)"), a "." (a wildcard target)
BACKTRACKS = r"((\w|\.)+)+y"


def test_patterns_match_as_peft_matches() -> None:
    assert fullmatches(r".*\.mlp\.gate", NAME)
    assert fullmatches(r".*(q_proj|gate)", NAME)
    assert not fullmatches(r"mlp\.gate", NAME)  # full match, not search
    assert not fullmatches(r"(unclosed", NAME)  # does not compile: matches nothing


@pytest.mark.parametrize("pattern", [ENDLESS, BACKTRACKS])
def test_a_pattern_that_backtracks_without_end_is_bounded(pattern: str) -> None:
    started = time.monotonic()
    assert not fullmatches(pattern, NAME)
    assert time.monotonic() - started < 5


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_verl_compat.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_check_with_an_endless_lora_target(upstream_checkout: Path, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "glm4_moe", "num_attention_heads": 96, "num_key_value_heads": 8}),
        encoding="utf-8",
    )
    script = upstream_checkout / "examples/grpo_trainer/run_qwen3_8b_fsdp.sh"
    done = _run(
        [
            "check",
            str(script),
            "--model-config",
            str(tmp_path / "config.json"),
            "--set",
            "actor_rollout_ref.model.lora_rank=32",
            "--set",
            f"actor_rollout_ref.model.target_modules='{ENDLESS}'",
        ]
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert "model.lora-router" not in done.stdout + done.stderr


def test_fit_with_an_endless_megatron_lora_target(upstream_checkout: Path) -> None:
    script = upstream_checkout / "examples/grpo_trainer/run_qwen3_8b_megatron.sh"
    done = _run(
        [
            "fit",
            str(script),
            "--gpu",
            "H100",
            "--set",
            "actor_rollout_ref.model.lora.rank=16",
            "--set",
            f"actor_rollout_ref.model.lora.target_modules=['{BACKTRACKS}']",
        ]
    )
    assert done.returncode in (0, 1), done.stderr
    assert "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_moe"])
@pytest.mark.parametrize("pattern", [ENDLESS, BACKTRACKS])
def test_fit_with_an_endless_fsdp_lora_target(
    upstream_checkout: Path, tmp_path: Path, pattern: str, model_type: str
) -> None:
    """The forecast judges whether peft builds the adapter from a pattern target (on a MoE type
    peft converts, after resolving the pattern against every name): neither pattern matches a
    module name (decided at once under the bounded match), so the run adapts nothing, an error,
    said in a moment; never a hang."""
    config = {
        "model_type": model_type,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 1000,
    }
    if model_type == "qwen3_moe":
        config |= {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 768}
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    script = upstream_checkout / "examples/grpo_trainer/run_qwen3_8b_fsdp.sh"
    started = time.monotonic()
    done = _run(
        [
            "fit",
            str(script),
            "--gpu",
            "H100",
            "--model-config",
            str(tmp_path / "config.json"),
            "--set",
            "actor_rollout_ref.model.lora_rank=32",
            "--set",
            f"actor_rollout_ref.model.target_modules='{pattern}'",
        ]
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1, done.stderr
    assert "error[model.lora-targets] actor_rollout_ref.model.target_modules" in done.stdout
    assert "names no module" in done.stdout
    assert time.monotonic() - started < 60
