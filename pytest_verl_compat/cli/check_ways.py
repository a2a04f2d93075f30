"""One result for a script checked way by way at the conditions only its run decides.

``if [ -d "$HOME/models/Qwen" ]; then MODEL=$HOME/models/Qwen; else MODEL=Qwen/Qwen2.5-7B; fi``
makes two launches; ``check`` checks each (``AuditSession.case_ways``) and gives the script one
result. When every way gives the same findings and verdicts, they are the script's, with one
note naming the tests (``launch.run-time-condition``). Otherwise the findings every way shares
are the script's, and each other finding is given once with the ways it belongs to
(``Finding.when``, said by the fewest tests that single those ways out: ``when [ -f .env ]
(line 7) is false``); the script is valid only if every way is, and ``FileResult.ways`` keeps
each way's verdicts (text: the verdict lines say which way gives which; JSON: ``ways``; SARIF
and GitHub: the way ends the message).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pytest_verl_compat.bash import TakenCondition, Way
from pytest_verl_compat.cli.check_report import FileResult, WayResult
from pytest_verl_compat.model import Finding, Location
from pytest_verl_compat.pipeline.suppress import Selection
from pytest_verl_compat.upstream.verdict.rules import LAUNCH_RUNTIME_CONDITION


def _same(finding: Finding) -> tuple[object, ...]:
    """What makes two ways' findings the same finding (its place included)."""
    location = finding.location
    place = (location.file, location.line, location.column) if location is not None else None
    return (finding.rule, finding.level, finding.path, finding.message, finding.fix, place)


def _all_valid(values: Sequence[bool | None]) -> bool | None:
    """Valid only if every way is; unknown when none says no and one cannot say."""
    if any(value is False for value in values):
        return False
    return None if any(value is None for value in values) else True


def _literals(way: Way) -> set[tuple[str, bool]]:
    return {(c.key, c.value) for c in way.conditions}


def describe(chosen: Sequence[int], ways: Sequence[Way]) -> str:
    """``when …`` for the ways at ``chosen`` (indexes into ``ways``): the one test whose value
    singles them out when there is one, else each way's tests, joined by "or"."""
    wanted = set(chosen)
    said: dict[tuple[str, bool], TakenCondition] = {
        (c.key, c.value): c for way in ways for c in way.conditions
    }
    for literal, condition in said.items():
        if {i for i, way in enumerate(ways) if literal in _literals(way)} == wanted:
            return f"when {condition.said()}"
    return "; or ".join(ways[i].said() for i in chosen)


def merge_ways(
    label: str,
    results: Sequence[tuple[Way, FileResult]],
    chosen: Selection,
    place: Location,
) -> FileResult:
    """The script's result from each way's; ``place``: the first test the ways part at, where
    the note points."""
    ways = [way for way, _ in results]
    first = results[0][1]
    found: dict[tuple[object, ...], tuple[Finding, list[int]]] = {}
    for index, (_, result) in enumerate(results):
        for finding in result.findings:
            found.setdefault(_same(finding), (finding, []))[1].append(index)
    verdicts = {(r.status, r.valid, r.runnable) for _, r in results}
    agree = len(verdicts) == 1 and all(len(at) == len(results) for _, at in found.values())
    tests = {(c.key, c.text, c.line) for way in ways for c in way.conditions}
    named = ", ".join(f"{text} (line {line})" for _, text, line in sorted(tests, key=_order))
    note = Finding(
        "info",
        "<launch>",
        f"the script goes {len(results)} ways at tests only decided where it runs ({named}); "
        + ("each way gives this verdict" if agree else "each way is checked on its own"),
        "nothing to do; bind what the tests read (--env NAME=VALUE) to check one way",
        check=LAUNCH_RUNTIME_CONDITION,
        location=place,
    )
    findings = [note] if chosen.reports(note.rule) else []
    for finding, at in found.values():
        when = "" if len(at) == len(results) else describe(at, ways)
        findings.append(dataclasses.replace(finding, when=when))
    checked = [result for _, result in results if result.status == "checked"]
    return FileResult(
        label,
        "checked" if checked else first.status,
        findings,
        sum(result.silenced for _, result in results),
        _all_valid([r.valid for r in checked]) if checked else None,
        _all_valid([r.runnable for r in checked]) if checked else None,
        "; ".join(
            dict.fromkeys(
                f"{describe([i], ways)}: {r.not_runnable}"
                for i, (_, r) in enumerate(results)
                if r.not_runnable
            )
        ),
        next((r.upstream_skipped for _, r in results if r.upstream_skipped), ""),
        error="; ".join(f"{way.said()}: {r.error}" for way, r in results if r.error),
        launcher=next((r.launcher for r in checked if r.launcher is not None), first.launcher),
        problems=tuple(dict.fromkeys(p for _, r in results for p in r.problems)),
        model_facts=next((r.model_facts for r in checked if r.model_facts), first.model_facts),
        case=first.case,
        ways=[]
        if agree
        else [
            WayResult(way.said(), r.status, r.valid, r.runnable, r.not_runnable)
            for way, r in results
        ],
        verdicts_by_way=()
        if agree
        else (
            _by_way([_said(r.valid, r.status) for _, r in results], ways),
            _by_way([_said(r.runnable, r.status, r.not_runnable) for _, r in results], ways),
        ),
    )


def _said(value: bool | None, status: str, why: str = "") -> str:
    if status == "not-a-launcher":
        return "no launch"
    if value is None:
        return "not decided"
    return "yes" if value else f"no ({why})" if why else "no"


def _by_way(values: Sequence[str], ways: Sequence[Way]) -> str:
    """``yes``, or ``no when … ; yes when …``: the ways grouped by what they say."""
    groups: dict[str, list[int]] = {}
    for index, value in enumerate(values):
        groups.setdefault(value, []).append(index)
    if len(groups) == 1:
        return values[0]
    return "; ".join(f"{value} {describe(at, ways)}" for value, at in groups.items())


def _order(test: tuple[str, str, int]) -> tuple[int, str]:
    return test[2], test[0]
