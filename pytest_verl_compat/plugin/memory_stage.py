"""``--verl-corpus-gpu TYPE``: the memory forecast added to the verdict stage, only when given
(the forecast's findings, as ``check --gpu`` reports them; the memory layer loads only then)."""

from __future__ import annotations

from typing import Any

from pytest_verl_compat.model import Finding


def memory_findings(
    outcome: Any,
    gpu_name: str,
    version: str,
    entry: Any = None,
    followers: dict[str, tuple[str, ...]] | None = None,
) -> tuple[list[Finding], str]:
    """The forecast's findings for a composed case on ``gpu_name`` with verl ``version``'s
    facts, or ([], why not) when the case cannot be forecast (an unknown model: a note, not a
    failure of the verdict)."""
    from pytest_verl_compat.files.safe_input import InputError
    from pytest_verl_compat.memory.architecture import UnsupportedModel
    from pytest_verl_compat.memory.findings import as_findings
    from pytest_verl_compat.memory.forecast import (
        NotForecastable,
        Request,
        forecast,
        own_rollout_pool,
        trains,
    )
    from pytest_verl_compat.memory.gpus import find_gpu
    from pytest_verl_compat.memory.models import UnknownModel
    from pytest_verl_compat.memory.release_facts import ReleaseFactsError, release_facts

    try:
        request = Request(
            gpu=find_gpu(gpu_name),
            world=outcome.fields.world_size,
            facts=release_facts(version),
            trains=trains(entry),
            rollout_pool=own_rollout_pool(entry),
            followers=followers or {},
        )
        result = forecast(outcome.composition.mapping, request)
    except (UnknownModel, UnsupportedModel, NotForecastable, InputError, ReleaseFactsError) as exc:
        return [], f"not forecast: {exc}"
    return as_findings(result), ""
