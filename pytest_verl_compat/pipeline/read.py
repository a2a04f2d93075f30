"""Read stage: the explicit launch fields of a case, exactly as Hydra receives them."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from markdown_it import MarkdownIt

from pytest_verl_compat.bash import LaunchReadError, SourceScope, Way, read_launch, read_launch_ways
from pytest_verl_compat.model import SCRIPT, Case, ExplicitFields, OverrideBlock, StageFailed
from pytest_verl_compat.pipeline.entry_registry import ReleaseModules
from pytest_verl_compat.pipeline.naming import may_carry
from pytest_verl_compat.pipeline.pins import PinMismatch, check_pins

__all__ = ["PinMismatch", "read_case_fields", "read_case_ways"]
from pytest_verl_compat.files.safe_input import InputError, read_text


def override_block(root: Path, block: OverrideBlock) -> list[str]:
    """The lines of the first fenced code block under a Markdown heading, one override each."""
    path = root / block.path
    tokens = MarkdownIt().parse(read_text(path, what="override block file"))
    in_section = False
    for index, token in enumerate(tokens):
        if token.type == "heading_open":
            title = tokens[index + 1].content.strip()
            if in_section:
                break
            in_section = title == block.heading
        elif in_section and token.type == "fence":
            fields: list[str] = []
            for line in token.content.splitlines():
                # The block is written as shell words, so quoting follows shell rules.
                fields.extend(shlex.split(line, comments=True))
            return fields
    raise LaunchReadError(
        str(path),
        None,
        "override block",
        f"no fenced code block under the heading {block.heading!r}",
    )


def source_scope(case: Case, root: Path) -> SourceScope:
    """The files a case's script may ``source``: a script given on the command line, those in
    its folder tree; a manifest case, only its pinned inputs (paths relative to ``root``)."""
    if case.kind == SCRIPT:
        return SourceScope.around(root / str(case.launch))
    return SourceScope(str(root), {pin.path: pin.sha256 for pin in case.inputs})


def read_case_fields(
    case: Case, root: Path, release: ReleaseModules | None = None
) -> ExplicitFields:
    """Verify the pinned inputs, read the launch script and append the case's extra overrides;
    a launch's entry module is judged by the checked release's modules (``release``; None:
    the pinned entry point alone)."""
    bad = [check for check in check_pins(root, case.inputs) if not check.ok]
    if bad:
        raise PinMismatch("; ".join(check.message() for check in bad))
    fields: list[str] = []
    line = None
    variables = None
    module: str | None = None
    world_size: int | None = None
    reason = ""
    launcher: str | None = None
    carried: tuple[tuple[str, str], ...] = ()
    if case.launch is not None:
        read = read_launch(
            root / case.launch,
            case.bindings,
            scope=source_scope(case, root),
            entry_modules=release.accepts if release is not None else None,
            carry=may_carry,
        )
        carried = tuple(
            (value.key, f"{value.what} as {', '.join(value.placeholders)}")
            for value in read.carried
        ) + tuple((value.key, value.what) for value in read.carried_options)
        fields.extend(read.argv)
        line = read.line
        variables = dict(read.exported)
        module, launcher = read.module or None, read.launcher
        world_size, reason = read.world_size, read.world_size_reason
    for block in case.override_blocks:
        fields.extend(override_block(root, block))
    fields.extend(case.overrides)
    return ExplicitFields(
        tuple(fields),
        line,
        variables,
        module,
        world_size,
        reason,
        launcher=launcher,
        carried=carried,
    )


def read_case_ways(
    case: Case, root: Path, release: ReleaseModules | None = None
) -> tuple[Way, ...]:
    """Each way the case's script goes at the conditions only the running system decides
    (``bash.read_launch_ways``, read as :func:`read_case_fields` reads): one way, with no
    condition, for a script that has none whose ways part. Each way's ``bindings`` read it."""
    bad = [check for check in check_pins(root, case.inputs) if not check.ok]
    if bad:
        raise PinMismatch("; ".join(check.message() for check in bad))
    assert case.launch is not None
    return read_launch_ways(
        root / case.launch,
        case.bindings,
        scope=source_scope(case, root),
        entry_modules=release.accepts if release is not None else None,
        carry=may_carry,
    )


def case_ways(
    case: Case, root: Path, release: ReleaseModules | None = None
) -> list[tuple[Way, Case]]:
    """:func:`read_case_ways` as the session's stages take it: per way, the way (its
    conditions, ``Way.said()``: ``when [ -d "$HOME/models/Q" ] (line 2) is true``) and a case
    that reads it (its own id, the way bound); a script that cannot be read fails the stage."""
    try:
        ways = read_case_ways(case, root, release)
    except (LaunchReadError, PinMismatch, InputError, OSError) as exc:
        raise StageFailed(str(exc)) from exc
    return [
        (way, dataclasses.replace(case, id=f"{case.id}~{index}", bindings=way.bindings))
        for index, way in enumerate(ways, 1)
    ]
