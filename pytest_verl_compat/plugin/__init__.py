"""pytest11 entry point: options only; the audit loads when ``--verl-corpus`` is given.

Nothing heavy (Hydra, torch, verl) is imported here, so installing the plugin costs other
test suites nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pytest_verl_compat.plugin.nodes import (
    NODE_PREFIX,
    STAGES,
    audit_from_command_line,
    corpus_args,
)

__all__ = ["NODE_PREFIX", "STAGES"]

TRUSTED_MODES = ("auto", "off", "require")


def _trusted_mode(value: str) -> str:
    if value not in TRUSTED_MODES:
        raise argparse.ArgumentTypeError(f"{value!r} is not one of {', '.join(TRUSTED_MODES)}")
    return value


def _existing_dir(value: str) -> str:
    if not Path(value).expanduser().is_dir():
        raise argparse.ArgumentTypeError(f"{value!r} is not a folder")
    return value


def _release_version(value: str) -> str:
    """A supported release (the release index; read without importing the pipeline)."""
    from pytest_verl_compat.releases.index import ReleaseError, load_release_index

    try:
        return load_release_index().supported_release(value).version
    except ReleaseError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _existing_file(value: str) -> str:
    if not Path(value).expanduser().is_file():
        raise argparse.ArgumentTypeError(f"{value!r}: file not found")
    return value


def _gpu_type(value: str) -> str:
    """A GPU type of the shipped table (``verl-compat fit --gpu``'s names), checked at parse time."""
    from pytest_verl_compat.memory.gpus import UnknownGpu, find_gpu

    try:
        find_gpu(value)
    except UnknownGpu as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return value


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the verl-corpus option group."""
    group = parser.getgroup("verl-corpus", "verl launch-script conformance audit")
    group.addoption(
        "--verl-corpus",
        action="store_true",
        dest="verl_corpus",
        default=False,
        help="run the corpus audit: one test per case and stage; stages: "
        + ", ".join(STAGES)
        + " (select with -k, e.g. -k 'snapshot and grpo'; node ids start with verl-corpus::)",
    )
    group.addoption(
        "--verl-corpus-upstream",
        dest="verl_corpus_upstream",
        type=_existing_dir,
        default=None,
        metavar="PATH",
        help="upstream folder laid out like a verl checkout (examples/ and verl/trainer/config); "
        "default: $VERL_UPSTREAM, the ini key, then the installed verl distribution",
    )
    group.addoption(
        "--verl-corpus-manifest",
        dest="verl_corpus_manifest",
        type=_existing_file,
        default=None,
        metavar="PATH",
        help="corpus manifest to audit instead of the embedded one",
    )
    group.addoption(
        "--verl-corpus-golden",
        dest="verl_corpus_golden",
        default=None,
        metavar="DIR",
        help="folder of golden snapshots (default: the manifest's golden_dir, else the embedded "
        "one, which --snapshot-update does not write when it is inside the installed package)",
    )
    group.addoption(
        "--verl-corpus-release",
        dest="verl_corpus_release",
        type=_release_version,
        default=None,
        metavar="VERSION",
        help="the verl release to audit against (its own tree, environment, profile and golden "
        "files); default: the release of the upstream folder given, the ini key, the installed "
        "verl, then the manifest's release",
    )
    group.addoption(
        "--verl-corpus-report",
        dest="verl_corpus_report",
        default=None,
        metavar="PATH",
        help="write the machine-readable audit as JSON to PATH",
    )
    group.addoption(
        "--verl-corpus-conformance-report",
        dest="verl_corpus_conformance_report",
        default=None,
        metavar="PATH",
        help="write the conformance stage's results (ours against upstream verl) as JSON to PATH",
    )
    group.addoption(
        "--verl-corpus-trusted",
        dest="verl_corpus_trusted",
        type=_trusted_mode,
        default="auto",
        metavar="{" + ",".join(TRUSTED_MODES) + "}",
        help="trusted composition through upstream's entry point: auto (when verl is installed; "
        "the default), off, or require (fail when it cannot run)",
    )
    group.addoption(
        "--verl-corpus-step",
        dest="verl_corpus_step",
        action="store_true",
        default=False,
        help="also run the step stage: training steps of the reference trainer against "
        "verl's own engine for the official, accepted derived and step-only cases (several "
        "steps, two data-parallel ranks; ~4 min on 2 cores; CI checks every step case; the "
        "default audit skips it to stay within seconds)",
    )
    group.addoption(
        "--verl-corpus-gpu",
        dest="verl_corpus_gpu",
        type=_gpu_type,
        default=None,
        metavar="TYPE",
        help="also forecast each case's GPU memory on this GPU type (as check --gpu): the "
        "verdict stage fails a case expected valid when a phase exceeds the GPU",
    )
    parser.addini(
        "verl_corpus_upstream", "upstream checkout folder, relative to rootdir", default=None
    )
    parser.addini("verl_corpus_manifest", "corpus manifest path, relative to rootdir", default=None)
    parser.addini("verl_corpus_golden", "golden snapshot folder, relative to rootdir", default=None)
    parser.addini("verl_corpus_release", "the verl release to audit against", default=None)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Load the conftests of what the run collects: the stage module's, and the project's own.

    pytest loads the conftests of the given paths (else of ``testpaths``, else of the current
    folder and its ``test*`` folders) before any plugin sees the arguments; ``--verl-corpus``
    alone, or a pasted ``verl-corpus::`` node id, collects only the stage module, so the
    conftests of test folders it does not collect (and the test-only packages they import) are
    no business of it. The conftest.py of the folder pytest runs in, and of its parents up to
    the rootdir, still loads: a project's own hooks and settings apply to the audit too.
    """
    namespace = early_config.known_args_namespace
    if not getattr(namespace, "verl_corpus", False):
        return
    given = list(getattr(namespace, "file_or_dir", None) or [])
    if given or audit_from_command_line(early_config):
        anchors = corpus_args(given, audit_only=not given)
        namespace.file_or_dir = anchors + _own_conftests(early_config)


def _own_conftests(config: pytest.Config) -> list[str]:
    """conftest.py of the invocation folder and its parents up to the rootdir (as files: a
    folder would also bring in its ``test*`` subfolders)."""
    folder = config.invocation_params.dir
    chain = [folder, *folder.parents] if folder.is_relative_to(config.rootpath) else [folder]
    found = []
    for directory in chain:
        if (directory / "conftest.py").is_file():
            found.append(str(directory / "conftest.py"))
        if directory == config.rootpath:
            break
    return found


def _ini_path(config: pytest.Config, name: str) -> str | None:
    value = config.getini(name)
    return str(config.rootpath / value) if value else None


def _ini_file(config: pytest.Config, name: str) -> str | None:
    path = _ini_path(config, name)
    if path is not None and not Path(path).is_file():
        raise pytest.UsageError(f"{name} = {config.getini(name)}: file not found ({path})")
    return path


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Start the audit session and its reporter, only when --verl-corpus is given."""
    if not config.getoption("verl_corpus"):
        return
    from pytest_verl_compat.pipeline.audit import AuditOptions, AuditSession
    from pytest_verl_compat.plugin import collect
    from pytest_verl_compat.plugin.keys import audit_state_key, is_xdist_worker
    from pytest_verl_compat.plugin.report import AuditReporter
    from pytest_verl_compat.plugin.state import AuditState

    release, release_source = _release_option(config)
    options = AuditOptions(
        manifest=config.getoption("verl_corpus_manifest")
        or _ini_file(config, "verl_corpus_manifest"),
        upstream=config.getoption("verl_corpus_upstream"),
        upstream_ini=_ini_path(config, "verl_corpus_upstream"),
        golden=config.getoption("verl_corpus_golden") or _ini_path(config, "verl_corpus_golden"),
        report=config.getoption("verl_corpus_report"),
        conformance_report=config.getoption("verl_corpus_conformance_report"),
        trusted=config.getoption("verl_corpus_trusted"),
        rootdir=str(config.rootpath),
        release=release,
        release_source=release_source,
    )
    for option, value in (
        ("--verl-corpus-report", options.report),
        ("--verl-corpus-conformance-report", options.conformance_report),
    ):
        refused = _output_refusal(value)
        if refused:
            raise pytest.UsageError(f"{option}={value}: {refused}")
    session = AuditSession.start(options)
    refusal = collect.golden_write_refusal(config, session)
    if refusal:
        raise pytest.UsageError(refusal)
    # Two oracle workers share verl's import and use the core the audit's own stages leave
    # idle; an xdist worker gets one (its siblings keep the other cores busy).
    state = AuditState.start(session, 1 if is_xdist_worker(config) else 2)
    config.stash[audit_state_key] = state
    config.pluginmanager.register(AuditReporter(config, state), "verl-corpus-reporter")
    config.pluginmanager.register(collect.CorpusCollector(), "verl-corpus-collector")
    collect.add_stage_tests(config)


def _release_option(config: pytest.Config) -> tuple[str | None, str]:
    """The release the run was told to audit and where: the option (a choice), else the ini
    key (a setting, named as such in every output)."""
    option = config.getoption("verl_corpus_release")
    if option:
        return str(option), ""
    ini = config.getini("verl_corpus_release")
    return (str(ini), "verl_corpus_release ini key") if ini else (None, "")


def _output_refusal(value: str | None) -> str | None:
    """Why a report path cannot be written, checked before the run rather than after it."""
    if not value:
        return None
    path = Path(value)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        return "not a regular file; refusing to replace it"
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a folder"
    return None


# Stages that wait for the upstream oracle process run last: it answers while the others run.
_UPSTREAM_STAGES = ("test_verdict", "test_trusted")


# trylast: after -k/-m deselection, so a selection without upstream stages starts no process.
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("verl_corpus"):
        return
    waiting = [item for item in items if item.name.split("[")[0] in _UPSTREAM_STAGES]
    others = [item for item in items if item.name.split("[")[0] not in _UPSTREAM_STAGES]
    items[:] = others + waiting
    from pytest_verl_compat.plugin.keys import audit_state_key, is_xdist_worker

    state = config.stash.get(audit_state_key, None)
    if state is None:
        return
    for item in waiting:
        if isinstance(item, pytest.Function) and hasattr(item, "callspec"):
            case_id = getattr(item.callspec.params.get("verl_case"), "id", None)
            if case_id is not None:
                state.upstream_stages.setdefault(case_id, set()).add(item.name.split("[")[0])
    # The oracle process starts at the first question no kept answer settles (``answers``): here
    # for a conformance case, else when a case composes (``AuditState.prefetch_upstream``).
    # By id from the state's own cases: a manifest without conformance cases (every one `init`
    # writes) leaves pytest's placeholder item of an empty parametrization, whose value is no case.
    cases = {case.id: case for case in state.conformance_cases()}
    conformance = [
        cases[item.callspec.id]
        for item in others
        if item.nodeid.startswith(f"{NODE_PREFIX}::test_conformance[")
        and isinstance(item, pytest.Function)
        and item.callspec.id in cases
    ]
    # A case whose result is kept (``conformance.results``) needs neither side computed.
    conformance = [case for case in conformance if state.conformance_results.get(case) is None]
    references = state.conformance_references() if conformance else None
    if references is not None:
        # Under xdist each worker asks only for the cases it is given, as it meets them.
        if not is_xdist_worker(config):
            for case in conformance:
                references.prefetch(case)


def pytest_unconfigure(config: pytest.Config) -> None:
    from pytest_verl_compat.plugin.keys import audit_state_key

    state = config.stash.get(audit_state_key, None)
    if state is not None:
        state.close()
