"""Upstream's answers, kept by content: the user cache folder, and those recorded for the default.

Every question the oracle process answers (upstream's checks on a mapping, its entry point's
composition, its side of a conformance case) is a pure function of what it is asked, upstream's
code and the code of ours that asks. So an answer is kept under a key that digests all of it
(``answer_key``): the question, the installed packages that run (verl, torch, transformers, …)
and the sha256 of our modules the oracle process runs (``oracle_code_sha256``). A key that
changes is a miss, never a wrong answer.

Two places hold answers, asked in order (``Answers``):

- the **user cache** (``$XDG_CACHE_HOME/pytest-verl-compat/answers/<kind>/``): one JSON file per
  key, written to a temporary file then renamed, a bad or foreign entry a miss;
- the **recorded answers** of the embedded default (``golden/answers/``, shipped in the wheel):
  what the pinned release answers for the default audit's own questions, written by
  ``verl-compat audit --write``; ``audit --check`` and ``tests/test_recorded_answers.py`` fail
  when they are stale. With them, the README's first command needs no verl import at all on
  the platform they were recorded on; on another (a different torch, a changed probe) their keys
  simply miss and the oracle answers.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from pytest_verl_compat.files.cache import user_cache_root
from pytest_verl_compat.files.safe_input import InputError, read_bytes
from pytest_verl_compat.pipeline.snapshot import write_atomic

# Bumped when an answer's shape changes, so an older entry is never read as this version's.
ANSWER_FORMAT = 4
# The kinds of question, each with its folder in the user cache and its recorded file.
CHECKS = "checks"
COMPOSE = "compose"
CONFORMANCE = "conformance"
KINDS = (CHECKS, COMPOSE, CONFORMANCE)
# The conformance stage's results (``conformance.results``): recorded for the embedded default
# instead of upstream's side of each case (~8 MB of tensors, needed only when our code changes).
CONFORMANCE_RESULTS = "conformance-results"
# What ``audit --write`` records beside the golden files.
RECORDED = (CHECKS, COMPOSE, CONFORMANCE_RESULTS)
# A kind whose recorded file is compressed (none today; tensors would be).
_COMPRESSED: frozenset[str] = frozenset()
MAX_ENTRY_BYTES = 1 << 22
MAX_RECORDED_BYTES = 1 << 26
# The installed distributions whose code answers (or shapes what upstream's code does).
# The distributions of this process that a kept result depends on: our side's (the reference
# trainer's math on torch, its models' transformers and peft) and the composition's. verl and its
# own packages run only in each release's environment, whose lock keys upstream's side
# (``release_platform``): whatever this process has of them decides nothing.
PLATFORM = (
    "torch",
    "transformers",
    "hydra-core",
    "omegaconf",
    "numpy",
    "peft",
)
# Our modules the oracle process runs for each kind, relative to the folder holding the package
# (a folder stands for every module in it); ``tests/test_recorded_answers.py`` checks that they
# cover every module the process imports for the kind.
_PROBES = "pytest_verl_compat/upstream/probes/"
# main_ppo's probes, and those the SFT trainer's checks run besides (``validate`` finds an entry
# point's probes by name, so a change to the SFT trainer's leaves main_ppo's answers valid).
_RL_PROBES = tuple(
    f"{_PROBES}{name}.py"
    for name in (
        "__init__",
        "boundary",
        "config_load",
        "effects",
        "first_step",
        "megatron_step",
        "optional",
        "patching",
        "phases",
        "recorder",
        "records",
        "stand_ins",
        "statements",
        "tiny_batch",
        "trainer",
        "types",
        "validate",
    )
)
_SFT_PROBES = (f"{_PROBES}sft",)
_ORACLE_PROCESS = (
    "pytest_verl_compat/upstream/oracle/__init__.py",
    "pytest_verl_compat/upstream/oracle/process.py",
    "pytest_verl_compat/upstream/oracle/client.py",
    "pytest_verl_compat/upstream/oracle/runner.py",
    "pytest_verl_compat/upstream/oracle/warm.py",
    "pytest_verl_compat/upstream/oracle/warm_process.py",
    *_RL_PROBES,
    "pytest_verl_compat/pipeline/targets.py",
    "pytest_verl_compat/files/safe_input.py",
    "pytest_verl_compat/files/cache.py",
    "pytest_verl_compat/files/digests.py",
    "pytest_verl_compat/releases/environment.py",
    "pytest_verl_compat/releases/index.py",
    "pytest_verl_compat/releases/wheels.py",
    "pytest_verl_compat/checks/roles.py",
    "pytest_verl_compat/checks/upstream_names.py",
    "pytest_verl_compat/pipeline/entry_points.py",
)
# Our code that completes a checks answer before it is kept: the keys of a failure whose statement
# reads none, found by experiment (``upstream/verdict/blame.py``).
_COMPLETION = ("pytest_verl_compat/upstream/verdict/blame.py",)
ORACLE_CODE: dict[str, tuple[str, ...]] = {
    CHECKS: (*_ORACLE_PROCESS, *_COMPLETION),
    COMPOSE: _ORACLE_PROCESS,
    # The whole conformance package but its step oracle, and the reference trainer's math (the
    # candidate side of a case that calls none of ours is answered there too).
    CONFORMANCE: (
        *_ORACLE_PROCESS,
        "pytest_verl_compat/conformance",
        "pytest_verl_compat/pipeline/answers.py",
        "pytest_verl_compat/pipeline/manifest.py",
        "pytest_verl_compat/pipeline/memo.py",
        "pytest_verl_compat/pipeline/snapshot.py",
        "reference_trainer/math",
    ),
}

# Our modules the oracle process runs for the checks of an entry point other than main_ppo.
_ASYNC_PROBES = (f"{_PROBES}asynchronous.py",)
ENTRY_CODE: dict[str, tuple[str, ...]] = {
    "verl.trainer.sft_trainer": (*_ORACLE_PROCESS, *_SFT_PROBES, *_COMPLETION),
    **dict.fromkeys(
        (
            "verl.experimental.fully_async_policy.fully_async_main",
            "verl.experimental.one_step_off_policy.main_ppo",
        ),
        (*_ORACLE_PROCESS, *_ASYNC_PROBES, *_COMPLETION),
    ),
}


@functools.cache
def platform_versions() -> tuple[tuple[str, str], ...]:
    """The installed versions of the distributions in PLATFORM ("" for one not installed)."""
    found = []
    for name in PLATFORM:
        try:
            found.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            found.append((name, ""))
    return tuple(found)


# Folders whose modules never answer a question nor compute a result of the stages keyed here.
NOT_ASKING = ("pytest_verl_compat/conformance/step",)


@functools.cache
def code_sha256(paths: tuple[str, ...]) -> str:
    """sha256 of the source files at ``paths`` (relative to the folder holding this package;
    a folder stands for its ``*.py`` files, recursively, but those under ``NOT_ASKING``)."""
    base = Path(__file__).resolve().parents[2]
    skipped = tuple(base / folder for folder in NOT_ASKING)
    files: list[Path] = []
    for relative in paths:
        path = base / relative
        found = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        files.extend(f for f in found if not any(f.is_relative_to(s) for s in skipped))
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(base).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def oracle_code_sha256(kind: str) -> str:
    """sha256 of the package's source files the oracle process runs for ``kind``."""
    return code_sha256(ORACLE_CODE[kind])


def mapping_digest(value: Any) -> str:
    """sha256 of a mapping as JSON with its key order kept (Hydra's order is part of a result)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


@functools.cache
def release_platform(release: str) -> str:
    """What answers for a release: its environment's lock for this platform, as the versions of
    every distribution it pins (the same versions on every platform give the same answers), or
    the release alone where no lock is pinned here (its environment cannot be built then)."""
    from pytest_verl_compat.releases.environment import load_lock
    from pytest_verl_compat.releases.index import ReleaseError, load_release_index

    try:
        lock = load_lock(load_release_index().supported_release(release))
    except ReleaseError:
        return f"verl=={release}"
    pins = sorted(f"{pin.name.lower()}=={pin.version}" for pin in lock.pins)
    return hashlib.sha256("\n".join(pins).encode()).hexdigest()


def answer_key(kind: str, question: Any, entry: str | None = None, *, release: str) -> str:
    """The key of one question of ``kind`` (JSON-able), answered by ``release``'s environment,
    asked by this code (for a ``checks`` question of another entry point than main_ppo,
    ``ENTRY_CODE``'s)."""
    code = code_sha256(ENTRY_CODE[entry]) if entry in ENTRY_CODE else oracle_code_sha256(kind)
    payload = json.dumps(
        {
            "format": ANSWER_FORMAT,
            "kind": kind,
            "release": release,
            "platform": release_platform(release),
            "code": code,
            "question": question,
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(payload.encode()).hexdigest()


Checker = Callable[[Any], bool]


class UserAnswers:
    """One JSON file per key under the user cache folder; written to a temporary file then
    renamed; a link, a file too large, bad JSON or an entry ``checker`` refuses is a miss."""

    def __init__(self, kind: str, folder: Path | None = None, checker: Checker | None = None):
        self.kind = kind
        self.folder = folder if folder is not None else user_cache_root() / "answers" / kind
        self.checker = checker

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def get(self, key: str) -> Any | None:
        path = self._path(key)
        if path.is_symlink():  # an entry is a regular file this class wrote, never a link
            return None
        try:
            data = read_bytes(path, MAX_ENTRY_BYTES, "cache entry")  # no FIFO, no device
            entry = json.loads(data)
        except (InputError, ValueError):
            return None
        if self.checker is not None and not self.checker(entry):
            return None
        return entry

    def put(self, key: str, entry: Any) -> None:
        """Keep an answer; a cache that cannot be written is only slower, never an error."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            # Key order kept: a resolved mapping's order is part of it (Hydra's merge order).
            write_atomic(self._path(key), json.dumps(entry))
        except OSError:
            return


def recorded_path(golden_dir: Path, kind: str, part: str = "") -> Path:
    """A kind's recorded file beside the golden files; ``part``: a further file of the kind,
    written by another recorder (``checks-examples.json``: verl's example scripts' answers)."""
    name = f"{kind}-{part}" if part else kind
    return golden_dir / "answers" / (f"{name}.json.gz" if kind in _COMPRESSED else f"{name}.json")


# The recorded file of upstream's checks on verl's own example scripts (``examples_record``).
EXAMPLES_PART = "examples"


def dumps_recorded(kind: str, entries: Mapping[str, Any]) -> bytes:
    """A recorded file's bytes: sorted JSON, gzip without a timestamp (byte-deterministic)."""
    text = json.dumps(dict(entries), indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    data = text.encode("utf-8")
    return gzip.compress(data, compresslevel=9, mtime=0) if kind in _COMPRESSED else data


def load_recorded(path: Path) -> dict[str, Any]:
    """A recorded file's entries; a missing file has none. Raises InputError when unreadable."""
    if not path.is_file():
        return {}
    data = read_bytes(path, MAX_RECORDED_BYTES, "recorded answers")
    try:
        if path.suffix == ".gz":
            data = gzip.decompress(data)
        entries = json.loads(data)
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(f"{path}: recorded answers are not readable ({exc})") from exc
    if not isinstance(entries, dict):
        raise InputError(f"{path}: recorded answers are not a mapping")
    return entries


class RecordedAnswers:
    """The recorded answers of one kind (read-only) from one or more files, loaded on the first
    question."""

    def __init__(self, path: Path | tuple[Path, ...], checker: Checker | None = None) -> None:
        self.paths = path if isinstance(path, tuple) else (path,)
        self.checker = checker
        self._entries: dict[str, Any] | None = None

    def entries(self) -> dict[str, Any]:
        if self._entries is None:
            self._entries = {}
            for path in self.paths:
                try:
                    self._entries.update(load_recorded(path))
                except InputError:
                    continue
        return self._entries

    def get(self, key: str) -> Any | None:
        entry = self.entries().get(key)
        if entry is None or (self.checker is not None and not self.checker(entry)):
            return None
        return entry


@dataclass
class Answers:
    """Where the answers of one kind are looked up: the user cache, then the recorded ones; new
    answers go to the user cache. ``asked`` keeps every key looked up (``audit --write`` records
    them), ``hits`` says where each came from."""

    kind: str
    user: UserAnswers | None
    recorded: RecordedAnswers | None = None
    asked: dict[str, None] = field(default_factory=dict)
    hits: dict[str, str] = field(default_factory=dict)

    def get(self, key: str) -> Any | None:
        self.asked[key] = None
        for where, store in (("user", self.user), ("recorded", self.recorded)):
            if store is None:
                continue
            entry = store.get(key)
            if entry is not None:
                self.hits[key] = where
                return entry
        return None

    def put(self, key: str, entry: Any) -> None:
        if self.user is not None:
            self.user.put(key, entry)


def answers(
    kind: str,
    golden_dir: Path | None,
    *,
    checker: Checker | None = None,
    user: bool = True,
) -> Answers:
    """The answers of ``kind``: the user cache (unless ``user`` is false) and, with a golden
    folder, the answers recorded there."""
    recorded = (
        RecordedAnswers(
            (recorded_path(golden_dir, kind), recorded_path(golden_dir, kind, EXAMPLES_PART)),
            checker,
        )
        if golden_dir is not None
        else None
    )
    return Answers(kind, UserAnswers(kind, checker=checker) if user else None, recorded)


def stale_keys(recorded: Mapping[str, Any], needed: Iterable[str]) -> tuple[list[str], list[str]]:
    """(keys needed but not recorded, keys recorded but no longer needed)."""
    wanted = set(needed)
    return sorted(wanted - set(recorded)), sorted(set(recorded) - wanted)
