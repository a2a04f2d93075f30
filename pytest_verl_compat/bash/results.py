"""What a read gives: the launch as bash would run it, the run-time values it carries, and
the conditions only the running system decides that it took one way of.

Nothing here imports the rest of the package: the caller of the reader holds these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CarriedValue:
    """A run-time value in an override's value, carried into the argv as a placeholder."""

    index: int  # the word's place in the argv (-1 for an option of the launcher)
    key: str  # the override's key (``torchrun --NAME`` for an option of torchrun)
    what: str  # the run-time values it holds, where each comes from (``$PWD (line 2)``)
    placeholders: tuple[str, ...]  # the text each stands as in the argv (``RUNTIME_PWD``)
    binding: str  # how to bind the first
    line: int  # the launcher's line

    def refusal(self, why: str = "") -> str:
        """The reader's words for a run-time value that must be known here (``why``: what it
        decides there, when the caller knows)."""
        where = "the launcher's argv"
        if why or self.index < 0:
            where = f"`{self.key}`" if self.index < 0 else self.key
            where += ", which decides the run" + (f" ({why})" if why else "") + ","
        return (
            f"{self.what} reaches {where} on line {self.line}, but is only known when the "
            f"script runs; {self.binding}"
        )


@dataclass(frozen=True)
class TakenCondition:
    """A condition only the running system decides, and the way the read took there."""

    key: str  # its place: FILE:LINE:COLUMN, and #N when met again
    text: str  # as written: `[ -d "$HOME/models/Qwen" ]`
    path: str  # the file it is in
    line: int
    value: bool  # true: the test succeeded

    def said(self) -> str:
        """``[ -d "$HOME/models/Qwen" ] (line 2) is true``."""
        return f"{self.text} (line {self.line}) is {'true' if self.value else 'false'}"


@dataclass(frozen=True)
class LaunchRead:
    """The launcher command as bash would run it."""

    argv: tuple[str, ...]
    line: int
    exported: Mapping[str, str]
    # Exported variables whose value is only known at run time (never needed by the argv): the
    # name and where the value comes from.
    runtime: Mapping[str, str] = field(default_factory=dict)
    # The launcher's working directory, None when only the running script knows it.
    cwd: str | None = None
    # The wrappers the launcher runs under, outermost first (`ray job submit`, `env`, ...).
    wrappers: tuple[str, ...] = ()
    # Environments the launcher also receives that no script text shows (the Ray cluster's, the
    # variables srun sets), each with the wrapper and line it comes from.
    unseen: tuple[str, ...] = ()
    # The files the script sourced: (path relative to the source scope's root, sha256).
    sources: tuple[tuple[str, str], ...] = ()
    # The file the launcher line is in (the script, or a file it sourced).
    path: str = ""
    # The entry module the launch runs (dotted: `verl.trainer.main_ppo`), and what runs it:
    # "python" or "torchrun" (also `python -m torch.distributed.run`).
    module: str = ""
    launcher: str = "python"
    # torchrun's options as it reads them (from its words, or its PET_* environment): the
    # canonical long name (`nproc_per_node`, `nnodes`, `standalone`, `master_port`, ...) and the
    # value, True for a flag; options whose value only the running script knows, described.
    torchrun: Mapping[str, str | bool] = field(default_factory=dict)
    torchrun_runtime: Mapping[str, str] = field(default_factory=dict)
    # The processes torchrun starts in all (nproc_per_node x nnodes), None when only the run
    # decides (`--nproc_per_node=gpu`, an elastic `--nnodes=1:4`, a run-time value, a plain
    # Python launch), with the reason.
    world_size: int | None = None
    world_size_reason: str = ""
    # Run-time values carried in overrides' values as placeholders (``CarriedValue``).
    carried: tuple[CarriedValue, ...] = ()
    # torchrun's options whose value is only known at run time, keyed ``torchrun --NAME``
    # (index -1: not a word of the module's argv).
    carried_options: tuple[CarriedValue, ...] = ()
    # The conditions only the running system decides that this read took one way of, as
    # ``Bindings.conditions`` told it (``TakenCondition``), in the order met.
    conditions: tuple[TakenCondition, ...] = ()
