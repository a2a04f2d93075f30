"""Issue 46, class 4: the agent loop's registry, looked up at the first generation.

Every row whose data names no agent loop of its own gets ``rollout.agent.default_agent_loop``
(verl/trainer/ppo/v1/agent_loop_tq.py:79-81) and the agent loop worker asserts the name is
registered (verl/experimental/agent_loop/agent_loop.py:692): a typo passed as valid until the
first generation. The registry's names are upstream's own, read here from each supported
release's ``_agent_loop_registry``; a file of agent loop configs may register names of the user's
(agent_loop.py:548-553), so with one no name is claimed unregistered.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import pytest
from release_python import run_in_release

from pytest_verl_compat.checks.upstream_names import REGISTRIES
from pytest_verl_compat.model import Finding
from pytest_verl_compat.pipeline.audit import AuditSession
from pytest_verl_compat.releases.index import load_release_index
from pytest_verl_compat.upstream.verdict.case import check_case

KEY = "actor_rollout_ref.rollout.agent.default_agent_loop"
RULE = f"registry.{KEY}"
_ids = itertools.count()


@pytest.fixture(scope="module")
def session(upstream_session: AuditSession) -> AuditSession:
    return upstream_session


def findings(session: AuditSession, overrides: Sequence[str]) -> list[Finding]:
    assert session.manifest is not None
    case = dataclasses.replace(session.manifest.case("grpo"), id=f"grpo+agent{next(_ids)}")
    case = session.with_overrides(case, tuple(overrides))
    return [f for f in check_case(session, case, None).findings if f.check == RULE]


@pytest.mark.parametrize(
    ("overrides", "fires"),
    [
        ((f"{KEY}=single_turn",), True),
        ((f"{KEY}=single_turn_agent",), False),
        ((f"{KEY}=tool_agent",), False),
        # a file of the user's may register the name
        (
            (
                f"{KEY}=my_agent",
                "actor_rollout_ref.rollout.agent.agent_loop_config_path=/cfg/agents.yaml",
            ),
            False,
        ),
    ],
    ids=["typo", "registered", "other-registered", "user-registry"],
)
def test_an_unregistered_default_agent_loop_is_an_error_and_its_twin_is_clean(
    session: AuditSession, overrides: tuple[str, ...], fires: bool
) -> None:
    found = findings(session, overrides)
    assert bool(found) is fires, found
    if fires:
        assert found[0].level == "error"
        assert "did you mean 'single_turn_agent'" in found[0].fix
        assert "agent_loop.py:692" in (found[0].evidence or "")


@pytest.mark.parametrize("version", load_release_index().supported_versions)
def test_the_names_are_upstreams_own_registry(version: str) -> None:
    from corpus_facts import release_ready

    if not release_ready(version):
        pytest.skip(f"the environment of verl {version} is not built")
    registered = run_in_release(
        "import verl.experimental.agent_loop\n"
        "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry\n"
        "result = sorted(_agent_loop_registry)\n",
        version,
    )
    assert sorted(REGISTRIES[KEY][0]) == registered
