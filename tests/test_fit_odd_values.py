"""Any value at any key the forecast may read is a forecast or one line, never a traceback.

Every leaf of the launch's resolved configuration, under every section a forecast reads (the
roles, the rollout, the data; the SFT trainer's engine, model, data and optimizer), is set with
``--set`` to values a user's typo or an unset variable gives: a negative number, and by turns a
mapping, zero, a huge number, text, a quoted number, a fraction, an empty list or mapping, null,
an empty string. ``fit`` must exit 0 or 1 with a forecast, or 2 with one line. The keys are every
leaf of the composed tree, not a list of the ones that once failed (a fuzz of 60 keys by hand
found ``checkpoint.save_contents=-1`` raising a TypeError, and dtypes read silently).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from pytest_verl_compat import cli
from pytest_verl_compat.pipeline.audit import AuditSession

SCRIPTS = {
    "rl": ("examples/grpo_trainer/run_qwen3_8b_fsdp.sh", ("actor_rollout_ref", "critic", "data")),
    "sft": ("examples/sft/gsm8k/run_qwen_megatron_fsdp.sh", ("engine", "model", "data", "optim")),
}
# what a typo or an unset variable writes, as Hydra's grammar reads it
ODD = ["0", "-1", "1000000000000000", "abc", "'8'", "3.5", "-0.5", "1e300", "[]", "{}", "null", ""]
ODD += ["true", "[1,2]", "{a:1}"]


def _leaves(node: Any, prefix: str) -> Iterator[str]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key != "_target_":
                yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    elif prefix:
        yield prefix


# Every key gets a number where text or a list may be read; the other odd values (a mapping
# where a number may be read among them) go round the keys, each key its own.
PASSES = ("-1", "round")


@pytest.mark.parametrize("odd", PASSES)
@pytest.mark.parametrize("kind", sorted(SCRIPTS))
def test_an_odd_value_at_any_key_is_a_forecast_or_one_line(
    upstream_session: AuditSession, upstream_checkout: Path, kind: str, odd: str
) -> None:
    script, sections = SCRIPTS[kind]
    path = upstream_checkout / script
    case = dataclasses.replace(upstream_session.case_for_script(path), id=script)
    mapping = upstream_session.outcome(case).composition.mapping
    keys = sorted(k for section in sections for k in _leaves(mapping.get(section, {}), section))
    forecasts = 0
    for index, key in enumerate(keys):
        value = ODD[index % len(ODD)] if odd == "round" else odd
        status, out, said = _fit(path, f"{key}={value}")
        where = f"--set {key}={value}"
        assert "Traceback" not in said and "internal error" not in said, (where, said)
        assert status in (0, 1, 2), (where, status, said)
        if status == 2:
            lines = [line for line in said.strip().splitlines() if line.startswith("verl-compat")]
            assert len(lines) == 1 and out == "", (where, said)
        else:
            assert "peak GiB" in out, (where, said)
            forecasts += 1
    assert forecasts > len(keys) // 2  # most keys hold no memory: the run is still forecast


def _fit(path: Path, setting: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = cli.main(["fit", str(path), "--gpu", "H100", "--set", setting])
        except SystemExit as exc:
            status = int(exc.code or 0)
    return status, out.getvalue(), err.getvalue()
