"""Running the step oracle: upstream's steps in sandboxed subprocesses, ours in process, compared.

`run_steps` takes the step cases and a runner (the plugin passes
`pytest_verl_compat.upstream.oracle.runner.run_module`, the one place allowed to start upstream code;
this layer may not import it). `run_upstream` writes the shared models and starts
``python -I -m pytest_verl_compat.conformance.step.upstream`` once for every one-rank case and
variant (verl is imported once), and once per case that runs on several ranks (one process per
rank). Upstream's steps depend only on a case's settings (`plan.upstream_key`), so cases whose
settings are equal (a derived case that changes nothing the step reads, e.g. group filtering,
which V1 applies before the batch exists) share one upstream run; ours runs per case from
that case's own lowered config (`compare_case`).
The result is the step report: case → variant → quantity → largest difference, deterministic.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_verl_compat.conformance.step.plan import (
    CoverageTable,
    StepCase,
    StepPlan,
    load_coverage,
    load_step_plan,
    request_json,
    settings_key,
    step_settings,
    upstream_key,
)
from reference_trainer.config import ReferenceTrainerConfig

UPSTREAM_MODULE = "pytest_verl_compat.conformance.step.upstream"
# What run_upstream ran, beside its results.
INDEX = "upstream.json"


class StepOracleError(RuntimeError):
    """The upstream side did not run (its stderr's tail is the message)."""


@dataclass
class UpstreamSteps:
    """Upstream's results in `folder`, and what both sides need to run ours against them."""

    folder: Path
    plan: StepPlan
    table: CoverageTable
    eos: int
    vocab: range
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    """`settings_key` of each case and variant → its settings."""
    runs: dict[str, str] = field(default_factory=dict)
    """`settings_key` of each case and variant → the file upstream's run of it wrote."""

    def upstream(self, case_id: str, variant: str) -> dict[str, Any]:
        import torch

        name = self.runs[settings_key({"case": case_id, "variant": variant})]
        loaded: dict[str, Any] = torch.load(self.folder / "out" / f"{name}.pt", weights_only=False)
        return loaded


@dataclass(frozen=True)
class UpstreamRequests:
    """What `launch_upstream` sends, once the models are written (`prepare_upstream`)."""

    folder: Path
    requests: tuple[tuple[int, str], ...]
    """(ranks, stdin) of each launch: one per rank count."""
    index: str
    """What `launch_upstream` writes beside the results (`INDEX`), for `load_upstream`."""


def prepare_upstream(
    cases: Sequence[StepCase],
    folder: Path,
    *,
    plan: StepPlan | None = None,
    table: CoverageTable | None = None,
) -> UpstreamRequests:
    """The shared models under `folder/models` and the requests of upstream's launches."""
    from pytest_verl_compat.conformance.step.reference import prepare_models

    plan = plan or load_step_plan()
    table = table or CoverageTable(load_coverage())
    (folder / "models").mkdir(parents=True, exist_ok=True)
    (folder / "out").mkdir(exist_ok=True)
    wanted = {
        settings_key(s): s
        for case in sorted(cases, key=lambda c: c.id)
        for v in case.variants
        for s in [step_settings(case, plan.variants[v], table)]
    }
    # One upstream run per distinct settings: the first case (in sorted order) names its file.
    first: dict[str, dict[str, Any]] = {}
    for s in wanted.values():
        first.setdefault(upstream_key(s), s)
    adapters = {s["lora"]["adapter"]: s["lora"] for s in wanted.values() if s["lora"]}
    tokens = prepare_models(folder / "models", [adapters[k] for k in sorted(adapters)])
    by_ranks: dict[int, list[dict[str, Any]]] = {}
    for s in first.values():
        by_ranks.setdefault(s["ranks"], []).append(s)
    # One launch per rank count: its processes import verl once and run every case with that
    # many ranks in turn, in one process group.
    requests = tuple(
        (ranks, request_json(str(folder / "models"), tokens["eos"], tokens["vocab"], batch))
        for ranks, batch in sorted(by_ranks.items())
    )
    runs = {key: settings_key(first[upstream_key(s)]) for key, s in wanted.items()}
    index = {"eos": tokens["eos"], "vocab": tokens["vocab"], "settings": wanted, "runs": runs}
    return UpstreamRequests(folder, requests, json.dumps(index, sort_keys=True))


def launch_upstream(prepared: UpstreamRequests, run_module: Callable[..., Any]) -> None:
    """Upstream's results under `folder/out`, then the index `load_upstream` reads."""
    for ranks, stdin in prepared.requests:
        run = run_module(
            UPSTREAM_MODULE,
            [str(prepared.folder / "out")],
            stdin=stdin,
            timeout=1800,
            ranks=ranks,
        )
        if run.returncode != 0:
            raise StepOracleError(
                f"upstream step failed (exit {run.returncode}): {run.stderr_tail(8)}"
            )
    (prepared.folder / INDEX).write_text(prepared.index, encoding="utf-8")


def run_upstream(
    cases: Sequence[StepCase],
    run_module: Callable[..., Any],
    folder: Path,
    *,
    plan: StepPlan | None = None,
    table: CoverageTable | None = None,
) -> UpstreamSteps:
    """Models under `folder/models`, upstream's results under `folder/out`."""
    launch_upstream(prepare_upstream(cases, folder, plan=plan, table=table), run_module)
    return load_upstream(folder, plan=plan, table=table)


def load_upstream(
    folder: Path, *, plan: StepPlan | None = None, table: CoverageTable | None = None
) -> UpstreamSteps:
    """The results `run_upstream` wrote to `folder` (another process may have run it)."""
    index = json.loads((folder / INDEX).read_text(encoding="utf-8"))
    return UpstreamSteps(
        folder=folder,
        plan=plan or load_step_plan(),
        table=table or CoverageTable(load_coverage()),
        eos=index["eos"],
        vocab=range(*index["vocab"]),
        settings=index["settings"],
        runs=index["runs"],
    )


def compare_case(
    upstream: UpstreamSteps,
    case: StepCase,
    variant: str,
    *,
    config: ReferenceTrainerConfig | None = None,
    timings: dict[str, dict[str, dict[str, float]]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Our steps of `case` (or of `config`, a changed step config) against upstream's: the
    report entry of one variant."""
    import torch

    from pytest_verl_compat.conformance.step.compare import activity, compare_steps, summarise
    from pytest_verl_compat.conformance.step.plan import fixed_rollout
    from pytest_verl_compat.conformance.step.reference import reference_steps, step_config

    key = settings_key({"case": case.id, "variant": variant})
    settings = upstream.settings[key]
    up = upstream.upstream(case.id, variant)
    chosen = upstream.plan.variants[variant]
    ours = reference_steps(
        config or step_config(case, chosen),
        settings,
        upstream.folder / "models",
        chosen,
        eos=upstream.eos,
        vocab=upstream.vocab,
    )
    masks = []
    for spec in settings["rollouts"]:
        responses = fixed_rollout(upstream.vocab, upstream.eos, spec)["responses"]
        mask = torch.zeros(len(responses), max(len(r) for r in responses))
        for i, response in enumerate(responses):
            mask[i, : len(response)] = 1
        masks.append(mask)
    results = compare_steps(
        ours, up, masks, upstream.plan.tolerances[variant], not_compared=case.not_compared
    )
    results += activity(case.active, up, settings["overrides"], variant)
    if timings is not None:
        timings[key] = {
            side: {
                k: float(sum(step[k] for step in r["steps"]))
                for k in ("pass_seconds", "update_seconds")
            }
            for side, r in (("ours", ours), ("upstream", up))
        }
    return summarise(results)


def run_steps(
    cases: Sequence[StepCase],
    run_module: Callable[..., Any],
    *,
    timings: dict[str, dict[str, dict[str, float]]] | None = None,
) -> dict[str, Any]:
    """The step report of `cases`: case → variant → quantity → largest difference."""
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="verl-step-") as tmp:
        upstream = run_upstream(cases, run_module, Path(tmp))
        for case in sorted(cases, key=lambda c: c.id):
            for variant in case.variants:
                entry = compare_case(upstream, case, variant, timings=timings)
                report.setdefault(case.id, {})[variant] = entry
    return report


def case_failures(entry: Mapping[str, Any]) -> list[str]:
    """The failing quantities of one case's report entry, as `variant.quantity (diff, where)`."""
    return [
        f"{variant}.{quantity} (max |diff| {row['max_abs_diff']:.3g}"
        + (f" at {row['worst']}" if row["worst"] else "")
        + ")"
        for variant in sorted(entry)
        for quantity, row in sorted(entry[variant].items())
        if not row["passed"]
    ]


def report_json(report: Mapping[str, Any]) -> str:
    """The report as deterministic JSON (sorted keys, differences rounded to 3 significant digits)."""

    def rounded(value: Any) -> Any:
        if isinstance(value, float):
            return float(f"{value:.3g}")
        if isinstance(value, dict):
            return {k: rounded(v) for k, v in value.items()}
        return value

    return json.dumps(rounded(dict(report)), sort_keys=True, indent=1) + "\n"
