"""``fit`` on a launch of an entry point the checked release no longer has: the forecast of what
the last release that had it would run (``pipeline/retired.py``), said as such.

Scripts of earlier releases keep running ``torchrun -m verl.trainer.fsdp_sft_trainer``; their
out-of-memory reports are the ones a user brings. The launch is composed on that trainer's own
tree (its defaults, not the replacement's), carried key by key to the checked release's SFT
trainer, and forecast with the old trainer's behaviour where no key decides."""

from __future__ import annotations

import dataclasses
from typing import Any

from pytest_verl_compat.checks.fields import field_key
from pytest_verl_compat.cli.common import UsageError
from pytest_verl_compat.cli.fit_common import NotForecastCase, forecast_mapping, forecast_outcome
from pytest_verl_compat.pipeline.audit import CaseOutcome
from pytest_verl_compat.pipeline.compose import Composer
from pytest_verl_compat.pipeline.entry_points import PINNED_ENTRY_MODULE
from pytest_verl_compat.pipeline.hydra_internals import override_literal
from pytest_verl_compat.pipeline.retired import (
    AS_LAUNCHED,
    REMOVE_PADDING_KEY,
    RETIRED_FILE,
    RetiredEntry,
    Untranslatable,
    retired_entry,
    translate,
)
from pytest_verl_compat.releases.index import ReleaseError
from pytest_verl_compat.releases.wheels import release_tree


def forecast_retired(session: Any, case: Any, fields: Any, request: Any) -> Any:
    """The forecast of ``case``, whose launch runs a retired entry point, from its read
    ``fields`` (the --set overrides among them); what cannot be forecast is one line naming the
    script."""
    from pytest_verl_compat.memory.release_facts import ReleaseFactsError, facts_from_mapping

    entry = retired_entry(fields.module)
    assert entry is not None, "a retired case's launch runs a retired entry point"
    where = request.script or case.launch or case.id
    if entry.carried == AS_LAUNCHED:
        return _as_launched(session, case, entry, fields, request)
    try:
        facts = facts_from_mapping(
            {"release": entry.last_release, "facts": entry.behaviour},
            f"{RETIRED_FILE.name}: {entry.module}",
        )
    except ReleaseFactsError as exc:
        raise UsageError(str(exc)) from exc
    given_lengths = request.lengths
    request = dataclasses.replace(request, world=fields.world_size, facts=facts)
    old_tree = _old_tree(entry, where)
    result, padded = _carried_forecast(session, case, entry, old_tree, fields, request, where)
    assumptions = [
        f"the launch runs {entry.said}, which verl {session.version} does not have: forecast as verl "
        f"{entry.last_release}'s trainer, the last with it (its {entry.config_name}.yaml "
        f"defaults, its code's behaviour) on {entry.forecast_as}'s keys: {_moves(entry)}"
    ]
    launched = {field_key(field) for field in fields.fields}
    for unread in entry.unread:
        if unread.key in launched:
            assumptions.append(
                f"the launch sets {unread.key}, which verl {entry.last_release}'s trainer never "
                f"reads: its micro-batches are {unread.instead} "
                f"({unread.where}@{entry.last_release}), forecast as that key says"
            )
    for default in entry.earlier:
        if default.key in launched:
            continue
        value = override_literal(default.value)
        other, _ = _carried_forecast(
            session,
            case,
            entry,
            old_tree,
            dataclasses.replace(fields, fields=(*fields.fields, f"{default.key}={value}")),
            request,
            where,
        )
        assumptions.append(
            f"the launch leaves {default.key} to verl {entry.last_release}'s default; "
            f"{default.releases} had {value} ({default.where}), with which the run peaks at "
            f"{_peak(other)}: set it as the run had it"
        )
    if padded and given_lengths is not None:
        padding = next(move for move in entry.moves if move.to == REMOVE_PADDING_KEY)
        assumptions.append(
            "every sample is padded to data.max_length without remove-padding and a Ulysses size "
            f"above 1, so --lengths is not used ({entry.evidence(padding)})"
        )
    assumptions.append(
        "findings name the launch's own keys, and only changes it can make: a key of "
        f"{entry.forecast_as} it has no key for is left out of them"
    )
    names = entry.launch_names()
    return dataclasses.replace(
        result,
        assumptions=(*assumptions, *result.assumptions),
        verdicts=tuple(_in_launch_keys(v, names) for v in result.verdicts),
    )


def _as_launched(session: Any, case: Any, entry: RetiredEntry, fields: Any, request: Any) -> Any:
    """A recipe's launch forecast as the replacement's own: its overrides composed on the
    checked release's tree, each key the tree lacks set aside and said, as for any old launch."""
    module = None if entry.forecast_as == PINNED_ENTRY_MODULE else entry.forecast_as
    carried = dataclasses.replace(fields, module=module)
    outcome = CaseOutcome(carried, "launch", session.compose_variant(carried, case.bindings))
    result = forecast_outcome(session, case, outcome, request)
    cited = "; ".join(f"{statement} ({where})" for where, statement in entry.shown_by)
    said = (
        f"the launch runs {entry.module}, {entry.what}, which verl {session.version} does not "
        f"have; its trainer builds {entry.forecast_as}'s workers and its config is "
        f"{entry.forecast_as}'s with keys of its own ({cited}): forecast as {entry.forecast_as} "
        "with the launch's overrides" + (f"; but {entry.differs}" if entry.differs else "")
    )
    return dataclasses.replace(result, assumptions=(said, *result.assumptions))


def _old_tree(entry: RetiredEntry, where: str) -> Composer:
    """The composer of the last release's own config, its files fetched or cached once."""
    try:
        tree = release_tree(entry.last_release)
    except ReleaseError as exc:
        raise UsageError(
            f"{where}: {entry.said} is forecast on verl {entry.last_release}'s tree, which is "
            f"not here: {exc}"
        ) from exc
    return Composer(tree.config_dir, entry.config_name)


def _carried_forecast(
    session: Any,
    case: Any,
    entry: RetiredEntry,
    old_tree: Composer,
    fields: Any,
    request: Any,
    where: str,
) -> tuple[Any, bool]:
    """The launch composed on the old tree, carried to the checked release's trainer and
    forecast; and whether every sample is padded to max_length there."""
    variables = dict(fields.environment(case.bindings))
    legacy = old_tree.compose(fields.fields, variables)
    if not legacy.composed:
        raise UsageError(
            f"{where}: {entry.said}: verl {entry.last_release}'s {entry.config_name} tree rejects the "
            f"launch: {legacy.reason}"
        )
    try:
        translation = translate(entry, legacy.mapping)
    except Untranslatable as exc:
        raise NotForecastCase(f"{where}: {exc}", str(exc), exc.key) from exc
    carried = dataclasses.replace(fields, module=entry.forecast_as, fields=translation.overrides)
    composition = session.compose_variant(carried, case.bindings)
    if not composition.composed:
        raise UsageError(
            f"{where}: {entry.said}: verl {session.version}'s {entry.forecast_as} tree rejects the "
            f"keys carried to it: {composition.reason}"
        )
    request = dataclasses.replace(
        request,
        lengths=None if translation.padded else request.lengths,
        followers=session.composer(carried).key_followers(carried.fields),
    )
    try:
        return forecast_mapping(composition.mapping, request, where), translation.padded
    except NotForecastCase as exc:
        raise _in_launch_terms(exc, entry, where) from exc


def _in_launch_terms(exc: NotForecastCase, entry: RetiredEntry, where: str) -> NotForecastCase:
    """A refusal at a key the launch sets under its old name (or decides through it), named by
    that name: the user wrote ulysses_sequence_parallel_size, not engine.*'s."""
    source = next((m.sources[0] for m in entry.moves if m.to == exc.key and m.sources), None)
    if source is None or source == exc.key:
        return exc
    reason = exc.reason.replace(exc.key, f"{source} (carried to {exc.key})", 1)
    return NotForecastCase(f"{where}: {reason}", reason, source)


def _peak(result: Any) -> str:
    """The highest phase of a forecast, as fit says it."""
    from pytest_verl_compat.memory.parts import PHASE_TITLES, gib

    phase = max((p for rank in result.ranks for p in rank.phases), key=lambda p: p.total)
    share = f", {phase.total / result.capacity:.0%} of the GPU" if result.capacity else ""
    return f"{gib(phase.total):.2f} GiB in the {PHASE_TITLES[phase.phase]}{share}"


def _in_launch_keys(verdict: Any, names: dict[str, str]) -> Any:
    """A verdict in the old launch's keys (``names``: RetiredEntry.launch_names): each key the
    old tree has under another name renamed, every fix changing a key it lacks dropped."""
    keys = tuple(names[key] for key in verdict.keys if key in names)
    fixes = tuple(
        dataclasses.replace(fix, keys=tuple((names[k], v) for k, v in fix.keys))
        for fix in verdict.fixes
        if all(k in names for k, _ in fix.keys)
    )
    return dataclasses.replace(verdict, keys=keys or verdict.keys, fixes=fixes)


def _moves(entry: RetiredEntry) -> str:
    """The keys carried under another name or set by the old trainer's code, each with its line
    (a key read under the same name on both trees goes unsaid)."""
    said = []
    for move in entry.moves:
        if move.rule == "copy" and move.sources == (move.to,):
            continue
        what = (
            f"{move.to}={override_literal(move.value)}"
            if not move.sources
            else f"{move.to} from {' and '.join(move.sources)}"
        )
        said.append(f"{what} ({entry.evidence(move)})")
    return "; ".join(said)
