"""Fuzzing: the composer on arbitrary overrides, the manifest loader on mutated manifests, and the
launch reader on generated scripts of supported constructs against real bash."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from bash_oracle import BASH, ENV, UNBOUND_MARKER, run_bash
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pytest_verl_compat.bash import read_launch_text
from pytest_verl_compat.model import Bindings, Composition, Manifest
from pytest_verl_compat.pipeline.compose import Composer
from pytest_verl_compat.pipeline.manifest import ManifestError, load_manifest

REPO = Path(__file__).resolve().parents[1]
UPSTREAM = Path(os.environ.get("VERL_UPSTREAM") or REPO.parent / "shared/upstream/verl-v0.9.0")
CONFIG_DIR = UPSTREAM / "verl/trainer/config"
MANIFEST = REPO / "corpus/manifest.yaml"
FIXTURES = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]

# --- (a) the composer never raises ----------------------------------------------------------------

override_text = st.one_of(
    st.text(max_size=30),
    st.text(alphabet="abc.=+~@/,[]{}()'\"$:\\ 01-_*", max_size=30),
    st.builds(
        lambda prefix, key, value: f"{prefix}{key}={value}",
        st.sampled_from(["", "+", "++", "~"]),
        st.sampled_from(
            ["trainer.nnodes", "trainer", "model_engine", "data", "x.y", "actor_rollout_ref.actor"]
        ),
        st.text(alphabet="abc01[]{}(),:'\"${}.=\\ -", max_size=16),
    ),
)


@pytest.mark.skipif(not CONFIG_DIR.is_dir(), reason=f"no verl config tree at {CONFIG_DIR}")
@settings(max_examples=50, deadline=None, suppress_health_check=FIXTURES)
@given(fields=st.lists(override_text, max_size=3))
@example(fields=["actor_rollout_ref.actor.optim._target_=0", "model_engine=[0]"])
def test_compose_never_raises(fields: list[str]) -> None:
    # Rejected overrides go through Hydra (~1 s each), hence no per-example deadline.
    result = Composer(CONFIG_DIR, "ppo_trainer").compose(fields, {"HOME": "/home/verl"})
    assert isinstance(result, Composition)
    assert result.outcome in {"composed", "composition_rejection"}
    assert (result.resolved is not None) == result.composed
    assert result.composed or result.reason


# --- (b) the manifest loader returns a Manifest or raises ManifestError ---------------------------

BASE_MANIFEST = yaml.safe_load(MANIFEST.read_text())
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=10),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    st.sampled_from(["0" * 64, "g" * 64, "abc", "", "../../etc/passwd", "/abs/path.sh"]),
)


def _containers(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(node, dict):
        for key, item in node.items():
            out.extend(_containers(item, (*path, key)))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            out.extend(_containers(item, (*path, index)))
    return out


@st.composite
def mutated_manifest(draw: st.DrawFn) -> Any:
    data = copy.deepcopy(BASE_MANIFEST)
    for _ in range(draw(st.integers(1, 4))):
        paths = [p for p in _containers(data) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = data
        for step in path[:-1]:
            parent = parent[step]
        action = draw(st.sampled_from(["delete", "replace", "duplicate_case", "bad_hash"]))
        if action == "delete":
            del parent[path[-1]]
        elif action == "replace":
            parent[path[-1]] = draw(JUNK)
        elif action == "duplicate_case" and isinstance(data, dict):
            cases = data.get("cases")
            if isinstance(cases, list) and cases:
                cases.append(copy.deepcopy(cases[draw(st.integers(0, len(cases) - 1))]))
        elif action == "bad_hash" and isinstance(parent, dict) and "sha256" in parent:
            parent["sha256"] = draw(st.sampled_from(["0" * 63, "Z" * 64, 12, None]))
    return data


def _check_manifest(tmp_path: Path, text: str) -> None:
    (tmp_path / "conformance.yaml").write_text((REPO / "corpus/conformance.yaml").read_text())
    path = tmp_path / "manifest.yaml"
    path.write_text(text)
    try:
        manifest = load_manifest(path)
    except ManifestError as exc:
        assert str(exc)
        return
    assert isinstance(manifest, Manifest)
    ids = [case.id for case in manifest.cases]
    for case in manifest.cases:
        assert case.error is None or isinstance(case.error, str)
    # A duplicate id is reported on every later case, never silently merged.
    assert all(
        ids.count(case.id) == 1 or case.error or ids.index(case.id) == i
        for i, case in enumerate(manifest.cases)
    )


# No per-example deadline: a load takes ~55 ms, but one took 1.25 s (then 86 ms on the rerun)
# while the trainer tests shared the two cores, and hypothesis fails such a test as flaky.
@settings(max_examples=100, deadline=None, suppress_health_check=FIXTURES)
@given(data=mutated_manifest())
def test_mutated_manifest_loads_or_raises_manifest_error(tmp_path: Path, data: Any) -> None:
    _check_manifest(tmp_path, yaml.safe_dump(data, sort_keys=False))


@settings(max_examples=100, deadline=None, suppress_health_check=FIXTURES)
@given(cut=st.integers(0, len(MANIFEST.read_text())), junk=st.text(max_size=8))
def test_truncated_manifest_text_loads_or_raises_manifest_error(
    tmp_path: Path, cut: int, junk: str
) -> None:
    text = MANIFEST.read_text()
    _check_manifest(tmp_path, text[:cut] + junk + text[cut + len(junk) :])


# --- (c) generated scripts of supported constructs, against real bash ----------------------------

LAUNCH = "python3 -m verl.trainer.main_ppo"
WORD = st.from_regex(r"[a-z0-9_./-]{1,8}", fullmatch=True)
SPACED = st.from_regex(r"[a-z0-9_.-]{1,5}( [a-z0-9_.-]{1,5}){0,2}", fullmatch=True)


@st.composite
def launch_script(draw: st.DrawFn) -> tuple[str, dict[str, str]]:
    lines = ["#!/usr/bin/env bash", draw(st.sampled_from(["", "set -euo pipefail", "set -x"]))]
    env: dict[str, str] = {}
    names: list[str] = []
    for index in range(draw(st.integers(1, 4))):
        name = f"V{index}"
        form = draw(st.sampled_from(["default", "literal", "quoted", "concat", "default_ref"]))
        if form == "default":
            lines.append(f"{name}=${{{name}:-{draw(WORD)}}}")
            if draw(st.booleans()):
                env[name] = draw(WORD)
        elif form == "literal":
            lines.append(f"{name}={draw(WORD)}")
        elif form == "quoted":
            lines.append(f'{name}="{draw(SPACED)}"')
        elif form == "concat" and names:
            lines.append(f'{name}="${{{draw(st.sampled_from(names))}}}_{draw(WORD)}"')
        else:
            ref = draw(st.sampled_from(names)) if names else "UNSET_X"
            lines.append(f"{name}=${{{ref}:-{draw(WORD)}}}")
        names.append(name)
    subject = draw(st.sampled_from(names))
    pattern = draw(WORD)
    lines += [
        f'case "${subject}" in',
        f"  {pattern}) CHOICE={draw(WORD)} ;;",
        f"  *) CHOICE={draw(WORD)} ;;",
        "esac",
        f'if [ "${draw(st.sampled_from(names))}" = "{draw(WORD)}" ]; then',
        f"  BRANCH={draw(WORD)}",
        "else",
        f"  BRANCH={draw(WORD)}",
        "fi",
    ]
    items = draw(st.lists(st.sampled_from(names), min_size=0, max_size=3))
    lines.append("ARR=(" + " ".join(f'"k{i}.x=${n}"' for i, n in enumerate(items)) + ")")
    args = [f"a{i}.b=${{{n}}}" for i, n in enumerate(names)]
    args += ['"${ARR[@]}"', "choice.value=$CHOICE", '"branch.value=${BRANCH}"']
    lines.append(f"{LAUNCH} \\\n    " + " \\\n    ".join(args))
    return "\n".join(lines) + "\n", env


@pytest.mark.skipif(BASH is None or ENV is None, reason="bash/env not available")
@settings(max_examples=60, deadline=None, suppress_health_check=FIXTURES)
@given(script=launch_script())
def test_generated_script_argv_matches_bash(tmp_path: Path, script: tuple[str, dict[str, str]]):
    # Each example runs bash and shfmt in subprocesses, hence no per-example deadline.
    text, extra = script
    bindings = Bindings(variables={"HOME": "/home/verl", **extra})
    oracle = run_bash(text.encode(), tmp_path, bindings.variables, {})
    assert oracle.argv is not None, f"bash exited {oracle.returncode}: {oracle.stderr}\n{text}"
    assert all(UNBOUND_MARKER not in field for field in oracle.argv)
    read = read_launch_text(text, bindings, path="generated.sh")
    assert read.argv == oracle.argv, text
