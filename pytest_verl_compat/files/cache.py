"""The user cache folder: every answer, release file, environment and result kept between runs."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_FOLDER = "pytest-verl-compat"


def user_cache_root() -> Path:
    """``$XDG_CACHE_HOME/pytest-verl-compat`` (an absolute XDG_CACHE_HOME), else under ``~/.cache``."""
    base = os.environ.get("XDG_CACHE_HOME") or ""
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    return root / CACHE_FOLDER
