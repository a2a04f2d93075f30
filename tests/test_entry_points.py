"""Every entry point a verl 0.9.0 script launches (issue 30): the registry read from the installed
verl's own source, the launch read as bash runs it, composed on its own config, and the launch
mistakes the entry point decides (a module the release lacks, a torchrun module run by python)."""

from __future__ import annotations

from pathlib import Path

import pytest
from corpus_facts import PINNED_VERSION, release_root

from pytest_verl_compat.model import Bindings
from pytest_verl_compat.pipeline import entry_registry
from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
from pytest_verl_compat.pipeline.entry_points import by_module, closest, scan
from pytest_verl_compat.releases.index import load_release_index

INSTALLED = (release_root(), PINNED_VERSION)
SUPPORTED = load_release_index().supported_versions
TORCHRUN = "torchrun --standalone --nnodes=1 --nproc_per_node=4"


@pytest.fixture(scope="module")
def site() -> Path:
    assert INSTALLED is not None
    return INSTALLED[0]


@pytest.fixture(scope="module")
def session() -> AuditSession:
    return AuditSession.start(AuditOptions())


def test_the_registry_is_every_hydra_main_of_the_release_with_its_config_and_world(
    site: Path,
) -> None:
    entries = by_module(scan(site))
    expected = {
        "verl.trainer.main_ppo": ("ppo_trainer", "ray"),
        "verl.trainer.sft_trainer": ("sft_trainer_engine", "torchrun"),
        "verl.trainer.sft_trainer_ray": ("sft_trainer_engine", "ray"),
        "verl.trainer.main_eval": ("evaluation", "ray"),
        "verl.trainer.main_generation_server": ("ppo_trainer", "ray"),
        "verl.experimental.fully_async_policy.fully_async_main": ("fully_async_ppo_trainer", "ray"),
        "verl.experimental.one_step_off_policy.main_ppo": ("one_step_off_ppo_trainer", "ray"),
    }
    assert {m: (e.config_name, e.world) for m, e in entries.items()} == expected
    sft = entries["verl.trainer.sft_trainer"]
    assert sft.world_evidence.startswith("verl/trainer/sft_trainer.py:")
    # The asynchronous trainers start Ray through main_ppo's run_ppo, and add verl's own tree.
    one_step = entries["verl.experimental.one_step_off_policy.main_ppo"]
    assert one_step.search_path == ("verl/trainer/config",) and one_step.cwd_relative
    assert one_step.world_evidence.startswith("verl/trainer/main_ppo.py:")
    assert closest("verl.trainer.main_ppo_sync", scan(site)) == "verl.trainer.main_ppo"
    assert closest("verl.trainer.fsdp_sft_trainer", scan(site)) == "verl.trainer.sft_trainer"
    # Which train: a trainer's fit reached from the module (its own, or run_ppo's in main_ppo).
    trains = {m: e.trains_at.rpartition(":")[0] for m, e in entries.items()}
    assert trains == {
        "verl.trainer.main_ppo": "verl/trainer/main_ppo.py",
        "verl.trainer.sft_trainer": "verl/trainer/sft_trainer.py",
        "verl.trainer.sft_trainer_ray": "verl/trainer/sft_trainer_ray.py",
        "verl.trainer.main_eval": "",
        "verl.trainer.main_generation_server": "",
        "verl.experimental.fully_async_policy.fully_async_main": "verl/trainer/main_ppo.py",
        "verl.experimental.one_step_off_policy.main_ppo": (
            "verl/experimental/one_step_off_policy/main_ppo.py"
        ),
    }


def test_the_registry_is_kept_by_the_content_of_the_installed_files(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process reads the registry of an unchanged release from the user cache, equal to the
    scan; a changed module of the release is scanned anew."""
    copy = tmp_path / "site"
    (copy / "verl").mkdir(parents=True)
    for path in (site / "verl").rglob("*"):
        if path.suffix in (".py", ".yaml") and path.is_file():
            target = copy / path.relative_to(site)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("VERL_COMPAT_NO_CACHE", raising=False)
    scanned = entry_registry.installed(copy)
    assert by_module(scanned)["verl.trainer.main_ppo"].config_name == "ppo_trainer"
    entry_registry.installed.cache_clear()

    def no_scan(_: Path) -> None:
        raise AssertionError("scanned, not read from the user cache")

    monkeypatch.setattr(entry_registry, "scan", no_scan)
    assert entry_registry.installed(copy) == scanned
    entry_registry.installed.cache_clear()
    main = copy / "verl/trainer/main_ppo.py"
    main.write_text(main.read_text() + "\n# changed\n")
    with pytest.raises(AssertionError, match="scanned"):
        entry_registry.installed(copy)
    entry_registry.installed.cache_clear()


def test_an_entry_point_that_never_trains_gets_no_training_check(
    session: AuditSession, tmp_path: Path
) -> None:
    """The generation server composes ppo_trainer's tree but never fits: a missing micro-batch
    size, an error for main_ppo, is none for it; its twin under main_ppo keeps the error."""
    body = "actor_rollout_ref.model.path=/m actor_rollout_ref.rollout.name=vllm\n"
    serving = _check(
        session, f"python3 -m verl.trainer.main_generation_server {body}", tmp_path, "g.sh"
    )
    training = _check(session, f"python3 -m verl.trainer.main_ppo {body}", tmp_path, "t.sh")
    assert serving == [], serving
    assert "validate.no-micro-batch-size" in training, training


def test_the_launch_is_an_entry_point_or_a_module_the_release_lacks(site: Path) -> None:
    accepts = entry_registry.ReleaseModules.from_site(site).accepts
    assert accepts is not None
    assert accepts("verl.trainer.sft_trainer") and accepts("verl.trainer.main_ppo")
    assert accepts("verl.trainer.main_ppo_sync")  # a module the release lacks: named as missing
    assert accepts("recipe.dapo.main_dapo")
    # A module the release has that is no entry point is another command of the script.
    assert not accepts("verl.model_merger") and not accepts("verl.trainer.ppo.core_algos")


@pytest.mark.parametrize("version", SUPPORTED)
def test_the_shipped_entry_points_and_modules_are_the_releases_own(version: str) -> None:
    """data/releases/VERSION/entry_points.json equals what the release's files say (else:
    ``verl-compat release derive VERSION --only entry-points``)."""
    shipped = entry_registry.shipped(version)
    assert shipped is not None, f"verl {version} ships no entry points"
    read = entry_registry.ReleaseModules.from_site(release_root(version))
    assert shipped.to_json() == read.to_json(), "stale: release derive --only entry-points"
    assert shipped.accepts("verl.trainer.sft_trainer") and not shipped.accepts("verl.model_merger")


def test_a_launch_is_read_with_the_shipped_modules_without_the_releases_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the release's files unreachable, the reader still knows the SFT trainer's launch and
    refuses a module the release lacks, from the shipped data alone."""
    from pytest_verl_compat.model import StageFailed, StageUnavailable

    fresh = AuditSession.start(AuditOptions())

    def unreachable() -> None:
        raise StageUnavailable("the release's files are not here")

    monkeypatch.setattr(fresh, "release_files", unreachable)
    sft = tmp_path / "sft.sh"
    sft.write_text(f"{TORCHRUN} -m verl.trainer.sft_trainer model.path=/m\n")
    assert fresh.read_fields(fresh.case_for_script(sft)).module == "verl.trainer.sft_trainer"
    missing = tmp_path / "sync.sh"
    missing.write_text("python3 -m verl.trainer.main_ppo_sync algorithm.adv_estimator=remax\n")
    with pytest.raises(StageFailed, match=r"no entry point verl\.trainer\.main_ppo_sync"):
        fresh.outcome(fresh.case_for_script(missing))


def _check(session: AuditSession, text: str, tmp_path: Path, name: str = "run.sh") -> list[str]:
    from pytest_verl_compat.upstream.verdict.case import check_case

    script = tmp_path / name
    script.write_text(text)
    case = session.case_for_script(script, Bindings())
    try:
        result = check_case(session, case, None)
    except Exception as exc:  # the stage's failure is what the test compares
        return [f"raised: {exc}"]
    return [f.rule for f in result.findings]


def test_a_module_the_release_lacks_names_the_closest(
    session: AuditSession, tmp_path: Path
) -> None:
    from pytest_verl_compat.model import StageFailed
    from pytest_verl_compat.pipeline.entry_points import UnknownEntryPoint

    script = tmp_path / "sync.sh"
    script.write_text("python3 -m verl.trainer.main_ppo_sync algorithm.adv_estimator=remax\n")
    with pytest.raises(StageFailed, match=r"no entry point verl\.trainer\.main_ppo_sync") as info:
        session.outcome(session.case_for_script(script))
    assert isinstance(info.value.__cause__, UnknownEntryPoint)
    assert info.value.__cause__.near == "verl.trainer.main_ppo"
    # Its twin: the entry point the release has composes.
    twin = tmp_path / "twin.sh"
    twin.write_text("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=remax\n")
    assert session.outcome(session.case_for_script(twin)).composition.composed


def test_the_sft_trainer_run_by_python_is_an_error_and_under_torchrun_it_is_not(
    session: AuditSession, tmp_path: Path
) -> None:
    body = "-m verl.trainer.sft_trainer data.train_batch_size=64 model.path=/m\n"
    by_python = _check(session, f"python3 {body}", tmp_path, "python.sh")
    by_torchrun = _check(session, f"{TORCHRUN} {body}", tmp_path, "torchrun.sh")
    assert "sft.needs-torchrun" in by_python
    assert "sft.needs-torchrun" not in by_torchrun


def test_the_world_comes_from_torchrun(session: AuditSession, tmp_path: Path) -> None:
    """train_batch_size 6 over 4 ranks leaves 2 sequences out of every step; over 3, none."""
    body = "-m verl.trainer.sft_trainer data.train_batch_size=6 model.path=/m\n"
    on_four = _check(session, f"{TORCHRUN} {body}", tmp_path, "four.sh")
    on_three = _check(session, f"{TORCHRUN.replace('=4', '=3')} {body}", tmp_path, "three.sh")
    assert "sft.batch-not-divisible" in on_four
    assert "sft.batch-not-divisible" not in on_three


@pytest.mark.parametrize(("micro", "fires"), [(2, False), (3, True)])
def test_megatrons_data_parallel_ranks_exclude_its_model_parallel_ranks(
    session: AuditSession, tmp_path: Path, micro: int, fires: bool
) -> None:
    """128 processes at tensor 2 x pipeline 4 are 16 data-parallel ranks (Megatron-Core's), so
    a batch of 128 gives each 8 sequences: micro-batches of 2 divide them, of 3 do not; FSDP's
    reckoning (128 ranks, 1 sequence each) would flag both."""
    body = (
        "-m verl.trainer.sft_trainer engine=megatron data.train_batch_size=128 "
        f"data.use_dynamic_bsz=False data.micro_batch_size_per_gpu={micro} model.path=/m "
        "engine.tensor_model_parallel_size=2 engine.pipeline_model_parallel_size=4\n"
    )
    launch = "torchrun --nnodes=16 --nproc_per_node=8"
    rules = _check(session, f"{launch} {body}", tmp_path, f"megatron{micro}.sh")
    assert ("sft.static-micro-batch" in rules) is fires, rules
    assert "sft.batch-per-rank" not in rules


def test_an_entry_point_with_a_search_path_composes_without_importing_verl(
    session: AuditSession, tmp_path: Path
) -> None:
    import subprocess
    import sys

    # In a fresh process: composing one_step_off's tree (its search path names verl's own tree,
    # pkg:// or file://) must never import the verl package.
    script = tmp_path / "one_step.sh"
    script.write_text(
        "python3 -m verl.experimental.one_step_off_policy.main_ppo rollout.nnodes=1 "
        "actor_rollout_ref.rollout.nnodes=2\n"
    )
    code = (
        "import sys\n"
        "from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession\n"
        "s = AuditSession.start(AuditOptions())\n"
        f"o = s.outcome(s.case_for_script({str(script)!r}))\n"
        "assert o.composition.composed, o.composition.reason\n"
        "print('verl' in sys.modules, o.composition.resolved['rollout']['nnodes'])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "1"]
    # And its own check: the key its main overwrites.
    assert "entry.forced-value" in _check(session, script.read_text(), tmp_path, "forced.sh")


def test_train_runs_the_corpus_sft_case_end_to_end(tmp_path: Path) -> None:
    """`verl-compat train sft_gsm8k`: the official SFT script's own fields, through the SFT
    compile gate and the reference trainer's SFT loop on the tiny model."""
    from pytest_verl_compat import cli

    out = tmp_path / "run"
    status = cli.main(["train", "sft_gsm8k", "--steps", "1", "--out", str(out), "--no-progress"])
    assert status == 0
    assert (out / "final" / "hf").is_dir()


def test_legacy_reward_keys_are_read_where_the_entry_point_migrates_them(
    session: AuditSession, tmp_path: Path
) -> None:
    """fully_async_main copies reward_model.* into reward.* (migrate_legacy_reward_impl,
    fully_async_main.py:237); main_ppo never does, so there the same key is an error."""
    body = "reward_model.reward_manager=dapo actor_rollout_ref.model.path=/m\n"
    fully_async = "verl.experimental.fully_async_policy.fully_async_main"
    migrated = _check(session, f"python3 -m {fully_async} {body}", tmp_path, "async.sh")
    ignored = _check(session, f"python3 -m verl.trainer.main_ppo {body}", tmp_path, "ppo.sh")
    assert "fields.legacy-reward-key" not in migrated, migrated
    assert "fields.legacy-reward-key" in ignored, ignored
