"""One rule set for every input (issue 46): ``compile RESOLVED`` judges a run's resolved file by
``check``'s rules, through the same code.

A resolved file here is what a run of the case writes: its resolved mapping as
``RUN/.hydra/config.yaml`` and the overrides it was given as ``RUN/.hydra/overrides.yaml``. Every
rule with an example (the static checks, the profile's, upstream's own early checks) fires on the
example's resolved file and not on its twin's, except the rules a resolved file cannot decide
(``NEEDS_LAUNCH``, each with why; the test fails when one of them starts to fire); every corpus
case gets from ``compile`` the findings ``check`` gives it, modulo where they are located.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from corpus_facts import needs_release, release_ready
from hostile_canary import make_canary

from pytest_verl_compat.checks import Example
from pytest_verl_compat.checks.model_facts import ModelFacts
from pytest_verl_compat.memory import findings as memory_findings  # registers the memory.* pages
from pytest_verl_compat.model import Case, Finding
from pytest_verl_compat.pipeline.audit import AuditSession
from pytest_verl_compat.pipeline.hydra_internals import override_literal
from pytest_verl_compat.pipeline.profile import load_profile
from pytest_verl_compat.pipeline.resolved import changed_fields
from pytest_verl_compat.upstream.oracle.client import UpstreamOracle
from pytest_verl_compat.upstream.verdict.case import (
    CaseCheck,
    check_case,
    live_asker,
    many_asker,
)
from pytest_verl_compat.upstream.verdict.rules import all_rules

CLI = (sys.executable, "-m", "pytest_verl_compat.cli")
RULES = all_rules()
# The memory forecast's rules need a GPU (check --gpu, fit): tests/test_fit_rules.py runs their
# examples. Their pages are registered above whatever the tests collected before, so that every
# worker collects the same parameters.
WITH_EXAMPLES = sorted(
    rule
    for rule, doc in RULES.items()
    if doc.example is not None and doc.source != memory_findings.SOURCE
)
_counter = itertools.count()

# The rules whose example a resolved file cannot reproduce, and why: what decides them is the
# launch's, which no run folder records.
NEEDS_LAUNCH = {
    "entry.forced-value": (
        "the entry module is the launch's: a file of main_ppo's tree is checked as main_ppo's, "
        "so a value another entry point (fully_async_main) overwrites is not known to be one"
    ),
    "run.async-test-freq-zero": (
        "the entry module is the launch's: a resolved file is checked as main_ppo's, whose loop "
        "tests test_freq > 0 before dividing (fully_async_main's trainer does not)"
    ),
}


@pytest.fixture(scope="module")
def session(upstream_session: AuditSession) -> AuditSession:
    return upstream_session


def run_folder(folder: Path, mapping: dict[str, Any], overrides: tuple[str, ...] | None) -> Path:
    """A run folder as Hydra writes it: the resolved mapping, and the overrides when given."""
    hydra = folder / ".hydra"
    hydra.mkdir(parents=True, exist_ok=True)
    (hydra / "config.yaml").write_text(yaml.safe_dump(mapping, sort_keys=False))
    if overrides is not None:
        (hydra / "overrides.yaml").write_text(yaml.safe_dump(list(overrides), sort_keys=False))
    return folder


def resolved_twin(
    session: AuditSession, case: Case, folder: Path, *, overrides: bool = True
) -> Case:
    """The case's run folder, as a case of its own: its mapping, its overrides, its world."""
    outcome = session.outcome(case)
    assert outcome.composition.composed, outcome.composition.reason
    written = run_folder(
        folder, outcome.composition.mapping, outcome.fields.fields if overrides else None
    )
    return session.case_for_resolved(written, world_size=outcome.fields.world_size)


def unlocated(findings: tuple[Finding, ...]) -> list[dict[str, Any]]:
    return [dataclasses.replace(f, location=None).to_json() for f in findings]


def same_verdict(by_check: CaseCheck, by_compile: CaseCheck) -> None:
    assert unlocated(by_compile.findings) == unlocated(by_check.findings)
    assert (by_compile.valid, by_compile.runnable) == (by_check.valid, by_check.runnable)
    assert by_compile.problems == by_check.problems


# ------------------------------------------------------------------ every rule, file and twin


def _example_case(session: AuditSession, example: Example, overrides: tuple[str, ...]) -> Case:
    if example.base.endswith(".sh"):
        assert session.upstream is not None
        base = session.case_for_script(session.upstream.root / example.base)
    else:
        assert session.manifest is not None
        base = session.manifest.case(example.base)
    fresh = dataclasses.replace(base, id=f"{base.id}+resolved-example{next(_counter)}")
    return session.with_overrides(fresh, overrides)


def _rules_of(
    session: AuditSession,
    rule: str,
    twin: bool,
    folder: Path,
    oracle: UpstreamOracle | None,
) -> tuple[list[str], list[str]]:
    """The rules ``check`` and ``compile`` give the example (or its twin)."""
    example = RULES[rule].example
    assert example is not None
    model = example.twin_model if twin and example.twin_model is not None else example.model
    session.model_facts_override = ModelFacts("example config.json", **model) if model else None
    try:
        case = _example_case(session, example, example.twin if twin else example.fires)
        ask = live_asker(session, None, oracle) if example.upstream else None
        by_check = [f.rule for f in check_case(session, case, ask).findings]
        if not session.outcome(case).composition.composed:
            return by_check, by_check  # a composition rejection: the file is never written
        resolved = resolved_twin(session, case, folder)
        return by_check, [f.rule for f in check_case(session, resolved, ask).findings]
    finally:
        session.model_facts_override = None


@pytest.mark.parametrize("rule", WITH_EXAMPLES)
def test_each_rule_fires_on_the_resolved_file_and_not_on_its_twin(
    session: AuditSession, rule: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    example = RULES[rule].example
    assert example is not None
    oracle = None
    if example.upstream:
        if not release_ready():
            pytest.skip("upstream's own checks need the release's environment")
        oracle = request.getfixturevalue("oracle")
    check_fires, compile_fires = _rules_of(session, rule, False, tmp_path / "fires", oracle)
    check_twin, compile_twin = _rules_of(session, rule, True, tmp_path / "twin", oracle)
    assert rule in check_fires and rule not in check_twin  # the example itself (test_rule_pages)
    if rule in NEEDS_LAUNCH:
        assert rule not in compile_fires, f"{rule} now fires on a resolved file: drop NEEDS_LAUNCH"
        return
    assert rule in compile_fires, f"{rule} does not fire on its example's resolved file"
    assert rule not in compile_twin, f"{rule} fires on its valid twin's resolved file"


# ------------------------------------------------------------------ parity on the corpus


def _composed_corpus_ids() -> list[str]:
    manifest = yaml.safe_load(
        (Path(__file__).resolve().parents[1] / "corpus" / "manifest.yaml").read_text()
    )
    golden = Path(__file__).resolve().parents[1] / "golden" / "compose"
    return [
        case["id"]
        for case in manifest["cases"]
        if json.loads((golden / f"{case['id']}.json").read_text())["outcome"] == "composed"
    ]


@needs_release()
@pytest.mark.parametrize("case_id", _composed_corpus_ids())
def test_check_and_compile_give_every_corpus_case_the_same_findings(
    session: AuditSession, case_id: str, tmp_path: Path
) -> None:
    """``check CASE`` and ``compile`` of the case's run folder: the same findings (rule, level,
    keys, message, fix, evidence), the same verdicts, upstream's answer the recorded one."""
    assert session.manifest is not None
    case = session.manifest.case(case_id)
    resolved = resolved_twin(session, case, tmp_path / "run")
    ask, close = many_asker(session, [case, resolved], workers=1)
    try:
        same_verdict(check_case(session, case, ask), check_case(session, resolved, ask))
    finally:
        close()


@pytest.mark.parametrize("case_id", ["grpo", "ppo", "dr_grpo", "grpo_lora", "sft_gsm8k"])
def test_without_overrides_the_changed_leaves_are_the_keys_the_run_set(
    session: AuditSession, case_id: str, tmp_path: Path
) -> None:
    """A run folder without overrides.yaml: the keys taken as set are those whose value the run
    changed, every one a key the script set (a key set to its default value is not seen)."""
    assert session.manifest is not None
    case = session.manifest.case(case_id)
    resolved = resolved_twin(session, case, tmp_path / "run", overrides=False)
    derived = {f.split("=", 1)[0] for f in session.outcome(resolved).fields.fields}
    written = {f.split("=", 1)[0].lstrip("+~") for f in session.outcome(case).fields.fields}
    assert derived and derived <= written, sorted(derived - written)
    assert session.compile(resolved) is not None


@pytest.mark.parametrize("name", ["grpo,v2", "1e-4", "C:\\runs\\", "it's"])
def test_a_derived_leaf_is_not_a_key_whatever_the_name_it_derives_from(
    session: AuditSession, name: str, tmp_path: Path
) -> None:
    """trainer.default_local_dir derives from the experiment's name; a name Hydra's grammar
    would read otherwise unquoted (a comma, a float's spelling, a backslash, a quote) is written
    back as Hydra reads it, so the derived leaf is still seen as derived."""
    assert session.manifest is not None
    case = session.with_overrides(
        dataclasses.replace(session.manifest.case("grpo"), id=f"grpo+name{next(_counter)}"),
        (f"trainer.experiment_name={override_literal(name)}",),
    )
    resolved = resolved_twin(session, case, tmp_path / "run", overrides=False)
    keys = {f.split("=", 1)[0] for f in session.outcome(resolved).fields.fields}
    assert "trainer.experiment_name" in keys
    assert "trainer.default_local_dir" not in keys


def test_changed_fields_skip_a_copy_made_by_interpolation() -> None:
    base = {"a": {"strategy": "fsdp"}, "b": {"strategy": "fsdp"}, "c": 1}
    sources = {"b.strategy": "a.strategy"}
    run = {"a": {"strategy": "fsdp2"}, "b": {"strategy": "fsdp2"}, "c": 1}
    assert changed_fields(run, base, sources) == ("a.strategy=fsdp2",)
    # The copy set apart from its source is a key of its own.
    run["b"]["strategy"] = "megatron"
    assert changed_fields(run, base, sources) == ("a.strategy=fsdp2", "b.strategy=megatron")


def test_an_sft_run_folder_is_the_sft_trainers(session: AuditSession, tmp_path: Path) -> None:
    """Its file is matched against sft_trainer_engine and compiled with the SFT profile."""
    assert session.manifest is not None
    case = session.manifest.case("sft_gsm8k")
    resolved = resolved_twin(session, case, tmp_path / "run")
    report = session.compile(resolved)
    assert report is not None and report.accepted, report
    assert report.profile == load_profile(session.release_profile("sft")).name
    # The same file read as main_ppo's would be a tree mismatch, not a verdict.
    assert session.outcome(resolved).fields.module == "verl.trainer.sft_trainer"


# ------------------------------------------------------------------ the command, hostile files


def _compile(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "compile", *args], capture_output=True, text=True, check=False, cwd=cwd
    )


def _golden_mapping(case_id: str) -> tuple[dict[str, Any], list[str]]:
    golden = Path(__file__).resolve().parents[1] / "golden" / "compose" / f"{case_id}.json"
    data = json.loads(golden.read_text())
    return data["resolved"], list(data["explicit_fields"])


def _set(mapping: dict[str, Any], dotted: str, value: Any) -> None:
    node = mapping
    *parents, last = dotted.split(".")
    for part in parents:
        node = node[part]
    node[last] = value


HOSTILE_TARGETS = [
    # (case, the node whose _target_ is replaced)
    ("grpo", "actor_rollout_ref.actor._target_"),
    ("grpo", "actor_rollout_ref.actor.optim._target_"),
    ("ppo", "critic._target_"),
    ("sft_gsm8k", "engine._target_"),
]


@pytest.mark.parametrize(("case_id", "node"), HOSTILE_TARGETS, ids=lambda v: str(v))
def test_a_foreign_target_in_a_resolved_file_is_refused_as_check_refuses_it(
    tmp_path: Path, case_id: str, node: str
) -> None:
    """Every ``_target_`` is data: a class the checked release's tree does not name is the
    composition rejection ``check --set NODE=os.system`` gives, never run; the twin with the
    tree's own class at that node compiles."""
    canary = make_canary(tmp_path)
    mapping, overrides = _golden_mapping(case_id)
    _set(mapping, node, "os.system")
    _set(mapping, node.removesuffix("_target_") + "_args_", [canary.payload])
    run = run_folder(tmp_path / "run", mapping, tuple(overrides))
    done = _compile(str(run), "--format", "json", "--no-upstream-checks")
    assert done.returncode == 1, done.stderr
    (result,) = json.loads(done.stdout)["files"]
    (finding,) = result["findings"]
    assert finding["rule"] == "compose" and finding["level"] == "error"
    assert finding["message"].startswith(f"{node}='os.system': a _target_ must be one of")
    assert finding["location"]["origin"] == "resolved"
    assert not canary.fired()
    twin, _ = _golden_mapping(case_id)
    twin_run = run_folder(tmp_path / "twin", twin, tuple(overrides))
    clean = _compile(str(twin_run), "--format", "json", "--no-upstream-checks")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert not any(f["rule"] == "compose" for f in json.loads(clean.stdout)["files"][0]["findings"])


def test_check_refuses_the_same_target_in_the_same_words(tmp_path: Path) -> None:
    mapping, overrides = _golden_mapping("grpo")
    _set(mapping, "actor_rollout_ref.actor._target_", "os.system")
    run = run_folder(tmp_path / "run", mapping, tuple(overrides))
    by_compile = _compile(str(run), "--format", "json", "--no-upstream-checks")
    by_check = subprocess.run(
        [*CLI, "check", "grpo", "--format", "json", "--no-upstream-checks", "--set",
         "actor_rollout_ref.actor._target_=os.system"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert by_check.returncode == by_compile.returncode == 1
    messages = [
        [f["message"] for f in json.loads(done.stdout)["files"][0]["findings"]]
        for done in (by_check, by_compile)
    ]
    assert messages[0] == messages[1]


def test_a_target_in_a_list_and_a_new_node_are_refused(tmp_path: Path) -> None:
    canary = make_canary(tmp_path)
    mapping, overrides = _golden_mapping("grpo")
    mapping["trainer"]["logger"] = [{"_target_": "subprocess.call", "_args_": [canary.payload]}]
    done = _compile(str(run_folder(tmp_path / "list", mapping, tuple(overrides))), "-q")
    assert done.returncode == 1
    assert "trainer.logger[0]._target_='subprocess.call'" in done.stdout
    mapping, overrides = _golden_mapping("grpo")
    mapping["pwn"] = {"_target_": "os.system", "_args_": [canary.payload]}
    done = _compile(str(run_folder(tmp_path / "new", mapping, tuple(overrides))), "-q")
    assert done.returncode == 1 and "pwn._target_='os.system'" in done.stdout
    assert not canary.fired()


def test_hostile_overrides_files_are_one_line(tmp_path: Path) -> None:
    mapping, _ = _golden_mapping("grpo")
    run = run_folder(tmp_path / "run", mapping, None)
    overrides = run / ".hydra" / "overrides.yaml"
    for text, words in (
        ("a: 1\n", "expected a list of override strings"),
        ("- [1, 2]\n", "expected a list of override strings"),
        ("- !!python/object/apply:os.system ['id']\n", "overrides.yaml"),
    ):
        overrides.write_text(text)
        done = _compile(str(run))
        assert done.returncode == 2, (text, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and words in done.stderr, done.stderr


def test_compile_prints_check_s_formats(tmp_path: Path) -> None:
    """Text, JSON (the check schema), SARIF and GitHub annotations, as check prints them."""
    import jsonschema

    mapping, overrides = _golden_mapping("field/adv-estimator-typo")
    run = run_folder(tmp_path / "run", mapping, tuple(overrides))
    schema = json.loads(
        (
            Path(__file__).resolve().parents[1] / "pytest_verl_compat/data/check.schema.json"
        ).read_text()
    )
    as_json = _compile(str(run), "--format", "json", "--no-upstream-checks")
    jsonschema.validate(json.loads(as_json.stdout), schema)
    sarif = json.loads(_compile(str(run), "--format", "sarif", "--no-upstream-checks").stdout)
    assert sarif["version"] == "2.1.0" and sarif["runs"][0]["results"]
    github = _compile(str(run), "--format", "github", "--no-upstream-checks").stdout
    assert github.startswith("::error file=")
    text = _compile(str(run), "--no-upstream-checks", "--select", "compose")
    # No finding selected; the profile's problems still fail it, listed as check --profile does.
    assert text.returncode == 1 and "error[" not in text.stdout
    assert text.stdout.startswith("ERROR algorithm.adv_estimator='grpoo' is not supported")
    assert "runnable by the reference trainer: no" in text.stderr


PROFILE_RULES = [
    # (case, an override the profile refuses, its near-identical twin the profile accepts)
    ("grpo", "actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla"),
    ("grpo", "algorithm.kl_ctrl.type=pid", "algorithm.kl_ctrl.type=adaptive"),
    ("sft_gsm8k", "data.pad_mode=left_right", "data.pad_mode=no_padding"),
]  # fmt: skip


@pytest.mark.parametrize(("case_id", "refused", "twin"), PROFILE_RULES)
def test_the_profile_refuses_a_resolved_file_as_it_refuses_the_launch(
    session: AuditSession, tmp_path: Path, case_id: str, refused: str, twin: str
) -> None:
    """The compile rules: a value the profile does not support is a problem of the file as of
    the launch (the reference trainer cannot run it), the twin's value is not."""
    assert session.manifest is not None
    base = session.manifest.case(case_id)
    for override, accepted in ((refused, False), (twin, True)):
        case = session.with_overrides(
            dataclasses.replace(base, id=f"{case_id}+profile{next(_counter)}"), (override,)
        )
        resolved = resolved_twin(session, case, tmp_path / str(accepted))
        by_check, by_compile = session.compile(case), session.compile(resolved)
        assert by_check is not None and by_compile is not None
        assert by_compile.accepted is by_check.accepted is accepted, by_compile.reason
        assert by_compile.reason == by_check.reason


def test_an_sft_run_folder_takes_the_sft_trainers_frequency_sentinel(
    session: AuditSession, tmp_path: Path
) -> None:
    """The SFT trainer's ``after_each_epoch`` (sft_trainer.py:190-196) is its type in a resolved
    file as in a launch; any other string is a wrong type in both."""
    assert session.manifest is not None
    base = session.manifest.case("sft_gsm8k")
    for value, wrong in (("after_each_epoch", False), ("sometimes", True)):
        case = session.with_overrides(
            dataclasses.replace(base, id=f"sft_gsm8k+sentinel{next(_counter)}"),
            (f"trainer.save_freq={value}",),
        )
        resolved = resolved_twin(session, case, tmp_path / value)
        for report in (session.compile(case), session.compile(resolved)):
            assert report is not None
            rules = [f.check for f in report.findings if f.path == "trainer.save_freq"]
            assert (rules == ["types.wrong-type"]) is wrong, (value, report.findings)
