"""What a release's own code decides about memory where its configuration does not, as data.

Where upstream decides by a configuration key (``use_no_sync_for_gradient_accumulation``,
``hybrid_engine``, ``gpu_memory_utilization``, ...) the forecast reads the resolved mapping as
upstream's code reads it, a key the release's tree lacks behaving as upstream's own default.
Where the *code* differs between releases (a copy one release makes and another skips), the
release's ``data/releases/<version>/memory.yaml`` says which, each fact with the statement of
that release's files that makes it true (tests/test_fit_release_facts.py finds each statement at
its lines). No version is compared in code: a forecast is asked for with its release's facts.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import Version  # pytest's own dependency

from pytest_verl_compat.files.safe_input import InputError, load_yaml_file, read_text
from pytest_verl_compat.releases.index import RELEASE_DATA, load_release_index

FACTS_FILE = "memory.yaml"

# Each fact and the values it may take (what the forecast does with each is in its docstring).
TEMPERATURE_COPY = "temperature_copy"
DYNAMIC_MICRO_BATCHES = "dynamic_micro_batches"
HYBRID_REPLICAS = "separate_async_hybrid_replicas"
BATCHED_TOKENS = "chunked_prefill_off_batched_tokens"
FUSED_BACKENDS = "fused_kernel_backends"
# The training engine's FSDP strategies that keep a role's shards, gradients and optimizer
# states on the host when the configuration asks for an offload policy (engine.offload_policy):
# 0.9.0 builds FSDP2's CPUOffloadPolicy and gives FSDP1 none; the old SFT trainer's FSDP1
# CPUOffload (its cpu_offload with offload_params) is carried to that key
HOST_OFFLOAD = "host_offload_strategies"
LIST_FACTS = (FUSED_BACKENDS, HOST_OFFLOAD)
ENTROPY_PASSES = "entropy_passes"
CRITIC_MICRO_BATCHES = "critic_micro_batches"
LOGPROB_BACKWARD = "logprob_backward"
VLLM_CUDA_GRAPHS = "vllm_cuda_graphs"
VEOMNI_ENGINE = "veomni_engine"
# Facts only a release with the code has (the older releases the recorded runs used, as
# classes, have no VeOmni engine): absent, the forecast refuses what needs them in one line.
OPTIONAL_FACTS = (VEOMNI_ENGINE,)
VALUES: dict[str, tuple[str, ...]] = {
    # the log-prob pass divides the logits by the temperature: out of place always, out of
    # place unless the temperature is a scalar 1.0, or in place (no second tensor)
    TEMPERATURE_COPY: ("always", "unless-unit", "never"),
    # dynamic micro-batches: ceil(tokens / budget) of them, balanced (one may exceed the budget
    # by less than a sequence), or as many more as keep every one within the budget
    DYNAMIC_MICRO_BATCHES: ("ceil", "within-budget"),
    # the separate_async trainer's colocated rollout replicas on the trainer GPUs: always, or
    # unless actor_rollout_ref.hybrid_engine is false
    HYBRID_REPLICAS: ("always", "unless-hybrid-engine-off"),
    # vLLM with chunked prefill off and max_num_batched_tokens below max_model_len: started as
    # configured, or with max_num_batched_tokens raised to max_model_len
    BATCHED_TOKENS: ("as-configured", "raised-to-max-model-len"),
    # the entropy of the logits: in the passes that ask for it (the old log-probs, an update
    # with an entropy term), or in every log-prob pass and update
    ENTROPY_PASSES: ("requested", "every-pass"),
    # the critic's micro-batches: both passes on critic.ppo_infer_max_token_len_per_gpu (the
    # engine's dynamic batching), or each pass on its own keys (the update on
    # ppo_micro_batch_size_per_gpu or ppo_max_token_len_per_gpu, the values on
    # forward_micro_batch_size_per_gpu or forward_max_token_len_per_gpu, by use_dynamic_bsz)
    CRITIC_MICRO_BATCHES: ("infer-budget", "per-pass"),
    # the log-probs' cross entropy (flash-attn's) writes the logits' gradient into the saved
    # logits unless the pass also takes the entropy of them, or always into a new tensor
    # (or, torch-autocast-fp32, torch's cross entropy under bf16 autocast: the logits cast to
    # fp32, their log_softmax saved in fp32, its gradient and the input's fp32 beside it)
    LOGPROB_BACKWARD: ("in-place-unless-entropy", "new-tensor", "torch-autocast-fp32"),
    # the vLLM the release pins sizes its KV cache before it captures its CUDA graphs (they sit
    # outside gpu_memory_utilization's share), or after subtracting their profiled estimate
    # (inside the share: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS's default from vLLM 0.21.0)
    VLLM_CUDA_GRAPHS: ("outside-share", "inside-share"),
    # the VeOmni engine: VeOmni builds the model with FSDP2, read as memory/veomni.py says
    VEOMNI_ENGINE: ("fsdp2",),
}


class ReleaseFactsError(ValueError):
    """A release without memory facts, or facts the forecast cannot read (one line)."""


@dataclass(frozen=True)
class Fact:
    """One fact: its value, what it means, and the statement of the release that makes it true."""

    value: Any
    means: str
    where: str  # verl/path/file.py:LINE or :START-END, in the release's own files
    statement: str  # a piece of the code at those lines

    def evidence(self, release: str) -> str:
        """The citation as fit prints it: the release's own line, marked as that release's."""
        return f"{self.where}@{release}" if _is_version(release) else self.where

    @property
    def cites_metadata(self) -> bool:
        """Whether it cites the release's distribution METADATA (the pins of its extras), which
        its installed environment holds, not its source tree."""
        return self.where.split(":", 1)[0].endswith(METADATA_FILE)

    def found_in(self, root: Path, installed: Path | None = None) -> bool:
        """Whether the statement is at the cited lines of the release's files under ``root``
        (its source), or, for its METADATA, under ``installed`` (its environment's
        site-packages; not found without one)."""
        cited = _WHERE.fullmatch(self.where)
        if cited is None or not self.statement:
            return False
        if self.cites_metadata:
            if installed is None:
                return False
            root = installed
        start = int(cited["start"])
        end = int(cited["end"] or start)
        try:
            text = read_text(root / cited["file"], what="upstream source")
        except (InputError, OSError):
            return False
        lines = " ".join(" ".join(text.splitlines()[start - 1 : end]).split())
        return " ".join(self.statement.split()) in lines


METADATA_FILE = "METADATA"
# A line of the release's source (its code or its config tree), or of its distribution's METADATA
# (the pins of its extras).
_WHERE = re.compile(
    r"(?P<file>[\w/]+\.(?:py|yaml)|verl-[\w.]+\.dist-info/METADATA)"
    r":(?P<start>\d+)(?:-(?P<end>\d+))?"
)


def _is_version(text: str) -> bool:
    parts = text.split(".")
    return len(parts) == 3 and all(p.isdigit() for p in parts)


@dataclass(frozen=True)
class ReleaseFacts:
    """The facts of one release (or of a class of older releases a recorded run used)."""

    release: str
    facts: Mapping[str, Fact] = field(default_factory=dict)
    # keys the release's config tree gives a value where an earlier release's code decided
    # without a key (its memory.yaml's ``tree_keys``): a forecast for an earlier release names
    # this one, with the phase under that value (``fixes.release_remedy``)
    tree_keys: Mapping[str, Fact] = field(default_factory=dict)

    def value(self, name: str) -> Any:
        return self.facts[name].value

    def evidence(self, name: str) -> str:
        return self.facts[name].evidence(self.release)

    @property
    def temperature_copy(self) -> str:
        return str(self.value(TEMPERATURE_COPY))

    @property
    def partitions_within_budget(self) -> bool:
        return bool(self.value(DYNAMIC_MICRO_BATCHES) == "within-budget")

    @property
    def hybrid_engine_decides_replicas(self) -> bool:
        return bool(self.value(HYBRID_REPLICAS) == "unless-hybrid-engine-off")

    @property
    def raises_batched_tokens(self) -> bool:
        return bool(self.value(BATCHED_TOKENS) == "raised-to-max-model-len")

    @property
    def entropy_every_pass(self) -> bool:
        return bool(self.value(ENTROPY_PASSES) == "every-pass")

    @property
    def critic_splits_per_pass(self) -> bool:
        return bool(self.value(CRITIC_MICRO_BATCHES) == "per-pass")

    @property
    def logprob_grad_in_place(self) -> bool:
        """Whether the log-probs' backward reuses the saved logits when no entropy is taken."""
        return bool(self.value(LOGPROB_BACKWARD) == "in-place-unless-entropy")

    @property
    def logprob_loss_in_fp32(self) -> bool:
        """Whether the log-probs' loss is torch's cross entropy under bf16 autocast (fp32 copies)."""
        return bool(self.value(LOGPROB_BACKWARD) == "torch-autocast-fp32")

    @property
    def vllm_graphs_in_share(self) -> bool:
        """Whether vLLM's CUDA graphs come out of the gpu_memory_utilization share."""
        return bool(self.value(VLLM_CUDA_GRAPHS) == "inside-share")

    @property
    def veomni_evidence(self) -> str | None:
        """The release's line that has VeOmni build its VeOmni engine, or None without one."""
        return self.evidence(VEOMNI_ENGINE) if VEOMNI_ENGINE in self.facts else None

    @property
    def fused_backends(self) -> tuple[str, ...]:
        return tuple(str(v) for v in self.value(FUSED_BACKENDS))

    @property
    def host_offload_strategies(self) -> tuple[str, ...]:
        return tuple(str(v) for v in self.value(HOST_OFFLOAD))


def facts_from_mapping(raw: Mapping[str, Any], origin: str) -> ReleaseFacts:
    """Facts from their data (a release's memory.yaml, or a recorded run's class of releases)."""
    release = str(raw.get("release") or "")
    entries = raw.get("facts")
    if not release or not isinstance(entries, Mapping):
        raise ReleaseFactsError(f"{origin}: expected `release` and a `facts` mapping")
    facts: dict[str, Fact] = {}
    for name in (*VALUES, *LIST_FACTS):
        entry = entries.get(name)
        if entry is None and name in OPTIONAL_FACTS:
            continue
        if not isinstance(entry, Mapping) or "value" not in entry:
            raise ReleaseFactsError(f"{origin}: facts.{name} is missing (value, means, where)")
        value = entry["value"]
        allowed = VALUES.get(name)
        if allowed is not None and value not in allowed:
            raise ReleaseFactsError(
                f"{origin}: facts.{name} is {value!r}; expected one of {', '.join(allowed)}"
            )
        if name in LIST_FACTS and not isinstance(value, list):
            raise ReleaseFactsError(f"{origin}: facts.{name} must be a list of names")
        facts[name] = _fact(entry, tuple(value) if isinstance(value, list) else value)
    unknown = sorted(set(entries) - set(facts))
    if unknown:
        raise ReleaseFactsError(f"{origin}: unknown facts {', '.join(unknown)}")
    return ReleaseFacts(release, facts, _tree_keys(raw.get("tree_keys"), origin))


def _tree_keys(raw: Any, origin: str) -> dict[str, Fact]:
    """A release's ``tree_keys``: each key its tree adds, the value the tree gives it, and the
    tree's line that says so."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ReleaseFactsError(f"{origin}: tree_keys must map a key to its value and line")
    keys: dict[str, Fact] = {}
    for key, entry in raw.items():
        if not isinstance(entry, Mapping) or "value" not in entry or not entry.get("where"):
            raise ReleaseFactsError(f"{origin}: tree_keys.{key} is missing (value, means, where)")
        keys[str(key)] = _fact(entry, entry["value"])
    return keys


def _fact(entry: Mapping[str, Any], value: Any) -> Fact:
    return Fact(
        value=value,
        means=str(entry.get("means") or ""),
        where=str(entry.get("where") or ""),
        statement=str(entry.get("statement") or ""),
    )


def later_tree_key(release: str, key: str) -> tuple[str, Fact] | None:
    """The first supported release after ``release`` whose tree gives ``key`` a value, with
    that value's fact (None when no later release does, or ``release`` is not a version)."""
    if not _is_version(release):
        return None
    for version in load_release_index().supported_versions:
        if Version(version) <= Version(release):
            continue
        fact = release_facts(version).tree_keys.get(key)
        if fact is not None:
            return version, fact
    return None


@functools.cache
def release_facts(version: str) -> ReleaseFacts:
    """The memory facts of a supported release (``data/releases/<version>/memory.yaml``)."""
    path = RELEASE_DATA / version / FACTS_FILE
    if not path.is_file():
        raise ReleaseFactsError(
            f"verl {version} has no memory facts ({path.relative_to(RELEASE_DATA.parent)}): "
            "the forecast cannot say what its code keeps on the GPU"
        )
    raw = load_yaml_file(path, what="memory facts")
    if not isinstance(raw, Mapping):
        raise ReleaseFactsError(f"{path}: expected a mapping")
    facts = facts_from_mapping(raw, str(path))
    if facts.release != version:
        raise ReleaseFactsError(f"{path}: names release {facts.release}, not {version}")
    return facts


def installed_root(version: str) -> Path | None:
    """The site-packages of the release's built environment (where its distribution's METADATA
    is), or None when it is not built."""
    from pytest_verl_compat.releases.environment import built, load_lock
    from pytest_verl_compat.releases.index import ReleaseError, load_release_index

    try:
        environment = built(load_lock(load_release_index().supported_release(version)))
    except ReleaseError:
        return None
    if environment is None:
        return None
    found = sorted((environment.folder / "lib").glob("python3*/site-packages"))
    return found[0] if found else None
