"""One sandboxed process that answers every upstream question of an audit: verl imported once.

Upstream's entry point (``python -m verl.trainer.main_ppo --cfg job --resolve``) spends ~5 s of
its ~5.5 s importing verl; 25 cases as 25 processes took ~146 s of a 155 s audit. This module runs
``python -I -m pytest_verl_compat.upstream.oracle.process`` once (through ``runner.UpstreamProcess``: empty
folder, isolated interpreter, allow-listed environment), and sends it one JSON line per question:

- ``compose``: call the entry point's own ``main()`` with ``sys.argv`` set exactly as the command
  line would set it, and return what Hydra printed (the resolved job config) or its error;
- ``validate``: upstream's ``validate_config`` on one resolved mapping (see ``validate.py``);
- ``checks``: every early upstream check on one resolved mapping (``early_checks.py``): the
  validate_config verdict, and a record (message, upstream file:line, phase) per failure;
- further kinds from the modules the parent names with ``--serve`` (their ``ORACLE_HANDLERS``):
  the plugin has ``conformance.reference_answers`` compute upstream's side of the conformance
  cases here, where verl is already imported.

Requests are pipelined: the plugin submits a case's questions as soon as it is composed and reads
the answers later, so the process works while the audit's other stages run. Only argv that
``entry_argv`` lets through reaches Hydra: its own command-line flags (``--experimental-rerun``
unpickles a file; ``--config-dir`` adds a search path) and ``hydra.*`` overrides are refused.
"""

from __future__ import annotations

import contextlib
import json
import queue
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_verl_compat.pipeline.entry_points import (
    ASYNC_ENTRY_MODULES,
    PINNED_ENTRY_MODULE,
    SFT_ENTRY_MODULE,
)
from pytest_verl_compat.releases.index import ReleaseError, ReleaseUnsupported
from pytest_verl_compat.upstream.oracle import warm
from pytest_verl_compat.upstream.oracle.runner import (
    UpstreamProcess,
    release_interpreter,
    safe_variables,
)

ENTRY_MODULE = PINNED_ENTRY_MODULE
# The SFT trainer's entry point (``torchrun … -m verl.trainer.sft_trainer``): its checks run the
# SFT probes on rank 0 of the launch's world; the asynchronous trainers' run their own runners.
CHECKED_ENTRIES = (ENTRY_MODULE, SFT_ENTRY_MODULE, *ASYNC_ENTRY_MODULES)
PROCESS_MODULE = "pytest_verl_compat.upstream.oracle.process"
# An answer's key when the release lacks a patch point the probes need (``probes.patching``).
KEY_UNSUPPORTED = "unsupported"
# Hydra's ``--config-path`` is relative to the file that declares ``@hydra.main`` (verl/trainer/),
# so these two spellings name the pinned tree itself; anything else would add another tree.
_PINNED_CONFIG_PATHS = frozenset({"config", "./config"})
_CONFIG_NAME = re.compile(r"^[A-Za-z0-9_]+(\.yaml)?$")
_OVERRIDE_KEY = re.compile(r"^(?:~|\+\+|\+)?([^=~+][^=]*?)(?:=|$)")


class EntryArgvRefused(ValueError):
    """An argument that must not reach upstream's entry point, with the reason."""


def entry_argv(fields: Sequence[str]) -> list[str]:
    """The fields as the entry point's argv, or EntryArgvRefused naming the first unsafe one.

    Allowed: Hydra overrides of the job config, ``--config-name NAME`` and a ``--config-path``
    that names the pinned tree. Refused: every other flag and every override of ``hydra``.
    """
    argv: list[str] = []
    pending_option: str | None = None
    for field in fields:
        if pending_option is not None:
            argv.append(_config_option(pending_option, field))
            pending_option = None
            continue
        if field.startswith("-"):
            option, has_value, value = field.partition("=")
            if option in {"--config-name", "-cn", "--config-path", "-cp"}:
                if has_value:
                    argv.append(_config_option(option, value))
                else:
                    pending_option = option
                continue
            raise EntryArgvRefused(f"{field!r}: Hydra command-line flag, not a config override")
        key = _OVERRIDE_KEY.match(field)
        if key is None:
            raise EntryArgvRefused(f"{field!r}: not a Hydra override")
        root = re.split(r"[./@]", key.group(1), maxsplit=1)[0]
        if root == "hydra":
            raise EntryArgvRefused(f"{field!r}: overrides Hydra's own settings, not the job config")
        argv.append(field)
    if pending_option is not None:
        raise EntryArgvRefused(f"{pending_option!r}: no value")
    return argv


def _config_option(option: str, value: str) -> str:
    long = {"-cn": "--config-name", "-cp": "--config-path"}.get(option, option)
    if long == "--config-path" and value.rstrip("/") not in _PINNED_CONFIG_PATHS:
        raise EntryArgvRefused(f"--config-path={value!r}: not the pinned config tree")
    if long == "--config-name" and not _CONFIG_NAME.match(value):
        raise EntryArgvRefused(f"--config-name={value!r}: not a config file name")
    return f"{long}={value}"


def compose_request(
    fields: Sequence[str], variables: Mapping[str, str], module: str | None = None
) -> dict[str, Any]:
    """A ``compose`` question, of ``module``'s entry point (the pinned one by default); raises
    EntryArgvRefused before anything is sent."""
    request = {"kind": "compose", "argv": entry_argv(fields), "env": safe_variables(variables)}
    if module and module != ENTRY_MODULE:
        request["module"] = module
    return request


def validate_request(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """A ``validate`` question: upstream's validate_config on one resolved mapping."""
    return {"kind": "validate", "mapping": dict(mapping)}


def checks_request(
    mapping: Mapping[str, Any],
    watch: Mapping[str, list[int]] | None = None,
    explicit: Sequence[str] = (),
    entry: str | None = None,
    world_size: int | None = None,
) -> dict[str, Any]:
    """A ``checks`` question: every probe of upstream's code on one resolved mapping; ``explicit``
    (the keys the script set) are examined for effect; with ``watch`` (the census's deciding
    lines, main_ppo's) the answer also says which of them ran.

    ``entry``: the entry point the mapping is composed for (``CHECKED_ENTRIES``), main_ppo by
    default; ``world_size``: the launch's world size where the launcher decides it (torchrun's
    ``--nnodes`` × ``--nproc_per_node`` for the SFT trainer; none known: one process). main_ppo's
    world is its configuration's (``trainer.nnodes`` × ``trainer.n_gpus_per_node``), so for it
    ``world_size`` is not part of the question. At their defaults the question is main_ppo's as
    it always was (its recorded answers keep their keys)."""
    request: dict[str, Any] = {"kind": "checks", "mapping": dict(mapping)}
    if explicit:
        request["explicit"] = sorted({str(key) for key in explicit})
    if watch:
        request["watch"] = {str(k): [int(n) for n in v] for k, v in watch.items()}
    if entry not in (None, ENTRY_MODULE):
        if entry not in CHECKED_ENTRIES:
            raise ValueError(f"no upstream checks for entry point {entry!r}: {CHECKED_ENTRIES}")
        request["entry"] = entry
        if world_size is not None:
            if int(world_size) < 1:
                raise ValueError(f"world_size={world_size}: a launch has at least one process")
            request["world_size"] = int(world_size)
    return request


class UpstreamOracle:
    """The parent's side: submit questions by id, read answers when needed.

    A reader thread drains the process's stdout (answers) and stderr (kept for errors), so a
    large answer never blocks the process while the parent is still submitting.
    """

    def __init__(self, workers: int = 1, served: Sequence[str] = (), *, release: str) -> None:
        self.workers = workers  # processes answering in parallel (forked after verl's import)
        # Modules of this package whose ORACLE_HANDLERS answer further kinds of question.
        self.served = tuple(served)
        # The release whose code answers: the process runs in that release's own environment.
        self.release = release
        self._process: UpstreamProcess | None = None
        self._answers: dict[str, dict[str, Any]] = {}
        self._submitted: set[str] = set()
        self._stderr: list[str] = []
        self._done = False
        self._condition = threading.Condition()
        self._readers: list[threading.Thread] = []
        self._outbox: queue.Queue[str | None] = queue.Queue()
        self._failure = ""

    def start(self) -> None:
        """Start the process now (it imports verl, ~5 s) so that it is ready for questions."""
        self._start()

    def _start(self) -> UpstreamProcess:
        if self._process is None:
            serve = [arg for name in self.served for arg in ("--serve", name)]
            if self._failure:
                raise RuntimeError(self._failure)
            try:
                interpreter = release_interpreter(self.release)
            except ReleaseError as exc:
                # Said once, for every question: the release's environment cannot be had here.
                self._failure = str(exc)
                raise RuntimeError(self._failure) from exc
            self._process = UpstreamProcess(
                PROCESS_MODULE,
                ("--workers", str(self.workers), *serve),
                fork=warm.fork,
                interpreter=interpreter,
            )
            self._readers = [
                threading.Thread(target=target, daemon=True)
                for target in (self._read_answers, self._read_stderr, self._write_questions)
            ]
            for reader in self._readers:
                reader.start()
        return self._process

    def _read_answers(self) -> None:
        assert self._process is not None and self._process.process.stdout is not None
        for line in self._process.process.stdout:
            answer = json.loads(line)
            with self._condition:
                self._answers[answer.pop("id")] = answer
                self._condition.notify_all()
        with self._condition:
            self._done = True
            self._condition.notify_all()

    def _read_stderr(self) -> None:
        assert self._process is not None and self._process.process.stderr is not None
        for line in self._process.process.stderr:
            self._stderr = [*self._stderr[-40:], line.rstrip("\n")]

    def _write_questions(self) -> None:
        # A writer thread: while the process is still importing verl it reads nothing, and a
        # pipe holds 64 KB (two resolved mappings), so writing from the caller would stall it.
        assert self._process is not None and self._process.process.stdin is not None
        stdin = self._process.process.stdin
        while (line := self._outbox.get()) is not None:
            try:
                stdin.write(line)
                stdin.flush()
            except (OSError, ValueError):
                return  # the process died or was closed; answer() reports its stderr
        with contextlib.suppress(OSError, ValueError):
            stdin.close()

    def submit(self, request_id: str, request: Mapping[str, Any]) -> None:
        """Queue one question unless it was already sent; returns at once."""
        if request_id in self._submitted:
            return
        try:
            self._start()
        except RuntimeError:
            return  # answer() says why
        self._submitted.add(request_id)
        self._outbox.put(json.dumps({"id": request_id, **request}) + "\n")

    def answer(
        self, request_id: str, request: Mapping[str, Any], timeout: float = 600
    ) -> dict[str, Any]:
        """The answer to a question, submitting it first if needed (raises ``ReleaseUnsupported``
        when the release lacks a patch point or module the probes need)."""
        self.submit(request_id, request)
        if self._failure:
            raise RuntimeError(self._failure)
        with self._condition:
            self._condition.wait_for(
                lambda: request_id in self._answers or self._done, timeout=timeout
            )
            if request_id in self._answers:
                answer = self._answers[request_id]
                if KEY_UNSUPPORTED in answer:
                    # The release lacks what the probes need: a fact of the release, said once
                    # in one line wherever a question meets it (never a question's failure).
                    raise ReleaseUnsupported(str(answer[KEY_UNSUPPORTED]))
                return answer
            done = self._done
        if done and len(self._readers) > 1:
            # The process ended: its last words (why it stopped) may still be in the stderr pipe,
            # read by another thread that the end of stdout does not wait for.
            self._readers[1].join(timeout=10)
        tail = "\n".join(self._stderr[-15:])
        raise RuntimeError(f"upstream oracle process gave no answer:\n{tail}")

    def close(self) -> None:
        if self._process is not None:
            with self._condition:
                answered = self._submitted <= self._answers.keys()
            self._outbox.put(None)  # the writer closes stdin: the process's signal to exit
            self._readers[-1].join(timeout=10)
            if answered:
                # Nothing outstanding: waiting would only watch verl's interpreter tear down (or
                # finish importing verl, when a -k selection asked it nothing).
                self._process.stop()
            self._process.finish()
            for reader in self._readers:
                reader.join(timeout=10)
            self._process.close()
            self._process = None
