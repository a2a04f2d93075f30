"""Upstream's early checks for one composed case, as findings, cached per mapping.

The caller's side of the probes (``probes/``): it never imports verl. It asks the oracle process
(verl imported once, ~5 s) to run upstream's own code on one resolved mapping up to its first
update, keeps the answer in a user cache folder keyed by (verl version, config-tree digest, sha256
of the mapping), and turns each failure into an error finding at the configuration keys upstream
read on the lines that decided it; the finding quotes upstream's message and names the upstream
file:line and the phase at which verl raises it (its rule id, ``upstream.<phase>``).

A static check of ``checks/`` that names the same upstream statement as a failure upstream itself
reported is the same cause said twice; ``covered_static_checks`` says which to leave out.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pytest_verl_compat.checks.fields import field_key
from pytest_verl_compat.model import Bindings, ExplicitFields, Finding
from pytest_verl_compat.pipeline.answers import CHECKS, Answers, answer_key, answers
from pytest_verl_compat.releases.index import RELEASE_DATA, ReleaseUnsupported
from pytest_verl_compat.upstream.oracle.client import (
    ENTRY_MODULE,
    KEY_UNSUPPORTED,
    UpstreamOracle,
    checks_request,
)
from pytest_verl_compat.upstream.probes import (
    KEY_ADMITTED,
    KEY_EFFECTS,
    KEY_NOT_EVALUATED,
    KEY_NOTES,
    KEY_PATH,
    KEY_TYPES,
    statements,
)
from pytest_verl_compat.upstream.probes import effects as probe_effects
from pytest_verl_compat.upstream.probes import optional as probe_optional
from pytest_verl_compat.upstream.probes import records as ec
from pytest_verl_compat.upstream.probes import types as probe_types
from pytest_verl_compat.upstream.probes.config_load import VALIDATE_CONFIG
from pytest_verl_compat.upstream.verdict import blame

if TYPE_CHECKING:
    from pytest_verl_compat.pipeline.audit import AuditSession

# The rule of a value a config dataclass's annotation refuses.
TYPE_ANNOTATION = "types.annotation"
# The rules of an explicit key without effect (``probes.effects``).
NEVER_READ_RULE = "effect.never-read"
OVERRIDDEN_RULE = "effect.overridden"

# prepare_micro_batches' one assertion, met by the update's and the log-prob passes' split.
_PREPARE_MICRO_BATCHES = (
    (
        "verl/workers/engine/utils.py",
        "assert total_data_size % (force_group_size * micro_batch_size_per_gpu) == 0",
    ),
)

_CORE_ALGOS = "verl/trainer/ppo/core_algos.py"
# kl_penalty_forward's fallback for an unknown estimator name (``kl``, ``abs``, ``mse``, …).
_KL_ESTIMATOR = ((_CORE_ALGOS, "raise NotImplementedError", "kl_penalty_forward"),)

# The static checks that say what an upstream statement says, by (installed file, statement[, the
# function it is in, where the statement alone is not unique]). When upstream's own code fails on
# that statement at the same section of the configuration, the static finding is left out.
STATIC_EQUIVALENTS: dict[str, tuple[tuple[str, ...], ...]] = {
    "registry.algorithm.adv_estimator": (
        (_CORE_ALGOS, 'raise ValueError(f"Unknown advantage estimator simply: {name}")'),
    ),
    "registry.actor_rollout_ref.actor.policy_loss.loss_mode": (
        (_CORE_ALGOS, "raise ValueError(", "get_policy_loss_fn"),
    ),
    "registry.actor_rollout_ref.actor.kl_loss_type": _KL_ESTIMATOR,
    "registry.algorithm.kl_penalty": _KL_ESTIMATOR,
    "registry.reward.reward_manager.name": (
        (
            "verl/experimental/reward_loop/reward_manager/registry.py",
            'raise ValueError(f"Unknown reward manager: {name}")',
        ),
    ),
    "registry.actor_rollout_ref.rollout.name": (
        ("verl/workers/rollout/base.py", "assert (rollout_name, mode) in _ROLLOUT_REGISTRY"),
    ),
    "registry.actor_rollout_ref.rollout.mode": (
        ("verl/workers/config/rollout.py", "raise ValueError(", "RolloutConfig.__post_init__"),
        ("verl/workers/rollout/base.py", "assert (rollout_name, mode) in _ROLLOUT_REGISTRY"),
    ),
    "registry.actor_rollout_ref.actor.loss_agg_mode": (
        ("verl/workers/config/actor.py", 'raise ValueError(f"Invalid loss_agg_mode:'),
    ),
    "filter-groups.no-metric": (
        ("verl/trainer/ppo/v1/trainer_base.py", 'raise ValueError("algorithm.filter_groups.metric'),
    ),
    "filter-groups.colocated-reward-model": (
        ("verl/trainer/ppo/v1/trainer_base.py", "assert streaming_reward_path, ("),
    ),
    "kl.adaptive-controller-needs-horizon-and-target": (
        (_CORE_ALGOS, "assert kl_ctrl.horizon > 0"),
    ),
    "validate.responses-over-gpus": (
        ("verl/utils/config.py", "assert real_train_batch_size % minimal_bsz == 0"),
    ),
    "validate.no-micro-batch-size": (
        (
            "verl/workers/config/actor.py",
            "assert not (self.ppo_micro_batch_size is None and self.ppo_micro_batch_size_per_gpu",
        ),
    ),
    "validate.no-log-prob-micro-batch-size": (
        ("verl/utils/config.py", 'raise ValueError(f"[{name}] Please set at least one of'),
    ),
    "validate.sampled-validation-temperature": (
        ("verl/utils/config.py", "assert config.actor_rollout_ref.rollout.temperature > 0"),
    ),
    "worker.dynamic-batch-disagrees": (
        (
            "verl/workers/engine_workers.py",
            "assert self.config.actor.use_dynamic_bsz == self.config.rollout.log_prob_use_dynamic_bsz",
        ),
    ),
    "parallel.rollout-replicas": (
        ("verl/workers/engine_workers.py", "assert self.world_size % infer_world_size == 0"),
    ),
    "parallel.sequence-parallel-divides-gpus": (
        ("verl/utils/config.py", "n_gpus % (model_parallel_size * config.actor_rollout_ref"),
    ),
    "batch.mini-batch-over-ranks": (
        (
            "verl/workers/engine_workers.py",
            "assert mini_batch_size % self.engine.get_data_parallel_size() == 0",
        ),
    ),
    "batch.micro-batch-does-not-divide-mini-batch": _PREPARE_MICRO_BATCHES,
    "batch.log-prob-micro-batch-does-not-divide-batch": _PREPARE_MICRO_BATCHES,
    "batch.deprecated-global-micro-batch": (
        (
            "verl/workers/engine_workers.py",
            "assert self.config.rollout.log_prob_micro_batch_size_per_gpu is not None",
        ),
        (
            "verl/workers/engine_workers.py",
            "assert self.config.actor.ppo_micro_batch_size_per_gpu is not None",
        ),
    ),
    # The SFT trainer's (verl.trainer.sft_trainer), where its probes see them fail.
    "sft.batch-per-rank": (
        ("verl/trainer/sft_trainer.py", "self.train_dataloader = StatefulDataLoader("),
    ),
    "sft.static-micro-batch": (
        (
            "verl/workers/engine/utils.py",
            "assert total_data_size % (force_group_size * micro_batch_size_per_gpu) == 0",
        ),
    ),
    "sft.sequence-parallel-divides-world": (
        (
            "verl/workers/engine/fsdp/transformer_impl.py",
            "self.ulysses_device_mesh = init_device_mesh(",
        ),
    ),
    "sft.token-budget-below-max-length": (
        ("verl/utils/seqlen_balancing.py", "assert max_token_len >= max_seq_len"),
    ),
}

# Upstream raises these in a multi-line ``raise ValueError(`` whose first line names nothing: the
# static check is matched by upstream's message instead.
STATIC_EQUIVALENT_MESSAGES = {
    "validate.sequence-parallel-needs-remove-padding": "you must enable `use_remove_padding`",
    "sft.sequence-parallel-needs-remove-padding": "you must enable `use_remove_padding`",
    "batch.mini-batch-larger-than-batch": "must be >= actor.ppo_mini_batch_size",
}


@dataclass(frozen=True)
class UpstreamFailure:
    """One early check that fails: upstream's message, where it is raised and when."""

    phase: str
    message: str
    where: str
    source: str
    stand_in: str = ""
    check: str = ""  # the upstream function that raised, or "stand-in"
    keys: tuple[str, ...] = ()  # the configuration leaves that decided it
    condition: str = ""  # what upstream requires there
    blame: str = ""  # how its keys were found when its statement read none (``blame``)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> UpstreamFailure:
        return cls(
            phase=str(raw[ec.KEY_PHASE]),
            message=str(raw[ec.KEY_MESSAGE]),
            where=str(raw[ec.KEY_WHERE]),
            source=str(raw[ec.KEY_SOURCE]),
            stand_in=str(raw.get(ec.KEY_STAND_IN) or ""),
            check=str(raw.get(ec.KEY_CHECK) or ""),
            keys=tuple(str(key) for key in raw.get(ec.KEY_KEYS) or ()),
            condition=str(raw.get(ec.KEY_CONDITION) or ""),
            blame=str(raw.get(blame.KEY_BLAME) or ""),
        )

    @property
    def check_id(self) -> str:
        """``upstream.<phase slug>``: ``upstream.trainer-start``, ``upstream.worker-start``, …"""
        when = self.phase.split(":", 1)[0]
        return "upstream." + re.sub(r"[^a-z0-9]+", "-", when.lower()).strip("-")

    def describe(self, version: str = "") -> str:
        """Upstream's message (with the statement when the message alone says nothing), the
        phase at which verl raises it and the upstream file:line."""
        message = self.message
        if ": " not in message and self.source:
            message = f"{message} on `{self.source}`"
        where = self.where or "its upstream line is gone (stale stand-in)"
        raises = f"verl {version} raises it" if version else "raised"
        label = "; stand-in, the statement needs a GPU" if self.stand_in else ""
        said = f"{message} ({raises} at {self.phase}, {where}{label})"
        if self.blame == blame.UPSTREAM_DEFAULT:
            said += (
                "; a default of upstream's: it fails with every key the script sets reset to "
                "the tree's default"
            )
        return said

    def fix(self, keys: str = "") -> str:
        """What to change: the keys, and what upstream requires of them where it says so."""
        keys = keys or ", ".join(self.keys)
        if self.condition.startswith("not ("):
            return f"change {keys}: verl raises when `{self.condition[5:-1]}`"
        if self.condition:
            return f"change {keys}: verl requires `{self.condition}`"
        return f"change {keys}"

    def finding(self, version: str, path: str | None = None, keys: str = "") -> Finding:
        """An error at the keys that decided it (``path`` overrides them, e.g. mapped back from an
        interpolation to the key the script set; ``keys``, those the fix names); the phase is the
        rule id and the evidence."""
        evidence = f"{self.where}: {self.source}" if self.where else self.source
        if self.stand_in:
            evidence += f" ({self.stand_in})"
        if self.blame == blame.BY_EXPERIMENT:
            evidence += (
                " (the failing statement reads no key: these are the fewest of the script's keys "
                "whose reset to the tree's default removes the failure, found by delta debugging)"
            )
        where = path or ", ".join(self.keys) or f"<{self.check_id}>"
        return Finding(
            "error",
            where,
            self.describe(version),
            self.fix(keys),
            evidence=evidence,
            check=self.check_id,
        )


@dataclass(frozen=True)
class EarlyAnswer:
    """Upstream's early checks on one mapping: validate_config's verdict and every failure."""

    verdict: str
    message: str
    failures: tuple[UpstreamFailure, ...]
    cached: bool = False
    # Probe steps that could not run on this machine, each with why (``{"step", "reason"}``).
    not_evaluated: tuple[Mapping[str, str], ...] = ()
    # Values the config dataclasses' annotations refuse (``probes.types``), every key's.
    wrong_types: tuple[Mapping[str, str], ...] = ()
    # Explicit keys never read, or read and overridden (``probes.effects``).
    without_effect: tuple[Mapping[str, Any], ...] = ()
    # Explicit keys whose config dataclass's annotation admits their value (``probes.types``).
    admitted_types: tuple[Mapping[str, str], ...] = ()
    # What this machine decided rather than the configuration (``probes.optional``).
    notes: tuple[Mapping[str, Any], ...] = ()
    # Where the run went: the lines that read each explicit key, the classes that read each
    # section (``records.path_of_run``; ``verdict/keys.py`` answers each key with it).
    path: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], cached: bool = False) -> EarlyAnswer:
        return cls(
            verdict=str(raw["verdict"]),
            message=str(raw["message"]),
            failures=tuple(UpstreamFailure.from_json(f) for f in raw.get("failures", [])),
            cached=cached,
            not_evaluated=tuple(dict(n) for n in raw.get(KEY_NOT_EVALUATED, [])),
            wrong_types=tuple(dict(t) for t in raw.get(KEY_TYPES, [])),
            without_effect=tuple(dict(e) for e in raw.get(KEY_EFFECTS, [])),
            admitted_types=tuple(dict(t) for t in raw.get(KEY_ADMITTED, [])),
            notes=tuple(dict(n) for n in raw.get(KEY_NOTES, [])),
            path=dict(raw.get(KEY_PATH) or {}),
        )

    def effect_findings(self, version: str, entry: str | None = None) -> list[Finding]:
        """A warning for each explicit key that changes nothing (``probes.effects``) on the path
        of ``entry``'s launch (main_ppo's V1 trainer by default)."""
        main = entry in (None, ENTRY_MODULE)
        path = "the main_ppo V1 path" if main else f"{str(entry).rpartition('.')[2]}'s path"
        out = []
        for record in self.without_effect:
            key = str(record[probe_effects.KEY_KEY])
            instead = [str(k) for k in record.get(probe_effects.KEY_INSTEAD) or []]
            if record[probe_effects.KEY_KIND] == probe_effects.NEVER_READ:
                read = f"; it reads {instead[0]} instead" if instead else ""
                out.append(
                    Finding(
                        "warning",
                        key,
                        f"verl {version} never reads it on {path}{read}",
                        f"set {instead[0]}" if instead else f"remove {key}",
                        evidence="no code of the checked release outside its config dataclasses "
                        "(verl/workers/config/) reads the field, and none of the probes did",
                        check=NEVER_READ_RULE,
                    )
                )
                continue
            effects = ", ".join(str(e) for e in record[probe_effects.KEY_EFFECTS])
            if record[probe_effects.KEY_KIND] == probe_effects.NOT_READ_HERE:
                when = (
                    f"; it reads it only with {instead[0]}"
                    if instead
                    else " (what reads it runs only under another setting)"
                )
                out.append(
                    Finding(
                        "warning",
                        key,
                        f"{key}={record[probe_effects.KEY_VALUE]} changes nothing here: "
                        f"upstream's code for {effects} never reads it with these settings{when}",
                        f"set {instead[0]}, or remove {key}"
                        if instead
                        else f"remove {key}, or select the setting that uses it",
                        evidence="the probes ran upstream's own functions for "
                        f"{effects}, which alone read it, and none read it",
                        check=OVERRIDDEN_RULE,
                    )
                )
                continue
            deciding = f" ({', '.join(instead)} decide instead)" if instead else ""
            where = ", ".join(str(w) for w in record.get(probe_effects.KEY_WHERE) or [])
            out.append(
                Finding(
                    "warning",
                    key,
                    f"{key}={record[probe_effects.KEY_VALUE]} changes nothing: with "
                    f"{' or '.join(str(record[probe_effects.KEY_TRIED]).split(', '))} instead, "
                    f"upstream's own code computes {effects} unchanged{deciding}",
                    f"remove {key}, or set what decides" if instead else f"remove {key}",
                    evidence=f"read at {where}; perturbed through the same functions"
                    if where
                    else "perturbed through upstream's own functions",
                    check=OVERRIDDEN_RULE,
                )
            )
        return out

    def note_findings(self, user_keys: Callable[[Iterable[str]], list[str]]) -> list[Finding]:
        """An info finding for each note: valid here, decided by what this machine lacks."""
        out = []
        for note in self.notes:
            keys = user_keys(str(k) for k in note.get(probe_optional.KEY_KEYS) or [])
            out.append(
                Finding(
                    "info",
                    ", ".join(keys) or "<environment>",
                    str(note[probe_optional.KEY_MESSAGE]),
                    str(
                        note.get("fix")
                        or "nothing: the name is valid where the package is installed"
                    ),
                    evidence=str(note[probe_optional.KEY_WHERE]),
                    check=str(note[probe_optional.KEY_RULE]),
                )
            )
        return out

    def type_findings(
        self,
        version: str,
        keys: Iterable[str],
        user_keys: Callable[[Iterable[str]], list[str]] | None = None,
    ) -> list[Finding]:
        """An error for each of ``keys`` whose value its config dataclass's annotation refuses;
        with ``user_keys`` (a key to the key the script set it by), also a refused copy the tree
        interpolates from one of ``keys``, named by that key."""
        wanted = set(keys)
        out: dict[str, Finding] = {}
        for record in self.wrong_types:
            copy = str(record[probe_types.KEY_KEY])
            key = copy if user_keys is None else user_keys([copy])[0]
            if key not in wanted or key in out:
                continue
            via = f" (the tree copies it into {copy})" if key != copy else ""
            out[key] = Finding(
                "error",
                key,
                f"{record[probe_types.KEY_VALUE]}, but verl {version}'s "
                f"{record[probe_types.KEY_FIELD]} expects {record[probe_types.KEY_EXPECTED]} (its "
                f"annotation){via}; Hydra's instantiate checks no type, so the value reaches the "
                "code that uses it",
                f"set {key} to {record[probe_types.KEY_EXPECTED]}",
                evidence=f"{record[probe_types.KEY_FIELD]} (verl/utils/config.py:52 instantiates "
                "it unchecked)",
                check=TYPE_ANNOTATION,
            )
        return list(out.values())

    def to_json(self) -> dict[str, Any]:
        """The answer as the oracle gave it (what the caches and the examples recording keep)."""
        return {
            "verdict": self.verdict,
            "message": self.message,
            "failures": [dataclasses.asdict(f) for f in self.failures],
            KEY_NOT_EVALUATED: [dict(n) for n in self.not_evaluated],
            KEY_TYPES: [dict(t) for t in self.wrong_types],
            KEY_EFFECTS: [dict(e) for e in self.without_effect],
            KEY_ADMITTED: [dict(t) for t in self.admitted_types],
            KEY_NOTES: [dict(n) for n in self.notes],
            KEY_PATH: dict(self.path),
        }

    def validate_message(self, version: str = "") -> str:
        """validate_config's failure with its file:line and phase (the validate stage's words)."""
        first = next((f for f in self.failures if f.check == VALIDATE_CONFIG), None)
        return first.describe(version) if first is not None else self.message


# --- where the answers are kept ----------------------------------------------------------------


def cache_key(
    version: str,
    tree: str,
    mapping: Mapping[str, Any],
    explicit: Sequence[str] = (),
    entry: str | None = None,
    world_size: int | None = None,
) -> str:
    """The key of upstream's checks on one mapping (``answers.answer_key`` of kind ``checks``):
    the verl version, the tree, the mapping and the keys the script set; for an entry point other
    than main_ppo also the entry point and the launch's world size (``oracle.checks_request``:
    what enters the question enters its key; main_ppo's question is what it always was)."""
    request = checks_request({}, entry=entry, world_size=world_size)
    return answer_key(
        CHECKS,
        {
            "verl": version,
            "tree": tree,
            "mapping": hashlib.sha256(json.dumps(mapping, sort_keys=True).encode()).hexdigest(),
            "explicit": sorted(set(explicit)),
            **{name: request[name] for name in ("entry", "world_size") if name in request},
        },
        request.get("entry"),
        release=version,
    )


@dataclass(frozen=True)
class ChecksQuestion:
    """One question for upstream's checks: a composed mapping, the keys the script set (examined
    for effect), and the launch's entry point and world size where they enter the question
    (``oracle.checks_request``: None for main_ppo, whose world is its configuration's)."""

    mapping: Mapping[str, Any]
    explicit: tuple[str, ...] = ()
    entry: str | None = None
    world_size: int | None = None
    # The launch it was composed from (its fields and bindings): not part of the question, but
    # what a failure that names no key is blamed on by experiment (``blame``).
    launch: tuple[ExplicitFields, Bindings] | None = dataclasses.field(default=None, compare=False)

    def key(self, version: str, tree: str) -> str:
        return cache_key(version, tree, self.mapping, self.explicit, self.entry, self.world_size)

    def request(self) -> dict[str, Any]:
        return checks_request(
            self.mapping, explicit=self.explicit, entry=self.entry, world_size=self.world_size
        )

    @classmethod
    def from_request(cls, request: Mapping[str, Any]) -> ChecksQuestion:
        """The question a ``checks`` request asks (``request``'s inverse)."""
        return cls(
            request["mapping"],
            tuple(request.get("explicit", ())),
            request.get("entry"),
            request.get("world_size"),
        )


class AnswerStore(Protocol):
    """Where answers are kept and looked up (``answers.Answers``, or one of its stores)."""

    def get(self, key: str) -> Any | None: ...

    def put(self, key: str, entry: Any) -> None: ...


def checked_entry(entry: Any) -> bool:
    """Whether a stored answer has an answer's shape (checked before it is trusted)."""
    try:
        EarlyAnswer.from_json(entry)
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    return isinstance(entry, dict)


def check_answers(golden_dir: Path | None, *, user: bool = True) -> Answers:
    """The stores of upstream's checks: the user cache, then those recorded in ``golden_dir``."""
    return answers(CHECKS, golden_dir, checker=checked_entry, user=user)


# --- whether upstream's code may see a session's compositions ----------------------------------


@dataclass(frozen=True)
class UpstreamGate:
    """Whether upstream's code may see this session's compositions: the tree it would see, or
    the reason it may not."""

    tree: str | None
    reason: str


def upstream_gate(session: AuditSession) -> UpstreamGate:
    """The checked release's tree hash when upstream's code may see this session's compositions.

    Only compositions of the checked release's own tree reach its code (in that release's own
    environment): a tree from elsewhere (a drift tree, a user's folder) may name any
    ``_target_`` and is never sent.
    """
    if session.release is None:
        return UpstreamGate(None, session.release_error or "no release chosen")
    if session.upstream is None:
        return UpstreamGate(None, f"no upstream config tree: {session.upstream_reason}")
    pinned = session.release.release.tree_sha256
    composed = session.upstream.tree_sha256
    if pinned != composed:
        return UpstreamGate(
            None,
            f"the composed tree {composed} is not verl {session.version}'s own ({pinned})",
        )
    return UpstreamGate(pinned, "")


def prefetch_answer(
    session: AuditSession,
    question: ChecksQuestion,
    tree: str,
    cache: AnswerStore | None,
    oracle: UpstreamOracle,
) -> None:
    """Send the question now (the answer arrives while other work runs) unless it is stored."""
    key = question.key(session.pin.version, tree)
    if cache is None or cache.get(key) is None:
        oracle.submit(key, question.request())


def early_answer(
    session: AuditSession,
    question: ChecksQuestion,
    tree: str,
    cache: AnswerStore | None,
    oracle: UpstreamOracle | None = None,
) -> EarlyAnswer:
    """Upstream's early checks on one question (``ChecksQuestion``: the composed mapping, the
    keys the script set, the launch's entry point and world size), from the cache or the oracle
    process.

    Raises RuntimeError when the oracle process gives no answer, ``ReleaseUnsupported`` when
    the release lacks a patch point of the probes.
    """
    key = question.key(session.pin.version, tree)
    hit = cache.get(key) if cache is not None else None
    if hit is not None:
        return EarlyAnswer.from_json(hit, cached=True)
    own = oracle is None
    asker = UpstreamOracle(release=session.version) if oracle is None else oracle
    try:
        stored = _stored(asker.answer(key, question.request()))
        if question.launch is not None and blame.pending(stored["failures"]):
            stored = blame.complete(
                stored,
                [k for k in question.explicit if not k.startswith("-")],
                _experiments(session, question, tree, cache, asker),
            )
    finally:
        if own:
            asker.close()
    if cache is not None:
        cache.put(key, stored)
    return EarlyAnswer.from_json(stored)


def _stored(answer: Mapping[str, Any]) -> dict[str, Any]:
    """An oracle's answer as the caches keep it (raises as ``early_answer`` says)."""
    if KEY_UNSUPPORTED in answer:
        raise ReleaseUnsupported(str(answer[KEY_UNSUPPORTED]))
    if "verdict" not in answer:
        raise RuntimeError(f"upstream's checks gave no verdict: {answer.get('error', answer)}")
    return {
        "verdict": answer["verdict"],
        "message": answer["message"],
        "failures": answer.get("failures", []),
        KEY_NOT_EVALUATED: answer.get(KEY_NOT_EVALUATED, []),
        KEY_TYPES: answer.get(KEY_TYPES, []),
        KEY_EFFECTS: answer.get(KEY_EFFECTS, []),
        KEY_ADMITTED: answer.get(KEY_ADMITTED, []),
        KEY_NOTES: answer.get(KEY_NOTES, []),
        KEY_PATH: answer.get(KEY_PATH, {}),
    }


def _experiments(
    session: AuditSession,
    question: ChecksQuestion,
    tree: str,
    cache: AnswerStore | None,
    oracle: UpstreamOracle,
) -> blame.Experiments:
    """Upstream's failures on the question's launch with some of its keys reset to the tree's
    defaults (their fields left out), for ``blame``: each variant composed, all sent to the
    oracle before the first answer is read; None for a variant that does not compose."""
    assert question.launch is not None
    fields, bindings = question.launch

    def run(resets: Sequence[frozenset[str]]) -> list[list[Mapping[str, Any]] | None]:
        variants: list[ChecksQuestion | None] = []
        for reset in resets:
            kept = tuple(f for f in fields.fields if field_key(f) not in reset)
            composition = session.compose_variant(
                dataclasses.replace(fields, fields=kept), bindings
            )
            if not composition.composed or composition.mapping is None:
                variants.append(None)
                continue
            # Types and effects are not asked: only the failures matter here.
            variant = ChecksQuestion(composition.mapping, (), question.entry, question.world_size)
            variants.append(variant)
            prefetch = variant.key(session.pin.version, tree)
            if cache is None or cache.get(prefetch) is None:
                oracle.submit(prefetch, variant.request())
        out: list[list[Mapping[str, Any]] | None] = []
        for asked in variants:
            if asked is None:
                out.append(None)
                continue
            try:
                answer = early_answer(session, asked, tree, cache, oracle)
            except RuntimeError:
                out.append(None)
                continue
            out.append([dataclasses.asdict(f) for f in answer.failures])
        return out

    return run


# --- the same cause said twice ---------------------------------------------------------------


@functools.lru_cache(maxsize=128)
def statement_lines(
    root: Path, relative: str, statement: str, function: str = ""
) -> tuple[int, ...]:
    """The lines of ``relative`` (in the release's files at ``root``) that start with
    ``statement``: the first, or every one inside ``function`` when given (``raise
    NotImplementedError`` alone is not unique)."""
    source = statements.parse(str(root / relative), relative)
    if source is None:
        return ()
    found = []
    for number, text in enumerate(source.lines, start=1):
        if not text.strip().startswith(statement):
            continue
        node = source.statement_at(number)
        if not function:
            return (number,)
        if node is not None and source.qualname(node) == function:
            found.append(number)
    return tuple(found)


# A statement's lines in a release (``statement_lines``'s arguments but ``root``).
StatementLines = Callable[[str, str, str], tuple[int, ...]]
# Where a supported release ships its ``STATIC_EQUIVALENTS`` statements' lines, in its folder
# (``verl-compat release derive VERSION --only statements``).
SHIPPED_STATEMENTS_FILE = "statement_lines.json"


def shipped_statements_path(version: str) -> Path:
    return RELEASE_DATA / version / SHIPPED_STATEMENTS_FILE


def equivalent_statements() -> list[tuple[str, str, str]]:
    """Every (file, statement, function) ``STATIC_EQUIVALENTS`` names, once each, in order."""
    found: dict[tuple[str, str, str], None] = {}
    for _check, entries in sorted(STATIC_EQUIVALENTS.items()):
        for relative, statement, *function in entries:
            found[(relative, statement, "".join(function))] = None
    return list(found)


def statement_table(root: Path) -> list[dict[str, Any]]:
    """The release's lines of every ``equivalent_statements`` entry (what it ships)."""
    return [
        {
            "file": relative,
            "statement": statement,
            "function": function,
            "lines": list(statement_lines(root, relative, statement, function)),
        }
        for relative, statement, function in equivalent_statements()
    ]


@functools.cache
def shipped_statement_lines(version: str) -> StatementLines | None:
    """The shipped lines of a release's statements as ``StatementLines``, read once; None when
    the release ships none (its files are read instead)."""
    path = shipped_statements_path(version)
    if not path.is_file():
        return None
    table = {
        (row["file"], row["statement"], row["function"]): tuple(row["lines"])
        for row in json.loads(path.read_text(encoding="utf-8"))
    }

    def lines(relative: str, statement: str, function: str) -> tuple[int, ...]:
        return table[(relative, statement, function)]

    return lines


def lines_in(root: Path) -> StatementLines:
    """``statement_lines`` of the release whose files are at ``root``."""
    return functools.partial(statement_lines, root)


def _sections(keys: Iterable[str]) -> set[str]:
    return {key.rpartition(".")[0] for key in keys}


def covered_static_findings(
    answer: EarlyAnswer,
    findings: Iterable[Finding],
    keys_of: Callable[[UpstreamFailure], Iterable[str]],
    lines: StatementLines,
) -> list[Finding]:
    """The static findings that repeat a failure upstream reported: the check says what the
    failing statement says (``STATIC_EQUIVALENTS``, or upstream's words), and the finding is
    about the same section of the configuration as the failure's keys (``keys_of`` maps them to
    the keys the user set). A section the failure does not name keeps its static finding: the
    first failing assertion hides the ones after it. ``lines``: where the answering release has
    the statements (shipped with it, or found by their shape in its files)."""
    covered = []
    for finding in findings:
        for failure in answer.failures:
            if _equivalent(finding.check, failure, lines) and _sections(
                finding.path.split(", ")
            ) & _sections(keys_of(failure)):
                covered.append(finding)
                break
    return covered


def _equivalent(check_id: str, failure: UpstreamFailure, lines: StatementLines) -> bool:
    words = STATIC_EQUIVALENT_MESSAGES.get(check_id)
    if words is not None and words in failure.message:
        return True
    for relative, statement, *function in STATIC_EQUIVALENTS.get(check_id, ()):
        if any(
            failure.where == f"{relative}:{n}"
            for n in lines(relative, statement, "".join(function))
        ):
            return True
    return False
