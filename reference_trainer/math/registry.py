"""Name registries keyed by verl's exact strings; an unknown name lists the valid ones."""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from typing import TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """A registry lookup with a name the registry does not hold.

    A KeyError so that `Mapping.get` and `in` keep working, a ValueError because that is what
    verl raises for an unknown loss or estimator and what config validation catches.
    """

    def __str__(self) -> str:
        # KeyError would print the repr of the message, quotes and escaped newlines included.
        return str(self.args[0])


class Registry(Mapping[str, T]):
    """A read-only mapping from verl's names to implementations."""

    def __init__(self, kind: str, entries: Mapping[str, T]) -> None:
        self.kind = kind
        self._entries = dict(entries)

    def __getitem__(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(self.unknown_message(name)) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def unknown_message(self, name: object) -> str:
        valid = sorted(self._entries)
        close = difflib.get_close_matches(str(name), valid, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"unknown {self.kind} {name!r}{hint} valid names: {', '.join(valid)}"

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._entries)})"
