"""``verl-compat init``: a starter manifest for a folder of the user's own launch scripts.

The folder acts as the upstream root of the audit: input paths are relative to it, and it
needs the pinned verl config tree at ``verl/trainer/config`` (a symlink to a checkout or to
the installed verl will do). The ``upstream`` block still pins that tree, copied from the
embedded manifest, so a different verl version is noticed.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

from pytest_verl_compat.bash import (
    LaunchRead,
    LaunchReadError,
    SourceScope,
    command_substitutions,
    read_launch,
)
from pytest_verl_compat.files.digests import sha256_file
from pytest_verl_compat.model import Bindings
from pytest_verl_compat.pipeline.manifest import default_manifest_path
from pytest_verl_compat.pipeline.snapshot import write_atomic

PLACEHOLDER = "BIND_ME"
_UPSTREAM_KEYS = (
    "repository",
    "tag",
    "commit",
    "version",
    "config_dir",
    "config_name",
    "tree_sha256",
)


# What JSON leaves raw but YAML reads as a line break (\x85, \u2028, \u2029) or refuses as
# non-printable (C1 controls, surrogates from undecodable file names, \ufffe, \uffff).
_NOT_YAML_TEXT = re.compile("[\x7f-\x9f\u2028\u2029\ud800-\udfff\ufffe\uffff]")


def _scalar(value: str) -> str:
    """A double-quoted YAML scalar on one line, whatever the text holds."""
    text = json.dumps(value, ensure_ascii=False)
    return _NOT_YAML_TEXT.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _comment(value: str) -> str:
    """Text for a ``#`` comment: escaped like a scalar, so a file name cannot end the comment."""
    return _scalar(value)[1:-1]


def unbound(text: str) -> list[str]:
    """The substitutions of a starter manifest still waiting for a value."""
    raw = yaml.safe_load(text) or {}
    substitutions = (raw.get("environment") or {}).get("substitutions") or {}
    return sorted(key for key, value in substitutions.items() if value == PLACEHOLDER)


def case_id(stem: str, taken: set[str]) -> str:
    """A manifest id from a file stem: lowercase ``[a-z0-9_]``, unique among ``taken``."""
    base = re.sub(r"[^a-z0-9_]+", "_", stem.lower()).strip("_") or "script"
    candidate, number = base, 2
    while candidate in taken:
        candidate, number = f"{base}_{number}", number + 1
    taken.add(candidate)
    return candidate


def launch_scripts(folder: Path) -> list[Path]:
    """Every ``*.sh`` under the folder, sorted; symlinked folders (the config tree) not followed."""
    found: list[Path] = []
    for directory, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found.extend(Path(directory) / name for name in filenames if name.endswith(".sh"))
    return sorted(found, key=lambda p: p.relative_to(folder).as_posix())


def _embedded_manifest() -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load(default_manifest_path().read_text(encoding="utf-8"))
    return raw


def _needed_substitutions(
    script: Path, texts: set[str], known: dict[str, str], home: str, scope: SourceScope
) -> set[str]:
    """The substitutions whose output the script's read depends on.

    A substitution left unbound is evaluated by the reader (the script-directory idiom) or is a
    run-time value it carries along; only a run-time value whose output reaches the argv (or
    decides a branch, or is exported) changes the read. So each is dropped in turn and kept
    when the read differs without it, unless the reader then knows its output itself.
    """

    def outcome(bound: set[str]) -> LaunchRead | str:
        values = {text: known.get(text, PLACEHOLDER) for text in bound}
        try:
            bindings = Bindings(variables={"HOME": home}, substitutions=values)
            return read_launch(script, bindings, scope=scope)
        except LaunchReadError as exc:
            return str(exc)

    def evaluated(read: LaunchRead | str, text: str) -> bool:
        # Unbound but read: the reader computed its output, unless it is carried as a run-time
        # value into the launcher's environment.
        shown = (f"$({text})", f"`{text}`")
        return isinstance(read, LaunchRead) and not any(
            form in origin for origin in read.runtime.values() for form in shown
        )

    # Dropped one at a time until none can go: an idiom built on another (ROOT from HERE) is
    # only evaluated once the one it uses is.
    needed = set(texts)
    changed = True
    while changed:
        changed = False
        every = outcome(needed)
        for text in sorted(needed):
            without = outcome(needed - {text})
            if without == every or evaluated(without, text):
                needed.discard(text)
                changed = True
                break
    return needed


def init_manifest(folder: str | Path, out: str | Path | None = None) -> str:
    """The starter manifest's YAML for the scripts under ``folder``; also written to ``out``."""
    folder = Path(folder).resolve()
    embedded = _embedded_manifest()
    known = embedded["environment"].get("substitutions", {})
    home = embedded["environment"].get("variables", {}).get("HOME", "/home/verl")

    scripts = launch_scripts(folder)
    # Files a script sources must lie under the folder; each is pinned with its script.
    scope = SourceScope(str(folder))
    substitutions: dict[str, list[str]] = {}
    problems: dict[Path, str] = {}
    for script in scripts:
        rel = script.relative_to(folder).as_posix()
        try:
            found = command_substitutions(script)
        except LaunchReadError as exc:
            problems[script] = str(exc)
            continue
        needed = _needed_substitutions(script, {text for _, text in found}, known, home, scope)
        for line, text in found:
            if text in needed:
                substitutions.setdefault(text, []).append(f"{rel}:{line}")
    bindings = Bindings(
        variables={"HOME": home},
        substitutions={text: known.get(text, PLACEHOLDER) for text in substitutions},
    )

    out_lines = [
        f"# Starter manifest for the launch scripts under {_comment(folder.name)}/, written by "
        "`verl-compat init`.",
        "# Input paths are relative to the folder given as --verl-corpus-upstream; it must hold",
        "# the pinned verl config tree at verl/trainer/config (a symlink will do).",
    ]
    if PLACEHOLDER in bindings.substitutions.values():
        out_lines += [
            f'# Replace every "{PLACEHOLDER}" with the output the command prints on the machine',
            "# you launch from; nothing is executed when the scripts are read.",
        ]
    out_lines += ["schema_version: 1", "", "upstream:"]
    out_lines += [f"  {key}: {_scalar(str(embedded['upstream'][key]))}" for key in _UPSTREAM_KEYS]
    out_lines += [
        "",
        "# Snapshots of these cases, beside this manifest.",
        "golden_dir: golden",
        "",
        "# No `conformance:` file: that stage checks the plugin's math against upstream verl's and",
        "# does not depend on your scripts; `pytest --verl-corpus -k conformance` runs it.",
        "",
        "environment:",
        "  variables:",
        f"    HOME: {_scalar(home)}",
    ]
    if substitutions:
        out_lines.append("  substitutions:")
        for text in sorted(substitutions):
            value = known.get(text, PLACEHOLDER)
            origin = " (value from the embedded corpus)" if text in known else ""
            out_lines.append(f"    # {_comment(', '.join(substitutions[text]))}{origin}")
            out_lines.append(f"    {_scalar(text)}: {_scalar(value)}")
    else:
        out_lines.append("  substitutions: {}")
    out_lines += ["  args: []", "", "cases:"]
    first = True

    taken: set[str] = set()
    if not scripts:
        out_lines.append(f"  # no *.sh file under {_comment(folder.name)}/")
    for script in scripts:
        rel = script.relative_to(folder).as_posix()
        problem = problems.get(script)
        sourced: tuple[tuple[str, str], ...] = ()
        if problem is None:
            try:
                sourced = read_launch(script, bindings, scope=scope).sources
            except LaunchReadError as exc:
                problem = str(exc)
        if not first:
            out_lines.append("")
        first = False
        if problem is not None:
            # Paths in the reader's message are this machine's; the relative one is enough.
            for text in problem.replace(str(script), rel).splitlines():
                out_lines.append(f"  # cannot read yet: {_comment(text)}")
        out_lines += [
            f"  - id: {case_id(script.stem, taken)}",
            "    kind: user",
            f"    title: {_scalar(rel)}",
            f"    launch: {_scalar(rel)}",
            "    inputs:",
            f"      - path: {_scalar(rel)}",
            f"        sha256: {sha256_file(script, 'launch script')}",
        ]
        for path, digest in sourced:
            if path != rel:
                out_lines += [
                    f"      - path: {_scalar(path)}  # sourced",
                    f"        sha256: {digest}",
                ]
    text = "\n".join(out_lines) + "\n"
    if out is not None:
        write_atomic(Path(out), text)
    return text
