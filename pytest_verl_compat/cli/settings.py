"""``[tool.verl-compat]`` in the nearest ``pyproject.toml``: the settings the command line replaces.

As ruff's: found from the working folder upward, the table itself (not any mention), each key
checked; ``--isolated`` (``check``) ignores the file.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pytest_verl_compat.files.safe_input import InputError, read_text
from pytest_verl_compat.model import LEVELS


class SettingsError(Exception):
    """A ``[tool.verl-compat]`` table the command cannot use; one line naming the file."""


SETTINGS_TABLE = "verl-compat"
SETTINGS_KEYS = ("select", "ignore", "fail-on", "release", "gpu")


def find_pyproject(start: Path) -> Path | None:
    """The nearest ``pyproject.toml`` from ``start`` upward that has ``[tool.verl-compat]``."""
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            try:
                text = read_text(candidate, what="pyproject.toml")
            except InputError:
                continue
            # The table itself, not any mention (a project's scripts may be named verl-compat).
            if f"[tool.{SETTINGS_TABLE}]" in text or f"tool.{SETTINGS_TABLE}." in text:
                return candidate
    return None


def settings_from(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(read_text(path, what="pyproject.toml"))
    except (InputError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"{path}: not valid TOML: {exc}") from exc
    table = data.get("tool", {}).get(SETTINGS_TABLE, {})
    if not isinstance(table, dict):
        raise SettingsError(f"{path}: [tool.{SETTINGS_TABLE}] must be a table")
    for key, value in table.items():
        if key not in SETTINGS_KEYS:
            raise SettingsError(
                f"{path}: [tool.{SETTINGS_TABLE}] has no setting {key!r} "
                f"(settings: {', '.join(SETTINGS_KEYS)})"
            )
        if key in ("select", "ignore") and not (
            isinstance(value, list) and all(isinstance(v, str) for v in value)
        ):
            raise SettingsError(f"{path}: [tool.{SETTINGS_TABLE}] {key} must be a list of rule ids")
        if key == "release" and not isinstance(value, str):
            raise SettingsError(f"{path}: [tool.{SETTINGS_TABLE}] release must be a version string")
        if key == "gpu" and not isinstance(value, str):
            raise SettingsError(f"{path}: [tool.{SETTINGS_TABLE}] gpu must be a GPU type name")
        if key == "fail-on" and value not in LEVELS[:2]:
            raise SettingsError(
                f"{path}: [tool.{SETTINGS_TABLE}] fail-on must be 'error' or 'warning'"
            )
    return dict(table)


def project_settings(args: Any) -> dict[str, Any]:
    """The nearest ``[tool.verl-compat]`` table from the working folder (empty with --isolated
    or without one)."""
    found = None if getattr(args, "isolated", False) else find_pyproject(Path.cwd())
    return settings_from(found) if found is not None else {}


def release_setting(start: Path) -> tuple[str | None, str]:
    """The ``release`` setting of the nearest ``[tool.verl-compat]`` and where it is written."""
    found = find_pyproject(start)
    if found is None:
        return None, ""
    value = settings_from(found).get("release")
    return (str(value), f"release in {found}") if value else (None, "")
