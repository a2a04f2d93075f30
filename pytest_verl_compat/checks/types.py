"""Values of the wrong type, by the type of the tree's own default for the same key.

Hydra types an override's value from its text (``abc`` is a string, ``3`` an int, ``true`` a
bool, an empty ``key=`` the empty string) and OmegaConf keeps it: verl's tree is untyped
(``DictConfig`` without a schema), so nothing checks it before the code that uses the value.
Upstream then fails far from the script line (``validate_config``'s ``real_train_batch_size %
minimal_bsz`` on a string, verl/utils/config.py:110), or never: ``optim.lr=fast`` reaches the
optimizer only on the GPU, and a boolean flag given ``maybe`` is truthy everywhere it is read
(``if config.actor_rollout_ref.actor.use_kl_loss:``). The tree's default says which type every
reader of the key expects; the oracle adds the config dataclasses' annotations for keys whose
default is null (``upstream.probes.types``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from importlib import resources
from typing import Any

import yaml

from pytest_verl_compat.checks.fields import field_key
from pytest_verl_compat.checks.registry import CheckInput, Example, Hit, check

# The tree's scalar default types, in words. A list or mapping default is left alone: verl's
# readers often take a single string too (``trainer.logger=console``: verl/trainer/main_ppo.py:48
# wraps a string logger in a list), so a string there is not a mistake by itself.
# An integer default takes any number: verl's dataclasses annotate many keys whose tree default is
# 0 as floats (``entropy_coeff: float = 0.0``, verl/workers/config/actor.py, default ``0`` in
# actor.yaml), so ``entropy_coeff=0.01`` is right; the annotation check settles int against float.
ANNOTATED_STRINGS = "data/annotated_strings.yaml"
# Strings an entry point's own code replaces in a key before any use, per release and entry
# module (``data/string_sentinels.yaml``): the SFT trainer turns ``trainer.save_freq=
# after_each_epoch`` into the steps of an epoch (verl/trainer/sft_trainer.py:190-192).
STRING_SENTINELS = "data/string_sentinels.yaml"
# The module a launch runs when none was read (a resolved file): main_ppo's.
_DEFAULT_ENTRY = "verl.trainer.main_ppo"
_KINDS: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (bool, "a boolean (true or false)"),
    ((int, float), "a number"),
)


def expected_kind(default: Any) -> str | None:
    """What a key whose default is ``default`` takes, or None when any value may do (a string
    default takes what verl formats into a name; a null default says nothing; see ``_KINDS``)."""
    for kind, words in _KINDS:
        if isinstance(default, kind):
            return words
    return None


def fits(value: Any, default: Any) -> bool:
    """Whether ``value`` has the type every reader of a key defaulting to ``default`` expects."""
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int | float):
        return isinstance(value, int | float) and not isinstance(value, bool)
    return True


def describe(value: Any) -> str:
    if value == "":
        return "an empty value (an unset variable in the script?)"
    return f"{value!r} ({type(value).__name__})"


def _leaf(mapping: Any, key: str) -> tuple[bool, Any]:
    node = mapping
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


@functools.cache
def annotated_strings(version: str) -> frozenset[str]:
    """Keys whose dataclass annotation admits a string although their tree default is a number
    or a flag (``data/annotated_strings.yaml``, derived from each release's own code)."""
    text = resources.files("pytest_verl_compat").joinpath(ANNOTATED_STRINGS).read_text()
    listed = yaml.safe_load(text) or {}
    return frozenset(str(key) for key in listed.get(version) or ())


@functools.cache
def _string_sentinels() -> dict[str, Any]:
    text = resources.files("pytest_verl_compat").joinpath(STRING_SENTINELS).read_text()
    return yaml.safe_load(text) or {}


def replaced_string(version: str, entry_module: str | None, key: str, value: Any) -> str | None:
    """Where the entry point's own code replaces the string ``value`` of ``key`` before any use
    (``verl/…py:line``), or None (``data/string_sentinels.yaml``, derived from each release)."""
    modules = _string_sentinels().get(version) or {}
    strings = (modules.get(entry_module or _DEFAULT_ENTRY) or {}).get(key) or {}
    where = strings.get(value) if isinstance(value, str) else None
    return str(where) if where else None


def wrong_types(inp: CheckInput) -> Iterator[tuple[str, Any, str]]:
    """(key, value, expected) for each explicit key whose value does not fit its default (a
    string the entry point's code replaces before use fits: it is the reading code's type)."""
    seen = set(annotated_strings(inp.version))
    for field in inp.explicit_fields:
        key = field_key(field)
        if key in seen:
            continue
        seen.add(key)
        found, default = _leaf(inp.defaults, key)
        present, value = _leaf(inp.resolved, key)
        if not (found and present) or value is None:
            continue
        kind = expected_kind(default)
        if kind is None or fits(value, default):
            continue
        if replaced_string(inp.version, inp.entry_module, key, value) is None:
            yield key, value, kind


@check(
    "types.wrong-type",
    level="error",
    evidence=(
        "verl/trainer/config/ppo_trainer.yaml and its defaults (the tree's default types); the tree "
        "is an untyped DictConfig, so a wrong type fails where the value is used, e.g. "
        "verl/utils/config.py:110 (real_train_batch_size % minimal_bsz), or never"
    ),
    summary="A key set to a value of another type than its default in the tree: a string where a "
    "number or a boolean is read, an empty value from an unset variable in the script.",
    fix="give the key a value of its default's type (a number, true or false); set the variable "
    "the script reads",
    example=Example(
        fires=("actor_rollout_ref.actor.optim.lr=fast",),
        twin=("actor_rollout_ref.actor.optim.lr=1e-6",),
    ),
    family=None,
)
def wrong_type(inp: CheckInput) -> Iterator[Hit]:
    for key, value, kind in wrong_types(inp):
        yield Hit(
            key,
            f"{describe(value)}, but verl {inp.version} expects {kind} (the tree's default is one)",
            f"set {key} to {kind}",
        )
