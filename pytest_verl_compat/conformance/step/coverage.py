"""Coverage as data, checked: which step case trains which setting off verl's default.

Every leaf the profile classes `exact` or `lowered` in the accepted cases (official, derived
and step-only) has one row of `corpus/step_coverage.yaml` (`plan.CoverageTable`). A `case`,
`shape` or `variant` row's leaves reach upstream as overrides (`plan.step_settings`); a leaf is
*moved* by a step case when the value it trains with differs from verl's default, the value
of the override-free composition of the pinned tree. `coverage_report` lists, per row, the
cases that move it and the variant that detects a wrong value; `problems` says what breaks
the promise (an unlisted leaf, a leaf no case moves, a row without its detector);
`markdown` is the table of docs/trainer.md.

    python -m pytest_verl_compat.conformance.step.coverage   # docs/trainer.md's table, on stdout
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_verl_compat.conformance.step.plan import (
    CoverageRow,
    CoverageTable,
    RunConformanceCase,
    StepCase,
    load_coverage,
    load_run_conformance,
    load_step_plan,
    step_settings,
)
from pytest_verl_compat.pipeline.compose import iter_leaves

TRAINED = ("case", "shape", "variant")
CLASSES = ("exact", "lowered")


@dataclass
class RowCoverage:
    row: CoverageRow
    leaves: set[str] = field(default_factory=set)
    moved_by: dict[str, set[str]] = field(default_factory=dict)
    """leaf → the step cases that train it off verl's default."""
    exact_outside: set[str] = field(default_factory=set)
    """The `exact` leaves of an `outside` row: the profile says ours runs them as verl does,
    so a run-conformance case (``corpus/run_conformance/``) must set each off verl's default."""
    conformed_by: dict[str, set[str]] = field(default_factory=dict)
    """exact outside leaf → the run-conformance cases that set it off verl's default."""


def defaults(session: Any) -> dict[str, Any]:
    """verl's default of every leaf: the override-free composition of the pinned tree."""
    return dict(iter_leaves(session.composer().compose((), {}).mapping))


def _leaf(key: str) -> str:
    return key.removeprefix("+")


def moved_leaves(
    case: StepCase, table: CoverageTable, verl_defaults: Mapping[str, Any], variants: Any
) -> set[str]:
    """The leaves `case` trains (in any of its variants) at a value other than verl's default;
    a leaf whose row's `when` field is unset in the case trains nothing there."""
    moved = set()
    for name in case.variants:
        overrides = step_settings(case, variants[name], table)["overrides"]
        for key, value in overrides.items():
            for path, item in iter_leaves(value, _leaf(key)):
                row = table.row_for(path)
                if row is not None and row.when and not _config_field(case.config, row.when):
                    continue
                if path not in verl_defaults or _differs(item, verl_defaults[path]):
                    moved.add(path)
                    # A list that replaces a default of another shape ("all-linear" by a list of
                    # modules) moves the leaf itself.
                    moved.add(re.sub(r"\[\d+\]$", "", path))
    return moved


def _config_field(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part, None)
    return cfg


def _differs(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is not b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) != float(b)
    return bool(a != b)


def classified_leaves(reports: Iterable[Any]) -> dict[str, str]:
    """dotted path → class, for the exact and lowered leaves of the given compile reports."""
    out = {}
    for report in reports:
        for leaf in report.leaves:
            if leaf.klass in CLASSES:
                out[leaf.path] = leaf.klass
    return out


def coverage_report(
    leaves: Mapping[str, str],
    cases: Sequence[StepCase],
    verl_defaults: Mapping[str, Any],
    table: CoverageTable | None = None,
    run_cases: Sequence[RunConformanceCase] | None = None,
) -> tuple[list[RowCoverage], list[str]]:
    """Rows with their leaves and the cases moving them, and the leaves no row describes."""
    table = table or CoverageTable(load_coverage())
    run_cases = load_run_conformance() if run_cases is None else run_cases
    variants = load_step_plan().variants
    rows = [RowCoverage(row) for row in table.rows]
    by_row = {id(r.row): r for r in rows}
    unlisted = []
    for path in sorted(leaves):
        row = table.row_for(path)
        if row is None:
            unlisted.append(path)
            continue
        by_row[id(row)].leaves.add(path)
        if row.how == "outside" and leaves[path] == "exact":
            by_row[id(row)].exact_outside.add(path)
    for run_case in (c for c in run_cases if c.shows_an_effect):
        for path, value in run_case.sets.items():
            row = table.row_for(path)
            if row is None or (path in verl_defaults and not _differs(value, verl_defaults[path])):
                continue
            by_row[id(row)].conformed_by.setdefault(path, set()).add(run_case.id)
    for case in cases:
        for path in moved_leaves(case, table, verl_defaults, variants):
            row = table.row_for(path)
            if row is not None and row.how in TRAINED:
                by_row[id(row)].moved_by.setdefault(path, set()).add(case.id)
    return rows, unlisted


def problems(rows: Sequence[RowCoverage], unlisted: Sequence[str]) -> list[str]:
    """What breaks the coverage promise, one line each."""
    out = [f"{path}: no row of corpus/step_coverage.yaml describes it" for path in unlisted]
    for r in rows:
        name = ", ".join(r.row.patterns)
        if r.row.how in TRAINED:
            for path in sorted(r.leaves):
                if not r.moved_by.get(path):
                    out.append(f"{path}: no step case trains it off verl's default ({name})")
            if (not r.row.field or not r.row.detect) and not r.row.why:
                out.append(
                    f"{name}: a {r.row.how} row names its field and its detecting variant, "
                    "or says why it has none"
                )
        elif r.row.how == "outside":
            if not r.row.why:
                out.append(f"{name}: an outside row says why")
            for path in sorted(r.exact_outside):
                if not r.conformed_by.get(path):
                    out.append(
                        f"{path}: exact, but no run-conformance case (corpus/run_conformance/) "
                        f"sets it off verl's default ({name})"
                    )
        elif r.row.how == "engine" and not r.row.oracle:
            out.append(f"{name}: an engine row says what the oracle runs")
    return out


def step_view(cfg: Any) -> tuple[Any, ...]:
    """What of a lowered config a training step reads (the oracle's `reference.step_config`
    replaces the shape and the rate): the algorithm but group filtering, the actor, the critic,
    the temperature, the model's LoRA, the schedules' horizon and whether a reference exists."""
    algorithm = dataclasses.replace(
        cfg.algorithm, filter_groups_enable=False, filter_groups_metric=None, max_num_gen_batches=0
    )
    model = cfg.model
    return (
        algorithm,
        cfg.actor,
        cfg.critic,
        cfg.rollout.temperature,
        (model.lora_rank, model.lora_alpha, model.target_modules, model.exclude_modules),
        cfg.trainer.total_training_steps,
        cfg.use_reference_policy,
    )


def misfiled(
    mapping: Mapping[str, Any], report: Any, table: CoverageTable, profile: Any
) -> list[str]:
    """Leaves an `engine`, `fixed` or `outside` row describes although changing them changes what
    the trainer's step reads: each is a training-step setting the step stage does not train."""
    import copy

    from pytest_verl_compat.pipeline.compile import compile_resolved
    from pytest_verl_compat.pipeline.lower import reference_config

    base = step_view(reference_config(mapping, report))
    out = []
    for leaf in report.leaves:
        row = table.row_for(leaf.path)
        if leaf.klass not in CLASSES or row is None or row.how in TRAINED:
            continue
        changed = copy.deepcopy(dict(mapping))
        if not _perturb(changed, leaf.path):
            continue
        again = compile_resolved(changed, case_id=report.case_id, profile=profile)
        if again.accepted and step_view(reference_config(changed, again)) != base:
            out.append(f"{leaf.path}: a {row.how} row, but it changes what the step trains")
    return out


def _perturb(mapping: dict[str, Any], dotted: str) -> bool:
    """Change one leaf in place (a number, a switch); False for leaves of other kinds."""
    parts = re.findall(r"[^.\[\]]+|\[\d+\]", dotted)
    holder: Any = mapping
    for part in parts[:-1]:
        holder = holder[int(part[1:-1])] if part.startswith("[") else holder[part]
    key: Any = int(parts[-1][1:-1]) if parts[-1].startswith("[") else parts[-1]
    value = holder[key]
    if isinstance(value, bool):
        holder[key] = not value
    elif isinstance(value, int | float):
        holder[key] = value * 0.5 + 3
    else:
        return False
    return True


def markdown(rows: Sequence[RowCoverage]) -> str:
    """docs/trainer.md's table: each trained row, the cases that move it, what detects a wrong value."""
    lines = [
        "| setting | how the step trains it | step cases that move it | a wrong value shows in |",
        "| --- | --- | --- | --- |",
    ]
    for r in rows:
        if r.row.how not in TRAINED:
            continue
        cases = sorted({c for ids in r.moved_by.values() for c in ids})
        shown = ", ".join(f"`{c}`" for c in cases[:3]) + (
            f" (+{len(cases) - 3})" if len(cases) > 3 else ""
        )
        lines.append(
            f"| `{'`, `'.join(r.row.patterns)}` | {r.row.how} | {shown} | "
            + ", ".join(f"`{d}`" for d in r.row.detect)
            + " |"
        )
    others = {how: [r for r in rows if r.row.how == how] for how in ("engine", "fixed", "outside")}
    counts = ", ".join(f"{len(v)} {k}" for k, v in others.items())
    lines.append("")
    lines.append(
        f"Other rows ({counts}) are listed with their reasons in `corpus/step_coverage.yaml`."
    )
    return "\n".join(lines) + "\n"


def session_coverage(session: Any) -> tuple[list[RowCoverage], list[str]]:
    """The coverage of a session's step cases (composes and compiles every one of them)."""
    from pytest_verl_compat.conformance.step.cases import step_cases, step_report

    cases = step_cases(session)
    leaves = classified_leaves(step_report(session, case.id) for case in cases)
    return coverage_report(leaves, cases, defaults(session))


def main(argv: list[str]) -> int:
    from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession

    session = AuditSession.start(AuditOptions(manifest=None, upstream=None))
    rows, unlisted = session_coverage(session)
    sys.stdout.write(markdown(rows))
    found = problems(rows, unlisted)
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
