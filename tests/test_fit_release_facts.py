"""The forecast follows the release it is asked for.

Each supported release's memory facts (``data/releases/<version>/memory.yaml``: what its code
decides where no configuration key does) are found in that release's own files at the lines
they cite; the ones the forecast computes with are checked against the release's own functions
in its own environment; and ``fit`` on one script gives each release's parts: the unsharded
gradients where the release's tree defers gradient sync, the temperature's copy of the logits
where its code makes one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from corpus_facts import needs_release, release_ready, release_root
from release_python import run_in_release

from pytest_verl_compat import cli
from pytest_verl_compat.memory.layout import micro_batches
from pytest_verl_compat.memory.release_facts import (
    TEMPERATURE_COPY,
    VALUES,
    ReleaseFactsError,
    facts_from_mapping,
    installed_root,
    release_facts,
)
from pytest_verl_compat.releases.index import RELEASE_DATA, load_release_index

RELEASES = load_release_index().supported_versions
NO_SYNC = "use_no_sync_for_gradient_accumulation"


@pytest.mark.parametrize("version", RELEASES)
def test_every_supported_release_has_its_memory_facts(version: str) -> None:
    facts = release_facts(version)
    assert facts.release == version
    assert set(VALUES) <= set(facts.facts)
    for name, fact in facts.facts.items():
        assert fact.means and fact.where and fact.statement, f"{name} [{version}]"


@pytest.mark.parametrize(
    ("version", "name"),
    [(v, n) for v in RELEASES for n in sorted(release_facts(v).facts)],
)
def test_each_fact_is_the_statement_at_its_lines_of_its_release(version: str, name: str) -> None:
    """The cited lines of the release's own files hold the statement that makes the fact true
    (what ``release derive VERSION --only memory-facts`` checks too)."""
    fact = release_facts(version).facts[name]
    installed = installed_root(version)
    if fact.cites_metadata and installed is None:
        pytest.skip(f"the environment of verl {version} is not built (its METADATA is there)")
    assert fact.found_in(release_root(version), installed), (
        f"statement={fact.statement!r}, but should be at {fact.where} of verl {version} [{name}]"
    )


def test_facts_that_are_not_what_the_forecast_reads_are_one_line(tmp_path: Path) -> None:
    raw = yaml.safe_load((RELEASE_DATA / RELEASES[0] / "memory.yaml").read_text())
    raw["facts"][TEMPERATURE_COPY]["value"] = "sometimes"
    with pytest.raises(ReleaseFactsError, match="temperature_copy is 'sometimes'; expected one"):
        facts_from_mapping(raw, "memory.yaml")
    with pytest.raises(ReleaseFactsError, match="has no memory facts"):
        release_facts("0.0.1")


# (sequences on one rank, tokens each, token budget x Ulysses size): equal lengths, as the
# forecast assumes; some where a balanced split of ceil(tokens / budget) overshoots the budget
PARTITIONS = [
    (31, 1000, 1500),
    (640, 3072, 24000),
    (100, 1536, 24000),
    (16, 1536, 24576),
    (9, 700, 2000),
]
_UPSTREAM_PARTITION = """
import torch
from tensordict import TensorDict
from verl.utils.seqlen_balancing import rearrange_micro_batches

result = []
for count, seq, budget in {cases}:
    ids = torch.nested.as_nested_tensor(
        [torch.ones(seq, dtype=torch.long) for _ in range(count)], layout=torch.jagged
    )
    parts, _ = rearrange_micro_batches(TensorDict({{"input_ids": ids}}, batch_size=[count]), budget)
    result.append([len(parts), max(len(p) for p in parts) * seq])
"""


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_dynamic_micro_batches_are_the_releases_own(version: str) -> None:
    """The number of micro-batches and the tokens of the largest, for sequences of one length,
    as the release's own rearrange_micro_batches splits them (its dynamic_micro_batches fact)."""
    if not release_ready(version):
        pytest.skip(f"the environment of verl {version} is not built")
    upstream = run_in_release(_UPSTREAM_PARTITION.format(cases=PARTITIONS), version)
    within = release_facts(version).partitions_within_budget
    forecast = [
        list(micro_batches(True, budget, 1, count, seq, 1, within))
        for count, seq, budget in PARTITIONS
    ]
    assert forecast == upstream, f"partitions={forecast}, but should be {upstream} [{version}]"


# (sequences on one rank, micro-batch size): more sequences than the size, fewer, as many
STATIC_SPLITS = [(31, 4), (8, 256), (4, 8), (64, 64)]
_UPSTREAM_STATIC = """
import torch
from verl import DataProto

result = []
for count, size in {cases}:
    parts = DataProto.from_dict(tensors={{"x": torch.zeros(count, 1)}}).split(size)
    result.append([len(parts), max(len(p) for p in parts)])
"""


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_static_micro_batches_hold_at_most_the_ranks_sequences(version: str) -> None:
    """A static micro-batch larger than the sequences a rank has holds those sequences only, as the
    release's own DataProto.split chunks them (a launch with a small train_batch_size and an
    example's micro-batch of 256 was forecast at 256 sequences, thousands of GiB)."""
    if not release_ready(version):
        pytest.skip(f"the environment of verl {version} is not built")
    upstream = run_in_release(_UPSTREAM_STATIC.format(cases=STATIC_SPLITS), version)
    within = release_facts(version).partitions_within_budget
    forecast = [
        list(micro_batches(False, 0, size, count, 1, 1, within)) for count, size in STATIC_SPLITS
    ]
    assert forecast == upstream, f"splits={forecast}, but should be {upstream} [{version}]"


_UPSTREAM_SCALE = """
import torch
from verl.workers.engine.fsdp import transformer_impl as impl

logits = torch.ones(3, 5)
scale = getattr(impl, "_scale_logits_by_temperature", None)
unit = getattr(impl, "_is_scalar_unit_temperature", None)
result = None if scale is None else [
    scale(logits, torch.tensor([t]), is_unit_temperature=unit(t)) is logits for t in (1.0, 0.7)
]
"""


@pytest.mark.slow
@pytest.mark.parametrize("version", RELEASES)
def test_the_temperature_copy_is_the_releases_own(version: str) -> None:
    """A release that skips the copy at a scalar 1.0 hands the model's logits on as they are, and
    divides into a new tensor at another temperature; a release that always copies has no such
    skip in its engine."""
    if not release_ready(version):
        pytest.skip(f"the environment of verl {version} is not built")
    kept = run_in_release(_UPSTREAM_SCALE, version)
    how = release_facts(version).temperature_copy
    if how == "unless-unit":
        assert kept == [True, False], kept
    else:
        assert kept is None, f"verl {version} has the unit-temperature skip, but its fact is {how}"


def _tree_default(version: str) -> Any:
    tree = release_root(version) / "verl" / "trainer" / "config" / "engine" / "fsdp.yaml"
    return (yaml.safe_load(tree.read_text(encoding="utf-8")) or {}).get(NO_SYNC, True)


def _fit_json(script: Path, version: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    status = cli.main(
        ["fit", str(script), "--gpu", "H100", "--release", version, "--format", "json"]
    )
    out, err = capsys.readouterr()
    assert status in (0, 1), err
    assert f"forecast for verl {version}" in err
    payload: dict[str, Any] = json.loads(out)
    return payload


def _actor_update(payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    for rank in payload["ranks"]:
        for phase in rank["phases"]:
            if phase["phase"] == "actor-update":
                return {part["key"]: part for part in phase["parts"]}
    raise AssertionError("no actor update")


@pytest.mark.parametrize("version", RELEASES)
@needs_release()
def test_fit_gives_each_release_its_own_parts(
    version: str, upstream_checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same script, forecast for each release: unsharded gradients between micro-batches
    where its tree defers gradient sync (0.9.0's code always does: a missing key reads as
    upstream's default), the logits' temperature copy where its code makes one, each part
    citing the release's own lines."""
    script = upstream_checkout / "examples" / "grpo_trainer" / "run_qwen3_8b_fsdp.sh"
    payload = _fit_json(script, version, capsys)
    assert payload["release"]["version"] == version
    parts = _actor_update(payload)
    assert ("actor.accumulated" in parts) == bool(_tree_default(version)), sorted(parts)
    facts = release_facts(version)
    logits = parts["actor.logits"]
    copied = facts.temperature_copy == "always"  # the example samples at temperature 1.0
    assert ("no temperature copy" not in logits["formula"]) == copied, logits["formula"]
    assert facts.evidence(TEMPERATURE_COPY) in logits["evidence"]
    assert "changed in" not in json.dumps(payload), "a part cites lines its release changed"


@pytest.mark.parametrize("version", RELEASES)
@needs_release()
def test_the_vllm_a_release_pins_is_the_one_its_environment_requires(version: str) -> None:
    """The ``vllm_cuda_graphs`` fact cites the release's METADATA (its vllm extra's pin); the
    release's own installed distribution requires the same (importlib.metadata, in its
    environment)."""
    from pytest_verl_compat.memory.release_facts import VLLM_CUDA_GRAPHS

    fact = release_facts(version).facts[VLLM_CUDA_GRAPHS]
    assert fact.where.startswith(f"verl-{version}.dist-info/METADATA:")
    assert fact.found_in(release_root(version), installed_root(version))
    assert not fact.found_in(release_root(version)), "METADATA is its environment's, not its tree's"
    requires = run_in_release(
        "import importlib.metadata as m\nresult = m.requires('verl')", version
    )
    assert fact.statement.removeprefix("Requires-Dist: ") in requires, requires
    # vLLM's envs.py defaults VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS to "1" from 0.21.0 (read in
    # the wheels of 0.18.0, 0.21.0 and 0.24.0): the version the release pins, or the least it
    # accepts, decides the fact's value
    pinned = re.search(r"vllm(?:==|>=)(\d+)\.(\d+)\.(\d+)", fact.statement)
    assert pinned is not None, fact.statement
    at_least_0_21 = tuple(int(g) for g in pinned.groups()) >= (0, 21, 0)
    assert fact.value == ("inside-share" if at_least_0_21 else "outside-share")


@pytest.mark.parametrize("version", RELEASES)
@needs_release()
def test_fit_puts_vllms_cuda_graphs_where_the_releases_vllm_does(
    version: str, upstream_checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Outside the gpu_memory_utilization share with 0.9.0's vLLM 0.18 (the awake server holds
    share + graphs), inside it with 0.9.1's vLLM 0.24 (the KV cache is smaller by them)."""
    script = upstream_checkout / "examples" / "grpo_trainer" / "run_qwen3_8b_fsdp.sh"
    payload = _fit_json(script, version, capsys)
    server = payload["rollout_kv_cache"]
    inside = release_facts(version).vllm_graphs_in_share
    assert server["cuda_graphs"] > 0
    assert server["outside_share"] == (0 if inside else server["cuda_graphs"])
    assert server["claimed"] == server["share"] + server["outside_share"]


@pytest.mark.parametrize("version", RELEASES)
def test_a_fact_whose_statement_moved_is_not_found(version: str) -> None:
    """A fact cited at lines that do not hold its statement is not found there: ``release derive
    VERSION`` then lists it as needing a person, never forecasts with it silently."""
    import dataclasses

    fact = release_facts(version).facts[TEMPERATURE_COPY]
    file, lines = fact.where.rsplit(":", 1)
    start = int(lines.split("-")[0])
    moved = dataclasses.replace(fact, where=f"{file}:{start + 400}")
    assert fact.found_in(release_root(version))
    assert not moved.found_in(release_root(version))


def test_the_log_prob_gradient_goes_into_the_saved_logits_only_without_entropy() -> None:
    """A release whose engine asks flash-attn's cross entropy for its gradient in place (unless
    the pass takes the entropy) holds one tensor fewer in an update without entropy; with the
    entropy, or in a class of releases whose gradient is always a new tensor, it is held."""
    import dataclasses

    from pytest_verl_compat.memory.activations import logits_cost
    from pytest_verl_compat.memory.release_facts import LOGPROB_BACKWARD, Fact, ReleaseFacts

    facts = release_facts("0.9.0")
    assert facts.logprob_grad_in_place
    new = dict(facts.facts)
    new[LOGPROB_BACKWARD] = dataclasses.replace(facts.facts[LOGPROB_BACKWARD], value="new-tensor")
    other = ReleaseFacts("a class", new)
    assert not other.logprob_grad_in_place
    assert isinstance(new[LOGPROB_BACKWARD], Fact)

    def copies(entropy: bool, in_place: bool, scaled: bool) -> float:
        return logits_cost(True, entropy, False, False, True, scaled, in_place).copies

    # no entropy: the saved logits hold the gradient; after the division's backward, two
    assert copies(False, True, False) == 1 and copies(False, False, False) == 2
    assert copies(False, True, True) == 2 and copies(False, False, True) == 2
    # the entropy needs the saved logits intact: its gradient and the cross entropy's are new
    assert copies(True, True, False) == copies(True, False, False) == 3
    assert copies(True, True, True) == 3


@pytest.mark.parametrize(
    ("version", "key"),
    [(v, k) for v in RELEASES for k in sorted(release_facts(v).tree_keys)],
)
def test_each_tree_key_is_the_value_at_its_line_of_its_releases_tree(
    version: str, key: str
) -> None:
    """A release's ``tree_keys`` (keys its tree gives a value where an earlier release's code
    decided alone) hold the line of its own config tree that gives it, and that value."""
    fact = release_facts(version).tree_keys[key]
    assert fact.found_in(release_root(version)), f"{fact.statement!r} not at {fact.where}"
    tree = yaml.safe_load((release_root(version) / fact.where.split(":")[0]).read_text())
    assert tree[key] == fact.value


def _findings(payload: dict[str, Any], phase: str) -> dict[str, Any]:
    return next(f for f in payload["findings"] if f["phase"] == phase)


@needs_release()
def test_a_run_that_only_the_releases_deferred_sync_sinks_names_the_release_that_syncs(
    upstream_checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """verl 0.9.0's engine keeps every gradient unsharded between micro-batches, with no key to
    stop it (transformer_impl.py:683-698), so no fix of its keys saves a 32B run on 16 H100s;
    0.9.1's tree syncs every micro-batch. The finding names 0.9.1 with the phase without the
    unsharded gradients, the rest as 0.9.0 has it; the release forecast on its own tree gives no
    such remedy, and neither does a phase of 0.9.0 without them (its Megatron engine)."""
    from importlib import resources

    import jsonschema

    schema = json.loads(
        resources.files("pytest_verl_compat").joinpath("data/fit.schema.json").read_text()
    )
    script = upstream_checkout / "examples" / "grpo_trainer" / "run_qwen2_5_32b_fsdp.sh"
    payload = _fit_json(script, "0.9.0", capsys)
    jsonschema.validate(payload, schema)
    finding = _findings(payload, "actor-update")
    parts = _actor_update(payload)
    phase_total = sum(part["bytes"] for part in parts.values())
    remedy = finding["release_remedy"]
    assert remedy == {
        "release": "0.9.1",
        "key": NO_SYNC,
        "value": False,
        "evidence": "verl/trainer/config/engine/fsdp.yaml:61@0.9.1",
        "after_bytes": phase_total - parts["actor.accumulated"]["bytes"],
        "phase_fits": True,
        "fits": True,
    }
    assert all(not fix["phase_fits"] for fix in finding["fixes"]), finding["fixes"]
    assert cli.main(["fit", str(script), "--gpu", "H100", "--release", "0.9.0"]) == 1
    assert "on verl 0.9.1 (use_no_sync_for_gradient_accumulation: false" in capsys.readouterr().out
    if release_ready("0.9.1"):
        later = _fit_json(script, "0.9.1", capsys)
        assert all("release_remedy" not in f for f in later["findings"])
    megatron = upstream_checkout / "examples" / "grpo_trainer" / "run_qwen3_8b_megatron.sh"
    other = _fit_json(megatron, "0.9.0", capsys)
    assert _findings(other, "actor-update")["level"] == "error"
    assert all("release_remedy" not in f for f in other["findings"])
    # the SFT trainer's engine defers the same way: its update without the unsharded gradients
    sft = upstream_checkout / "examples" / "sft" / "gsm8k" / "run_qwen3_8b_fsdp.sh"
    args = ["fit", str(sft), "--arg", "8", "--arg", "/tmp/save", "--gpu", "A100-40GB"]
    args += ["--set", "model.lora_rank=0", "--set", "model.path=Qwen/Qwen2.5-14B-Instruct"]
    assert cli.main([*args, "--release", "0.9.0", "--format", "json"]) == 1
    payload = json.loads(capsys.readouterr().out)
    update = next(p for r in payload["ranks"] for p in r["phases"] if p["phase"] == "sft-update")
    accumulated = next(p["bytes"] for p in update["parts"] if p["key"].endswith(".accumulated"))
    remedy = _findings(payload, "sft-update")["release_remedy"]
    assert remedy["after_bytes"] == update["total_bytes"] - accumulated > 0
