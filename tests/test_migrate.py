"""``verl-compat migrate``: moved keys rewritten where upstream gives evidence, verified, or reported."""

from __future__ import annotations

import json
import stat
import textwrap
from pathlib import Path
from typing import Any

import pytest
from corpus_facts import PINNED_VERSION, needs_release, release_root
from launch_scripts import launch_script

from pytest_verl_compat.bash import read_launch
from pytest_verl_compat.cli import main
from pytest_verl_compat.model import Bindings
from pytest_verl_compat.pipeline.defaults_mounts import Mount
from pytest_verl_compat.pipeline.script_edits import FieldEdit, candidates, locate_edits
from pytest_verl_compat.releases.index import load_release_index
from pytest_verl_compat.releases.wheels import release_tree
from pytest_verl_compat.upstream.drift.evidence import (
    DEPRECATION_MESSAGE,
    MIGRATION_FUNCTION,
    MOVED_MOUNT,
    MOVED_SUBTREE,
    WILDCARD,
    Move,
    MoveContext,
    deprecated_renames,
    function_assignments,
    mount_moves,
    subtree_moves,
)
from pytest_verl_compat.upstream.drift.mounts import (
    derive_moved_mounts,
    dumps_moved_mounts,
    moved_mounts_path,
)

INDEX = load_release_index()
VERL = (release_root(), PINNED_VERSION)
needs_verl = needs_release()
BINDINGS = Bindings(variables={"HOME": "/home/verl"})

LEGACY_REWARD = textwrap.dedent(
    """\
    max_len=2048
    REWARD=(
        reward_model.reward_manager=dapo
        +reward_model.reward_kwargs.overlong_buffer_cfg.enable=True
        +reward_model.reward_kwargs.max_resp_len=${max_len}
    )
    # reward_model.reward_manager=naive was the default before
    """
)


def _migrate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["migrate", *args])
    out, err = capsys.readouterr()
    return status, out, err


def _report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "report.json"
    status, _, _ = _migrate(capsys, *args, "--json", str(out))
    return status, json.loads(out.read_text())


# --- the evidence ------------------------------------------------------------------------------


def test_a_migration_function_is_read_from_its_syntax_tree() -> None:
    source = textwrap.dedent(
        """\
        def migrate(cfg):
            if cfg.old.a is not None:
                cfg.new.a = cfg.old.a
            for key in ["b", "c"]:
                if cfg.old.get(key) is not None:
                    cfg.new.inner[key] = cfg.old[key]
            legacy = cfg.old.sub
            for key in legacy.keys():
                cfg.new.sub[key] = legacy[key]
            with open_dict(cfg):
                cfg["top"] = cfg.old["whole"]
            unrelated = compute(cfg)
            cfg.new.d = unrelated
        """
    )
    found = [(a.old, a.new, a.line, a.requires) for a in function_assignments(source, "migrate")]
    assert found == [
        (("old", "a"), ("new", "a"), 3, (("old", "a"),)),
        (("old", "b"), ("new", "inner", "b"), 6, (("old", "b"),)),
        (("old", "c"), ("new", "inner", "c"), 6, (("old", "c"),)),
        (("old", "sub", WILDCARD), ("new", "sub", WILDCARD), 9, ()),
        (("old", "whole"), ("top",), 11, ()),
    ]
    assert function_assignments(source, "absent") == []


@needs_verl
def test_the_legacy_reward_migration_reads_as_its_code_says() -> None:
    assert VERL is not None
    (function,) = INDEX.migration_functions
    path = VERL[0] / function.file
    moves = {
        (".".join(a.old), ".".join(a.new)): a.line
        for a in function_assignments(path.read_text(), function.function)
    }
    lines = path.read_text().splitlines()
    for (old, new), line in moves.items():
        # Each cited line is the assignment itself: `config.<new> = <old>`.
        statement = lines[line - 1].strip()
        assert statement.startswith("config.reward") and " = " in statement, (old, new, statement)
    assert moves[("reward_model.reward_manager", "reward.reward_manager.name")]
    assert moves[("reward_model.reward_kwargs", "reward.reward_kwargs")]
    assert moves[("reward_model.rollout.*", "reward.reward_model.rollout.*")]
    assert moves[("custom_reward_function", "reward.custom_reward_function")]


def test_a_move_maps_keys_under_it() -> None:
    move = Move(
        ("old", WILDCARD),
        ("new", "deep", WILDCARD),
        MIGRATION_FUNCTION,
        "e",
        (("old", WILDCARD, "on"),),
    )
    assert move.successor("old.x.y") == "new.deep.x.y"
    assert move.successor("older.x") is None and move.successor("old") is None
    assert move.required_keys("old.x.y") == ["old.x.on"]


@needs_verl
def test_a_deprecation_message_names_the_new_field() -> None:
    assert VERL is not None
    renames = {
        (r.old, r.new)
        for r in deprecated_renames(VERL[0], "verl.workers.config.FSDPOptimizerConfig")
    }
    assert renames == {("warmup_style", "lr_scheduler_type"), ("grad_clip", "clip_grad")}


def test_a_deprecation_without_the_copy_is_not_evidence(tmp_path: Path) -> None:
    package = tmp_path / "pkg" / "config"
    package.mkdir(parents=True)
    (package / "opt.py").write_text(
        textwrap.dedent(
            """\
            class Base:
                def __post_init__(self):
                    if self.old is not None:
                        warnings.warn("`old` is deprecated, use `new` instead.")
                        self.new = self.old

            class Said(Base):
                def __post_init__(self):
                    warnings.warn("`gone` is deprecated, use `kept` instead.")
            """
        )
    )
    found = {(r.old, r.new, r.owner) for r in deprecated_renames(tmp_path, "pkg.config.Said")}
    assert found == {("old", "new", "Base")}  # inherited; `gone` has no copy into `kept`


def _one_edit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, source: str
) -> dict[str, Any]:
    """The one edit ``migrate --from source`` makes to a launch that sets ``field``."""
    script = launch_script(tmp_path, "run.sh", field)
    status, report = _report(tmp_path, capsys, str(script), "--from", source)
    assert status == 0, report
    (edit,) = report["edits"]
    return dict(edit)


def _context(source: dict[str, Any], target: dict[str, Any]) -> MoveContext:
    return MoveContext(
        INDEX.releases[0], INDEX.releases[1], source, target, INDEX, None, PINNED_VERSION
    )


def test_a_subtree_moves_only_when_its_defaults_match_one_new_subtree() -> None:
    block = {"_target_": "x.Module", "path": None, "name": "compute"}
    moved = subtree_moves(
        _context({"a": {"module": block, "x": 1}}, {"a": {"x": 1}, "b": {"module": dict(block)}})
    )
    assert [(m.old, m.new, m.kind) for m in moved] == [
        (("a", "module"), ("b", "module"), MOVED_SUBTREE)
    ]
    changed = {**block, "name": "other"}
    assert subtree_moves(_context({"a": {"module": block}}, {"b": {"module": changed}})) == []
    twice = {"b": {"module": dict(block)}, "c": {"module": dict(block)}}
    assert subtree_moves(_context({"a": {"module": block}}, twice)) == []
    blank = {"path": None, "name": None}  # all-null defaults match by accident
    assert subtree_moves(_context({"a": {"x": blank}}, {"b": {"y": dict(blank)}})) == []


def _mount(config: str, package: str, parent: str = "c/dp_c") -> Mount:
    return Mount(config, package, parent, None, None)


def test_a_mount_moves_only_where_the_same_parent_puts_the_same_config_elsewhere() -> None:
    """critic/dp_critic's ``engine/fsdp`` at ``critic.model.fsdp_config`` (0.7.1) and at
    ``critic.fsdp`` (0.8.0 on) is a move; the same config under another parent, at the same
    package, or where the old section is still in the target's tree is not."""
    source = {"c": {"model": {"fsdp_config": {"param_offload": False}, "path": "m"}}}
    target = {"c": {"model": {"path": "m"}, "fsdp": {"param_offload": False, "new": 1}}}
    moved = _context(source, target)
    moved.source_mounts = [_mount("engine/fsdp", "c.model.fsdp_config")]
    moved.target_mounts = [_mount("engine/fsdp", "c.fsdp")]
    ((old, new, kind),) = [(m.old, m.new, m.kind) for m in mount_moves(moved)]
    assert (old, new, kind) == (("c", "model", "fsdp_config"), ("c", "fsdp"), MOVED_MOUNT)
    other_parent = _context(source, target)
    other_parent.source_mounts = [_mount("engine/fsdp", "c.model.fsdp_config")]
    other_parent.target_mounts = [_mount("engine/fsdp", "c.fsdp", parent="c/other")]
    assert mount_moves(other_parent) == []
    kept = _context(source, {**target, "c": {**target["c"], "model": source["c"]["model"]}})
    kept.source_mounts, kept.target_mounts = moved.source_mounts, moved.target_mounts
    assert mount_moves(kept) == []  # the old section is still there: nothing moved
    same = _context(source, source)
    same.source_mounts = same.target_mounts = moved.source_mounts
    assert mount_moves(same) == []


@pytest.mark.usefixtures("release_cache")
def test_a_moved_mount_is_migrated_citing_both_trees_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit = _one_edit(tmp_path, capsys, "critic.model.fsdp_config.param_offload=True", "0.7.1")
    assert (edit["key"], edit["new_key"], edit["kind"], edit["verified"]) == (
        "critic.model.fsdp_config.param_offload",
        "critic.fsdp.param_offload",
        MOVED_MOUNT,
        True,
    )
    for version, package in (("0.7.1", "model.fsdp_config"), (PINNED_VERSION, "fsdp")):
        cited = f"{INDEX.config_dir}/critic/dp_critic.yaml:"
        line = int(edit["evidence"].split(cited)[1 if version == "0.7.1" else 2].split("@")[0])
        root = release_tree(version, fetch=False).root
        text = (root / INDEX.config_dir / "critic" / "dp_critic.yaml").read_text()
        assert text.splitlines()[line - 1].strip() == f"- ../engine@{package}: fsdp"
    # a fork's top-level key (Search-R1's max_turns) is a value no tree has, not a config-group
    # selection: it blocks the script, and the moved keys are still migrated
    fork = launch_script(
        tmp_path, "fork.sh", "critic.model.fsdp_config.param_offload=True", "max_turns=2"
    )
    status, report = _report(tmp_path, capsys, str(fork), "--from", "0.7.1")
    assert status == 1 and [e["new_key"] for e in report["edits"]] == ["critic.fsdp.param_offload"]
    assert [b["key"] for b in report["blocked"]] == ["max_turns"]
    # a key of the moved section that the new one lacks (0.7's grad_offload) is not added with
    # `+` there: it is reported removed, citing the move
    gone = launch_script(tmp_path, "gone.sh", "critic.model.fsdp_config.grad_offload=True")
    status, report = _report(tmp_path, capsys, str(gone), "--from", "0.7.1")
    assert status == 1 and report["edits"] == []
    (blocked,) = report["blocked"]
    assert (blocked["key"], blocked["why"]) == ("critic.model.fsdp_config.grad_offload", "removed")
    assert "`critic.fsdp.grad_offload` is not in verl" in blocked["evidence"]


@pytest.mark.usefixtures("release_cache")
@pytest.mark.parametrize("version", INDEX.supported_versions)
def test_the_shipped_moved_mounts_are_what_the_trees_give(version: str) -> None:
    """data/releases/VERSION/moved_mounts.json (what ``fit`` places an older tree's engine keys
    by) is current: re-derive with ``verl-compat release derive VERSION --only moved-mounts``."""
    shipped = moved_mounts_path(version).read_text(encoding="utf-8")
    assert dumps_moved_mounts(derive_moved_mounts(version)) == shipped
    assert '"old": "critic.model.fsdp_config"' in shipped


# --- where the edit is made ---------------------------------------------------------------------


def _locate(tmp_path: Path, text: str, key: str, new: str) -> Any:
    path = tmp_path / "run.sh"
    path.write_text(text)
    argv = read_launch(path, BINDINGS).argv
    index = next(i for i, field in enumerate(argv) if field.lstrip("+").startswith(key + "="))
    prefix = argv[index][: len(argv[index]) - len(argv[index].lstrip("+"))]
    return locate_edits(
        path, text, BINDINGS, argv, [FieldEdit(index, prefix + key, prefix + new)]
    ), index


@pytest.mark.parametrize(
    "text",
    [
        "python3 -m verl.trainer.main_ppo a.b=1 x.y=2\n",
        'ARGS=(a.b=1)\npython3 -m verl.trainer.main_ppo "${ARGS[@]}" x.y=2\n',
        'K=a.b\npython3 -m verl.trainer.main_ppo "$K=1" x.y=2\n',
        'if [ -n "${NEVER:-}" ]; then A=a.b=9; else A=a.b=1; fi\npython3 -m verl.trainer.main_ppo $A x.y=2\n',
    ],
    ids=["launcher-line", "array", "variable", "taken-branch"],
)
def test_the_edit_is_made_where_the_key_is_written(tmp_path: Path, text: str) -> None:
    located, index = _locate(tmp_path, text, "a.b", "n.a.b")
    assert located.failures == {}
    edit = located.edits[index]
    assert text[edit.start : edit.end] == "a.b"
    if "NEVER" in text:
        assert text.index("a.b=1") == edit.start  # not the branch bash skips
        assert located.unedited == {index: [1]}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('P=a\npython3 -m verl.trainer.main_ppo "${P}.b=1" x.y=2\n', "is not written literally"),
        (
            "A=a.b=1\npython3 -m verl.trainer.main_ppo $A z.a.b=3 $A\n",
            "does not change only this field",
        ),
    ],
    ids=["built-from-variables", "builds-two-fields"],
)
def test_an_edit_that_cannot_be_placed_is_reported(tmp_path: Path, text: str, reason: str) -> None:
    located, index = _locate(tmp_path, text, "a.b", "n.a.b")
    assert located.edits == {} and reason in located.failures[index]


def test_a_key_inside_a_longer_key_is_not_a_candidate() -> None:
    assert candidates("x.a.b=1 a.b=2 a.bc=3 +a.b=4", "a.b") == [(8, 11), (21, 25)]


# --- the command --------------------------------------------------------------------------------


@needs_verl
@pytest.mark.usefixtures("release_cache")
def test_legacy_reward_keys_are_migrated_and_verified(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = launch_script(
        tmp_path,
        "run.sh",
        '"${REWARD[@]}"',
        "custom_reward_function.path=/home/verl/reward.py",
        head=LEGACY_REWARD,
    )
    original = script.read_text()
    status, out, err = _migrate(capsys, str(script), "--from", "0.8.0")
    assert status == 0, err
    assert script.read_text() == original  # a diff only, without --write
    removed = [
        line for line in out.splitlines() if line.startswith("-") and not line.startswith("---")
    ]
    added = [
        line for line in out.splitlines() if line.startswith("+") and not line.startswith("+++")
    ]
    assert removed == [
        "-    reward_model.reward_manager=dapo",
        "-    +reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
        "-    +reward_model.reward_kwargs.max_resp_len=${max_len}",
        "-    custom_reward_function.path=/home/verl/reward.py",
    ]
    assert added == [
        "+    reward.reward_manager.name=dapo",
        "+    +reward.reward_kwargs.overlong_buffer_cfg.enable=True",
        "+    +reward.reward_kwargs.max_resp_len=${max_len}",
        "+    reward.custom_reward_function.path=/home/verl/reward.py",
    ]
    assert "verified" in err and "NOT verified" not in err
    assert "reward_loop.py:51 (migrate_legacy_reward_impl)" in err
    assert "line(s) 9, where editing it does not change the argv" in err, err  # the comment

    mode = stat.S_IMODE(script.stat().st_mode)
    status, report = _report(tmp_path, capsys, str(script), "--from", "0.8.0", "--write")
    assert status == 0 and stat.S_IMODE(script.stat().st_mode) == mode
    assert [e["kind"] for e in report["edits"]] == [MIGRATION_FUNCTION] * 4
    assert all(e["verified"] for e in report["edits"])
    assert report["findings"]["after"] == [] and len(report["findings"]["before"]) == 4
    assert report["changed_by_release"] == [] and report["blocked"] == []
    # Migrated once, there is nothing left to migrate.
    status, out, err = _migrate(capsys, str(script), "--from", "0.8.0")
    assert (status, out) == (0, "") and "0 edit(s)" in err
    # And `check` no longer reports the legacy keys.
    assert main(["check", str(script), "--no-upstream-checks"]) == 0


@pytest.mark.usefixtures("release_cache")
def test_a_script_on_the_new_keys_has_nothing_to_migrate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = launch_script(
        tmp_path,
        "run.sh",
        "reward.reward_manager.name=dapo",
        "+reward.reward_kwargs.max_resp_len=2048",
    )
    status, out, err = _migrate(capsys, str(script), "--from", "0.8.0")
    assert (status, out) == (0, "")
    assert "0 edit(s), 0 key(s) blocking" in err


@pytest.mark.usefixtures("release_cache")
def test_a_removed_key_is_reported_with_its_evidence_never_guessed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = launch_script(tmp_path, "run.sh", "actor_rollout_ref.rollout.skip.enable=True")
    original = script.read_text()
    status, report = _report(tmp_path, capsys, str(script), "--from", "0.8.0", "--write")
    assert status == 1 and script.read_text() == original
    assert report["edits"] == [] and not report["target"]["composed"]
    (blocked,) = report["blocked"]
    assert blocked["key"] == "actor_rollout_ref.rollout.skip.enable" and blocked["why"] == "removed"
    generated = f"{INDEX.config_dir}/_generated_ppo_trainer.yaml"
    assert f"`actor_rollout_ref.rollout.skip.enable` is in {generated}:" in blocked["evidence"]
    line = int(blocked["evidence"].split(f"{generated}:")[1].split(" ")[0])
    tree = release_tree("0.8.0", fetch=False)
    assert (tree.root / generated).read_text().splitlines()[line - 1].strip() == "enable: false"


@pytest.mark.usefixtures("release_cache")
def test_a_moved_subtree_is_migrated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit = _one_edit(tmp_path, capsys, "reward_manager.module.path=/home/verl/manager.py", "0.7.0")
    assert (edit["key"], edit["new_key"], edit["kind"]) == (
        "reward_manager.module.path",
        "reward.reward_manager.module.path",
        MOVED_SUBTREE,
    )
    assert edit["verified"] and edit["value"] == '"/home/verl/manager.py"'


@needs_verl
@pytest.mark.usefixtures("release_cache")
def test_a_deprecated_key_the_release_still_reads_is_left_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = launch_script(tmp_path, "run.sh", "actor_rollout_ref.actor.optim.warmup_style=cosine")
    status, report = _report(tmp_path, capsys, str(script), "--from", "0.8.0")
    assert status == 0 and report["edits"] == []
    (note,) = [n for n in report["notes"] if "warmup_style" in n]
    assert DEPRECATION_MESSAGE not in note and "optimizer.py:" in note and "still reads it" in note


@needs_verl
@pytest.mark.usefixtures("release_cache")
def test_a_legacy_key_that_had_no_effect_or_conflicts_is_not_rewritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    null = launch_script(tmp_path, "null.sh", "reward_model.reward_manager=null")
    status, report = _report(tmp_path, capsys, str(null), "--from", "0.8.0")
    assert status == 0 and report["edits"] == []
    assert any("had no effect on verl 0.8.0 either" in note for note in report["notes"])
    both = launch_script(
        tmp_path, "both.sh", "reward_model.reward_manager=dapo", "reward.reward_manager.name=naive"
    )
    status, report = _report(tmp_path, capsys, str(both), "--from", "0.8.0")
    assert status == 1 and report["edits"] == []
    assert "its successor `reward.reward_manager.name` is set too" in report["blocked"][0]["why"]


def test_migrate_needs_a_script_and_a_known_release(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = _migrate(capsys, str(tmp_path / "missing.sh"), "--from", "0.8.0")
    assert status == 2 and "launch script not found" in err
    script = launch_script(tmp_path, "run.sh", base=False)
    status, _, err = _migrate(capsys, str(script), "--from", "0.6.0")
    assert status == 2 and "verl 0.6.0 is not a pinned release" in err


@pytest.mark.slow
@pytest.mark.usefixtures("release_cache")
def test_the_v080_examples_migrate_only_with_evidence(tmp_path: Path) -> None:
    """migrate --from 0.8.0 --write on copies of verl v0.8.0's own launch scripts: every edit is
    verified and cites an upstream line, removes the findings on the keys it moved, and changes no
    other value the script sets; a script 0.9.0 still rejects names what blocks it."""
    import re

    from corpus_facts import REPO

    from conftest import upstream_path
    from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
    from pytest_verl_compat.pipeline.manifest import load_examples
    from pytest_verl_compat.upstream.drift.migrate_corpus import measure

    root = upstream_path("VERL_UPSTREAM_080", "verl-v0.8.0")
    if root is None:
        pytest.skip("no verl v0.8.0 examples (set VERL_UPSTREAM_080)")
    session = AuditSession.start(AuditOptions())
    assert session.manifest is not None
    bindings = {
        case.launch or "": case.bindings
        for case in load_examples(REPO / "corpus/examples.yaml", session.manifest.bindings)
    }
    measured = measure(
        session, root, "0.8.0", PINNED_VERSION, tmp_path, bindings, upstream_checks=False
    )
    scripts = measured["scripts"]
    read = {
        key: entry
        for key, entry in scripts.items()
        if entry["read"] and "migrate_skipped" not in entry
    }
    assert len(scripts) == len(list((root / "examples").rglob("*.sh"))) and read
    edited = {key: entry for key, entry in read.items() if entry["edits"]}
    assert edited, "the legacy reward keys of v0.8.0's Nemotron example move"
    for key, entry in read.items():
        assert entry["changed_by_release"] == [], key
        for edit in entry["edits"]:
            assert edit["verified"], (key, edit)
            assert re.search(r"verl/[\w/]+\.py:\d+", edit["evidence"]), (key, edit)
        if entry["edits"]:
            assert entry["moved_key_errors"][1] == 0, key
        if not entry["composed_after"]:
            assert entry["blocked"], key
