"""What ``fit`` and ``check --gpu`` share: the GPU a command names, and the forecast of a case
check's pipeline has composed (input it cannot read is a one-line usage error).

The memory layer is imported only when a command asks for a forecast: ``check`` without a GPU
never loads it (nor registers its memory.* rule pages), so its output and time are unchanged."""

from __future__ import annotations

import dataclasses
from typing import Any

from pytest_verl_compat.cli.common import UsageError
from pytest_verl_compat.files.safe_input import InputError


def choose_gpu(name: str | None, gib: float | None, setting: str | None) -> Any:
    """The GPU: --gpu-memory, else --gpu, else the [tool.verl-compat] gpu setting, else none."""
    from pytest_verl_compat.memory.gpus import UnknownGpu, custom_gpu, find_gpu

    try:
        if gib is not None:
            return custom_gpu(gib)  # refuses what is not a positive, finite size
        if name or setting:
            return find_gpu(str(name or setting))
    except UnknownGpu as exc:
        # a type from the settings file is said as the setting it is
        where = "" if name else "[tool.verl-compat] gpu: "
        raise UsageError(f"{where}{exc}") from exc
    return None


class NotComposed(UsageError):
    """A launch its release rejects for what is not a key the tree lacks: nothing to forecast
    (``check`` says the rejection itself)."""


class NotForecastCase(UsageError):
    """A composed case the forecast cannot model (an unknown model, an engine it does not count, a
    value it cannot read): ``key`` is the key it stopped at where it names one."""

    def __init__(self, message: str, reason: str, key: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.key = key


def forecast_mapping(mapping: Any, request: Any, where: str) -> Any:
    """The forecast of a resolved mapping for ``request``; what it cannot model is a one-line
    NotForecastCase naming ``where`` (the script as the user named it)."""
    from pytest_verl_compat.memory.architecture import UnsupportedModel
    from pytest_verl_compat.memory.forecast import NotForecastable, forecast
    from pytest_verl_compat.memory.models import UnknownModel

    try:
        return forecast(mapping, request)
    except (UnknownModel, UnsupportedModel, NotForecastable, InputError) as exc:
        # the key the refusal names, where one decides it (UnknownModel, NotForecastable)
        raise NotForecastCase(f"{where}: {exc}", str(exc), getattr(exc, "key", "")) from exc


def forecast_case(session: Any, case: Any, request: Any) -> Any:
    """The forecast of a composed case; input it cannot read is a one-line UsageError."""
    return forecast_outcome(session, case, session.outcome(case), request)


def forecast_outcome(session: Any, case: Any, outcome: Any, request: Any) -> Any:
    """The forecast of ``case`` as ``outcome`` reads and composes it (its own, or its launch
    carried to another entry point)."""
    from pytest_verl_compat.memory.forecast import own_rollout_pool, trains
    from pytest_verl_compat.memory.release_facts import ReleaseFactsError, release_facts

    composition, fields, aside = composed_for_forecast(session, case, outcome)
    try:
        facts = release_facts(session.version)
    except ReleaseFactsError as exc:
        raise UsageError(str(exc)) from exc
    # the release checked is the release forecast for: its tree composed the mapping, its facts
    # say what its code does where no key decides; its entry point, whether it trains and where
    # it puts the rollout
    entry = session.entry_point(outcome.fields)
    request = dataclasses.replace(
        request,
        world=outcome.fields.world_size,
        facts=facts,
        trains=trains(entry),
        rollout_pool=own_rollout_pool(entry),
        followers=session.composer(outcome.fields).key_followers(fields),
    )
    # the script as the user named it (fit's label, else the launch's path), not the case id
    result = forecast_mapping(
        composition.mapping, request, request.script or case.launch or case.id
    )
    ignored = _ignored_reward_model(outcome.fields.fields, entry, session.version)
    if ignored:
        result = dataclasses.replace(result, assumptions=(*result.assumptions, ignored))
    if not aside:
        return result
    said = (
        f"the launch without the {len(aside)} override(s) verl {session.version}'s tree rejects "
        f"({', '.join(a.key for a in aside)}; each an error below)"
    )
    return dataclasses.replace(result, set_aside=aside, assumptions=(said, *result.assumptions))


def _migrates_legacy_reward(entry: Any) -> bool:
    """Whether the launch's entry point copies the legacy reward_model.* keys into reward.*
    (migrate_legacy_reward_impl: fully_async_main.py:237 calls it, main_ppo does not)."""
    from pytest_verl_compat.checks.fields import MIGRATES_LEGACY_REWARD

    return entry is not None and MIGRATES_LEGACY_REWARD in entry.calls


def _unread_sections(entry: Any) -> tuple[str, ...]:
    """The legacy top-level reward block, which only migrate_legacy_reward_impl reads
    (verl/experimental/reward_loop/reward_loop.py:39-86): its keys, an old reward model's
    fsdp_config among them, are set aside losing nothing, unless the entry point migrates them."""
    return () if _migrates_legacy_reward(entry) else ("reward_model",)


def _ignored_reward_model(fields: Any, entry: Any, version: str) -> str:
    """What the forecast leaves out for the launch's legacy reward_model.* keys, which the
    release's main_ppo never migrates to reward.* (check's fields.legacy-reward-key): no reward
    model runs, so none is forecast; "" where the launch sets none or its entry migrates them."""
    from pytest_verl_compat.checks.fields import field_key, legacy_reward_replacement

    if _migrates_legacy_reward(entry):
        return ""
    moved = {
        key: new
        for key in map(field_key, fields)
        if key.startswith("reward_model.") and (new := legacy_reward_replacement(key))
    }
    if not moved:
        return ""
    said = ", ".join(f"{key} is {new}" for key, new in moved.items())
    return (
        f"{', '.join(moved)}: legacy reward keys verl {version}'s main_ppo never reads (an error "
        f"of check, fields.legacy-reward-key), so no reward model they ask for is forecast ({said})"
    )


def composed_for_forecast(
    session: Any, case: Any, outcome: Any
) -> tuple[Any, tuple[str, ...], tuple[Any, ...]]:
    """The case's composition, its overrides and none set aside; or, where the release's tree
    rejects overrides for their keys (a script written for another verl), the launch composed
    without them (``pipeline/set_aside.py``): a forecast of what the release would run once they
    are gone, each still an error. Any other rejection is a one-line UsageError."""
    from pytest_verl_compat.pipeline.set_aside import compose_setting_aside

    fields = tuple(outcome.fields.fields)
    if outcome.composition.composed:
        return outcome.composition, fields, ()
    if case.resolved is not None:
        # a run's resolved file is composed from the file, not from overrides: nothing to set
        # aside, and composing its overrides alone would forecast the tree's defaults
        raise NotComposed(f"composition rejected: {outcome.composition.reason}")
    composition, kept, aside = compose_setting_aside(
        lambda tried: session.compose_variant(
            dataclasses.replace(outcome.fields, fields=tried), case.bindings
        ),
        fields,
        session.version,
        _relocating(session),
        _unread_sections(session.entry_point(outcome.fields)),
    )
    if not composition.composed:
        past = (
            f" (past {', '.join(a.key for a in aside)}, which the tree does not have)"
            if aside
            else ""
        )
        raise NotComposed(f"composition rejected{past}: {composition.reason}")
    return composition, kept, aside


def _relocating(session: Any) -> Any:
    """Where a key of an engine section the checked tree lacks went, by the shipped evidence of
    an earlier release's tree (``upstream/drift/mounts.py``): the critic's ``model.fsdp_config``
    of verl 0.7 is ``critic.fsdp`` from 0.8 on."""
    from pytest_verl_compat.upstream.drift.mounts import relocation

    return lambda key: relocation(session.version, key)


def memory_check(session: Any, case: Any, gpu: Any) -> list[Any]:
    """``check --gpu``: the forecast's findings for a case check has composed."""
    from pytest_verl_compat.memory import findings as memory_findings
    from pytest_verl_compat.memory.forecast import Request
    from pytest_verl_compat.pipeline.compile import in_release

    try:
        # check --model-config's model (its facts' source: a config.json or a model's name), as
        # fit takes its own
        given = session.model_facts_override
        request = Request(gpu=gpu, model_config=given.source if given is not None else None)
        found = memory_findings.as_findings(forecast_case(session, case, request))
    except NotForecastCase as exc:
        # one script the forecast cannot model says so and the others are still checked (the
        # plugin's --verl-corpus-gpu makes it a note the same way)
        found = [memory_findings.not_forecast(exc.reason, exc.key)]
    except NotComposed:
        return []  # check's own compose error says why
    return [in_release(finding, session.version) for finding in found]
