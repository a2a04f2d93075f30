"""Explicit launch fields that no code path of the pinned release reads."""

from __future__ import annotations

from collections.abc import Iterator

from pytest_verl_compat.checks.registry import CheckInput, Hit, check
from pytest_verl_compat.checks.upstream_names import LEGACY_REWARD_KEYS


def field_key(field: str) -> str:
    """The dotted key of an override (``+a.b=1`` → ``a.b``)."""
    return field.split("=", 1)[0].lstrip("+~")


def _legacy_replacement(key: str) -> str | None:
    return next(
        (new for old, new in LEGACY_REWARD_KEYS.items() if key == old or key.startswith(old + ".")),
        None,
    )


@check(
    "fields.legacy-reward-key",
    level="error",
    evidence="verl/trainer/config/legacy_reward_impl.yaml (kept for compatibility, never read); verl PR #7331, #5558, #6172",
)
def legacy_reward_key(inp: CheckInput) -> Iterator[Hit]:
    for field in inp.explicit_fields:
        key = field_key(field)
        replacement = _legacy_replacement(key)
        if replacement:
            yield Hit(
                key,
                f"`{field}` sets a legacy top-level reward key that verl {inp.version} silently ignores "
                "(its migration to reward.* was dropped)",
                fix=f"set {replacement} instead",
            )


@check("fields.no-effect", level="warning", evidence="profile {profile}")
def no_effect(inp: CheckInput) -> Iterator[Hit]:
    # Names, output folders and profiler switches are set on purpose; flag only the fields whose
    # setting suggests an intent upstream ignores: the profile marks those rules `no_effect`.
    inert = {leaf.path for leaf in inp.leaves if leaf.klass == "inert" and leaf.no_effect}
    for field in inp.explicit_fields:
        key = field_key(field)
        if _legacy_replacement(key):
            continue  # the legacy-key error says more
        if key in inert or any(
            path.startswith(key + ".") or path.startswith(key + "[") for path in inert
        ):
            yield Hit(
                key,
                f"`{field}` lands on a field with no effect on training here (profile class inert)",
            )
