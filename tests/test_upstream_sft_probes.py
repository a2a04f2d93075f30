"""The SFT trainer's own checks, run by the oracle: each class of mistake upstream catches, from a
composed ``sft_trainer_engine`` mapping and torchrun's world size, next to its near-identical valid
twin (issue 30).

Every example is asked of one oracle process (verl imported once for the module) through
``early_answer`` with ``entry=verl.trainer.sft_trainer``: a failure names the configuration key
its failing statement read, upstream's message and file:line, and the phase; a value the config
dataclasses' annotations refuse is a type record; a key another key decides is without effect.
The twin differs by one value and stays clean.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from corpus_facts import needs_release, release_root
from hostile_canary import Canary

from pytest_verl_compat.model import Bindings
from pytest_verl_compat.pipeline.audit import AuditSession
from pytest_verl_compat.pipeline.entry_points import SFT_ENTRY_MODULE
from pytest_verl_compat.pipeline.sft import compose_sft
from pytest_verl_compat.upstream.oracle.client import ENTRY_MODULE, UpstreamOracle, checks_request
from pytest_verl_compat.upstream.verdict.early import (
    ChecksQuestion,
    EarlyAnswer,
    cache_key,
    early_answer,
    upstream_gate,
)

pytestmark = needs_release()

MODEL = "model.path=Qwen/Qwen2.5-0.5B-Instruct"
WORLD = 8


@pytest.fixture(scope="module")
def session(upstream_session: AuditSession) -> AuditSession:
    return upstream_session


def explicit_of(overrides: Sequence[str]) -> list[str]:
    return [field.split("=", 1)[0].lstrip("+~") for field in overrides]


def ask(
    session: AuditSession,
    oracle: UpstreamOracle,
    overrides: Sequence[str],
    world: int | None = WORLD,
    base: Sequence[str] = ("engine=fsdp", MODEL),
) -> EarlyAnswer:
    """The SFT probes' answer on ``sft_trainer_engine`` composed with ``base`` (the FSDP engine,
    a model) and ``overrides``."""
    composition = compose_sft([*base, *overrides])
    assert composition.composed, composition.reason
    tree = upstream_gate(session).tree
    assert tree is not None
    question = ChecksQuestion(
        composition.mapping, tuple(explicit_of(overrides)), SFT_ENTRY_MODULE, world
    )
    return early_answer(session, question, tree, None, oracle)


def errors_at(answer: EarlyAnswer, key: str) -> list[str]:
    """Each failure naming ``key``, as ``phase | message | where``."""
    return [
        f"{failure.phase} | {failure.message} | {failure.where}"
        for failure in answer.failures
        if key in failure.keys
    ]


def clean(answer: EarlyAnswer, explicit: Sequence[str], version: str) -> list[str]:
    found = [f"{f.phase}: {f.message} ({f.where})" for f in answer.failures]
    found += [f.line() for f in answer.type_findings(version, explicit)]
    found += [f.line() for f in answer.effect_findings(version)]
    return found


# (world size, the mistake, the key its failure names, words of upstream's message, the phase it
# fails in, the valid twin): one per class of mistake the SFT trainer's own code catches.
FAILURES = {
    # FSDPEngineConfig.__post_init__ (verl/workers/config/engine.py:304)
    "dataclass-refusal": (
        WORLD,
        ("engine.strategy=fsdp3",),
        "engine.strategy",
        "strategy fsdp3 not supported",
        "config load",
        ("engine.strategy=fsdp2",),
    ),
    # SFTTrainer._validate_profiler_interval (verl/trainer/sft_trainer.py:155)
    "profiler-interval": (
        WORLD,
        ("trainer.profile_interval=[5,2]",),
        "trainer.profile_interval",
        "AssertionError",
        "config load",
        ("trainer.profile_interval=[2,5]",),
    ),
    # train_batch_size // dp_size is 0 on 16 ranks: the loader refuses (sft_trainer.py:241-244)
    "batch-per-rank": (
        16,
        ("data.train_batch_size=8",),
        "data.train_batch_size",
        "batch_size=0",
        "trainer init",
        ("data.train_batch_size=16",),
    ),
    # 256 // 8 = 32 rows per rank in micro-batches of 3 (verl/workers/engine/utils.py:125)
    "micro-batches": (
        WORLD,
        ("data.use_dynamic_bsz=false", "data.micro_batch_size_per_gpu=3"),
        "data.micro_batch_size_per_gpu",
        "divisible",
        "first update",
        ("data.use_dynamic_bsz=false", "data.micro_batch_size_per_gpu=4"),
    ),
    # a (dp, sp) mesh of 2 x 3 is not 8 ranks (transformer_impl.py:228, torch's device mesh)
    "sequence-parallel-world": (
        WORLD,
        ("engine.ulysses_sequence_parallel_size=3",),
        "engine.ulysses_sequence_parallel_size",
        "world size 8",
        "trainer init",
        ("engine.ulysses_sequence_parallel_size=2",),
    ),
    # Ulysses needs the unpadded layout (transformer_impl.py:129-133)
    "sequence-parallel-padding": (
        WORLD,
        ("engine.ulysses_sequence_parallel_size=2", "model.use_remove_padding=false"),
        "model.use_remove_padding",
        "use_remove_padding",
        "trainer init",
        ("engine.ulysses_sequence_parallel_size=2", "model.use_remove_padding=true"),
    ),
    # HFModelConfig.__post_init__ (verl/workers/config/model.py:256)
    "lora-target-modules": (
        WORLD,
        ("model.lora_rank=32", "model.target_modules=[q_proj,7]"),
        "model.target_modules",
        "must be strings",
        "config load",
        ("model.lora_rank=32", "model.target_modules=[q_proj,v_proj]"),
    ),
    # the trainer's LoRA metadata (sft_trainer.py:118) and peft's scaling
    "lora-alpha": (
        WORLD,
        ("model.lora_rank=32", "model.lora_alpha=sixteen"),
        "model.lora_alpha",
        "invalid literal for int()",
        "trainer init",
        ("model.lora_rank=32", "model.lora_alpha=16"),
    ),
    # a 1024-token row does not fit a 512-token budget (verl/utils/seqlen_balancing.py:384);
    # sequence parallel multiplies the budget (engine/utils.py:111), so 512 x 2 holds it
    "token-budget": (
        WORLD,
        ("data.max_token_len_per_gpu=512",),
        "data.max_token_len_per_gpu",
        "max_token_len must be greater than the sequence length",
        "first update",
        ("data.max_token_len_per_gpu=512", "engine.ulysses_sequence_parallel_size=2"),
    ),
    # CheckpointHandler._determine_resume_path (verl/utils/checkpoint/checkpoint_handler.py:216)
    "resume-path-step": (
        WORLD,
        ("trainer.resume_mode=resume_path", "trainer.resume_from_path=/ckpt/latest"),
        "trainer.resume_from_path",
        "must specify the global_steps",
        "trainer init",
        ("trainer.resume_mode=resume_path", "trainer.resume_from_path=/ckpt/global_step_40"),
    ),
    # checkpoint_handler.py:219
    "resume-mode": (
        WORLD,
        ("trainer.resume_mode=latest",),
        "trainer.resume_mode",
        "Invalid resume_mode",
        "trainer init",
        ("trainer.resume_mode=disable",),
    ),
    # the FSDP engine takes the no-padding layout only (transformer_impl.py:1137)
    "pad-mode": (
        WORLD,
        ("data.pad_mode=right",),
        "data.pad_mode",
        "pad_mode right not supported",
        "first update",
        ("data.pad_mode=no_padding",),
    ),
}


@pytest.mark.parametrize("name", sorted(FAILURES))
def test_an_sft_mistake_upstream_catches_names_its_key_and_the_twin_is_clean(
    name: str, session: AuditSession, oracle: UpstreamOracle
) -> None:
    world, fires, key, words, phase, twin = FAILURES[name]
    bad = ask(session, oracle, fires, world)
    named = errors_at(bad, key)
    assert named, f"no failure names {key}: {[f.describe() for f in bad.failures]}"
    assert any(words in line for line in named), named
    assert any(line.startswith(phase) for line in named), named
    assert all(f.where.startswith("verl/") and f.where.rpartition(":")[2] for f in bad.failures)
    assert (bad.verdict == "fails") == (phase == "config load"), bad.verdict
    good = ask(session, oracle, twin, world)
    assert good.verdict == "passes"
    assert not clean(good, explicit_of(twin), session.pin.version)


def test_a_value_the_annotation_refuses_is_a_type_record_and_its_twin_is_clean(
    session: AuditSession, oracle: UpstreamOracle
) -> None:
    """FSDPOptimizerConfig.lr: float (verl/workers/config/optimizer.py); Hydra checks no type."""
    version = session.pin.version
    bad = ask(session, oracle, ("optim.lr=fast",))
    typed = bad.type_findings(version, ["optim.lr"])
    assert [f.path for f in typed] == ["optim.lr"] and "'fast'" in typed[0].message
    good = ask(session, oracle, ("optim.lr=2e-5",))
    assert not clean(good, ["optim.lr"], version)


# (the mistake, the key without effect, the twin where it acts)
WITHOUT_EFFECT = {
    # a constant schedule has no floor (fsdp/transformer_impl.py:484-515)
    "min-lr-under-constant": (
        ("optim.min_lr_ratio=0.1",),
        "optim.min_lr_ratio",
        ("optim.min_lr_ratio=0.1", "optim.lr_scheduler_type=cosine"),
    ),
    # _init_engine sets the optimizer's horizon (sft_trainer.py:181-185)
    "horizon-is-the-trainers": (
        ("optim.total_training_steps=100",),
        "optim.total_training_steps",
        ("trainer.total_training_steps=100",),
    ),
}


@pytest.mark.parametrize("name", sorted(WITHOUT_EFFECT))
def test_a_key_another_decides_is_without_effect_and_its_twin_acts(
    name: str, session: AuditSession, oracle: UpstreamOracle
) -> None:
    fires, key, twin = WITHOUT_EFFECT[name]
    version = session.pin.version
    found = [f for f in ask(session, oracle, fires).effect_findings(version) if f.path == key]
    assert found and found[0].level == "warning", found
    assert not clean(ask(session, oracle, twin), explicit_of(twin), version)


def test_the_users_modules_adapters_and_checkpoints_are_never_imported_or_read(
    session: AuditSession, oracle: UpstreamOracle, canary: Canary, tmp_path: Path
) -> None:
    """A custom data set class, an external library, a LoRA adapter and a checkpoint to resume:
    looked up by name as upstream does, never imported or read; each a note, not a finding."""
    module = tmp_path / "evil_dataset.py"
    module.write_text(f"{canary.python}\nclass Evil:\n    pass\n")
    (tmp_path / "evil_lib.py").write_text(f"{canary.python}\n")
    answer = ask(
        session,
        oracle,
        (
            f"data.custom_cls.path={module}",
            "data.custom_cls.name=Evil",
            "model.external_lib=evil_lib",
            "model.lora_rank=8",
            f"model.lora_adapter_path={tmp_path}",
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={tmp_path}/global_step_1",
        ),
    )
    assert not canary.fired()
    assert not answer.failures, [f.describe() for f in answer.failures]
    assert len(answer.not_evaluated) >= 3, answer.not_evaluated


def test_the_question_is_main_ppos_unless_another_entry_point_is_named() -> None:
    """main_ppo's question and key are what they always were, whatever world size is given (its
    world is its configuration's); the SFT trainer's carry the entry point and the world."""
    mapping = {"data": {"train_batch_size": 8}}
    plain = checks_request(mapping, explicit=["data.train_batch_size"])
    assert plain == {"kind": "checks", "mapping": mapping, "explicit": ["data.train_batch_size"]}
    assert checks_request(mapping, explicit=["data.train_batch_size"], entry=ENTRY_MODULE) == plain
    assert "world_size" not in checks_request(mapping, entry=ENTRY_MODULE, world_size=8)
    sft = checks_request(mapping, entry=SFT_ENTRY_MODULE, world_size=8)
    assert (sft["entry"], sft["world_size"]) == (SFT_ENTRY_MODULE, 8)
    keys = {
        cache_key("0.9.0", "t", mapping),
        cache_key("0.9.0", "t", mapping, entry=ENTRY_MODULE, world_size=8),
    }
    assert len(keys) == 1
    assert cache_key("0.9.0", "t", mapping, entry=SFT_ENTRY_MODULE, world_size=8) not in keys
    assert cache_key("0.9.0", "t", mapping, entry=SFT_ENTRY_MODULE, world_size=8) != cache_key(
        "0.9.0", "t", mapping, entry=SFT_ENTRY_MODULE, world_size=16
    )
    with pytest.raises(ValueError, match="no upstream checks"):
        checks_request(mapping, entry="verl.trainer.main_eval")


def test_never_read_is_scoped_to_the_sft_entry_points_modules() -> None:
    """Names only the RL trainers' modules read are not read on the SFT path: the scan follows
    the SFT entry point's imports, not the whole package."""
    from pytest_verl_compat.upstream.probes.effects import referenced_names
    from pytest_verl_compat.upstream.probes.sft.effects import (
        SFT_ENTRY,
        entry_files,
        referenced_on_path,
    )

    root = release_root() / "verl"
    files = {path.relative_to(root).as_posix() for path in entry_files(root, SFT_ENTRY)}
    assert "trainer/sft_trainer.py" in files and "workers/engine/fsdp/transformer_impl.py" in files
    assert "trainer/main_ppo.py" not in files
    rl_only = referenced_names(root) - referenced_on_path(root, SFT_ENTRY)
    assert {"use_pf_ppo", "kl_ctrl"} <= rl_only


# The FSDP SFT examples of 0.9.0 as their usage lines run them: `<nproc_per_node> <save_path>`.
EXAMPLES = (
    "gsm8k/run_deepseek_coder_6_7b_fsdp.sh",
    "gsm8k/run_gemma_2b_fsdp.sh",
    "gsm8k/run_gemma_7b_fsdp.sh",
    "gsm8k/run_qwen2_5_0_5b_fsdp.sh",
    "gsm8k/run_qwen3_8b_fsdp.sh",
    "gsm8k/run_seed_oss_36b_fsdp.sh",
    "multiturn/run_qwen2_5_0_5b_fsdp.sh",
    "vlm/run_qwen3_vl_2b_fsdp.sh",
)


@pytest.mark.parametrize("script", EXAMPLES)
def test_the_fsdp_sft_examples_are_clean(
    script: str, session: AuditSession, oracle: UpstreamOracle, upstream_checkout: Path
) -> None:
    from pytest_verl_compat.bash import read_launch

    if "entry_modules" not in inspect.signature(read_launch).parameters:
        pytest.skip("this launch reader reads main_ppo launches only")
    reader: Any = read_launch  # the reader of any entry point (its signature is newer)
    bindings = Bindings(variables={"HOME": "/root", "PWD": "/work"}, args=("8", "/tmp/ckpt"))
    read = reader(
        upstream_checkout / "examples" / "sft" / script,
        bindings,
        entry_modules=lambda module: module == SFT_ENTRY_MODULE,
    )
    assert read.world_size == 8, read.world_size_reason
    answer = ask(session, oracle, read.argv, read.world_size, base=())
    assert answer.verdict == "passes"
    assert not clean(answer, explicit_of(read.argv), session.pin.version)
