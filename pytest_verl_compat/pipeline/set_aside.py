"""A launch the release's tree rejects for its keys, composed without them: what ``fit`` forecasts
for a script written for another verl.

Hydra stops at the first override the tree cannot take, so a script written for an older verl
(``actor.fsdp_config.grad_offload``, ``actor.use_token_level_loss``, ``reward_model.micro_batch_size``)
is one rejection, whatever else it sets. Its memory is still a question a user asks, and the
answer is the launch as the release would run it once those keys are gone: each rejection Hydra
names is taken in turn, the override it names is set aside (a key the tree does not have: the
release reads nothing of it) or applied as Hydra would have taken it (``+key=value`` where the
tree has the key: the value is what the user asked for), and the rest composed again. Each one
stays an error of the launch as written. Not set aside: a key of an engine section the tree does
not have at that place (``actor.megatron.*`` on the FSDP tree, ``critic.model.fsdp_config.*`` of
older trees; a section the launch's own ``+`` keys make is not the tree's), whose sizes and
offloads would be lost, and anything else Hydra refuses (a config
group option the tree lacks, a value of the wrong type): forecast without them, the launch would
be another run.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_verl_compat.checks.fields import field_key
from pytest_verl_compat.model import COMPOSITION_REJECTION, Composition

# Hydra's messages for an override whose key the tree does not have (hydra/_internal/
# config_loader_impl.py ConfigLoaderImpl._apply_overrides_to_config@hydra-core-1.3.2):
# "Could not override 'a.b'." (a plain override), "Could not delete from config. 'a.b' does not
# exist." (``~a.b``); and for ``+a.b=v`` where the tree has a.b: "Could not append to config. An
# item is already at 'a.b'."
_ABSENT = (
    re.compile(r"Could not override '([^']+)'"),
    re.compile(r"Could not delete from config\. '([^']+)' does not exist"),
)
_PRESENT = re.compile(r"Could not append to config\. An item is already at '([^']+)'")
_PATTERNS = (*((pattern, False) for pattern in _ABSENT), (_PRESENT, True))
# The names of the sections an engine's sizes, offloads and precision sit in: the options of
# verl's engine config group (verl/trainer/config/engine/*.yaml) and the FSDP engine's packages
# (``fsdp_config`` for actor and ref, ``fsdp`` for the critic: checks/roles.py engine_key). Kept
# here, not beside engine_key, whose module keys the oracle's recorded answers.
ENGINE_SECTIONS = frozenset(
    {"fsdp_config", "fsdp", "megatron", "mindspeed", "veomni", "torchtitan", "automodel"}
)
# At most this many rejections taken before the launch is refused as Hydra refused it.
MAX_SET_ASIDE = 32


@dataclass(frozen=True)
class SetAside:
    """One override of the launch its release's tree rejected: ``written`` as the script gives it,
    the dotted ``key``, Hydra's ``reason`` (its first line), and ``applied``: the override composed
    in its place ("" when the key was left out)."""

    written: str
    key: str
    reason: str
    applied: str = ""
    release: str = ""  # the release whose tree rejected it
    closest: str = ""  # the tree's key with the closest name, in its section or above (_closest)
    # Why ``applied`` is the key's new place where the tree lacks the key (an earlier release's
    # tree had its section there: ``relocating``'s evidence); "" for a key Hydra refused to add.
    moved: str = ""

    def said(self) -> str:
        """The finding's message: what the release does with the launch as written."""
        tree = f"verl {self.release}'s tree" if self.release else "the tree"
        if self.moved:
            then = (
                f"the forecast applies `{self.applied}`"
                if self.applied
                else "the key is not in the new section either: the forecast is of the launch "
                "without it"
            )
            return (
                f"`{self.written}`: {tree} has no such key, so Hydra rejects the launch before "
                f"any GPU is used; its section moved ({self.moved}), and {then}"
            )
        if self.applied:
            return (
                f"`{self.written}`: {tree} already has the key, so Hydra refuses to add it and "
                f"the launch does not start; the forecast applies `{self.applied}`"
            )
        return (
            f"`{self.written}`: {tree} has no such key, so Hydra rejects the launch before any "
            "GPU is used; the forecast is of the launch without it"
        )

    def fix(self) -> str:
        if self.applied:
            return f"write `{self.applied}`"
        near = f" (the closest key it has: {self.closest})" if self.closest else ""
        return f"delete it, or set the key that replaced it in verl {self.release}{near}"


def rejected_key(reason: str) -> str:
    """The dotted key a rejection names as one the tree does not have, or "" (another kind)."""
    first = reason.splitlines()[0] if reason else ""
    match = next((m for pattern in _ABSENT if (m := pattern.search(first))), None)
    return match.group(1) if match else ""


def _one(reason: str, fields: Sequence[str], release: str) -> tuple[int, SetAside] | None:
    """The override a rejection names and what takes its place, or None (another rejection)."""
    first = reason.splitlines()[0] if reason else ""
    for pattern, present in _PATTERNS:
        match = pattern.search(first)
        if match is None:
            continue
        key = match.group(1)
        for index, written in enumerate(fields):
            if field_key(written) != key:
                continue
            if present and written.startswith("+") and not written.startswith("++"):
                return index, SetAside(written, key, first, written[1:], release)
            if not present:
                return index, SetAside(written, key, first, release=release)
    return None


def _setting_aside(
    compose: Callable[[tuple[str, ...]], Composition], fields: tuple[str, ...], release: str
) -> tuple[Composition, tuple[str, ...], list[SetAside]]:
    """Hydra's rejections of ``fields`` for their keys taken in turn (at most ``MAX_SET_ASIDE``):
    the last composition, the overrides it composed, and what was set aside or applied."""
    current = fields
    taken: list[SetAside] = []
    composition = compose(current)
    while not composition.composed and len(taken) < MAX_SET_ASIDE:
        found = _one(composition.reason, current, release)
        if found is None:
            break
        index, aside = found
        replaced = (aside.applied,) if aside.applied else ()
        current = current[:index] + replaced + current[index + 1 :]
        taken.append(aside)
        composition = compose(current)
    return composition, current, taken


def _adds(field: str) -> bool:
    """``+a.b=v`` or ``++a.b=v``: a key the launch may add to the tree (a config group's ``+g/o=x``
    selects one of the tree's own files, and is not counted)."""
    return field.startswith("+") and "/" not in field_key(field)


def _tree_mapping(
    compose: Callable[[tuple[str, ...]], Composition],
    composed: Composition,
    fields: tuple[str, ...],
) -> Mapping[str, Any]:
    """The sections the tree itself has for this launch: ``fields`` composed without the keys the
    launch adds (its group selections kept). A section made only by the launch's own ``+`` keys
    (``+actor.megatron.override_transformer_config.*`` on the FSDP tree) is not the tree's. Where
    the launch without them does not compose, the composition as it is."""
    own = tuple(field for field in fields if not _adds(field))
    if own == fields:
        return composed.mapping
    tree, _, _ = _setting_aside(compose, own, "")
    return tree.mapping if tree.composed else composed.mapping


# Where a key of an engine section the tree lacks went: the dotted key it is now and the
# evidence, or None (``upstream/drift/mounts.py`` relocation).
Relocating = Callable[[str], tuple[str, str] | None]


def compose_setting_aside(
    compose: Callable[[tuple[str, ...]], Composition],
    fields: Sequence[str],
    release: str = "",
    relocating: Relocating | None = None,
    unread: tuple[str, ...] = (),
) -> tuple[Composition, tuple[str, ...], tuple[SetAside, ...]]:
    """``fields`` composed by ``compose`` with every override the tree rejects for its key set
    aside (or applied as Hydra takes it): the composition, the overrides composed, and those set
    aside in the order Hydra named them. The first rejection of any other kind (or past
    ``MAX_SET_ASIDE``) is returned as it is, and so is a key of an engine section the tree lacks
    (none set aside then), unless ``relocating`` names where each such key went: they are then
    applied there and the launch composed again. A key under one of the ``unread`` sections
    (a legacy block the release's entry point never reads) loses nothing when set aside, engine
    section or not."""
    composition, current, taken = _setting_aside(compose, tuple(fields), release)
    if not composition.composed or not taken:
        return composition, current, tuple(taken)
    tree = _tree_mapping(compose, composition, current)
    # an engine's section the tree does not have there (Megatron's keys on the FSDP tree, the
    # critic's fsdp_config of older trees), even where the launch's own `+` keys make one: the
    # sizes and offloads the launch asks for would be lost and the forecast be of another run
    stranded = [
        (aside, section)
        for aside in taken
        if (section := _absent_engine(tree, aside))
        and not any(aside.key.startswith(f"{prefix}.") for prefix in unread)
    ]
    places = {
        aside.written: place
        for aside, _ in stranded
        if relocating is not None and (place := relocating(aside.key)) is not None
    }
    unplaced = [(aside, section) for aside, section in stranded if aside.written not in places]
    if stranded and not unplaced:  # each has a new place with evidence: the launch with them there
        moved = [_placed(aside, *places[aside.written]) for aside, _ in stranded]
        by_field = {aside.written: aside for aside in moved}
        relocated = tuple(by_field[f].applied if f in by_field else f for f in fields)
        composition, current, rest = compose_setting_aside(
            compose, relocated, release, unread=unread
        )
        if not composition.composed:
            return composition, current, rest
        # a moved key its new section lacks as well is left out, and said once, where written
        gone = {aside.written for aside in rest} & {aside.applied for aside in moved}
        moved = [dataclasses.replace(a, applied="") if a.applied in gone else a for a in moved]
        rest = tuple(aside for aside in rest if aside.written not in gone)
        return composition, current, (*moved, *rest)
    if unplaced:  # refused as Hydra did, at the first key with no new place
        aside, missing = unplaced[0]
        where = f"verl {release}'s tree" if release else "the tree"
        near = _engine_sections_near(tree, missing)
        has = f"; the engine sections it has there: {', '.join(near)}" if near else ""
        reason = f"{aside.reason} ({where} has no engine section {missing}: a launch for another engine or tree{has})"
        return Composition(COMPOSITION_REJECTION, reason=reason), tuple(fields), ()
    taken = [dataclasses.replace(a, closest=_closest(a.key, composition.mapping)) for a in taken]
    return composition, current, tuple(taken)


def _absent_engine(tree: Mapping[str, Any], aside: SetAside) -> str:
    """The engine section the tree lacks that ``aside``'s key sits in, or ""."""
    missing = _first_absent(tree, aside.key.rpartition(".")[0])
    return missing if missing and missing.rpartition(".")[2] in ENGINE_SECTIONS else ""


def _placed(aside: SetAside, successor: str, evidence: str) -> SetAside:
    """``aside`` applied at ``successor``, its key's place in the tree, with the evidence."""
    prefix = aside.written[: len(aside.written) - len(aside.written.lstrip("+~"))]
    value = aside.written[len(prefix) + len(aside.key) :]
    return dataclasses.replace(aside, applied=f"{prefix}{successor}{value}", moved=evidence)


def _sections_along(
    mapping: Mapping[str, Any], section: str
) -> list[tuple[str, Mapping[str, Any]]]:
    """The sections of ``mapping`` along the dotted ``section``, from the root, as far as they
    exist: (dotted prefix, node) pairs, the root's prefix "" first."""
    chain: list[tuple[str, Mapping[str, Any]]] = [("", mapping)]
    for part in section.split(".") if section else []:
        below = chain[-1][1].get(part)
        if not isinstance(below, Mapping):
            break
        chain.append((f"{chain[-1][0]}.{part}".lstrip("."), below))
    return chain


def _engine_sections_near(mapping: Mapping[str, Any], missing: str) -> list[str]:
    """The engine sections the tree has beside the absent ``missing`` or one level above it
    (``critic.model.fsdp_config``: ``critic.fsdp``), nearest first, for the refusal to name."""
    chain = _sections_along(mapping, missing.rpartition(".")[0])
    return [
        f"{prefix}.{name}"
        for prefix, node in reversed(chain[1:][-2:])
        for name in sorted(ENGINE_SECTIONS)
        if isinstance(node.get(name), Mapping)
    ]


def _first_absent(mapping: Mapping[str, Any], section: str) -> str:
    """The shortest prefix of the dotted ``section`` that is not a section of ``mapping`` ("" when
    the whole of it is)."""
    parts = section.split(".") if section else []
    present = len(_sections_along(mapping, section)) - 1
    return "" if present == len(parts) else ".".join(parts[: present + 1])


def _closest(key: str, mapping: Mapping[str, Any]) -> str:
    """The key of the composed ``mapping`` whose name is closest to ``key``'s own (difflib's ratio,
    at least 0.75), in ``key``'s section or else the nearest section above it that has one
    (``actor_rollout_ref.actor.model_engine``: the top-level ``model_engine``); "" when none."""
    section, _, name = key.rpartition(".")
    for prefix, node in reversed(_sections_along(mapping, section)):
        close = difflib.get_close_matches(name, [str(k) for k in node], n=1, cutoff=0.75)
        if close:
            return f"{prefix}.{close[0]}".lstrip(".")
    return ""
