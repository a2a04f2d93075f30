"""Which configuration keys upstream's code reads, and on which of its lines (oracle process only).

While a probe runs upstream code on one configuration, ``recording`` hooks the three ways verl
reads it: OmegaConf's ``DictConfig`` (attribute, item and ``get`` access all go through
``DictConfig._get_impl``), verl's config dataclasses (``verl.base_config.BaseConfig``, read as
attributes), and Hydra's ``instantiate``, which builds those dataclasses from ``DictConfig``
sections (each instance remembers the dotted path it was built from). A read is kept only when
the first frame outside OmegaConf, Hydra, ``dataclasses`` and this module is upstream's own code,
with that frame's ``verl/…py`` line. Writes (``ref.ppo_mini_batch_size = actor.ppo_mini_batch_size``)
carry the keys read on their line, so a key upstream derived from the user's names the user's key.

A failure then names the keys read on the lines that decide the failing statement
(``statements.deciding_lines``), innermost verl frame first.

These are patches of third-party internals; they apply only inside ``recording`` and are restored
on exit (STYLE 14d), and only the oracle process ever enters it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import traceback
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pytest_verl_compat.upstream.probes import statements
from pytest_verl_compat.upstream.probes.patching import all_patched

_UNSET: Any = object()  # ``wrote`` without the value written
# Set on an exception raised while Hydra instantiated a config section: that section's path.
SECTION_ATTRIBUTE = "_verl_compat_section"
_PROBES = Path(__file__).resolve().parent
# Files of ours or verl's that read on a caller's behalf.
_HELPERS = frozenset({"verl/base_config.py", "probes/recorder.py", "probes/boundary.py"})
# The recorder of the probe step that is running (``recording`` sets it), for the stand-ins
# that answer on the configuration's behalf (the world size a mesh or a worker reports).
_ACTIVE: list[ConfigReads] = []


def note_read(*keys: str) -> None:
    """Record ``keys`` as read by the verl line that called the stand-in calling this."""
    if _ACTIVE:
        for key in keys:
            _ACTIVE[-1].note(key)


def note_environment(value: Any, note: dict[str, Any], keys_field: str = "keys") -> None:
    """Keep ``note`` (about this machine, not the configuration: a name registered only where an
    optional package imports) for the running probe step, with the configuration keys read so
    far that hold ``value`` under ``keys_field``."""
    if _ACTIVE:
        reads = _ACTIVE[-1]
        keys = sorted(k for k in reads.origins(reads.read) if reads.leaves.get(k) == value)
        reads.notes.append({**note, keys_field: keys})


# Functions between a reading line and the hook that are plain accessors, not traversals.
_ACCESSORS = frozenset(
    {
        "__getattr__",
        "__getitem__",
        "__contains__",
        "get",
        "pop",
        "items",
        "items_ex",
        "values",
        "setdefault",
    }
)


class ConfigReads:
    """The reads of one probe run: keys by ``(verl/…py, line)``, every key read, and where a key
    upstream wrote came from."""

    def __init__(self, verl_root: Path, leaves: Mapping[str, Any] | None = None) -> None:
        self.root = verl_root.resolve()
        self.leaves = leaves or {}
        # Keys read by each line itself, and by each line including the functions it called.
        self.by_line: dict[tuple[str, int], set[str]] = defaultdict(set)
        self.by_line_deep: dict[tuple[str, int], set[str]] = defaultdict(set)
        self.read: set[str] = set()
        self.provenance: dict[str, frozenset[str]] = {}
        self._paths: dict[int, tuple[Any, str]] = {}
        self._aliases: dict[int, tuple[Any, str]] = {}
        self._building: list[str] = []
        self._roots: list[str] = []
        self._skip = _skipped_prefixes()
        self._relative: dict[str, str | None] = {}
        # Notes of the environment (``note_environment``), and the writes upstream made to keys
        # (key → [(verl/…py:line, the value written, the keys read on that line)]).
        self.notes: list[dict[str, Any]] = []
        self.writes: dict[str, list[tuple[str, Any, frozenset[str]]]] = {}
        # Section → the verl classes (``module.Qualname``, with their verl bases) of the objects
        # whose methods read a key of it: what the probes built for that section (``path_of_run``).
        self.readers: dict[str, set[str]] = defaultdict(set)
        self._classes: dict[type, tuple[str, ...]] = {}
        # The verl lines that read each key, in the order they first did, and for a key upstream
        # overwrote, those that read it before its first write: the user's value reached only
        # them (``records.path_of_run``).
        self.read_lines: dict[str, dict[str, None]] = defaultdict(dict)
        self.read_before_write: dict[str, list[str]] = {}

    # --- where a read comes from ------------------------------------------------------------

    def relative(self, filename: str) -> str | None:
        """``verl/…py`` for upstream's files, ``probes/…py`` for the probes that call it (a
        frame's file name is asked for on every read, so each answer is kept)."""
        if filename not in self._relative:
            self._relative[filename] = _relative_to(filename, self.root)
        return self._relative[filename]

    def _callers(self) -> list[tuple[str, int]]:
        return self._stack()[0]

    def _stack(self) -> tuple[list[tuple[str, int]], Any]:
        """The verl (or probe) line that asked, then every verl or probe line above it on the
        stack: a line's reads include what the functions it calls read.

        The asker is found through accessors only (OmegaConf's and the standard library's item
        and attribute access, verl's own Mapping helpers such as ``BaseConfig.get``, this
        package's hooks and stand-ins): a read made by a traversal (``to_container``, Hydra's
        instantiate, a merge) is not a read of that key by the line that started it."""
        frame: Any = sys._getframe(2)
        while frame is not None:
            code = frame.f_code
            relative = self.relative(code.co_filename)
            if relative is not None and relative not in _HELPERS:
                break
            if relative is None and not code.co_filename.startswith(self._skip):
                return [], None
            if relative is None and code.co_name not in _ACCESSORS:
                return [], None
            frame = frame.f_back
        reader = frame
        lines = []
        while frame is not None:
            relative = self.relative(frame.f_code.co_filename)
            if relative is not None and relative not in _HELPERS:
                lines.append((relative, frame.f_lineno))
            frame = frame.f_back
        return lines, reader

    def _reader_classes(self, frame: Any) -> tuple[str, ...]:
        """The verl classes of the object whose method ``frame`` runs (its own and its verl
        bases, qualified), or none for a function."""
        code = frame.f_code
        if not (code.co_argcount and code.co_varnames[0] == "self"):
            return ()
        cls = type(frame.f_locals.get("self"))
        if cls not in self._classes:
            self._classes[cls] = tuple(
                f"{c.__module__}.{c.__qualname__}"
                for c in cls.__mro__
                if c.__module__.split(".")[0] == "verl"
            )
        return self._classes[cls]

    def note(self, key: str) -> None:
        lines, reader = self._stack()
        if not lines:
            return
        if lines[0][0].startswith("verl/"):
            self.readers[key.rpartition(".")[0]].update(self._reader_classes(reader))
            self.read_lines[key].setdefault(f"{lines[0][0]}:{lines[0][1]}")
        self.by_line[lines[0]].add(key)
        for where in lines:
            self.by_line_deep[where].add(key)
        if lines[0][0].startswith("verl/"):
            self.read.add(key)

    def wrote(self, key: str, value: Any = _UNSET) -> None:
        """Upstream's code set ``key``: its value now comes from the keys read on that line;
        with ``value``, the write is also kept (``writes``: a key upstream overwrites)."""
        lines = self._callers()
        if lines:
            sources = frozenset(self.by_line.get(lines[0], ()))
            if sources:
                self.provenance[key] = sources
            if value is not _UNSET and lines[0][0].startswith("verl/") and key in self.leaves:
                where = f"{lines[0][0]}:{lines[0][1]}"
                if key not in self.writes:
                    self.read_before_write[key] = list(self.read_lines.get(key, {}))
                self.writes.setdefault(key, []).append((where, value, sources))

    def copied(self, key: str, value: Any) -> None:
        """A field whose value is not the configuration's: upstream copied a setting down into a
        nested config without a traced write (``object.__setattr__(self.engine, "strategy",
        self.strategy)``, actor.py). The setting is the key of the same name one section up that
        holds that value."""
        if key in self.provenance or key not in self.leaves or self.leaves[key] == value:
            return
        parts = key.split(".")
        for up in range(len(parts) - 2, 0, -1):
            candidate = ".".join([*parts[:up], parts[-1]])
            if candidate in self.leaves and self.leaves[candidate] == value:
                self.provenance[key] = frozenset({candidate})
                return

    # --- which dotted path an object stands for -----------------------------------------------

    def alias(self, node: Any, path: str) -> None:
        """A detached copy of a section (``cfg.ref.copy()``) stands for ``path``."""
        self._aliases[id(node)] = (node, path)

    def dict_path(self, node: Any, key: Any = None) -> str:
        full = node._get_full_key(key) if key is not None else node._get_full_key(None)
        root = node._get_root()
        held = self._aliases.get(id(root))
        if held is not None and held[0] is root:
            return f"{held[1]}.{full}" if full else held[1]
        return str(full)

    def tag(self, obj: Any, path: str) -> None:
        self._paths[id(obj)] = (obj, path)

    def tagged(self) -> Iterator[tuple[Any, str]]:
        """Every config dataclass instance built from a section, with the section's path."""
        return iter(list(self._paths.values()))

    def path_of(self, obj: Any) -> str | None:
        held = self._paths.get(id(obj))
        if held is not None and held[0] is obj:
            return held[1]
        return self._building[-1] if self._building else None

    # --- the keys behind a failure ---------------------------------------------------------

    def origins(self, keys: Iterable[str]) -> set[str]:
        """Keys with each key upstream wrote replaced by the keys it was written from."""
        out: set[str] = set()
        pending, seen = list(keys), set()
        while pending:
            key = pending.pop()
            if key in seen:
                continue
            seen.add(key)
            if key in self.provenance:
                pending.extend(self.provenance[key])
            else:
                out.add(key)
        return out

    def keys_for(self, exc: BaseException, leaves: Mapping[str, Any]) -> list[str]:
        """The configuration leaves that decided ``exc``: read on the deciding lines of its
        innermost verl frame that read any (then the caller's, and so on)."""
        found: set[str] = set()
        section = _section_of_cause(exc)
        if section:
            found |= _named_fields(section, exc, leaves)
        if found:
            return sorted(found)
        frames = [
            frame_line
            for cause in _chain(exc)
            for frame_line in reversed(list(traceback.walk_tb(cause.__traceback__)))
        ]
        innermost = True
        for frame, line in frames:
            relative = self.relative(frame.f_code.co_filename)
            if relative is None:
                continue
            source = statements.parse(frame.f_code.co_filename, relative)
            if source is None:
                continue
            ranges = statements.deciding_lines(source, line)
            # The failing statement's own reads include what the functions it calls read (a
            # property, a mesh's size); an assignment it depends on counts only its own reads.
            keys = self._read_on(relative, ranges, deep=False)
            if innermost:
                keys |= self._read_on(relative, ranges[: statements.OWN_RANGES], deep=True)
                innermost = False
            keys = {key for key in self.origins(keys) if key in leaves}
            if keys:
                return sorted(_by_value(keys, exc, leaves))
        return []

    def statement_text(self, exc: BaseException) -> str:
        """The source of the innermost verl statement ``exc`` went through (its deciding lines)."""
        for cause in _chain(exc):
            for frame, line in reversed(list(traceback.walk_tb(cause.__traceback__))):
                relative = self.relative(frame.f_code.co_filename)
                if relative is None or not relative.startswith("verl/"):
                    continue
                source = statements.parse(frame.f_code.co_filename, relative)
                if source is not None:
                    return statements.text(source, statements.deciding_lines(source, line))
        return ""

    def _read_on(self, relative: str, ranges: list[tuple[int, int]], *, deep: bool) -> set[str]:
        table = self.by_line_deep if deep else self.by_line
        return {
            key
            for (where, number), read in table.items()
            if where == relative and any(lo <= number <= hi for lo, hi in ranges)
            for key in read
        }


def _relative_to(filename: str, verl: Path) -> str | None:
    path = Path(filename).resolve()
    for root, prefix in ((verl, "verl/"), (_PROBES, "probes/")):
        try:
            return prefix + path.relative_to(root).as_posix()
        except ValueError:
            continue
    return None


def _by_value(keys: set[str], exc: BaseException, leaves: Mapping[str, Any]) -> set[str]:
    """The keys whose value the message quotes (``KeyError: 'foo'``, ``Unknown backend: x``),
    when some are; else all of them."""
    text = str(exc)
    quoted = {
        key
        for key in keys
        if isinstance(leaves[key], str)
        and leaves[key]
        and (f"'{leaves[key]}'" in text or text.rstrip().endswith(f": {leaves[key]}"))
    }
    return quoted or keys


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and its causes, innermost cause first (Hydra wraps what a dataclass raised)."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__  # explicit chaining only (Hydra raises … from what failed)
    return chain[::-1]


def _section_of_cause(exc: BaseException) -> str | None:
    for cause in _chain(exc):
        section = getattr(cause, SECTION_ATTRIBUTE, None)
        if section:
            return str(section)
    return None


def _named_fields(section: str, exc: BaseException, leaves: Mapping[str, Any]) -> set[str]:
    """The section's keys a dataclass constructor named (``unexpected keyword argument 'x'``)."""
    text = str(exc)
    named = {
        f"{section}.{name}"
        for name in _quoted(text)
        if f"{section}.{name}" in leaves or any(k.startswith(f"{section}.{name}.") for k in leaves)
    }
    return {key for key in named if key in leaves} or (
        {k for k in leaves if any(k.startswith(f"{n}.") for n in named)}
    )


def _quoted(text: str) -> Iterator[str]:
    parts = text.split("'")
    return iter(parts[1::2])


def _skipped_prefixes() -> tuple[str, ...]:
    """Frames that may read on someone else's behalf: OmegaConf, Hydra, the standard library, and
    generated code (a dataclass's ``__init__`` is ``<string>``)."""
    import hydra
    import omegaconf

    folders = [Path(str(m.__file__)).resolve().parent for m in (omegaconf, hydra, dataclasses)]
    return (*(str(f) for f in folders), "<")


@contextlib.contextmanager
def recording(reads: ConfigReads) -> Iterator[ConfigReads]:
    """Hook OmegaConf's reads and writes, verl's config dataclasses and Hydra's instantiate."""
    import hydra.utils
    from hydra._internal.instantiate import _instantiate2
    from omegaconf import DictConfig
    from verl.base_config import BaseConfig

    fields_of: dict[type, frozenset[str]] = {}

    def field_names(cls: type) -> frozenset[str]:
        if cls not in fields_of:
            fields_of[cls] = frozenset(f.name for f in dataclasses.fields(cls))
        return fields_of[cls]

    original_get = DictConfig._get_impl
    original_setattr = DictConfig.__setattr__
    original_setitem = DictConfig.__setitem__
    original_base_setattr = BaseConfig.__setattr__
    original_instantiate = hydra.utils.instantiate
    original_call = _instantiate2._call_target

    def get_impl(node: Any, key: Any, default_value: Any, validate_key: bool = True) -> Any:
        try:
            return original_get(node, key, default_value, validate_key)
        finally:
            if isinstance(key, str):
                reads.note(reads.dict_path(node, key))

    def set_attr(node: Any, key: str, value: Any) -> None:
        original_setattr(node, key, value)
        if not key.startswith("_"):
            reads.wrote(reads.dict_path(node, key), value)

    def set_item(node: Any, key: Any, value: Any) -> None:
        original_setitem(node, key, value)
        if isinstance(key, str):
            reads.wrote(reads.dict_path(node, key), value)

    def getattribute(obj: Any, name: str) -> Any:
        value = object.__getattribute__(obj, name)
        if name[:1] != "_" and name in field_names(type(obj)):
            path = reads.path_of(obj)
            if path is not None:
                reads.note(f"{path}.{name}")
                reads.copied(f"{path}.{name}", value)
                if isinstance(value, BaseConfig) and reads.path_of(value) is None:
                    reads.tag(value, f"{path}.{name}")
        return value

    def base_setattr(obj: Any, name: str, value: Any) -> None:
        original_base_setattr(obj, name, value)
        if name[:1] != "_":
            held = reads._paths.get(id(obj))
            if held is not None and held[0] is obj:
                reads.wrote(f"{held[1]}.{name}", value)
            elif reads._building and name in field_names(type(obj)):
                # Its own ``__post_init__`` while Hydra builds it (``sequence_parallel = False``
                # under a tensor parallel size of 1, engine.py:237-239): the section being built.
                reads.wrote(f"{reads._building[-1]}.{name}", value)

    def instantiate(config: Any, *args: Any, **kwargs: Any) -> Any:
        root = reads.dict_path(config) if isinstance(config, DictConfig) else ""
        reads._roots.append(root)
        try:
            return original_instantiate(config, *args, **kwargs)
        finally:
            reads._roots.pop()

    def call_target(target: Any, partial: bool, args: Any, kwargs: Any, full_key: str) -> Any:
        # Hydra's full key is absolute for a section of the whole config, relative for a copy.
        root = reads._roots[-1] if reads._roots else ""
        absolute = not root or full_key == root or full_key.startswith(root + ".")
        path = full_key if absolute else ".".join(part for part in (root, full_key) if part)
        reads._building.append(path)
        try:
            obj = original_call(target, partial, args, kwargs, full_key)
        except Exception as exc:
            if path and not getattr(exc, SECTION_ATTRIBUTE, None):
                setattr(exc, SECTION_ATTRIBUTE, path)
            raise
        finally:
            reads._building.pop()
        if path and isinstance(obj, BaseConfig):
            reads.tag(obj, path)
        return obj

    patches = [
        (DictConfig, "_get_impl", get_impl),
        (DictConfig, "__setattr__", set_attr),
        (DictConfig, "__setitem__", set_item),
        (BaseConfig, "__getattribute__", getattribute),
        (BaseConfig, "__setattr__", base_setattr),
        (hydra.utils, "instantiate", instantiate),
        (_instantiate2, "_call_target", call_target),
    ]
    _ACTIVE.append(reads)
    try:
        with all_patched(patches):
            yield reads
    finally:
        _ACTIVE.pop()
