"""Versioned profiles: ordered dotted-path rules that give every resolved leaf one class.

A profile is data (``profiles/NAME.yaml``): adding a rule touches the YAML only. The upstream
version a profile describes comes from the file, never from code.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from pytest_verl_compat.files.safe_input import InputError, load_yaml_file, read_bytes
from pytest_verl_compat.model import RULE_CLASSES, LeafClass

# The profile the embedded corpus is compiled with when its manifest names none.
DEFAULT_SFT_PROFILE_FILE = "profiles/default_sft.txt"
DEFAULT_PROFILE_FILE = "profiles/default.txt"


@dataclass(frozen=True)
class Rule:
    """Dotted-path patterns mapped to one class, with the reason and what the class needs."""

    patterns: tuple[str, ...]
    klass: LeafClass
    reason: str
    detail: str = ""  # exact: target field; lowered: the lowering; binding: what is bound
    values: tuple[Any, ...] | None = None  # exact/binding/lowered: the supported values
    neutral: tuple[Any, ...] | None = None  # unsupported: values that keep the feature off
    # Setting the field explicitly signals an intent upstream ignores (legacy, deprecated, or a
    # switch of a feature this profile keeps off); the explicit-field check warns about it.
    no_effect: bool = False
    regex: re.Pattern[str] = field(default=re.compile(""), compare=False, repr=False)


@dataclass(frozen=True)
class Profile:
    """A versioned profile: an ordered list of rules; the first match classifies a leaf."""

    name: str
    version: str
    tree_sha256: str
    rules: tuple[Rule, ...]
    path: str
    sha256: str = ""  # of the profile file's bytes
    _memo: dict[str, Rule | None] = field(default_factory=dict, compare=False, repr=False)

    def rule_for(self, dotted: str) -> Rule | None:
        # Every case has the same ~880 paths; matching ~150 rules per path dominated compile time.
        if dotted in self._memo:
            return self._memo[dotted]
        found = next((rule for rule in self.rules if rule.regex.fullmatch(dotted)), None)
        self._memo[dotted] = found
        return found


def pattern_regex(patterns: Iterable[str]) -> re.Pattern[str]:
    # `**` crosses segments, `*` stays inside one; list indices are written `[*]` or `[0]`.
    parts = []
    for pattern in patterns:
        escaped = re.escape(pattern).replace(r"\*\*", "\0").replace(r"\*", r"[^.\[]*")
        parts.append(escaped.replace("\0", r".*"))
    return re.compile("|".join(f"(?:{p})" for p in parts))


def default_profile() -> str:
    """The shipped default profile's name (data beside the profiles, not a literal in code)."""
    return resources.files("pytest_verl_compat").joinpath(DEFAULT_PROFILE_FILE).read_text().strip()


def default_sft_profile() -> str:
    """The shipped SFT profile's name (``profiles/default_sft.txt``)."""
    return (
        resources.files("pytest_verl_compat").joinpath(DEFAULT_SFT_PROFILE_FILE).read_text().strip()
    )


def profile_path(name: str) -> Path:
    return Path(str(resources.files("pytest_verl_compat") / "profiles" / f"{name}.yaml"))


def _profile_file(name_or_path: str | None) -> Path:
    name_or_path = name_or_path or default_profile()
    # Profile names contain dots (verl-0.9.0-...), so only a YAML suffix means a path.
    if name_or_path.endswith((".yaml", ".yml")):
        return Path(name_or_path)
    return profile_path(name_or_path)


def profile_sha256(name_or_path: str | None = None) -> str:
    """The sha256 of a profile's file (what ``Profile.sha256`` holds once it is loaded)."""
    return hashlib.sha256(read_bytes(_profile_file(name_or_path), what="profile")).hexdigest()


@lru_cache(maxsize=8)
def load_profile(name_or_path: str | None = None) -> Profile:
    """A profile by name (shipped in the package) or by path to its YAML file."""
    path = _profile_file(name_or_path)
    raw = load_yaml_file(path, what="profile")  # InputError (a ValueError) names the file
    if not isinstance(raw, dict) or not isinstance(raw.get("rules"), list):
        raise InputError(f"{path}: expected a mapping with a 'rules' list")
    # A profile may be a path the manifest names: a malformed one is its file's error, not ours.
    where = "the top level"
    try:
        rules = []
        for index, entry in enumerate(raw["rules"]):
            where = f"rules[{index}]"
            klass = entry["class"]
            if klass not in RULE_CLASSES:
                raise InputError(f"{path}: {where}: class {klass!r} is not one of {RULE_CLASSES}")
            patterns = entry["match"] if isinstance(entry["match"], list) else [entry["match"]]
            rules.append(
                Rule(
                    patterns=tuple(patterns),
                    klass=klass,
                    reason=entry["reason"],
                    detail=entry.get("target")
                    or entry.get("lowering")
                    or entry.get("binding")
                    or "",
                    values=tuple(entry["values"]) if "values" in entry else None,
                    neutral=tuple(entry["neutral"]) if "neutral" in entry else None,
                    no_effect=bool(entry.get("no_effect", False)),
                    regex=pattern_regex(patterns),
                )
            )
        where = "the top level"
        return Profile(
            name=raw["profile"],
            version=str(raw["upstream"]["version"]),
            tree_sha256=raw["upstream"]["tree_sha256"],
            rules=tuple(rules),
            path=str(path),
            sha256=hashlib.sha256(read_bytes(path, what="profile")).hexdigest(),
        )
    except (KeyError, TypeError, AttributeError, re.error) as exc:
        missing = f"no {exc}" if isinstance(exc, KeyError) else str(exc)
        raise InputError(f"{path}: {where}: {missing}") from exc
