"""``verl-compat pin``: re-pin every case's inputs in a manifest after the scripts were edited.

Only the sha256 values change, in place: each one is replaced at its position in the text (its
quoting kept), so comments, order and formatting stay as the user wrote them. The manifest is
checked first (``load_manifest``), every input is hashed bounded (a relative path under its root)
before anything is written, and the file is replaced through a temporary file: a refused input leaves
the manifest as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pytest_verl_compat.files.digests import sha256_file
from pytest_verl_compat.files.safe_input import BoundedLoader, InputError, read_text
from pytest_verl_compat.pipeline.manifest import load_manifest
from pytest_verl_compat.pipeline.snapshot import write_atomic


@dataclass(frozen=True)
class PinChange:
    """One input whose pin moved: its path, both digests, and the cases that pin it."""

    path: str
    old: str
    new: str
    cases: tuple[str, ...]

    def line(self) -> str:
        # Abbreviated as git abbreviates commits; the manifest holds the whole digest.
        return f"{self.path}: sha256 {self.old[:12]} -> {self.new[:12]} ({', '.join(self.cases)})"


@dataclass(frozen=True)
class _Pin:
    case: str
    path: str
    digest: str
    start: int  # the sha256 scalar's span in the text, quotes included
    end: int


def _scalar(node: Any, key: str) -> Any:
    if not isinstance(node, yaml.MappingNode):
        return None
    return next((value for k, value in node.value if getattr(k, "value", None) == key), None)


def _pins(text: str, label: str) -> list[_Pin]:
    """Every ``cases[*].inputs[*]`` pin with the span of its sha256 scalar in ``text``."""
    try:
        root = yaml.compose(text, Loader=BoundedLoader)
    except yaml.YAMLError as exc:
        raise InputError(f"{label}: not valid YAML: {' '.join(str(exc).split())}") from exc
    cases = _scalar(root, "cases")
    pins: list[_Pin] = []
    for case in cases.value if isinstance(cases, yaml.SequenceNode) else []:
        case_id = _scalar(case, "id")
        inputs = _scalar(case, "inputs")
        for item in inputs.value if isinstance(inputs, yaml.SequenceNode) else []:
            path, digest = _scalar(item, "path"), _scalar(item, "sha256")
            if isinstance(path, yaml.ScalarNode) and isinstance(digest, yaml.ScalarNode):
                pins.append(
                    _Pin(
                        str(case_id.value) if case_id is not None else "?",
                        str(path.value),
                        str(digest.value),
                        digest.start_mark.index,
                        digest.end_mark.index,
                    )
                )
    return pins


def pin_manifest(manifest: Path, root: Path, *, write: bool = True) -> list[PinChange]:
    """Re-pin the manifest's case inputs to the files under ``root``; the changes, in order.

    Raises ``ManifestError`` (an unusable manifest) or ``InputError`` (an input that is missing,
    unreadable or outside ``root``), before anything is written.
    """
    load_manifest(manifest)  # the manifest must be one the audit would read
    text = read_text(manifest, what="manifest")
    pins = _pins(text, str(manifest))
    found: dict[str, str] = {}
    for pin in pins:
        relative = Path(pin.path)
        if relative.is_absolute() or ".." in relative.parts:
            # The audit reads inputs as root / path; a pin names a file under the root only.
            raise InputError(f"{manifest}: input {pin.path!r} is not a path under {root}")
        if pin.path not in found:
            found[pin.path] = sha256_file(root / relative, "pinned input")
    changes: dict[str, PinChange] = {}
    for pin in pins:
        new = found[pin.path]
        if new != pin.digest:
            known = changes.get(pin.path)
            cases = (*known.cases, pin.case) if known else (pin.case,)
            changes[pin.path] = PinChange(pin.path, pin.digest, new, cases)
    if changes and write:
        out = text
        for pin in sorted(pins, key=lambda p: p.start, reverse=True):
            if pin.path in changes:
                original = text[pin.start : pin.end]
                quote = original[0] if original[:1] in {'"', "'"} else ""
                out = out[: pin.start] + f"{quote}{found[pin.path]}{quote}" + out[pin.end :]
        write_atomic(manifest, out)
    return list(changes.values())
