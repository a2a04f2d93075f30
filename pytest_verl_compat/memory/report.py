"""The forecast for a terminal (a table per kind of rank) and as JSON (data/fit.schema.json)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from pytest_verl_compat.memory.layout import SERVE
from pytest_verl_compat.memory.parts import PHASE_TITLES, Forecast, ReleaseRemedy, gib

SCHEMA_VERSION = 1
BAR = 24


def _gib(value: int) -> str:
    return f"{gib(value):.2f}"


def text_lines(forecast: Forecast, parts: bool = True) -> list[str]:
    """The forecast as a terminal reads it: one table per kind of rank, largest parts first."""
    lines = [
        f"{forecast.script or 'configuration'}: {forecast.model} ({forecast.model_origin})",
        f"GPU: {forecast.gpu}; {forecast.world} GPUs in the "
        + ("run" if forecast.kind == SERVE else "trainer"),
    ]
    lines += [f"assumes: {a}" for a in forecast.assumptions]
    capacity = forecast.capacity
    for rank in forecast.ranks:
        lines += ["", f"{rank.name} GPUs ({rank.count}): {rank.description}"]
        header = f"  {'phase':<26} {'peak GiB':>9}"
        if capacity:
            header += f"  {'of GPU':>6}  {'':<{BAR}}"
        lines.append(header)
        for phase in rank.phases:
            row = f"  {PHASE_TITLES[phase.phase]:<26} {_gib(phase.total):>9}"
            if capacity:
                share = phase.total / capacity
                filled = min(BAR, round(share * BAR))
                mark = "!" if share > 1 else ("~" if share > forecast.margin else " ")
                row += f"  {share:>5.0%}{mark} {'#' * filled}{'.' * (BAR - filled)}"
            lines.append(row)
            if parts:
                for part in sorted(phase.parts, key=lambda p: (-p.bytes, p.key)):
                    if part.bytes:
                        lines.append(f"      {_gib(part.bytes):>8}  {part.label}: {part.formula}")
    if forecast.server:
        s = forecast.server
        lines += [
            "",
            f"rollout KV cache per GPU: {_pool_text(s)} after "
            f"{_gib(int(s['weights']))} GiB of weights{_lora_slots(s)} and {_gib(int(s['overhead']))} GiB of profiled "
            f"activations and non-torch allocations{_graphs_where(s)}; one max_model_len sequence "
            f"needs {_gib(int(s['one_sequence_bytes']))} GiB",
        ]
    return lines


def _lora_slots(server: Mapping[str, int | float]) -> str:
    """The server's LoRA slots, which its weights include (server_lora)."""
    slots = int(server.get("lora_slots", 0))
    return f" ({_gib(slots)} GiB of them its LoRA slots)" if slots else ""


def _pool_text(server: Mapping[str, int | float]) -> str:
    """The KV cache as its server counts it: vLLM's blocks, SGLang's tokens (a block of one
    token), SGLang's sliding-window pool beside its full layers'."""
    tokens, kv = int(server["kv_tokens"]), _gib(int(server["kv_bytes"]))
    if int(server["block_size"]) == 1:
        window = int(server.get("window_tokens", 0))
        if window:
            return f"{tokens:,} tokens in the full-attention layers and {window:,} in the sliding-window layers' pool ({kv} GiB)"
        return f"{tokens:,} tokens ({kv} GiB)"
    return f"{int(server['blocks']):,} blocks of {int(server['block_size'])} tokens ({tokens:,} tokens, {kv} GiB)"


def _graphs_where(server: Mapping[str, int | float]) -> str:
    """Where the server's CUDA graphs sit: in its share (counted in the overhead), or outside."""
    outside = int(server["outside_share"])
    if not outside and not int(server["cuda_graphs"]):
        return " in its share; no CUDA graphs (enforce_eager)"
    if outside:
        # SGLang's static share holds weights and pool only: its activations sit outside too
        what = (
            "CUDA graphs" if outside == int(server["cuda_graphs"]) else "CUDA graphs, activations"
        )
        return f" in its share; {_gib(outside)} GiB ({what}) outside it"
    return f", CUDA graphs ({_gib(int(server['cuda_graphs']))} GiB) included, in its share"


def verdict_lines(forecast: Forecast) -> list[str]:
    """One line per finding, as check prints them: level[rule] keys: message (fix)."""
    out = []
    for v in forecast.verdicts:
        fixes = "; ".join(
            f"{f.text()} -> {_gib(f.after)} GiB" + (f" ({f.outcome()})" if f.outcome() else "")
            for f in v.suggestions
        )
        tail = f" (change {', '.join(v.keys)}" + (f"; e.g. {fixes}" if fixes else "") + ")"
        out.append(f"{v.level}[memory.{v.phase}] {v.keys[0] if v.keys else ''}: {v.message}{tail}")
    return out


def json_payload(forecast: Forecast) -> dict[str, Any]:
    """The forecast as data/fit.schema.json describes it (bytes as integers, keys sorted)."""
    payload: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "script": forecast.script,
        "kind": forecast.kind,
        "model": {"name": forecast.model, "origin": forecast.model_origin},
        "gpu": {
            "name": forecast.gpu,
            "capacity_bytes": forecast.capacity,
            "assumed": forecast.capacity_assumed,
        },
        "margin": forecast.margin,
        "world": forecast.world,
        "assumptions": list(forecast.assumptions),
        "ranks": [
            {
                "name": rank.name,
                "count": rank.count,
                "description": rank.description,
                "phases": [
                    {
                        "phase": phase.phase,
                        "title": PHASE_TITLES[phase.phase],
                        "role": phase.role,
                        "total_bytes": phase.total,
                        "parts": [
                            {
                                "key": p.key,
                                "label": p.label,
                                "bytes": p.bytes,
                                "formula": p.formula,
                                "evidence": p.evidence,
                            }
                            for p in phase.parts
                        ],
                    }
                    for phase in rank.phases
                ],
            }
            for rank in forecast.ranks
        ],
        "findings": [
            {
                "level": v.level,
                "rule": f"memory.{v.phase}",
                "rank": v.rank,
                "phase": v.phase,
                "total_bytes": v.total,
                "capacity_bytes": v.capacity,
                "message": v.message,
                "keys": list(v.keys),
                "fixes": [
                    {
                        "set": [f"{k}={val}" for k, val in f.keys],
                        "after_bytes": f.after,
                        "phase_fits": f.phase_fits,
                        "fits": f.fits,
                    }
                    for f in v.fixes
                ],
            }
            | (_remedy(v.remedy) if v.remedy else {})
            for v in forecast.verdicts
        ],
        "rollout_kv_cache": dict(sorted(forecast.server.items())),
    }
    # the optional sections, only where the forecast has them
    if forecast.set_aside:
        payload["set_aside"] = [
            {"written": a.written, "key": a.key, "applied": a.applied, "reason": a.reason}
            | ({"moved": a.moved} if a.moved else {})
            for a in forecast.set_aside
        ]
    if forecast.refused:
        payload["adapter_refused"] = [dataclasses.asdict(r) for r in forecast.refused]
    return payload


def _remedy(remedy: ReleaseRemedy) -> dict[str, Any]:
    return {
        "release_remedy": {
            "release": remedy.release,
            "key": remedy.key,
            "value": remedy.value,
            "evidence": remedy.evidence,
            "after_bytes": remedy.after,
            "phase_fits": remedy.phase_fits,
            "fits": remedy.fits,
        }
    }


def dumps(payload: dict[str, Any]) -> str:
    return json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
