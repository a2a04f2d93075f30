"""What verl hands SGLang: the actor's LoRA adapter (``rollout.sglang-lora``) and the attention
backend (``rollout.sglang-attention``).

What each release hands SGLang is its own server code, run in its environment: derived there
again and equal to the shipped record, each statement at its line of the release's files. The
check then fires, per release, exactly on the values SGLang (or verl itself) refuses at the
server's start, and stays quiet on their near-identical valid twins: 0.9.0 hands
``target_modules`` on as written (a string, ``all-linear`` included, is refused by SGLang) and
the rank from ``lora_rank`` only; 0.9.1 translates ``all-linear`` and refuses a pattern or null.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from check_findings import findings, manifest_case, model_folder
from corpus_facts import release_root, skip_unless_built

from pytest_verl_compat.checks.lora import served_rank_spelling
from pytest_verl_compat.checks.sglang_lora import target_class
from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
from pytest_verl_compat.releases.index import load_release_index
from pytest_verl_compat.releases.sglang_server import PROBE, sglang_server, sglang_server_path
from pytest_verl_compat.upstream.oracle.runner import release_runner

RELEASES = load_release_index().supported_versions
RULE = "rollout.sglang-lora"
MODEL = "actor_rollout_ref.model"
SGLANG = "actor_rollout_ref.rollout.name=sglang"
RANK = f"{MODEL}.lora_rank=8"
TARGETS = f"{MODEL}.target_modules"


@pytest.mark.parametrize("version", RELEASES)
def test_the_shipped_record_is_derived_again_in_the_release_environment(version: str) -> None:
    skip_unless_built(version)
    run = release_runner(version)(PROBE)
    assert run.returncode == 0, run.stderr_tail(20)
    assert json.loads(run.stdout) == json.loads(sglang_server_path(version).read_text())


@pytest.mark.parametrize("version", RELEASES)
def test_each_statement_is_at_its_line_of_the_release(version: str) -> None:
    record = sglang_server(version)
    assert record is not None
    for read in (record.rank.read, record.targets.read, record.attention):
        file, _, line = read.where.rpartition(":")
        lines = (release_root(version) / file).read_text(encoding="utf-8").splitlines()
        assert lines[int(line) - 1].strip() == read.statement, read
    assert record.sglang  # the sglang extra's pin


@pytest.fixture(scope="module")
def sessions(upstream_session: AuditSession) -> dict[str, AuditSession]:
    return {
        version: upstream_session
        if version == upstream_session.pin.version
        else AuditSession.start(AuditOptions(release=version))
        for version in RELEASES
    }


def _fired(session: AuditSession, *overrides: str) -> list[str]:
    found = findings(session, manifest_case(session, "grpo"), *overrides)
    return sorted(f.split(": ", 1)[0] for f in found if f"[{RULE}]" in f or "hands SGLang" in f)


TARGET = f"error:{TARGETS}"
# (overrides, the findings on 0.9.0, on 0.9.1): each key a finding names.
CASES = {
    "all-linear (the default)": ((SGLANG, RANK), [TARGET], []),
    "a pattern": ((SGLANG, RANK, f"{TARGETS}=.*_proj"), [TARGET], [TARGET]),
    "null": ((SGLANG, RANK, f"{TARGETS}=null"), [TARGET], [TARGET]),
    "a list": ((SGLANG, RANK, f"{TARGETS}=[q_proj,v_proj]"), [], []),
    "the Megatron spelling": (
        (SGLANG, f"{MODEL}.lora.rank=8", f"{TARGETS}=[q_proj,v_proj]"),
        [f"error:{MODEL}.lora.rank"],
        [],
    ),
    "both spellings": (
        (SGLANG, RANK, f"{MODEL}.lora.rank=8", f"{TARGETS}=[q_proj,v_proj]"),
        [],
        [],
    ),
    "merged into the weights": ((SGLANG, RANK, f"{MODEL}.lora.merge=True"), [], []),
    "vLLM": ((RANK,), [], []),
    "no LoRA": ((SGLANG,), [], []),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("version", RELEASES)
def test_fires_where_the_release_and_sglang_refuse_and_not_on_the_twins(
    sessions: dict[str, AuditSession], version: str, name: str
) -> None:
    overrides, on_090, on_091 = CASES[name]
    expected = {"0.9.0": on_090, "0.9.1": on_091}[version]
    assert _fired(sessions[version], *overrides) == expected


def test_a_finding_names_the_releases_own_line_and_what_is_refused(
    sessions: dict[str, AuditSession],
) -> None:
    (old,) = [
        f
        for f in findings(sessions["0.9.0"], manifest_case(sessions["0.9.0"], "grpo"), SGLANG, RANK)
        if "hands SGLang" in f
    ]
    assert "async_sglang_server.py:330@0.9.0" in old and "'all-linear'" in old
    assert "NotImplementedError" in old and "SGLang 0.5.8" in old
    pattern = f"{TARGETS}=.*proj"
    (new,) = [
        f
        for f in findings(
            sessions["0.9.1"], manifest_case(sessions["0.9.1"], "grpo"), SGLANG, RANK, pattern
        )
        if "hands SGLang" in f
    ]
    assert "async_sglang_server.py:349@0.9.1" in new
    assert "ValueError: SGLang cannot serve a regex `target_modules` ('.*proj')" in new


@pytest.mark.parametrize(
    ("value", "kind"),
    [("all-linear", "all-linear"), ("All-Linear", "pattern"), (None, "null"), (["q_proj"], "list")],
)
def test_a_value_is_of_the_class_the_record_renders(value: object, kind: str) -> None:
    assert target_class(value) == kind


@pytest.mark.parametrize(
    ("model", "spelling"),
    [
        ({"lora_rank": 8, "lora": {"rank": 0}}, "lora_rank"),
        ({"lora_rank": 0, "lora": {"rank": 8}}, "lora.rank"),
        ({"lora_rank": 8, "lora": {"rank": 8, "merge": True}}, None),
        ({"lora_rank": 0, "lora": {"rank": 0}}, None),
        ({"lora_rank": True}, None),
    ],
)
def test_the_adapter_is_served_as_verl_decides(
    model: dict[str, object], spelling: str | None
) -> None:
    assert served_rank_spelling(model) == spelling


def test_no_record_no_finding() -> None:
    assert sglang_server("0.0.0") is None


# --- the attention backend ----------------------------------------------------------------------

BACKEND = "actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend"
NAME_KEY = "actor_rollout_ref.rollout.name"


def _config(folder: Path, architecture: str, **extra: object) -> str:
    model = model_folder(folder, architecture, architectures=[architecture], **extra)
    return f"actor_rollout_ref.model.path={model}"


def _attention(session: AuditSession, *overrides: str) -> list[str]:
    found = findings(session, manifest_case(session, "grpo"), *overrides)
    return [
        f.split(": ", 1)[0] for f in found if "rollout server stops at start" in f and "SGLang" in f
    ]


# (architecture, its config's extra keys, overrides, the findings on 0.9.0, on 0.9.1)
ATTENTION = {
    "gpt-oss, verl's pick": ("GptOssForCausalLM", {}, (SGLANG,), [], [f"error:{NAME_KEY}"]),
    "gpt-oss, flashinfer named": (
        "GptOssForCausalLM",
        {},
        (SGLANG, f"+{BACKEND}=flashinfer"),
        [f"error:{BACKEND}"],
        [f"error:{BACKEND}"],
    ),
    "gpt-oss, triton named": ("GptOssForCausalLM", {}, (SGLANG, f"+{BACKEND}=triton"), [], []),
    "gpt-oss on vLLM": ("GptOssForCausalLM", {}, (), [], []),
    # not a backend's name: verl hands it on as it is, and this check does not judge it
    "gpt-oss, a number named": ("GptOssForCausalLM", {}, (SGLANG, f"+{BACKEND}=123"), [], []),
    "Olmo 2, verl's pick": ("Olmo2ForCausalLM", {}, (SGLANG,), [], [f"error:{NAME_KEY}"]),
    "Llama 4, verl's pick": (
        "Llama4ForConditionalGeneration",
        {},
        (SGLANG,),
        [],
        [f"error:{NAME_KEY}"],
    ),
    "Exaone 4 with sliding windows": (
        "Exaone4ForCausalLM",
        {"sliding_window_pattern": 4},
        (SGLANG,),
        [],
        [f"error:{NAME_KEY}"],
    ),
    "Exaone 4 without": ("Exaone4ForCausalLM", {}, (SGLANG,), [], []),
    "Qwen3, verl's pick": ("Qwen3ForCausalLM", {}, (SGLANG,), [], []),
}


@pytest.mark.parametrize("name", sorted(ATTENTION))
@pytest.mark.parametrize("version", RELEASES)
def test_an_attention_backend_sglang_refuses_for_the_architecture(
    sessions: dict[str, AuditSession], tmp_path: Path, version: str, name: str
) -> None:
    architecture, extra, overrides, on_090, on_091 = ATTENTION[name]
    model = _config(tmp_path, architecture, **extra)
    expected = {"0.9.0": on_090, "0.9.1": on_091}[version]
    assert _attention(sessions[version], model, *overrides) == expected


def test_without_the_models_config_nothing_is_said(sessions: dict[str, AuditSession]) -> None:
    assert _attention(sessions["0.9.1"], SGLANG) == []


def test_verls_pick_is_the_releases_own_for_its_sglang() -> None:
    picks = {version: sglang_server(version) for version in RELEASES}
    assert {v: (r.sglang, r.default_attention) for v, r in picks.items() if r} == {
        "0.9.0": ("0.5.8", "fa3"),
        "0.9.1": ("0.5.12", "flashinfer"),
    }


# A model named to --model-config that the shipped table knows carries its model_type, not its
# architectures: the check takes the class transformers builds for that model_type.
NAMED = {
    "gpt-oss by name, verl's pick": ("lmsys/gpt-oss-20b-bf16", (SGLANG,), [f"error:{NAME_KEY}"]),
    "gpt-oss by name, triton named": ("lmsys/gpt-oss-20b-bf16", (SGLANG, f"+{BACKEND}=triton"), []),
    "gpt-oss by name on vLLM": ("lmsys/gpt-oss-20b-bf16", (), []),
    "Qwen3 by name, verl's pick": ("Qwen/Qwen3-8B", (SGLANG,), []),
}


@pytest.mark.parametrize("name", sorted(NAMED))
def test_a_model_named_by_the_table_is_judged_by_its_model_types_class(name: str) -> None:
    from pytest_verl_compat.cli.common import given_model_facts

    model, overrides, expected = NAMED[name]
    session = AuditSession.start(AuditOptions(release="0.9.1"))
    session.model_facts_override = given_model_facts(model)
    assert session.model_facts_override.architecture is None  # the table has no architectures
    assert _attention(session, *overrides) == expected


def test_each_model_types_class_is_the_one_transformers_builds_for_it() -> None:
    from transformers.models.auto import modeling_auto

    from pytest_verl_compat.checks.sglang_attention import ACCEPTED, CLASS_OF_MODEL_TYPE

    mapped: dict[str, set[str]] = {}
    for name in dir(modeling_auto):
        mapping = getattr(modeling_auto, name)
        if name.endswith("_MAPPING_NAMES") and isinstance(mapping, dict):
            for model_type, classes in mapping.items():
                for cls in classes if isinstance(classes, tuple) else (classes,):
                    mapped.setdefault(model_type, set()).add(cls)
    refused = {a for rules in ACCEPTED.values() for rule in rules for a in rule.architectures}
    for model_type, cls in CLASS_OF_MODEL_TYPE.items():
        assert cls in mapped.get(model_type, set()), model_type
        assert cls in refused, cls
    # every refused class transformers names has its model_type here (one of them, for llama4)
    for cls in refused:
        types = {t for t, classes in mapped.items() if cls in classes}
        assert not types or types & set(CLASS_OF_MODEL_TYPE), cls
