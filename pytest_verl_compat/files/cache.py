"""The user cache folder: every answer, release file, environment and result kept between runs."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_FOLDER = "pytest-verl-compat"
# Where each release's files, environment and pinned wheels are kept, when not in the user cache
# (as ``PRE_COMMIT_HOME`` moves pre-commit's environments): they outlive a cache of answers.
HOME_VARIABLE = "VERL_COMPAT_HOME"


def user_cache_root() -> Path:
    """``$XDG_CACHE_HOME/pytest-verl-compat`` (an absolute XDG_CACHE_HOME), else under ``~/.cache``."""
    base = os.environ.get("XDG_CACHE_HOME") or ""
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    return root / CACHE_FOLDER


def releases_home() -> Path:
    """``$VERL_COMPAT_HOME`` (an absolute folder), else the user cache folder: where the
    releases' files (``releases/``), environments (``environments/``) and pinned wheels
    (``wheels/``) are kept."""
    given = os.environ.get(HOME_VARIABLE, "")
    return Path(given) if os.path.isabs(given) else user_cache_root()
