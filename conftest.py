"""Repository-level pytest configuration: nothing here is needed by users of the plugin."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # `pytest -n 2` hands tests out in fixed chunks ("load"); the five-minute checkout audit then
    # left one worker idle for minutes at the end of CI. Work stealing rebalances as it goes.
    if config.pluginmanager.hasplugin("xdist") and config.getoption("dist", "no") == "load":
        config.option.dist = "worksteal"
