"""A regular expression from a launch script, matched against a module name, bounded in time.

peft full-matches a string LoRA target against each module's name (``re.fullmatch``,
tuners_utils.py check_target_module_exists@peft-0.21.2) and Megatron-Bridge anchors its
wildcard targets at both ends (peft/utils.py wildcard_match@megatron-bridge-0.3.1); to say what
they would adapt, the checks and the forecast match the script's pattern the same way. A
hostile or mistyped pattern can backtrack without end on those names (``(.*)*x`` never returns
under ``re``), so the match runs under the ``regex`` package (mrab-regex: ``re``'s syntax, with
a timeout; transformers' own dependency), and a pattern that does not compile or is not decided
in time matches nothing.
"""

from __future__ import annotations

# Seconds for one match: the names are module paths of under a hundred characters, which any
# pattern a person writes decides in microseconds.
MATCH_SECONDS = 0.05


def fullmatch_decided(pattern: str, name: str) -> bool | None:
    """Whether ``pattern`` matches all of ``name``; None when it does not compile, or is not
    decided within ``MATCH_SECONDS`` (a caller that must not guess says nothing then)."""
    import regex  # 28 ms to import: only where a script writes a pattern

    try:
        return regex.fullmatch(pattern, name, timeout=MATCH_SECONDS) is not None
    except (regex.error, TimeoutError, ValueError, RecursionError):
        return None


def fullmatches(pattern: str, name: str) -> bool:
    """Whether ``pattern`` matches all of ``name`` (False when it is not decided)."""
    return fullmatch_decided(pattern, name) is True
