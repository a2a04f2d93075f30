"""Where the stage tests come from: node ids that paste back, the user's own tests kept, and the
embedded golden files protected from ``--snapshot-update``.

The stage tests live in the installed package, outside the user's rootdir, so pytest would
give them node ids without a path (``::test_snapshot[grpo]``) that cannot be run again. They
get the path ``verl-corpus`` instead: ``pytest --verl-corpus "verl-corpus::test_snapshot[grpo]"``
reruns exactly that test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import pytest_verl_compat
from pytest_verl_compat.pipeline.audit import AuditSession
from pytest_verl_compat.plugin.nodes import (
    NODE_PREFIX,
    STAGES_PATH,
    audit_from_command_line,
    corpus_args,
)


def add_stage_tests(config: pytest.Config) -> None:
    """Add the stage tests to what pytest collects (``corpus_args``): beside the user's paths, or
    beside the testpaths when ``--verl-corpus`` comes from addopts; ``pytest --verl-corpus``
    alone runs only the audit."""
    given = config.args_source == pytest.Config.ArgsSource.ARGS
    audit_only = not given and audit_from_command_line(config)
    config.args[:] = corpus_args(config.args, audit_only=audit_only)


class CorpusCollector:
    """Collects the stage module under the node id ``verl-corpus``."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_pycollect_makemodule(
        self, module_path: Path, parent: pytest.Collector
    ) -> pytest.Module | None:
        """The stage module gets a node id that can be pasted back on the command line."""
        if module_path.resolve() != STAGES_PATH:
            return None
        return pytest.Module.from_parent(parent, path=module_path, nodeid=NODE_PREFIX)


def embedded_golden_refusal(golden_dir: Path, *, named: bool, package_dir: Path) -> str | None:
    """Why ``--snapshot-update`` must not write ``golden_dir``, or None when it may.

    The embedded golden files of an installed wheel sit inside the package: an update there
    changes the installation, not the user's project.
    """
    if named or not golden_dir.resolve().is_relative_to(package_dir.resolve()):
        return None
    return (
        f"--snapshot-update would write the golden files inside the installed package "
        f"({golden_dir}); name a folder to write with --verl-corpus-golden DIR (or audit a "
        "manifest with golden_dir)"
    )


def golden_write_refusal(config: pytest.Config, session: AuditSession) -> str | None:
    """The refusal for this run's golden folder, when --snapshot-update is given."""
    if not config.getoption("update_snapshots", False) or session.manifest is None:
        return None
    named = bool(session.options.golden) or session.manifest.golden_dir is not None
    return embedded_golden_refusal(
        session.golden_dir, named=named, package_dir=Path(pytest_verl_compat.__file__).parent
    )
