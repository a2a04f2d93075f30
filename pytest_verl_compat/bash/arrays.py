"""Associative arrays, kept in the order bash 5.2 lists their keys.

bash stores an associative array in a hash table of 1024 buckets (``assoc.h``
``ASSOC_HASH_BUCKETS``), hashes a key with 32-bit FNV-1 (``hashlib.c`` ``hash_string``: multiply
by the FNV prime, then xor the byte as a signed ``char``), puts a new key at the head of its
bucket's list (``hash_search`` with ``HASH_CREATE``) and lists keys bucket by bucket
(``assoc_to_word_list_internal``). ``"${!A[@]}"`` and ``"${A[@]}"`` follow that order, so the
argv built from an associative array is the one bash builds. The table grows at twice as many
keys as buckets, which reorders it; an array that large is refused instead.
"""

from __future__ import annotations

from collections.abc import Iterator

_BUCKETS = 1024
# hashlib.h HASH_SHOULDGROW: nentries >= nbuckets * 2 rehashes the table.
MAX_KEYS = 2 * _BUCKETS - 1
_FNV_OFFSET = 2166136261
_FNV_PRIME = 16777619


def _bucket(key: str) -> int:
    value = _FNV_OFFSET
    for byte in key.encode("utf-8"):
        value = (value * _FNV_PRIME) & 0xFFFFFFFF
        # `*s` is a signed char on the platforms bash is built for: sign-extended before xor.
        value ^= byte if byte < 0x80 else (byte - 0x100) & 0xFFFFFFFF
    return value & (_BUCKETS - 1)


class Assoc:
    """An associative array: string keys, listed as bash lists them."""

    __slots__ = ("items",)

    def __init__(self, items: dict[str, str] | None = None) -> None:
        # Insertion order, oldest first; a key set again keeps its place (bash updates it in
        # its bucket), a key unset and set again goes last (bash puts it at the bucket's head).
        self.items: dict[str, str] = dict(items or {})

    def copy(self) -> Assoc:
        return Assoc(self.items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Assoc) and list(self.items.items()) == list(other.items.items())

    __hash__ = None  # type: ignore[assignment]

    def __len__(self) -> int:
        return len(self.items)

    def keys(self) -> list[str]:
        """The keys in bash's order: by bucket, the newest of a bucket first."""
        age = {key: position for position, key in enumerate(self.items)}
        return sorted(self.items, key=lambda key: (_bucket(key), -age[key]))

    def values(self) -> list[str]:
        return [self.items[key] for key in self.keys()]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def size(self) -> int:
        """Characters held, for the value budget."""
        return sum(len(key) + len(value) for key, value in self.items.items())
