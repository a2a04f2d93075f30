"""SFT: the `sft_trainer_engine` tree composed, compiled against the SFT profile and lowered."""

from __future__ import annotations

import pytest
from corpus_facts import needs_release

from pytest_verl_compat.pipeline.compose import Composer
from pytest_verl_compat.pipeline.lower import NotAccepted
from pytest_verl_compat.pipeline.profile import load_profile
from pytest_verl_compat.pipeline.sft import (
    compile_sft,
    compose_sft,
    default_sft_profile,
    lower_sft,
    sft_composer,
    sft_config,
)

pytestmark = needs_release()

# What an FSDP SFT script of verl's examples passes (examples/sft/gsm8k/run_qwen2_5_0_5b_fsdp.sh).
SCRIPT_FIELDS = [
    "data.train_files=/data/train.parquet",
    "data.val_files=/data/test.parquet",
    "data.messages_key=messages",
    "data.micro_batch_size_per_gpu=4",
    "optim.lr=1e-4",
    "engine=fsdp",
    "engine.ulysses_sequence_parallel_size=1",
    "model.path=/models/qwen",
    "model.use_remove_padding=true",
    'trainer.logger=["console","wandb"]',
    "trainer.total_epochs=1",
]


@pytest.fixture(scope="module")
def composer() -> Composer:
    return sft_composer()


def test_the_default_tree_is_classified_leaf_by_leaf(composer: Composer) -> None:
    composition = compose_sft([], composer=composer)
    report = compile_sft(composition.mapping, case_id="sft-default")
    assert report.accepted, report.reason
    assert report.counts["unknown"] == 0
    assert report.profile == default_sft_profile()
    assert load_profile(default_sft_profile()).version in report.profile


def test_group_selections_compose_as_hydra_composes_them(composer: Composer) -> None:
    slow = Composer(composer.config_dir, composer.config_name, fast=False)
    for fields in (SCRIPT_FIELDS, ["engine=megatron", "optim=megatron", "model.path=/m"]):
        assert composer.compose(fields, {}).resolved == slow.compose(fields, {}).resolved


def test_a_script_lowers_to_the_sft_config(composer: Composer) -> None:
    report, cfg = lower_sft(
        [*SCRIPT_FIELDS, "model.lora_rank=8", "optim.optimizer=SGD"],
        case_id="sft-script",
        composer=composer,
    )
    assert report.accepted
    assert (cfg.data.train_batch_size, cfg.data.max_token_len, cfg.data.micro_batch_size) == (
        256,
        8192,
        None,
    )
    assert (cfg.model.lora_rank, cfg.optimizer, cfg.optim.lr) == (8, "SGD", 1e-4)
    assert "data.train_files" in cfg.bindings and "engine.strategy" in cfg.lowered
    assert cfg.lowered_values["data.micro_batch_size_per_gpu"] == 4
    assert type(cfg).from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (["data.pad_mode=right"], "data.pad_mode='right' is not supported"),
        (["engine=megatron", "optim=megatron"], "engine.tensor_model_parallel_size: unknown"),
        (["model.lora_adapter_path=/a"], "model.lora_adapter_path='/a' is not supported"),
        (["+engine.new_knob=1"], "engine.new_knob: unknown field"),
        (
            ["data.use_dynamic_bsz=false", "data.train_batch_size=6"],
            "do not split into micro-batches of 4",
        ),
    ],
)
def test_the_compile_gate_refuses(composer: Composer, fields: list[str], reason: str) -> None:
    composition = compose_sft(fields, composer=composer)
    report = compile_sft(composition.mapping, case_id="sft-refused")
    assert not report.accepted and reason in report.reason, report.reason
    with pytest.raises(NotAccepted, match="rejected by profile"):
        sft_config(composition.mapping, report)


def test_after_each_epoch_frequencies_lower_as_verl_reads_them(composer: Composer) -> None:
    _, cfg = lower_sft(
        ["trainer.test_freq=after_each_epoch", "trainer.save_freq=after_each_epoch"],
        case_id="sft-epochs",
        composer=composer,
    )
    assert (cfg.trainer.save_freq, cfg.trainer.test_freq) == ("after_each_epoch",) * 2


def test_a_deprecated_warmup_style_still_picks_the_schedule(composer: Composer) -> None:
    """verl's VLM SFT script sets optim.warmup_style=cosine; FSDPOptimizerConfig copies it."""
    _, cfg = lower_sft(["optim.warmup_style=cosine"], case_id="sft-style", composer=composer)
    assert cfg.optim.lr_scheduler_type == "cosine"
