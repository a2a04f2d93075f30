"""The one writer of Hydra override literals (``hydra_internals.override_literal``): whatever it
writes, Hydra's own grammar reads back as the value it was given. Used where the project composes
values it did not read as text: a retired launch's moved keys, the step plan's leaves, a resolved
run's changed leaves."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_verl_compat.pipeline.hydra_internals import override_literal, parse_override

# Characters a launch's paths and names hold, and every character Hydra's grammar treats
# specially (quotes, escapes, brackets, separators, interpolation's `$`).
TEXT = st.text(
    alphabet=st.characters(min_codepoint=32, max_codepoint=126) | st.sampled_from("\t"),
    max_size=24,
).filter(lambda text: "${" not in text)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT
KEYS = st.from_regex(r"[A-Za-z_][A-Za-z0-9_\-./: ]{0,10}", fullmatch=True)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=10,
)


def _read_back(value: Any) -> Any:
    return parse_override(f"k={override_literal(value)}").value()


@given(VALUES)
def test_hydra_reads_back_what_was_written(value: Any) -> None:
    assert _read_back(value) == value


@pytest.mark.parametrize(
    "value",
    ["C:\\data\\", "a\\'b", "x,y=z", "it's", "[not, a list]", "{a: 1}", " padded ", "1e-4", "null"],
)
def test_strings_hydra_would_read_otherwise_stay_strings(value: str) -> None:
    assert _read_back(value) == value


def test_what_no_override_holds_is_refused() -> None:
    for value in ("${oc.env:HOME}", {1: "a"}, object()):
        with pytest.raises(ValueError):
            override_literal(value)
    assert override_literal(float("inf")) == "inf"
    assert override_literal([1, True, None, "x"]) == "[1,true,null,'x']"
