"""Entry points a supported release no longer has, and the launch of one carried to the trainer
that replaced it, for the memory forecast (``data/retired_entry_points.yaml``).

A launch of ``verl.trainer.fsdp_sft_trainer`` (removed in verl 0.7.1) is composed on the tree of
the last release that had it, so its defaults are that trainer's; each key the old trainer reads
for memory is then set on the checked release's SFT tree under the key that does the same there
(``translate``), each move citing the old trainer's line. ``check`` still reports the module as
unknown to the release: only ``fit`` forecasts it this way, and says so.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_verl_compat.files.safe_input import load_yaml_file
from pytest_verl_compat.model import dotted_value
from pytest_verl_compat.pipeline.hydra_internals import override_literal
from pytest_verl_compat.releases.index import DATA

RETIRED_FILE = DATA / "retired_entry_points.yaml"
# The checked tree's key whose value says whether samples are packed or padded to max_length.
REMOVE_PADDING_KEY = "model.use_remove_padding"


class Untranslatable(ValueError):
    """A launch the old trainer would run in a way the forecast does not carry (one line, naming
    the key)."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class KeyMove:
    """One key of the checked tree, set from the old tree's keys (``rule``) as the old trainer's
    statement at ``where`` reads them."""

    to: str
    rule: str
    sources: tuple[str, ...]
    value: Any
    where: str
    statement: str


@dataclass(frozen=True)
class UnreadKey:
    """A key of the old tree its trainer never reads, and the key it reads in its place."""

    key: str
    instead: str
    where: str  # the line that reads ``instead``, without the release
    statement: str


@dataclass(frozen=True)
class EarlierDefault:
    """A default of the old tree that earlier releases with the same trainer had otherwise."""

    key: str
    value: Any
    releases: str
    where: str


# How a retired entry point's launch is carried (the data file's ``carried``).
OWN_TREE = "own-tree"
AS_LAUNCHED = "as-launched"


@dataclass(frozen=True)
class RetiredEntry:
    module: str
    carried: str  # OWN_TREE or AS_LAUNCHED
    forecast_as: str
    # OWN_TREE: the last release with the module, its config and file, the keys carried, the old
    # trainer's behaviour, and defaults earlier releases had otherwise
    last_release: str = ""
    removed_in: str = ""
    config_name: str = ""
    file: str = ""
    moves: tuple[KeyMove, ...] = ()
    behaviour: Mapping[str, Any] = field(default_factory=dict)
    earlier: tuple[EarlierDefault, ...] = ()
    unread: tuple[UnreadKey, ...] = ()
    # AS_LAUNCHED: what the module is, and the (address, statement) pairs that make its launch
    # the replacement's
    what: str = ""
    shown_by: tuple[tuple[str, str], ...] = ()
    differs: str = ""  # what its trainer did that the replacement's does not, said with it

    def evidence(self, move: KeyMove) -> str:
        return f"{move.where}@{self.last_release}"

    @property
    def said(self) -> str:
        """The module as the forecast names it: with the release that removed it."""
        return f"{self.module} (removed in verl {self.removed_in})"

    def launch_names(self) -> dict[str, str]:
        """The old tree's name of each key of the checked tree that one copy move fills."""
        return {
            move.to: move.sources[0]
            for move in self.moves
            if move.rule == "copy" and len(move.sources) == 1
        }


@dataclass(frozen=True)
class Translation:
    """The overrides of the checked tree, and whether every sample is padded to max_length."""

    overrides: tuple[str, ...]
    padded: bool


def _entry(raw: Mapping[str, Any]) -> RetiredEntry:
    module, carried, forecast_as = str(raw["module"]), str(raw["carried"]), str(raw["forecast_as"])
    if carried == AS_LAUNCHED:
        shown_by = tuple((str(e["where"]), str(e["statement"])) for e in raw["evidence"])
        return RetiredEntry(
            module,
            carried,
            forecast_as,
            what=str(raw["what"]),
            shown_by=shown_by,
            differs=str(raw.get("differs") or ""),
        )
    if carried != OWN_TREE:
        raise ValueError(f"{RETIRED_FILE.name}: {module}: carried is {carried!r}")
    release = str(raw["last_release"])
    moves = tuple(
        KeyMove(
            to=str(m["to"]),
            rule=str(m["rule"]),
            sources=tuple(str(s) for s in m.get("from") or ()),
            value=m.get("value"),
            where=_own_line(m["where"], release, module),
            statement=str(m["statement"]),
        )
        for m in raw["keys"]
    )
    behaviour = {
        name: {**fact, "where": _own_line(fact["where"], release, module)}
        for name, fact in raw["behaviour"].items()
    }
    unknown = sorted({m.rule for m in moves} - set(RULES))
    if unknown:
        raise ValueError(f"{RETIRED_FILE.name}: unknown rules {', '.join(unknown)}")
    return RetiredEntry(
        module,
        carried,
        forecast_as,
        last_release=release,
        removed_in=str(raw["removed_in"]),
        config_name=str(raw["config_name"]),
        file=str(raw["file"]),
        moves=moves,
        behaviour=behaviour,
        earlier=tuple(
            EarlierDefault(str(d["key"]), d["value"], str(d["releases"]), str(d["where"]))
            for d in raw.get("earlier_defaults") or ()
        ),
        unread=tuple(
            UnreadKey(
                str(u["key"]),
                str(u["instead"]),
                _own_line(u["where"], release, module),
                str(u["statement"]),
            )
            for u in raw.get("unread") or ()
        ),
    )


def _own_line(where: Any, release: str, module: str) -> str:
    """A line of the last release's files, written ``file.py:N@VERSION`` in the data (so every
    citation says its release), as the release's own files are searched: without the suffix."""
    text, mark, version = str(where).partition("@")
    if not mark or version != release:
        raise ValueError(f"{RETIRED_FILE.name}: {module}: {where} is not cited @{release}")
    return text


@functools.cache
def retired_entries() -> dict[str, RetiredEntry]:
    raw: Any = load_yaml_file(RETIRED_FILE, what="retired entry points")
    return {entry.module: entry for entry in map(_entry, raw["retired"])}


def retired_entry(module: str | None) -> RetiredEntry | None:
    return retired_entries().get(module or "")


def _count(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 1


def _copy(move: KeyMove, values: list[Any]) -> Any:
    return values[0]


def _constant(move: KeyMove, values: list[Any]) -> Any:
    return move.value


def _save_at_end(move: KeyMove, values: list[Any]) -> Any:
    freq = _count(values[0])
    return freq if freq > 0 else -1


def _fsdp1_offload(move: KeyMove, values: list[Any]) -> Any:
    cpu_offload, offload_params, strategy = values
    if not cpu_offload:
        return False
    if strategy != "fsdp":
        # fully_shard takes FSDP1's CPUOffload as its offload_policy (:325-339), which is not
        # FSDP2's CPUOffloadPolicy: what the shards do then is not read from the code
        raise Untranslatable(
            f"{move.sources[0]}=true with model.strategy={strategy}: the old trainer hands "
            "FSDP1's CPUOffload to FSDP2's fully_shard, which is not an offload policy there; "
            "not forecast (model.strategy=fsdp offloads)",
            move.sources[0],
        )
    return bool(offload_params)


def _sequence_parallel(move: KeyMove, values: list[Any]) -> Any:
    size, remove_padding = _count(values[0]), bool(values[1])
    if size > 1 and not remove_padding:
        raise Untranslatable(
            f"{move.sources[0]}={size} without use_remove_padding=True: the old trainer refuses "
            f"to start ({move.where})",
            move.sources[0],
        )
    return size


def _remove_padding(move: KeyMove, values: list[Any]) -> Any:
    return bool(values[0]) and _count(values[1]) > 1


RULES: dict[str, Callable[[KeyMove, list[Any]], Any]] = {
    "copy": _copy,
    "constant": _constant,
    "save_at_end": _save_at_end,
    "fsdp1_offload": _fsdp1_offload,
    "sequence_parallel": _sequence_parallel,
    "remove_padding": _remove_padding,
}


def translate(entry: RetiredEntry, legacy: Mapping[str, Any]) -> Translation:
    """The checked tree's overrides for a launch composed on the old tree (``legacy``: its
    resolved mapping). ``++`` sets a key the checked tree may lack (0.9.0's engine has no
    use_no_sync_for_gradient_accumulation; its code then defers the sync)."""
    overrides, values = [], {}
    for move in entry.moves:
        value = RULES[move.rule](move, [dotted_value(legacy, source) for source in move.sources])
        values[move.to] = value
        try:
            overrides.append(f"++{move.to}={override_literal(value)}")
        except ValueError as exc:
            source = move.sources[0] if move.sources else move.to
            raise Untranslatable(f"{source}: {exc}", source) from exc
    return Translation(tuple(overrides), padded=not values.get(REMOVE_PADDING_KEY, False))
