"""Which findings are reported: rule selection (``--select``/``--ignore``) and inline directives.

As ruff does it: a selector is a rule id (``batch.padded-step``), a family prefix (``batch``,
``upstream``) or ``ALL``; a rule is reported when the most specific selector that matches it comes
from ``select`` (no ``select``: every rule is selected), an ``ignore`` winning a tie.

A launch script silences a rule on one line with ``# verl-compat: ignore[RULE, ...]`` on that line
or the line above it. A finding located outside the script (a ``--set`` argument, the config
tree's default) is silenced by a directive on the launcher line or the line above it: that is
where the script takes the value. A directive id that silences nothing is itself a finding,
``directive.unused`` (a warning at the id), as ruff's unused ``noqa``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pytest_verl_compat.checks import RuleDoc, register_rule
from pytest_verl_compat.model import LEVELS, Finding, Level, Location

ALL = "ALL"
UNUSED_DIRECTIVE = "directive.unused"
_DIRECTIVE = re.compile(r"#\s*verl-compat:\s*ignore\[([^\]\n]*)\]")

register_rule(
    RuleDoc(
        UNUSED_DIRECTIVE,
        "warning",
        "An inline `# verl-compat: ignore[RULE]` directive names a rule that gives no finding on "
        "its line or the next one (or a rule id that does not exist), so it silences nothing.",
        "not upstream's: a directive that silences nothing hides a later finding of that rule "
        "on the same line (as ruff's unused-noqa, RUF100)",
        "remove the directive, or the id from it",
        source="the inline directives of a launch script",
    )
)


class SelectorError(ValueError):
    """A selector that is not a rule id, a family or ALL."""


def check_selectors(selectors: Iterable[str], known: Iterable[str], where: str) -> tuple[str, ...]:
    """The selectors, each a known rule id, a family of known ids, or ALL (else SelectorError)."""
    known = tuple(known)
    out = []
    for selector in selectors:
        selector = selector.strip()
        if not selector:
            continue
        if selector != ALL and not any(_matches(selector, rule) for rule in known):
            close = difflib.get_close_matches(selector, _candidates(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise SelectorError(
                f"{where}: {selector!r} is no rule id or family{hint} (verl-compat rule lists them)"
            )
        out.append(selector)
    return tuple(out)


def _candidates(known: Sequence[str]) -> list[str]:
    """Rule ids and their families, for a "did you mean"."""
    return sorted({*known, *(rule.split(".")[0] for rule in known)})


def _matches(selector: str, rule: str) -> bool:
    return selector == ALL or rule == selector or rule.startswith(selector + ".")


def _specificity(selector: str) -> int:
    return -1 if selector == ALL else selector.count(".") + 1


@dataclass(frozen=True)
class Selection:
    """Which rules are reported, and from which level a finding fails the run."""

    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    fail_on: Level = "error"

    def reports(self, rule: str) -> bool:
        chosen = [(_specificity(s), 1, s) for s in self.select or (ALL,) if _matches(s, rule)]
        chosen += [(_specificity(s), 2, s) for s in self.ignore if _matches(s, rule)]
        if not chosen:
            return False
        return max(chosen)[1] == 1

    def fails(self, finding: Finding) -> bool:
        return LEVELS.index(finding.level) <= LEVELS.index(self.fail_on)


@dataclass(frozen=True)
class Directive:
    """One ``# verl-compat: ignore[...]`` comment: its line and each id with its column."""

    line: int
    ids: tuple[tuple[str, int], ...]


def directives(text: str) -> list[Directive]:
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for match in _DIRECTIVE.finditer(line):
            ids = []
            offset = match.start(1)
            for part in match.group(1).split(","):
                name = part.strip()
                if name:
                    ids.append((name, offset + part.index(name) + 1))
                offset += len(part) + 1
            found.append(Directive(number, tuple(ids)))
    return found


@dataclass(frozen=True)
class Suppressed:
    """What the directives left: the findings kept, how many were silenced, and the unused ids."""

    kept: tuple[Finding, ...]
    silenced: int
    unused: tuple[Finding, ...]


def _line_in_script(finding: Finding, script: str, launcher: int | None) -> int | None:
    location = finding.location
    if location is None:
        return launcher
    if location.file == script and location.origin in ("script", "launcher"):
        return location.line
    return launcher


def apply_directives(
    findings: Sequence[Finding],
    found: Sequence[Directive],
    script: str,
    launcher: int | None,
    known: Iterable[str],
) -> Suppressed:
    """Silence each finding a directive on its line (or the line above) names."""
    known = tuple(known)
    used: set[tuple[int, str]] = set()
    kept = []
    for finding in findings:
        line = _line_in_script(finding, script, launcher)
        hit = None
        if line is not None:
            for directive in found:
                if directive.line in (line, line - 1):
                    hit = next(
                        (n for n, _ in directive.ids if _matches(n, finding.rule) and n != ALL),
                        None,
                    )
                    if hit is not None:
                        used.add((directive.line, hit))
                        break
        if hit is None:
            kept.append(finding)
    unused = []
    for directive in found:
        for name, column in directive.ids:
            if (directive.line, name) in used:
                continue
            if any(_matches(name, rule) for rule in known):
                message = f"no {name} finding on line {directive.line} or {directive.line + 1}"
            else:
                close = difflib.get_close_matches(name, _candidates(known), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                message = f"{name!r} is no rule id or family{hint}"
            unused.append(
                Finding(
                    "warning",
                    f"verl-compat: ignore[{name}]",
                    f"the directive silences nothing: {message}",
                    fix="remove the directive, or this id from it",
                    check=UNUSED_DIRECTIVE,
                    location=Location(script, directive.line, column, "script"),
                )
            )
    return Suppressed(tuple(kept), len(findings) - len(kept), tuple(unused))
