"""Retarget a profile to another verl tree: the same rules, plus a rule for every new leaf.

A new leaf is never silently accepted: under profiler and tracing sections it is ``inert``
with a "not yet reviewed" reason; anywhere else it is ``unsupported`` with its new default
as the only neutral value, so setting it to anything else rejects the case until a person
has written a real rule. The pinned profile file is never touched.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from pytest_verl_compat.files.digests import tree_sha256
from pytest_verl_compat.pipeline.compose import Composer, iter_leaves

# Path segments whose leaves only observe a run (profilers, tracers).
OBSERVING_SEGMENTS = ("profiler", "tracing", "trace")
_VERSION_IN_NAME = re.compile(r"verl-(\d+\.\d+\.\d+[\w.+-]*?)-")


class RetargetError(Exception):
    """The profile cannot be retargeted (no version for the tree, or the output exists)."""


def is_observing(path: str) -> bool:
    """True for leaves under a profiler or tracing section (e.g. ``global_profiler.*``)."""
    segments = path.split("[", 1)[0].split(".")
    return any(
        segment in OBSERVING_SEGMENTS or segment.endswith("_profiler") for segment in segments
    )


def new_rules(unclassified: Mapping[str, Any], version: str) -> list[dict[str, Any]]:
    """Rules for leaves the pinned profile cannot classify, keyed by path with their new default."""
    inert = sorted(path for path in unclassified if is_observing(path))
    rules: list[dict[str, Any]] = []
    if inert:
        rules.append(
            {
                "match": inert,
                "class": "inert",
                "reason": f"added in {version}; not yet reviewed — review before relying on it",
            }
        )
    for path in sorted(p for p in unclassified if not is_observing(p)):
        rules.append(
            {
                "match": path,
                "class": "unsupported",
                "neutral": [unclassified[path]],
                "reason": f"added in {version}; not yet reviewed: only its {version} default is "
                "accepted until a rule states its semantics",
            }
        )
    return rules


def _version_for(against_root: Path, digest: str, new_name: str, version: str | None) -> str:
    if version:
        return version
    from pytest_verl_compat.upstream.drift.report import release_trees, tree_version

    found = tree_version(against_root, digest, release_trees())
    if found:
        return found
    match = _VERSION_IN_NAME.search(new_name + "-")
    if match:
        return match.group(1)
    raise RetargetError(
        f"cannot tell the verl version of {against_root} (no verl/version/version file, unknown "
        f"tree {digest}); name the profile verl-<version>-... or pass the version"
    )


def retarget_profile(
    pinned_profile_name: str,
    against_root: Path,
    new_name: str,
    *,
    out_dir: Path | None = None,
    version: str | None = None,
    config_dir: str = "verl/trainer/config",
    config_name: str = "ppo_trainer",
    cases: Sequence[tuple[Sequence[str], Mapping[str, str]]] = (),
) -> Path:
    """Write ``<new_name>.yaml`` (next to the pinned profile, or in ``out_dir``) for another tree.

    The leaves to cover are those of the override-free composition plus those of every
    ``(explicit fields, variables)`` in ``cases`` that composes on the other tree: config
    group choices made by overrides can bring in leaves the default composition lacks.
    """
    from pytest_verl_compat.pipeline.profile import load_profile

    pinned = load_profile(pinned_profile_name)
    pinned_path = Path(pinned.path)
    against_root = Path(against_root).expanduser().resolve()
    tree = against_root / config_dir
    if not (tree / f"{config_name}.yaml").is_file():
        raise RetargetError(f"{against_root} has no {config_dir}/{config_name}.yaml")
    digest = tree_sha256(tree)
    version = _version_for(against_root, digest, new_name, version)
    target = Path(out_dir or pinned_path.parent) / f"{new_name}.yaml"
    if target.resolve() == pinned_path.resolve():
        raise RetargetError(f"{target} is the pinned profile; choose another name")

    composer = Composer(tree, config_name)
    unclassified: dict[str, Any] = {}
    # The default composition comes first, so its values are the defaults that become neutral.
    for fields, variables in [((), {}), *cases]:
        composition = composer.compose(list(fields), variables)
        if not composition.composed:
            continue
        for path, value in iter_leaves(composition.resolved):
            if path not in unclassified and pinned.rule_for(path) is None:
                unclassified[path] = value

    text = pinned_path.read_text(encoding="utf-8")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(_retargeted_text(text, pinned, new_name, version, digest, unclassified))
    check = yaml.safe_load(target.read_text(encoding="utf-8"))
    original = yaml.safe_load(text)
    assert check["rules"][: len(original["rules"])] == original["rules"], target
    load_profile.cache_clear()
    return target


def _retargeted_text(
    text: str,
    pinned: Any,
    new_name: str,
    version: str,
    digest: str,
    unclassified: Mapping[str, Any],
) -> str:
    """The pinned profile's text with a new name and upstream block, new rules appended.

    Editing the text keeps every comment and the order of the reviewed rules.
    """
    header = (
        f"# Retargeted from {pinned.name} (verl {pinned.version}) to verl {version} by "
        "`verl-compat retarget`.\n"
        f"# The last {len(new_rules(unclassified, version))} rules cover leaves {pinned.name} "
        "cannot classify; review them,\n# and the drift report's changed defaults, before "
        "relying on this profile.\n"
    )
    text = re.sub(r"(?m)^profile: .*$", f"profile: {new_name}", text, count=1)
    text = re.sub(
        r"(?m)^upstream:\n(?:[ \t]+.*\n)+",
        f"upstream:\n  version: {version}\n  tree_sha256: {digest}\n",
        text,
        count=1,
    )
    rules = new_rules(unclassified, version)
    if rules:
        block = yaml.safe_dump(rules, sort_keys=False, allow_unicode=True, width=100)
        indented = "".join(f"  {line}\n" for line in block.splitlines())
        text = (
            text.rstrip("\n")
            + f"\n\n  # ------------------------------------------------------------------ added in "
            f"{version} (not yet reviewed)\n" + indented
        )
    return header + text


def retarget_cases(session: Any) -> list[tuple[Sequence[str], Mapping[str, str]]]:
    """The explicit fields and variables of a session's cases that it can read or take from golden."""
    from pytest_verl_compat.model import StageFailed, StageUnavailable

    found: list[tuple[Sequence[str], Mapping[str, str]]] = []
    for case in session.cases:
        try:
            outcome = session.outcome(case)
        except (StageFailed, StageUnavailable):
            continue
        found.append((outcome.fields.fields, dict(outcome.fields.environment(case.bindings))))
    return found
