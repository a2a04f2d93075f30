"""Read stage: the explicit launch fields of a case, exactly as Hydra receives them."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from markdown_it import MarkdownIt

from pytest_verl_compat.bash import LaunchReadError, SourceScope, read_launch
from pytest_verl_compat.model import SCRIPT, Case, ExplicitFields, OverrideBlock
from pytest_verl_compat.pipeline.entry_registry import launch_acceptor
from pytest_verl_compat.pipeline.pins import PinMismatch, check_pins

__all__ = ["PinMismatch", "read_case_fields"]
from pytest_verl_compat.files.safe_input import read_text


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


# A leaf whose value only names a file or a folder (verl opens, copies, writes or passes it on):
# a run-time value there (``data.train_files=$PWD/data/train.parquet``) changes no verdict, so the
# reader's placeholder is kept. Elsewhere (a size, a name, a flag) the value decides something.
_PATH_LEAF = re.compile(r"(^|_)(path|paths|dir|dirs|file|files|folder)$")
# Path leaves whose text upstream itself reads, and the text that must stay known after the last
# run-time value: the resume folder's step (``int(path.split("global_step_")[-1])``,
# verl/trainer/ppo/v1/trainer_base.py:812-823).
_CONTENT_READ = {"trainer.resume_from_path": "global_step_"}
RUNTIME_PREFIX = "RUNTIME_"


def carry_in_path_leaves(key: str, value: str) -> bool:
    """Whether an override may keep a run-time value (``read_launch``'s ``carry``): in a leaf
    that only names a file or a folder, outside any part of it upstream reads."""
    if not _PATH_LEAF.search(key.rpartition(".")[2]):
        return False
    marker = _CONTENT_READ.get(key)
    return marker is None or (marker in value and RUNTIME_PREFIX not in value.rpartition(marker)[2])


def read_case_fields(case: Case, root: Path, release_root: Path | None = None) -> ExplicitFields:
    """Verify the pinned inputs, read the launch script and append the case's extra overrides;
    a launch's entry module is judged by the checked release's files at ``release_root``."""
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
            entry_modules=launch_acceptor(release_root),
            carry=carry_in_path_leaves,
        )
        carried = tuple(
            (value.key, f"{value.what} as {', '.join(value.placeholders)}")
            for value in read.carried
        )
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
