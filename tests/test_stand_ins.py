"""Issue 46, class 6: the sandbox never accuses the user.

Each stand-in the probes put in upstream's place is checked against what it replaces, in every
supported release's own environment: the calls upstream makes that it must take (signatures), and
what upstream's own code sets that it must set (``ast`` of the replaced function and of what it
calls: ``LLMServerManager._init_global_load_balancer`` sets ``self.global_load_balancer``,
verl/workers/rollout/llm_server.py:600-611). The check runs the probes on configurations that
meet every stand-in (the FSDP and Megatron engines, a critic, the separate-async trainer and its
standalone replicas, the SFT trainer) and fails when upstream's class changes; and a failure a
stand-in causes is an ``info`` (not decided here), never an error: the issue's false alarm, made
again with the stand-in as it was, and its twin.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from corpus_facts import needs_release
from release_python import run_in_release

from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
from pytest_verl_compat.pipeline.manifest import (
    default_examples_path,
    default_manifest_path,
    load_examples,
    load_manifest,
)
from pytest_verl_compat.releases.index import load_release_index

SUPPORTED = load_release_index().supported_versions
ARR = "actor_rollout_ref"
# The separate-async trainer with its standalone rollout (trainer_separate_async.py:45-60 asserts).
SEPARATE_ASYNC = (
    "trainer.v1.trainer_mode=separate_async",
    f"{ARR}.rollout.checkpoint_engine.backend=nccl",
    f"{ARR}.rollout.nnodes=1",
    f"{ARR}.rollout.n_gpus_per_node=8",
    "trainer.v1.separate_async.parameter_sync_step=4",
)
MEGATRON = "examples/ppo_trainer/run_qwen3_8b_megatron"
SFT = "examples/sft/gsm8k/run_qwen2_5_0_5b_fsdp"
# The asynchronous trainers' own runners (probes/asynchronous.py), on launches of ours that
# compose on every supported release (verl 0.9.0's fully-async example does not on 0.9.1).
ASYNC_LAUNCHES = tuple(
    Path(__file__).resolve().parent / "data" / name
    for name in ("fully_async_grpo.sh", "one_step_off_grpo.sh")
)


def _questions(checkout: Path, version: str) -> list[dict[str, Any]]:
    """The configurations that meet every stand-in, composed on ``version``'s tree."""
    session = AuditSession.start(AuditOptions(upstream=str(checkout), release=version))
    assert session.manifest is not None
    examples = {
        case.id: case
        for case in load_examples(
            default_examples_path(), load_manifest(default_manifest_path()).bindings
        )
    }
    cases = [
        session.manifest.case("grpo"),
        session.manifest.case("ppo"),
        session.with_overrides(session.manifest.case("grpo"), SEPARATE_ASYNC),
        examples[MEGATRON],
        examples[SFT],
        *(session.case_for_script(script) for script in ASYNC_LAUNCHES),
    ]
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in cases:
            outcome = session.outcome(case)
            assert outcome.composition.composed, (case.id, outcome.composition.reason)
            out.append(
                {
                    "id": case.id,
                    "mapping": outcome.composition.mapping,
                    "module": outcome.fields.module,
                    "world": outcome.fields.world_size,
                }
            )
    return out


# In the release's environment: every probe on each configuration, every patch entered watched.
_CONTRACT = """
import json
from pytest_verl_compat.pipeline.entry_points import ASYNC_ENTRY_MODULES, SFT_ENTRY_MODULE
from pytest_verl_compat.upstream.probes import asynchronous, stand_ins
from pytest_verl_compat.upstream.probes.patching import patch_point, watching
from pytest_verl_compat.upstream.probes.phases import run_all
from pytest_verl_compat.upstream.probes.sft.phases import run_entry
from pytest_verl_compat.upstream.probes.validate import (
    install_stand_ins,
    validate_config_with_stand_ins,
)

install_stand_ins()
seen, failures, notes = [], {}, {}
for question in json.loads(QUESTIONS):
    with watching() as met:
        if question["module"] == SFT_ENTRY_MODULE:
            answer = run_entry(question["mapping"], question["world"])
        elif question["module"] in ASYNC_ENTRY_MODULES:
            answer = asynchronous.run_entry(question["mapping"], entry=question["module"])
        else:
            answer = run_all(question["mapping"], validate_config_with_stand_ins)
    seen += met
    failures[question["id"]] = [f["message"] for f in answer["failures"]]
    notes[question["id"]] = [
        n for n in answer.get("notes", []) if n["rule"] == stand_ins.STAND_IN_RULE
    ]
points = sorted({patch_point(owner, name) for owner, name, _, _ in seen})
import ray

result = {
    "ray": ray.is_initialized(),
    "points": points,
    "gaps": [gap.line() for gap in stand_ins.contract_gaps(seen)],
    "stale": stand_ins.unmatched_known_gaps(points),
    "failures": failures,
    "notes": notes,
}
"""


@pytest.fixture(scope="module", params=SUPPORTED)
def contract(request: pytest.FixtureRequest, upstream_checkout: Path) -> dict[str, Any]:
    version = str(request.param)
    if not _ready(version):
        pytest.skip(f"the environment of verl {version} is not built")
    questions = json.dumps(_questions(upstream_checkout, version))
    return dict(run_in_release(f"QUESTIONS = {questions!r}\n{_CONTRACT}", version))


def _ready(version: str) -> bool:
    from corpus_facts import release_ready

    return release_ready(version)


@pytest.mark.slow
def test_every_stand_in_sets_and_takes_what_upstreams_own_does(contract: dict[str, Any]) -> None:
    """No stand-in met on these runs falls short of the code it replaces, but for the gaps each
    declares with its reason (``stand_ins.KNOWN_GAPS``), none of which is stale."""
    assert len(contract["points"]) > 60, contract["points"]
    assert contract["gaps"] == [], "\n".join(contract["gaps"])
    assert contract["stale"] == [], contract["stale"]


@pytest.mark.slow
def test_the_runs_that_meet_every_stand_in_fail_nowhere_and_blame_no_stand_in(
    contract: dict[str, Any],
) -> None:
    """The configurations are valid ones: no upstream failure, no note of the sandbox's."""
    assert {k: v for k, v in contract["failures"].items() if v} == {}
    assert {k: v for k, v in contract["notes"].items() if v} == {}
    # Nor did any start a Ray cluster (ray.get on a stand-in actor's call starts one unless
    # stood in: the separate-async trainer's add_replicas_to_balancer did).
    assert contract["ray"] is False


# The check itself catches a stand-in that sets less than what it replaces: the stand-in of the
# resume's checkpoint load (which sets nothing) put in the place of the load balancer's setup.
_SHORT_STAND_IN = """
from verl.workers.rollout import llm_server
from pytest_verl_compat.upstream.probes import stand_ins, trainer
from pytest_verl_compat.upstream.probes.patching import patched, watching

with watching() as met:
    with patched(
        llm_server.LLMServerManager, "_init_global_load_balancer", trainer._checkpoint_not_read
    ):
        pass
result = [gap.line() for gap in stand_ins.contract_gaps(met)]
"""


@pytest.mark.parametrize("version", SUPPORTED)
def test_a_stand_in_that_sets_less_than_upstreams_own_is_a_gap(version: str) -> None:
    if not _ready(version):
        pytest.skip(f"the environment of verl {version} is not built")
    gaps = run_in_release(_SHORT_STAND_IN, version)
    assert any("_init_global_load_balancer" in g and "'global_load_balancer'" in g for g in gaps)


# --- a failure the sandbox causes is an info ---------------------------------------------------

# The issue's false alarm: the separate-async trainer hands its standalone replicas to the load
# balancer the real ``_init_global_load_balancer`` sets (trainer_separate_async.py:100,
# llm_server.py:600-611). Made again with the stand-in that set nothing, it stops on a missing
# attribute: a note, and the configuration stays valid; with today's stand-in, nothing at all.
_ISSUE = """
import json
from pytest_verl_compat.upstream.probes import stand_ins, trainer
from pytest_verl_compat.upstream.probes.patching import patched
from pytest_verl_compat.upstream.probes.phases import run_all
from pytest_verl_compat.upstream.probes.validate import (
    install_stand_ins,
    validate_config_with_stand_ins,
)

async def _set_nothing(self, *_, **__):
    return None

install_stand_ins()
mapping = json.loads(MAPPING)
result = {}
for name, stand_in in (("as it was", _set_nothing), ("as it is", trainer._no_servers)):
    with patched(trainer, "_no_servers", stand_in):
        answer = run_all(mapping, validate_config_with_stand_ins)
    result[name] = {
        "failures": [f["message"] for f in answer["failures"]],
        "notes": [n for n in answer["notes"] if n["rule"] == stand_ins.STAND_IN_RULE],
    }
"""


@needs_release()
def test_an_attribute_a_stand_in_lacks_is_a_note_never_an_error(
    upstream_checkout: Path,
) -> None:
    session = AuditSession.start(AuditOptions(upstream=str(upstream_checkout)))
    assert session.manifest is not None
    case = session.with_overrides(session.manifest.case("grpo"), SEPARATE_ASYNC)
    mapping = json.dumps(session.outcome(case).composition.mapping)
    result = run_in_release(f"MAPPING = {mapping!r}\n{_ISSUE}")
    was, now = result["as it was"], result["as it is"]
    assert was["failures"] == [] and now["failures"] == [], result
    assert len(was["notes"]) == 1, was
    note = was["notes"][0]
    assert "global_load_balancer" in note["message"], note
    assert "_init_global_load_balancer" in note["message"], note
    assert note["where"].startswith("verl/trainer/ppo/v1/trainer_separate_async.py:"), note
    assert now["notes"] == [], now
