"""Shared fixtures: where the pinned upstream inputs are, and pytester helpers."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from corpus_facts import PINNED_VERSION, release_ready
from hypothesis import settings

REPO = Path(__file__).resolve().parents[1]

# CI explores the same examples on every run, so a red CI points at the commit, not at the draw
# (hypothesis's advice for CI). A developer's runs keep drawing new examples; a failure they find
# prints the blob to reproduce it and becomes an explicit test.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

# Each supported release's files and environment are the developer's (and CI's) own, kept between
# runs: the run's user cache below is fresh, they are not (an environment is ~1.6 GB and a minute).
if not os.environ.get("VERL_COMPAT_HOME"):
    from pytest_verl_compat.files.cache import releases_home

    os.environ["VERL_COMPAT_HOME"] = str(releases_home())


def pytest_configure(config: pytest.Config) -> None:
    """Build every supported release's environment before the run collects (the controller
    only: its xdist workers find them built); without a network a developer's run skips the
    tests that need one, CI's fails."""
    if hasattr(config, "workerinput"):
        return
    from pytest_verl_compat.releases.environment import release_environment
    from pytest_verl_compat.releases.index import ReleaseError, load_release_index

    for release in load_release_index().supported:
        try:
            release_environment(release, progress=lambda line: print(line, flush=True))
        except ReleaseError as exc:
            if os.environ.get("CI"):
                raise pytest.UsageError(
                    f"cannot build verl {release.version}'s environment: {exc}"
                ) from exc
            print(f"verl {release.version}'s environment is not built: {exc}", flush=True)


def upstream_path(env: str, folder: str) -> Path | None:
    """An upstream folder from an environment variable, else ../shared/upstream/<folder>."""
    value = os.environ.get(env)
    path = Path(value) if value else REPO.parent / "shared" / "upstream" / folder
    return path if path.is_dir() else None


@pytest.fixture(scope="session")
def upstream_checkout() -> Path:
    path = upstream_path("VERL_UPSTREAM", "verl-v0.9.0")
    if path is None:
        pytest.skip("no verl v0.9.0 checkout (set VERL_UPSTREAM)")
    return path


@pytest.fixture
def here(tmp_path: Path, upstream_checkout: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with the pinned tree linked as verl-v0.9.0 (as the README's clone has it)."""
    (tmp_path / "verl-v0.9.0").symlink_to(upstream_checkout)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VERL_UPSTREAM", str(upstream_checkout))
    return tmp_path


@pytest.fixture(scope="session")
def upstream_091() -> Path:
    path = upstream_path("VERL_UPSTREAM_091", "verl-v0.9.1")
    if path is None:
        pytest.skip("no verl v0.9.1 tree (set VERL_UPSTREAM_091)")
    return path


def run_folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of this test run, shared by its xdist workers (they share the parent of their
    base folders and the run's id)."""
    from pytest_verl_compat.plugin.keys import is_xdist_worker

    base = tmp_path_factory.getbasetemp()
    if not is_xdist_worker(request.config):
        return base
    run = request.config.workerinput["testrunuid"]  # type: ignore[attr-defined]
    folder = base.parent / f"run-{run}"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session", autouse=True)
def upstream_checks_cache(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """One user cache (upstream's answers, the conformance results) for the whole run, shared by
    its xdist workers, so each answer is asked of verl once per run; never the developer's own
    ``~/.cache``. The CLI and pytester subprocesses inherit it."""
    folder = run_folder(request, tmp_path_factory) / "xdg-cache"
    folder.mkdir(exist_ok=True)
    saved = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(folder)
    yield folder
    if saved is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = saved


@pytest.fixture
def pytester(pytester: pytest.Pytester) -> pytest.Pytester:
    """pytester, whose subprocess runs leave out two plugins that no run of a test here uses and
    that cost every run: hypothesis's, whose terminal summary imports hypothesis at the end of
    every run (``_hypothesis_pytestplugin.py``, ``pytest_terminal_summary``; ~1 s here), and
    Hydra's, which imports ``hydra.compose`` and ``hydra.utils`` when it loads
    (``hydra/extra/pytest_plugin.py``; 0.68 s of a 1.46 s empty run here). The plugin imports
    Hydra itself where a stage composes."""
    run = pytester.runpytest_subprocess

    def without_unused_plugins(*args: object, **kwargs: object) -> pytest.RunResult:
        return run("-p", "no:hypothesispytest", "-p", "no:hydra_pytest", *args, **kwargs)  # type: ignore[arg-type]

    pytester.runpytest_subprocess = without_unused_plugins  # type: ignore[method-assign]
    return pytester


@pytest.fixture(scope="session")
def shared_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One pytest cache for every pytester run, so upstream's slow entry point runs once per case."""
    return tmp_path_factory.mktemp("verl-cache")


@pytest.fixture(scope="session")
def sample_rollout():
    """Sample the trainer's rollout batch from the first shipped training prompts.

    Temperature 1 without top-k/top-p filtering; `stream` picks the sampling generator, so
    tests that need rows finishing at different steps can choose one that gives them.
    """
    from reference_trainer.data import PROMPTS_PATH, load_prompts
    from reference_trainer.generation import SamplingSettings, generate, sampling_generator

    def sample(
        policy, tokenizer, *, prompts, n, max_new_tokens, stream, temperature=1.0, fast=True
    ):
        return generate(
            policy,
            tokenizer,
            load_prompts(PROMPTS_PATH, "train")[:prompts],
            sampling=SamplingSettings(n=n, temperature=temperature, top_k=-1, top_p=1.0),
            max_new_tokens=max_new_tokens,
            generator=sampling_generator(0, stream),
            fast=fast,
        )

    return sample


@pytest.fixture
def canary(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A fresh canary (see tests/hostile_canary.py); assert ``not canary.fired()`` after the attack."""
    from hostile_canary import make_canary

    return make_canary(tmp_path_factory.mktemp("hostile"))


@pytest.fixture(scope="session")
def release_wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every pinned release's wheel, fetched with pip once per test run: the folder is shared by
    the xdist workers (the parent of their base temp folders), behind a file lock. Without PyPI
    the tests that need them skip, except in CI, where they fail."""
    from filelock import FileLock

    from pytest_verl_compat.releases.index import ReleaseError, load_release_index
    from pytest_verl_compat.releases.wheels import download_wheel

    shared = tmp_path_factory.getbasetemp().parent / "verl-release-wheels"
    shared.mkdir(exist_ok=True)
    wheels = {}
    with FileLock(f"{shared}.lock"):
        for release in load_release_index().releases:
            wheel = shared / "wheel" / release.wheel
            if not wheel.is_file():
                try:
                    download_wheel(release, shared)
                except ReleaseError as exc:
                    if os.environ.get("CI"):
                        raise
                    pytest.skip(f"cannot fetch the release wheels: {exc}")
            wheels[release.version] = wheel
    return wheels


@pytest.fixture(scope="session")
def release_cache(release_wheels: dict[str, Path], upstream_checks_cache: Path) -> Path:
    """Every release's files where the commands look (``VERL_COMPAT_HOME``'s ``releases``),
    from the wheels."""
    from filelock import FileLock

    from pytest_verl_compat.releases.index import ReleaseError, load_release_index
    from pytest_verl_compat.releases.wheels import cache_dir, install_wheel, release_tree

    index = load_release_index()
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{cache}.lock"):
        for version, wheel in release_wheels.items():
            try:
                release_tree(version, fetch=False)
            except ReleaseError:
                install_wheel(index.release(version), wheel, cache / version, index)
    return cache


@pytest.fixture(scope="session")
def example_answers(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    upstream_checkout: Path,
    upstream_checks_cache: Path,
) -> Path:
    """Upstream's answers for every composed example script of the pinned release, in this run's
    user cache: asked once per run (the first xdist worker asks, behind a file lock; the other
    waits and finds them), as ``check`` asks them (``many_asker``: one oracle process, verl
    imported once). The tests that judge all examples through ``check``, the plugin or the
    oracle's answers then read the same answers instead of each asking verl ~100 times (about
    a minute on 2 cores each). Skips without verl."""
    from filelock import FileLock

    if not release_ready():
        pytest.skip("verl is not installed")
    folder = run_folder(request, tmp_path_factory)
    done = folder / "example-answers.done"
    with FileLock(f"{folder / 'example-answers'}.lock"):
        if not done.exists():
            from pytest_verl_compat.model import StageFailed, StageUnavailable
            from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
            from pytest_verl_compat.pipeline.manifest import (
                default_examples_path,
                default_manifest_path,
                load_examples,
                load_manifest,
            )
            from pytest_verl_compat.upstream.verdict.case import many_asker, upstream_question

            session = AuditSession.start(AuditOptions(upstream=str(upstream_checkout)))
            bindings = load_manifest(default_manifest_path()).bindings
            cases = []
            with warnings.catch_warnings():
                # Hydra warns that Megatron-Lite's own search path (a Megatron example's) is absent.
                warnings.filterwarnings("ignore", "provider=hydra.searchpath")
                for case in load_examples(default_examples_path(), bindings):
                    try:
                        composed = session.outcome(case).composition.composed
                    except (StageFailed, StageUnavailable):
                        continue  # not read: upstream is never asked about it
                    if composed:
                        cases.append(case)
                ask, close = many_asker(session, cases)
                try:
                    for case in cases:
                        question = upstream_question(session, case)
                        if ask is not None and not isinstance(question, str):
                            ask(question)
                finally:
                    close()
            done.write_text("")
    return upstream_checks_cache


@pytest.fixture(scope="module")
def oracle() -> Iterator[object]:
    """One upstream oracle process per test module (verl imported once); skips without verl."""
    from pytest_verl_compat.upstream.oracle.client import UpstreamOracle

    if not release_ready():
        pytest.skip("verl is not installed")
    process = UpstreamOracle(release=PINNED_VERSION)
    try:
        yield process
    finally:
        process.close()


@pytest.fixture(scope="module")
def upstream_session(upstream_checkout: Path) -> object:
    """An audit session on the pinned upstream checkout, one per test module."""
    from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession

    return AuditSession.start(AuditOptions(upstream=str(upstream_checkout)))


STEP_ORACLE = "step_oracle"


def _step_oracle_root(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """Where this run's upstream step results live: one folder per run, shared by its xdist
    workers (they share the parent of their base folders and the run's id)."""
    return run_folder(request, tmp_path_factory) / "step-oracle"


@pytest.fixture(scope="session", autouse=True)
def _start_step_oracle(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Upstream's steps of every step case, started in the background at the first test of a
    session that selected a test needing them, so no worker waits idle for them later.

    The first worker to claim the run's folder composes the cases and writes the models here
    (Hydra and the global RNG stay on the main thread), then runs upstream's subprocesses from
    a thread and writes `done` (or `error`); `step_oracle` waits for either.
    """
    import threading

    wanted = any(STEP_ORACLE in getattr(item, "fixturenames", ()) for item in request.session.items)
    if not wanted or not release_ready():
        yield
        return
    root = _step_oracle_root(request, tmp_path_factory)
    try:
        root.mkdir(parents=True)  # the claim: exactly one worker creates it
    except FileExistsError:
        yield
        return
    from pytest_verl_compat.conformance.step.cases import step_cases
    from pytest_verl_compat.conformance.step.run import launch_upstream, prepare_upstream
    from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
    from pytest_verl_compat.upstream.oracle.runner import release_runner

    try:
        session = AuditSession.start(AuditOptions(manifest=None, upstream=None))
        prepared = prepare_upstream(step_cases(session), root / "steps")
    except Exception as exc:
        (root / "error").write_text(f"preparing upstream's steps: {exc!r}")
        yield
        return

    def launch() -> None:
        try:
            launch_upstream(prepared, release_runner(PINNED_VERSION))
        except Exception as exc:  # reported to every test that needs the results
            (root / "error").write_text(repr(exc))
        else:
            (root / "done").write_text("")

    thread = threading.Thread(target=launch, name="step-oracle", daemon=True)
    thread.start()
    yield
    thread.join()


@pytest.fixture(scope="session")
def step_oracle(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    _start_step_oracle: None,
):
    """Upstream's steps of every step case and variant, run once per session (also under
    xdist), loaded once their run is done."""
    import time

    from pytest_verl_compat.conformance.step.run import load_upstream

    if not release_ready():
        pytest.skip("verl is not installed")
    root = _step_oracle_root(request, tmp_path_factory)
    deadline = time.monotonic() + 3600
    while not (root / "done").exists():
        if (root / "error").exists():
            pytest.fail(f"upstream's steps did not run: {(root / 'error').read_text()}")
        if time.monotonic() > deadline:
            pytest.fail(f"upstream's steps did not finish within an hour ({root})")
        time.sleep(1.0)
    return load_upstream(root / "steps")
