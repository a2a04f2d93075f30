"""``verl-compat fit SCRIPT --gpu TYPE``: will it fit? The memory forecast of one launch (or of a
run's resolved configuration, ``RUN/.hydra/config.yaml``, read as ``compile`` reads it).

For each kind of rank, each phase of a step (rollout, log-prob passes, critic and actor
updates, checkpoint save; SFT's update), the forecast peak and its parts against the GPU's
capacity; ``--format json`` follows ``pytest_verl_compat/data/fit.schema.json``, ``--plot``
draws stacked bars per rank. Exit status: 0 fits, 1 a phase exceeds the GPU (or a rollout
server cannot start, or the release's tree rejects an override: the forecast is then of the
launch without it), 2 unreadable input or a usage error (one line).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_verl_compat.cli.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    MODEL_NOT_FOUND,
    UsageError,
    add_bindings_flags,
    open_session,
    override_value,
)
from pytest_verl_compat.cli.fit_common import choose_gpu, forecast_case
from pytest_verl_compat.cli.fit_retired import forecast_retired
from pytest_verl_compat.cli.output import note
from pytest_verl_compat.releases.lines import cite

SETTING = "gpu"


def _lengths(text: str) -> tuple[int, int]:
    prompt, sep, response = text.partition(",")
    try:
        values = (int(prompt), int(response))
    except ValueError:
        values = (-1, -1)
    if not sep or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected PROMPT,RESPONSE token counts, got {text!r}")
    return values


def _gib(text: str) -> float:
    """--gpu-memory, refused as the option's own error where custom_gpu would refuse it."""
    from pytest_verl_compat.memory.gpus import custom_gpu

    try:
        value = float(text)
        custom_gpu(value)  # the one rule: a positive, finite size
    except ValueError:  # UnknownGpu is one
        raise argparse.ArgumentTypeError(
            f"expected a positive number of GiB, got {text!r}"
        ) from None
    return value


def gpu_setting(args: argparse.Namespace) -> str | None:
    """The ``gpu`` key of the nearest ``[tool.verl-compat]`` (unless --isolated)."""
    from pytest_verl_compat.cli.settings import project_settings

    value = project_settings(args).get(SETTING)
    return str(value) if value else None


def _refusal(prepared: Any, label: str) -> str:
    """Why a prepared target has no forecast (one line)."""
    found = prepared.result
    # each finding with its fix: the binding that gets the read past where it stopped
    reason = found.error or "; ".join(
        f"{f.location}: {f.message}" + (f" ({f.fix})" if f.fix else "") for f in found.findings
    )
    return str(reason or f"{label}: nothing to forecast")


@dataclass(frozen=True)
class WayForecast:
    """One way of a script (``when``: the tests it takes, "" for a script with one way) and its
    forecast with the locator of its findings, or why it has none (``refusal``)."""

    when: str
    forecast: Any = None
    locator: Any = None
    refusal: str = ""


def _forecasts(session: Any, prepared: Any, request: Any, label: str) -> list[WayForecast]:
    """Each way of the script forecast alone: one, with no condition, unless it goes several ways
    at tests only its run decides (``check``'s ways)."""
    parts = prepared.ways or [(None, prepared)]
    out = []
    for way, part in parts:
        when = way.said() if way is not None else ""
        if part.result is not None and part.retired is None:
            out.append(WayForecast(when, refusal=_refusal(part, label)))
            continue
        try:
            if part.retired is not None:
                # an entry point of an earlier release: what that release would run
                assert part.locator is not None, "a retired launch's fields are its locator's"
                retired = forecast_retired(session, part.retired, part.locator.fields, request)
                out.append(WayForecast(when, retired, part.locator))
                continue
            assert part.case is not None, "a prepared target has a case, a result or ways"
            out.append(WayForecast(when, forecast_case(session, part.case, request), part.locator))
        except UsageError as exc:
            if way is None:
                raise
            out.append(WayForecast(when, refusal=str(exc)))  # this way's own, said beside it
    return out


def cmd_fit(args: argparse.Namespace) -> int:
    from pytest_verl_compat.cli.check import Target, prepare, targets
    from pytest_verl_compat.cli.resolved import is_resolved_target, prepare_resolved
    from pytest_verl_compat.memory import findings as memory_findings
    from pytest_verl_compat.memory.forecast import Request
    from pytest_verl_compat.memory.report import dumps, json_payload, text_lines

    if not hasattr(args, "argv"):
        args.argv = []
    gpu = choose_gpu(args.gpu, args.gpu_memory, gpu_setting(args))
    if args.plot and Path(args.plot).suffix.lower() not in (".png", ".svg"):
        raise UsageError(f"{args.plot}: the picture must be .png or .svg")
    session = open_session(args)
    if args.model_config and not Path(args.model_config).expanduser().exists():
        from pytest_verl_compat.memory.models import model_by_name

        if model_by_name(args.model_config) is None:
            raise UsageError(f"{args.model_config}: {MODEL_NOT_FOUND}")
    if is_resolved_target(args.targets[0]):  # nargs=1: one target
        # a run's resolved configuration (the run that ran out of memory, say): its case as
        # compile prepares it, each finding at its key's line of the file
        prepared = prepare_resolved(session, args.targets[0], args)
        label = prepared.target.label
    else:
        listed: list[Target] = targets(args, session)
        if len(listed) != 1:
            raise UsageError("fit takes one launch script (or case)")
        label = listed[0].label
        with tempfile.TemporaryDirectory(prefix="verl-compat-fit-") as scratch:
            prepared = prepare(session, listed[0], args, Path(scratch))
    request = Request(gpu=gpu, model_config=args.model_config, lengths=args.lengths, script=label)
    runs = _forecasts(session, prepared, request, label)
    forecast = [run for run in runs if run.forecast is not None]
    if not forecast:
        raise UsageError(
            "; ".join(f"{r.refusal} ({r.when})" if r.when else r.refusal for r in runs)
        )
    why = session.release.why if session.release else ""
    release = {"version": session.version, "chosen_by": why}
    rendered: list[Any] = []  # each way's JSON payload, or its text
    for run in forecast:
        if args.format == "json":
            rendered.append(json_payload(run.forecast) | {"release": release})
        else:
            lines = text_lines(run.forecast, parts=not args.brief)
            lines += _located(run.forecast, run.locator)
            rendered.append("".join(line + "\n" for line in lines))
    alike = len(forecast) == len(runs) and all(r == rendered[0] for r in rendered)
    if len(runs) > 1 and alike:
        note(
            "fit",
            f"the script goes {len(runs)} ways at tests only its run decides; each way forecasts this",
        )
    text: str
    if alike:
        text = dumps(rendered[0]) if args.format == "json" else rendered[0]
    else:
        if args.plot:
            raise UsageError(
                f"{label}: its ways forecast differently ({'; '.join(r.when for r in runs)}); "
                "run without --plot for each way's, or bind what the tests read to draw one"
            )
        text = _ways_text(args.format, runs, iter(rendered), release, label)
    # The release is a choice, said as one; the parts cite its own lines (``releases.lines``).
    note("fit", f"forecast for verl {session.version} ({why})")
    sys.stdout.write(cite(text, session.version))
    if args.plot:
        from pytest_verl_compat.memory.plot import write_plot

        try:
            write_plot(forecast[0].forecast, Path(args.plot))
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        except OSError as exc:
            raise UsageError(f"{args.plot}: cannot write: {exc.strerror}") from exc
        note("fit", f"wrote {args.plot}")
    # an error finding fails the run: a phase over the GPU, a server that cannot start, an
    # override the release's tree rejects (memory/findings.py as_findings says them all)
    failed = any(
        f.level == "error" for run in forecast for f in memory_findings.as_findings(run.forecast)
    )
    return EXIT_FINDINGS if failed else EXIT_OK


def _ways_text(
    form: str,
    runs: list[WayForecast],
    rendered: Any,
    release: dict[str, str],
    label: str,
) -> str:
    """Each way's forecast (``rendered``: its text or payload, in order) or why it has none, under
    the tests it takes."""
    if form == "json":
        from pytest_verl_compat.memory.report import SCHEMA_VERSION, dumps

        ways = [
            {"when": run.when, "forecast": next(rendered)}
            if run.forecast is not None
            else {"when": run.when, "not_forecast": run.refusal}
            for run in runs
        ]
        payload = {"schema_version": SCHEMA_VERSION, "release": release, "script": label}
        return str(dumps(payload | {"ways": ways}))
    blocks = [
        f"{run.when}:\n{next(rendered)}"
        if run.forecast is not None
        else f"{run.when}: not forecast: {run.refusal}\n"
        for run in runs
    ]
    return "\n".join(blocks)


def _located(result: Any, locator: Any) -> list[str]:
    """The findings, each at the script line where its first key was set (as check prints)."""
    from pytest_verl_compat.memory import findings as memory_findings

    findings = memory_findings.as_findings(result)
    if locator is not None:
        findings = locator.located(findings)
    out = [""] if findings else []
    for f in findings:
        where = f"{f.location}: " if f.location is not None else ""
        out.append(f"{where}{f.level}[{f.rule}] {f.path}: {f.message} ({f.fix})")
    return out


def add_fit_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    from pytest_verl_compat.cli.resolved import add_world_size_flag

    fit = sub.add_parser(
        "fit",
        parents=[common],
        help="forecast the GPU memory of each rank, role and phase of a launch; exit 1 if a phase does not fit",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    fit.add_argument(
        "targets",
        nargs=1,
        metavar="SCRIPT|CASE|RESOLVED.yaml|RUN",
        help="a launch script, a manifest case id, or a run's resolved configuration "
        "(RUN/.hydra/config.yaml, or the run folder)",
    )
    fit.add_argument(
        "--gpu",
        metavar="TYPE",
        help="the GPU type (H100-80GB, H200, H20, B200, A100-80GB, A100-40GB, L40S, L20, A40, A6000, A10, L4, RTX4090, RTX3090, V100-32GB, MI300X, Ascend-910B, ...)",
    )
    fit.add_argument(
        "--gpu-memory",
        type=_gib,
        metavar="GIB",
        help="any other GPU: its usable memory in GiB (as torch reports it)",
    )
    fit.add_argument(
        "--model-config",
        metavar="PATH|MODEL",
        help="the actor model's config.json (or its folder), read as JSON only; or a model the "
        "shipped table or the Hugging Face cache knows by name (a fine-tune's base model)",
    )
    fit.add_argument(
        "--set", action="append", type=override_value, metavar="KEY=VALUE", help="an extra override"
    )
    fit.add_argument(
        "--lengths",
        type=_lengths,
        metavar="PROMPT,RESPONSE",
        help="tokens per prompt and response (default: the configured maxima, every response at its limit)",
    )
    fit.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="text (default) or json (schema: pytest_verl_compat/data/fit.schema.json)",
    )
    fit.add_argument(
        "--plot",
        metavar="PATH",
        help="draw the forecast (PNG or SVG by the suffix; needs the [trainer] extra's matplotlib)",
    )
    fit.add_argument(
        "--brief", action="store_true", help="text: the phases' totals without their parts"
    )
    fit.add_argument(
        "--isolated", action="store_true", help="ignore [tool.verl-compat] in pyproject.toml"
    )
    fit.add_argument("--stdin-filename", metavar="NAME", help=argparse.SUPPRESS)
    add_world_size_flag(fit)
    add_bindings_flags(fit)
    fit.set_defaults(func=cmd_fit)
